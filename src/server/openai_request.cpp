#include "server/openai_request.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace bie::server {

// Request bodies are parsed keeping the client's key order: a tool's or a response schema's
// properties are rendered and generated in the order their author wrote them.
using json = nlohmann::ordered_json;

bool valid_utf8(std::string_view s) {
  return tokenizer::unicode::valid_prefix_len(s) == s.size();
}

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_float:
      return "number";
    default:
      return "integer";
  }
}

ApiError wrong_type(const std::string& field, const char* want, const json& got) {
  return bad_request(fmt::format("'{}' must be {}, got {}", field, want, type_name(got)), field,
                     "invalid_type");
}

// Reads an optional field; null counts as absent (OpenAI clients send null for "not given").
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

struct Reader {
  const json& obj;
  std::optional<ApiError> err;

  std::optional<double> number(const char* name, double lo, double hi, bool lo_open = false) {
    const json* v = field(obj, name);
    if (v == nullptr || err) return std::nullopt;
    if (!v->is_number()) {
      err = wrong_type(name, "a number", *v);
      return std::nullopt;
    }
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
      err = bad_request(
          fmt::format("'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, d),
          name, "invalid_value");
      return std::nullopt;
    }
    return d;
  }

  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) {
    const json* v = field(obj, name);
    if (v == nullptr || err) return std::nullopt;
    if (!v->is_number_integer()) {
      err = wrong_type(name, "an integer", *v);
      return std::nullopt;
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      err = bad_request(fmt::format("'{}' is too large", name), name, "invalid_value");
      return std::nullopt;
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) {
      err = bad_request(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, i), name,
                        "invalid_value");
      return std::nullopt;
    }
    return i;
  }

  std::optional<bool> boolean(const char* name) {
    const json* v = field(obj, name);
    if (v == nullptr || err) return std::nullopt;
    if (!v->is_boolean()) {
      err = wrong_type(name, "a boolean", *v);
      return std::nullopt;
    }
    return v->get<bool>();
  }
};

// Message content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> read_content(const json& m, size_t i, std::string& out) {
  const std::string name = fmt::format("messages[{}].content", i);
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::nullopt;  // e.g. an assistant turn
  if (it->is_string()) {
    out = it->get<std::string>();
    return std::nullopt;
  }
  if (!it->is_array()) return wrong_type(name, "a string or an array of text parts", *it);
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return bad_request(name + ": only {\"type\": \"text\", \"text\": ...} parts are supported",
                         name, "invalid_value");
    }
    out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> read_messages(const json& body, ParsedRequest& r) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) {
    return bad_request("'messages' is required", "messages", "missing_field");
  }
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty()) return bad_request("'messages' must not be empty", "messages", "invalid_value");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    if (!m.is_object()) return wrong_type(fmt::format("messages[{}]", i), "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return bad_request(fmt::format("messages[{}].role must be a string", i),
                         fmt::format("messages[{}].role", i), "invalid_type");
    }
    tokenizer::ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for it
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool") {
      return bad_request(fmt::format("messages[{}].role '{}' is not supported (expected "
                                     "'system', 'user', 'assistant' or 'tool')",
                                     i, msg.role),
                         fmt::format("messages[{}].role", i), "invalid_value");
    }
    if (auto e = read_content(m, i, msg.content)) return e;
    const std::string at = fmt::format("messages[{}]", i);
    msg.extra = nlohmann::ordered_json::object();
    if (msg.role == "tool") {
      // The result of a call: which call it answers (templates that number calls need it).
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string()) {
        return bad_request(at + ".tool_call_id must be a string (the id of the call this answers)",
                           at + ".tool_call_id", "missing_field");
      }
      msg.extra["tool_call_id"] = id->get<std::string>();
    }
    if (auto n = m.find("name"); n != m.end() && !n->is_null()) {
      if (!n->is_string()) return wrong_type(at + ".name", "a string", *n);
      msg.extra["name"] = n->get<std::string>();
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (msg.role != "assistant") {
        return bad_request(at + ".tool_calls is only for assistant messages", at + ".tool_calls",
                           "invalid_value");
      }
      if (!tc->is_array()) return wrong_type(at + ".tool_calls", "an array", *tc);
      for (size_t c = 0; c < tc->size(); ++c) {
        const json& call = (*tc)[c];
        const std::string cat = fmt::format("{}.tool_calls[{}]", at, c);
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          return bad_request(cat +
                                 " must be {\"id\", \"type\": \"function\", \"function\": "
                                 "{\"name\", \"arguments\"}}",
                             cat, "invalid_value");
        }
        if (auto a = call["function"].find("arguments");
            a != call["function"].end() && !a->is_string() && !a->is_object()) {
          return wrong_type(cat + ".function.arguments", "a JSON string", *a);
        }
      }
      msg.extra["tool_calls"] = *tc;
      if (m.find("content") == m.end() || m["content"].is_null()) msg.extra["content"] = nullptr;
    }
    r.messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

// tools: [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}].
std::optional<ApiError> read_tools(const json& body, ParsedRequest& r) {
  const json* t = field(body, "tools");
  if (t != nullptr) {
    if (!t->is_array()) return wrong_type("tools", "an array", *t);
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!tool.is_object()) return wrong_type(at, "an object", tool);
      if (tool.value("type", "") != "function") {
        return bad_request(at + ".type must be \"function\"", at + ".type", "invalid_value");
      }
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) {
        return bad_request(at + ".function must be an object", at + ".function", "invalid_type");
      }
      auto name = fn->find("name");
      const bool name_ok =
          name != fn->end() && name->is_string() && !name->get<std::string>().empty() &&
          name->get<std::string>().size() <= 64 &&
          name->get<std::string>().find_first_not_of(
              "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
              std::string::npos;
      if (!name_ok) {
        return bad_request(at + ".function.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                           at + ".function.name", "invalid_value");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string()) {
        return wrong_type(at + ".function.description", "a string", *d);
      }
      if (auto ps = fn->find("parameters"); ps != fn->end() && !ps->is_null()) {
        if (!ps->is_object())
          return wrong_type(at + ".function.parameters", "a JSON schema object", *ps);
        if (auto ty = ps->find("type"); ty != ps->end() && *ty != "object") {
          return bad_request(
              at + ".function.parameters must describe an object (\"type\": \"object\")",
              at + ".function.parameters", "invalid_value");
        }
      }
    }
    if (!t->empty()) r.tools = *t;
  }
  const auto has_tool = [&](const std::string& n) {
    if (r.tools.is_null()) return false;
    for (const json& tool : r.tools) {
      if (tool["function"]["name"] == n) return true;
    }
    return false;
  };
  if (const json* c = field(body, "tool_choice")) {
    if (c->is_string()) {
      const std::string v = c->get<std::string>();
      if (v == "auto") {
        r.tool_choice = ParsedRequest::ToolChoice::kAuto;
      } else if (v == "none") {
        r.tool_choice = ParsedRequest::ToolChoice::kNone;
      } else if (v == "required") {
        r.tool_choice = ParsedRequest::ToolChoice::kRequired;
      } else {
        return bad_request(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or "
            "{\"type\": \"function\", \"function\": {\"name\": ...}}",
            "tool_choice", "invalid_value");
      }
    } else if (c->is_object() && c->value("type", "") == "function" && c->contains("function") &&
               (*c)["function"].is_object() && (*c)["function"].contains("name") &&
               (*c)["function"]["name"].is_string()) {
      r.tool_choice = ParsedRequest::ToolChoice::kFunction;
      r.tool_choice_name = (*c)["function"]["name"].get<std::string>();
      if (!has_tool(r.tool_choice_name)) {
        return bad_request("'tool_choice' names the function '" + r.tool_choice_name +
                               "', which is not in 'tools'",
                           "tool_choice", "invalid_value");
      }
    } else {
      return wrong_type("tool_choice", "a string or a function object", *c);
    }
    if (r.tool_choice == ParsedRequest::ToolChoice::kRequired && r.tools.is_null()) {
      return bad_request("'tool_choice' is \"required\" but no 'tools' are given", "tool_choice",
                         "invalid_value");
    }
  }
  if (const json* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) return wrong_type("parallel_tool_calls", "a boolean", *p);
    r.parallel_tool_calls = p->get<bool>();
  }
  return std::nullopt;
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"schema"}}.
std::optional<ApiError> read_response_format(const json& body, ParsedRequest& r) {
  const json* f = field(body, "response_format");
  if (f == nullptr) return std::nullopt;
  if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string()) {
    return bad_request("'response_format' must be an object with a \"type\"", "response_format",
                       "invalid_type");
  }
  const std::string type = (*f)["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_schema") {
    auto js = f->find("json_schema");
    if (js == f->end() || !js->is_object() || !js->contains("schema") ||
        !(*js)["schema"].is_object()) {
      return bad_request("'response_format.json_schema.schema' must be a JSON schema object",
                         "response_format.json_schema", "invalid_value");
    }
    r.response_schema = (*js)["schema"];
  } else if (type != "json_object") {
    return bad_request(
        "'response_format.type' must be \"text\", \"json_object\" or "
        "\"json_schema\"",
        "response_format.type", "invalid_value");
  }
  r.response_format = type;
  return std::nullopt;
}

// The shapes OpenAI defines, read without recursion: a string, an array of one string, an array
// of token ids, or an array of one array of token ids.
std::optional<ApiError> read_prompt(const json& body, ParsedRequest& r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return bad_request("'prompt' is required", "prompt", "missing_field");
  }
  const json* p = &*it;
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return std::nullopt;
  }
  if (!p->is_array()) return wrong_type("prompt", "a string or an array of token ids", *p);
  if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array()) && p->size() != 1) {
    return bad_request("only one prompt per request is supported", "prompt", "invalid_value");
  }
  if (p->size() == 1 && (*p)[0].is_string()) {
    r.prompt_text = (*p)[0].get<std::string>();
    return std::nullopt;
  }
  if (p->size() == 1 && (*p)[0].is_array()) p = &(*p)[0];  // [[ids...]]
  r.prompt_is_tokens = true;
  r.prompt_tokens.reserve(p->size());
  for (const json& t : *p) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      return bad_request(
          "'prompt' must be a string, an array of strings, an array of token ids or an array "
          "of token-id arrays",
          "prompt", "invalid_type");
    }
    r.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// Counts depth and values while nlohmann's lexer scans the text; builds nothing.
class ShapeCheck : public json::json_sax_t {
 public:
  explicit ShapeCheck(const ParseLimits& l) : limits_(l) {}
  std::optional<ApiError> error;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // Also number overflow (nlohmann's out_of_range 406, e.g. 1e400): the client's error.
    error = bad_request(std::string("malformed JSON body: ") + e.what(), {}, "invalid_json");
    return false;
  }

 private:
  bool value() {
    if (++values_ <= limits_.max_json_values) return true;
    error =
        bad_request(fmt::format("the JSON body holds more than {} values", limits_.max_json_values),
                    {}, "json_too_large");
    return false;
  }
  bool open() {
    if (++depth_ > limits_.max_json_depth) {
      error = bad_request(
          fmt::format("the JSON body nests deeper than {} levels", limits_.max_json_depth), {},
          "json_too_deep");
      return false;
    }
    return value();
  }
  bool close() {
    --depth_;
    return true;
  }

  const ParseLimits& limits_;
  int32_t depth_ = 0;
  int64_t values_ = 0;
};

std::optional<ApiError> read_stop(const json& body, int32_t max_stop,
                                  std::vector<std::string>& out) {
  const json* v = field(body, "stop");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return wrong_type("stop", "a string or an array of strings", *v);
  if (static_cast<int32_t>(v->size()) > max_stop) {
    return bad_request(
        fmt::format("'stop' has {} strings; at most {} are supported", v->size(), max_stop), "stop",
        "invalid_value");
  }
  for (const json& s : *v) {
    if (!s.is_string()) return wrong_type("stop", "a string or an array of strings", s);
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// logit_bias: {"<token id>": bias in [-100, 100], ...} (OpenAI: keys are token ids as strings).
std::optional<ApiError> read_logit_bias(const json& body,
                                        std::vector<std::pair<int32_t, float>>& out) {
  const json* lb = field(body, "logit_bias");
  if (lb == nullptr) return std::nullopt;
  if (!lb->is_object()) return wrong_type("logit_bias", "an object of token id -> bias", *lb);
  for (const auto& [key, value] : lb->items()) {
    const std::string at = "logit_bias." + key;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id > INT32_MAX) {
      return bad_request(
          "'logit_bias' keys must be token ids (non-negative integers as strings), "
          "got \"" +
              key + "\"",
          "logit_bias", "invalid_value");
    }
    if (!value.is_number()) return wrong_type(at, "a number", value);
    const double b = value.get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0) {
      return bad_request(fmt::format("'{}' must be in [-100, 100], got {}", at, b), "logit_bias",
                         "invalid_value");
    }
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> check_json_shape(std::string_view body, const ParseLimits& limits) {
  // Never valid JSON, and nlohmann's lexer would stop at it and ignore the rest.
  if (const size_t nul = body.find('\0'); nul != std::string_view::npos) {
    return bad_request(fmt::format("malformed JSON body: a NUL byte at offset {}", nul), {},
                       "invalid_json");
  }
  ShapeCheck check(limits);
  const bool ok = json::sax_parse(body, &check);
  if (check.error) return check.error;
  if (!ok) return bad_request("malformed JSON body", {}, "invalid_json");
  return std::nullopt;
}

std::variant<ParsedRequest, ApiError> parse_request(std::string_view body, Endpoint endpoint,
                                                    const ParseLimits& limits) {
  if (!valid_utf8(body)) {
    return bad_request("the request body is not valid UTF-8", {}, "invalid_utf8");
  }
  if (auto e = check_json_shape(body, limits)) return *e;
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    return bad_request(std::string("malformed JSON body: ") + e.what(), {}, "invalid_json");
  }
  if (!j.is_object()) return bad_request("the JSON body must be an object", {}, "invalid_json");

  ParsedRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) return wrong_type("model", "a string", *m);
    r.model = m->get<std::string>();
  }
  if (endpoint == Endpoint::kChat) {
    if (auto e = read_messages(j, r)) return *e;
    if (auto e = read_tools(j, r)) return *e;
  } else {
    if (auto e = read_prompt(j, r)) return *e;
  }

  Reader rd{j, std::nullopt};
  SamplingParams& s = r.engine.sampling;
  // OpenAI's defaults: temperature 1, top_p 1, no top-k/min-p, no penalties.
  s.temperature = static_cast<float>(rd.number("temperature", 0.0, 2.0).value_or(1.0));
  s.top_p = static_cast<float>(rd.number("top_p", 0.0, 1.0, /*lo_open=*/true).value_or(1.0));
  s.top_k = static_cast<int32_t>(rd.integer("top_k", -1, 1 << 20).value_or(0));
  if (s.top_k < 0) s.top_k = 0;
  s.min_p = static_cast<float>(rd.number("min_p", 0.0, 1.0).value_or(0.0));
  s.presence_penalty = static_cast<float>(rd.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  s.frequency_penalty = static_cast<float>(rd.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  s.repetition_penalty =
      static_cast<float>(rd.number("repetition_penalty", 0.0, 10.0, true).value_or(1.0));
  if (auto seed = rd.integer("seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*seed);
  const int64_t max_len = limits.max_model_len > 0 ? limits.max_model_len : INT32_MAX;
  auto max_tokens = rd.integer("max_tokens", 1, max_len);
  if (auto mct = rd.integer("max_completion_tokens", 1, max_len)) max_tokens = mct;
  if (max_tokens) r.max_tokens = static_cast<int32_t>(*max_tokens);
  if (auto e = read_logit_bias(j, s.logit_bias)) return *e;
  // n choices share the prompt's KV blocks; the engine caps n at --max-num-seqs.
  if (auto n = rd.integer("n", 1, 128)) r.engine.n = static_cast<int32_t>(*n);
  r.stream = rd.boolean("stream").value_or(false);
  r.engine.ignore_eos = rd.boolean("ignore_eos").value_or(false);  // extension (as vLLM)
  // Extension: the KV regime to run in (one the server offers, e.g. "f16" or "int8").
  if (const json* kv = field(j, "kv_cache_dtype")) {
    if (!kv->is_string()) return wrong_type("kv_cache_dtype", "a string", *kv);
    r.engine.kv_cache_dtype = kv->get<std::string>();
  }
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    Reader sr{*so, std::nullopt};
    r.include_usage = sr.boolean("include_usage").value_or(false);
    if (sr.err) return *sr.err;
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto lp = rd.integer("logprobs", 0, limits.max_top_logprobs)) {
      r.logprobs = true;
      r.top_logprobs = static_cast<int32_t>(*lp);
    }
    r.echo = rd.boolean("echo").value_or(false);
    if (r.echo && r.logprobs) {
      // The prompt's tokens are not scored (their logits are never computed).
      return bad_request("'echo' together with 'logprobs' is not supported", "echo",
                         "invalid_value");
    }
  } else {
    r.logprobs = rd.boolean("logprobs").value_or(false);
    if (auto tl = rd.integer("top_logprobs", 0, limits.max_top_logprobs)) {
      if (!r.logprobs && *tl > 0) {
        return bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs",
                           "invalid_value");
      }
      r.top_logprobs = static_cast<int32_t>(*tl);
    }
  }
  if (rd.err) return *rd.err;
  if (auto e = read_response_format(j, r)) return *e;
  if (auto e = read_stop(j, limits.max_stop, r.engine.stop)) return *e;
  r.engine.logprobs = r.logprobs ? r.top_logprobs : -1;
  if (Status st = s.validate(); !st) return bad_request(st.error(), {}, "invalid_value");
  return r;
}

}  // namespace bie::server
