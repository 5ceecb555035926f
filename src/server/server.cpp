#include "bie/server/server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <thread>

#include "bie/engine/engine.h"
#include "bie/tokenizer/chat_template.h"
#include "bie/tokenizer/tokenizer.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/request_stream.h"
#include "server/responses_api.h"
#include "server/server_metrics.h"
#include "server/structured_output.h"
#include "server/tool_calls.h"

namespace bie::server {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr auto kPollInterval = std::chrono::milliseconds(100);
constexpr auto kKeepAliveComment = std::chrono::seconds(1);

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void send_error(HttpExchange& ex, const ApiError& e) {
  ex.send(e.status, "application/json", e.body());
}

void send_json(HttpExchange& ex, int status, const json& j) {
  ex.send(status, "application/json", dump(j));
}

ApiError submit_error(const SubmitFailure& f) {
  switch (f.kind) {
    case SubmitError::kInvalid:
      return bad_request(f.message, {}, "invalid_value");
    case SubmitError::kTooLong:
      return too_large(f.message, "messages", "context_length_exceeded");
    case SubmitError::kQueueFull:
      return too_many_requests(f.message);
    case SubmitError::kShuttingDown:
      return unavailable(f.message);
  }
  return internal_error(f.message);
}

// What the handler knows about one accepted request, for the response and the log line.
struct Flight {
  RequestId id = 0;
  ResponseContext ctx;
  bool include_usage = false;
  Clock::time_point arrived;
  int64_t prompt_tokens = 0;
  // Tool calls: the syntax the model writes them in (kNone: this request has no tools), the
  // text the prompt already ends with when a call is forced (tool_choice required / a named
  // function), and whether more than one call may be returned.
  ToolCallSyntax tool_syntax = ToolCallSyntax::kNone;
  std::string forced_prefix;
  bool parallel_tool_calls = true;
  int32_t n = 1;           // choices
  bool responses = false;  // /v1/responses: written as a Response object / its events
  std::string echo;  // completions with echo: the prompt's text, sent before each choice's text
  // Written on the engine thread by the callbacks (read after finish, under the stream's lock).
  std::atomic<double> ttft{-1.0};
};

}  // namespace

struct Server::Impl {
  ServerConfig cfg;
  std::unique_ptr<HttpServer> http;
  std::atomic<Engine*> engine{nullptr};
  std::atomic<bool> shutting_down{false};
  std::atomic<RequestId> next_id{1};
  std::optional<Result<tokenizer::ChatTemplate>> chat_template;  // set with the engine
  ToolCallSyntax tool_syntax = ToolCallSyntax::kNone;            // what its model writes
  std::string model_name;                                        // served name
  ServerMetrics metrics;

  explicit Impl(ServerConfig c) : cfg(std::move(c)) {}

  [[nodiscard]] bool check_access(const HttpRequest& req, HttpExchange& ex) const;
  void dispatch(const HttpRequest& req, HttpExchange& ex);
  void kv_policy(const HttpRequest& req, HttpExchange& ex);
  void handle_generate(const HttpRequest& req, HttpExchange& ex, Endpoint ep,
                       bool responses = false);
  void handle_responses(const HttpRequest& req, HttpExchange& ex);
  [[nodiscard]] std::optional<ApiError> tokenize(Engine& eng, ParsedRequest& p,
                                                 std::vector<int32_t>& out, Flight& fl) const;
  void stream_response(HttpExchange& ex, Engine& eng, Flight& fl, RequestStream& rs);
  void whole_response(HttpExchange& ex, Engine& eng, Flight& fl, RequestStream& rs);
  void log_finish(const Flight& fl, const FinishEvent& f) const;
  [[nodiscard]] bool model_known(const std::string& name) const;
};

bool Server::Impl::model_known(const std::string& name) const {
  Engine* eng = engine.load();
  return name.empty() || name == model_name || (eng != nullptr && name == eng->model_info().id) ||
         name == "default";
}

namespace {

// The start of a call in the model's own syntax: the prompt ends with it when a call is forced,
// so the model can only complete it ("required": any tool's name; a function: the inside of its
// arguments object — left open at the name, small models write the arguments unquoted).
std::string forced_call_prefix(ToolCallSyntax syntax, const ParsedRequest& p) {
  const bool named = p.tool_choice == ParsedRequest::ToolChoice::kFunction;
  const std::string name = named ? p.tool_choice_name + "\", " : std::string();
  switch (syntax) {
    case ToolCallSyntax::kHermes:
      return "<tool_call>\n{\"name\": \"" + name + (named ? "\"arguments\": {" : "");
    case ToolCallSyntax::kMistral:
      return "[TOOL_CALLS][{\"name\": \"" + name + (named ? "\"arguments\": {" : "");
    case ToolCallSyntax::kLlama3:
      return "{\"name\": \"" + name + (named ? "\"parameters\": {" : "");
    case ToolCallSyntax::kNone:
      break;
  }
  return {};
}

// One call unless parallel calls are allowed; "tool_calls" as the finish reason when there are
// calls; a broken call stays text (with the model's own finish reason) and is logged.
void finish_tool_calls(const Flight& fl, ToolCallParse& calls, std::string& reason) {
  if (!fl.parallel_tool_calls && calls.calls.size() > 1) calls.calls.resize(1);
  if (!calls.calls.empty() && reason != "error" && reason != "cancelled") reason = "tool_calls";
  if (calls.error) {
    spdlog::warn("request {}: the model's tool call is not usable ({}); returned as text",
                 fl.ctx.id, *calls.error);
  }
}

}  // namespace

std::optional<ApiError> Server::Impl::tokenize(Engine& eng, ParsedRequest& p,
                                               std::vector<int32_t>& out, Flight& fl) const {
  const tokenizer::Tokenizer& tok = eng.tokenizer();
  tokenizer::EncodeOptions eo;
  eo.parse_special = true;
  if (p.endpoint == Endpoint::kChat) {
    const Result<tokenizer::ChatTemplate>& tmpl = *chat_template;
    if (!tmpl.ok()) return bad_request(tmpl.error(), "messages", "no_chat_template");
    // Message content is plain text: control tokens come from the template alone.
    if (!cfg.special_tokens_in_content) {
      for (tokenizer::ChatMessage& m : p.messages) m.content = tok.mark_plain(m.content);
      eo.strip_plain_marks = true;
    }
    tokenizer::ChatRenderOptions ro;
    const bool use_tools = !p.tools.is_null() && p.tool_choice != ParsedRequest::ToolChoice::kNone;
    if (use_tools) {
      if (tool_syntax == ToolCallSyntax::kNone) {
        return bad_request("this model's chat template (" + tmpl->origin() +
                               ") has no tool-call syntax; pass one that has with --chat-template",
                           "tools", "tools_unsupported");
      }
      ro.tools = p.tools;
      fl.tool_syntax = tool_syntax;
      fl.parallel_tool_calls = p.parallel_tool_calls;
      if (p.tool_choice != ParsedRequest::ToolChoice::kAuto) {
        fl.forced_prefix = forced_call_prefix(tool_syntax, p);
      }
      if (!p.parallel_tool_calls && tool_syntax == ToolCallSyntax::kHermes) {
        p.engine.stop.push_back("</tool_call>");  // one call, then stop
      }
    }
    auto text = tmpl->render(p.messages, ro);
    if (!text.ok()) return bad_request(text.error(), "messages", "invalid_value");
    *text += fl.forced_prefix;
    // The template already wrote BOS as text where the model wants one.
    const tokenizer::TokenId bos = tok.bos();
    if (tok.vocab().valid(bos) && text->rfind(tok.vocab().text(bos), 0) == 0) eo.add_bos = false;
    out = tok.encode(*text, eo);
    p.engine.stop.push_back(tmpl->end_of_turn());
    return std::nullopt;
  }
  if (p.prompt_is_tokens) {
    for (int32_t t : p.prompt_tokens) {
      if (t >= tok.n_tokens()) {
        return bad_request("prompt token id " + std::to_string(t) + " is outside the vocabulary",
                           "prompt", "invalid_value");
      }
    }
    out = p.prompt_tokens;
    return std::nullopt;
  }
  out = tok.encode(p.prompt_text, eo);
  return std::nullopt;
}

void Server::Impl::log_finish(const Flight& fl, const FinishEvent& f) const {
  const RequestMetrics& m = f.metrics;
  const double ttft = fl.ttft.load();
  const double total = seconds_since(fl.arrived);
  const double decode = total - std::max(ttft, 0.0);
  const double tps = m.generated_tokens > 1 && decode > 0
                         ? static_cast<double>(m.generated_tokens - 1) / decode
                         : 0.0;
  spdlog::info(
      "request {} prompt={} cached={} completion={} ttft={:.3f}s tok/s={:.1f} kv={} "
      "finish={}{}",
      fl.ctx.id, fl.prompt_tokens, m.cached_tokens, m.generated_tokens, ttft, tps,
      m.kv_regime.empty() ? fl.ctx.kv_regime : m.kv_regime, f.finish_reason,
      f.error.empty() ? "" : " error=" + f.error);
}

void Server::Impl::whole_response(HttpExchange& ex, Engine& eng, Flight& fl, RequestStream& rs) {
  const auto n = static_cast<size_t>(fl.n);
  std::vector<std::string> texts(n);
  std::vector<std::vector<TokenEvent>> events(n);
  std::vector<std::optional<FinishEvent>> fins(n);
  std::vector<TokenEvent> batch;
  std::vector<FinishEvent> finished;
  bool gone = false, done = false;
  while (!done) {
    done = rs.take(batch, finished, kPollInterval);
    for (TokenEvent& e : batch) {
      const auto i = static_cast<size_t>(e.index);
      texts[i] += e.text;
      events[i].push_back(std::move(e));
    }
    for (FinishEvent& f : finished) fins[static_cast<size_t>(f.index)] = std::move(f);
    // A client that went away frees its slot now, not after max_tokens more tokens.
    if (!done && !gone && ex.client_gone()) {
      gone = true;
      rs.mark_client_gone();
      eng.cancel(fl.id);
    }
  }
  if (gone) {
    ex.force_close();
    return send_error(ex, bad_request("the client closed the connection", {}, "client_gone"));
  }
  for (const std::optional<FinishEvent>& f : fins) {
    if (f->finish_reason == "error") {
      return send_error(ex, internal_error("generation failed: " + f->error));
    }
    if (f->finish_reason == "cancelled" && shutting_down.load()) {
      return send_error(ex, unavailable("the server is shutting down"));
    }
  }
  if (!fins[0]->metrics.kv_regime.empty()) fl.ctx.kv_regime = fins[0]->metrics.kv_regime;
  Usage u{fl.prompt_tokens, 0, fins[0]->metrics.cached_tokens};
  for (const auto& ev : events) u.completion_tokens += static_cast<int64_t>(ev.size());
  json out;
  for (size_t i = 0; i < n; ++i) {
    std::string text = fl.echo + std::move(texts[i]) + fins[i]->tail_text;
    std::string reason = fins[i]->finish_reason;
    ToolCallParse calls;
    if (fl.tool_syntax != ToolCallSyntax::kNone) {
      const std::string prefix = n > 1 ? fmt::format("{}_{}", fl.id, i) : std::to_string(fl.id);
      calls = parse_tool_calls(fl.tool_syntax, fl.forced_prefix + text, prefix);
      finish_tool_calls(fl, calls, reason);
      text = calls.content;
    }
    ResponseContext ctx = fl.ctx;
    ctx.choice = static_cast<int32_t>(i);
    if (fl.responses) return send_json(ex, 200, response_object(ctx, text, calls.calls, reason, u));
    json one = full_response(ctx, text, reason, u, events[i], calls.calls);
    if (i == 0) {
      out = std::move(one);
    } else {
      out["choices"].push_back(std::move(one["choices"][0]));
    }
  }
  send_json(ex, 200, out);
}

void Server::Impl::stream_response(HttpExchange& ex, Engine& eng, Flight& fl, RequestStream& rs) {
  const auto gone = [&] {
    rs.mark_client_gone();
    eng.cancel(fl.id);
    // The engine still sends its finish events; wait for them so no callback outlives us.
    std::vector<TokenEvent> drop;
    std::vector<FinishEvent> drop_fins;
    while (!rs.take(drop, drop_fins, kPollInterval)) {
    }
  };
  if (!ex.begin_chunked(200, "text/event-stream",
                        {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}})) {
    return gone();
  }
  // Per choice: whether its first chunk went out, and with tools the call parser (text streams
  // as content until a call starts; the call is sent whole).
  struct Choice {
    ResponseContext ctx;
    bool first = true;
    std::optional<ToolCallStream> calls;
  };
  std::vector<Choice> choices(static_cast<size_t>(fl.n));
  for (size_t i = 0; i < choices.size(); ++i) {
    Choice& c = choices[i];
    c.ctx = fl.ctx;
    c.ctx.choice = static_cast<int32_t>(i);
    if (fl.tool_syntax != ToolCallSyntax::kNone) {
      const std::string prefix =
          choices.size() > 1 ? fmt::format("{}_{}", fl.id, i) : std::to_string(fl.id);
      c.calls.emplace(fl.tool_syntax, prefix);
      (void)c.calls->feed(fl.forced_prefix);
    }
  }
  std::optional<ResponseEvents> rev;  // /v1/responses: its events instead of chunks
  if (fl.responses) {
    rev.emplace(fl.ctx);
    if (!ex.write_chunk(rev->start())) return gone();
  }
  if (!fl.echo.empty()) {
    std::string out;
    for (Choice& c : choices)
      out += sse_frame(stream_chunk(c.ctx, fl.echo, {}, "", false, fl.include_usage));
    if (!ex.write_chunk(out)) return gone();
  }
  std::vector<TokenEvent> batch;
  std::vector<FinishEvent> finished;
  auto last_write = Clock::now();
  int64_t generated = 0, cached = 0;
  for (;;) {
    const bool done = rs.take(batch, finished, kPollInterval);
    std::string out;
    // New tokens, one chunk per choice that has some (in the order they came).
    for (size_t b = 0; b < batch.size();) {
      const int32_t idx = batch[b].index;
      size_t e = b;
      std::string text;
      while (e < batch.size() && batch[e].index == idx) text += batch[e++].text;
      Choice& c = choices[static_cast<size_t>(idx)];
      // The first token names the regime the choice runs in (a spiky-attention fallback moves a
      // request after submission, before its first token).
      if (!batch[b].kv_regime.empty()) c.ctx.kv_regime = batch[b].kv_regime;
      if (c.calls) text = c.calls->feed(text);
      if (rev) {
        out += rev->text(text);
      } else if (!text.empty() || c.first || !c.calls) {
        const std::span<const TokenEvent> evs(batch.data() + b, e - b);
        out += sse_frame(stream_chunk(c.ctx, text, evs, "", c.first, fl.include_usage));
        c.first = false;
      }
      b = e;
    }
    for (const FinishEvent& f : finished) {
      Choice& c = choices[static_cast<size_t>(f.index)];
      generated += f.metrics.generated_tokens;
      if (f.index == 0) cached = f.metrics.cached_tokens;
      if (!f.metrics.kv_regime.empty()) c.ctx.kv_regime = f.metrics.kv_regime;
      if (f.finish_reason == "error") {
        out += sse_frame(json::parse(internal_error("generation failed: " + f.error).body()));
      } else if (rev) {
        std::string reason = f.finish_reason;
        ToolCallParse parsed;
        std::string rest = f.tail_text;
        if (c.calls) {
          rest = c.calls->feed(f.tail_text);
          parsed = c.calls->finish();
          finish_tool_calls(fl, parsed, reason);
          rest += parsed.content;
        }
        out += rev->text(rest);
        out += rev->finish(
            parsed.calls, reason,
            Usage{fl.prompt_tokens, f.metrics.generated_tokens, f.metrics.cached_tokens});
      } else if (c.calls) {
        std::string rest = c.calls->feed(f.tail_text);
        ToolCallParse parsed = c.calls->finish();
        std::string reason = f.finish_reason;
        finish_tool_calls(fl, parsed, reason);
        rest += parsed.content;
        if (!rest.empty() || c.first) {
          out += sse_frame(stream_chunk(c.ctx, rest, {}, "", c.first, fl.include_usage));
          c.first = false;
        }
        if (!parsed.calls.empty()) {
          out += sse_frame(tool_calls_chunk(c.ctx, parsed.calls, fl.include_usage));
        }
        out += sse_frame(stream_chunk(c.ctx, "", {}, reason, false, fl.include_usage));
      } else {
        out += sse_frame(
            stream_chunk(c.ctx, f.tail_text, {}, f.finish_reason, c.first, fl.include_usage));
        c.first = false;
      }
    }
    if (done && rev) {
      if (ex.write_chunk(out)) ex.end_chunked();
      return;
    }
    if (done) {
      if (fl.include_usage) {
        Usage u{fl.prompt_tokens, generated, cached};
        out += sse_frame(usage_chunk(choices[0].ctx, u));
      }
      out += kSseDone;
      if (ex.write_chunk(out)) ex.end_chunked();
      return;
    }
    if (!out.empty()) {
      if (!ex.write_chunk(out)) return gone();
      last_write = Clock::now();
    }
    // A client that closed its socket is seen at once; one that only stopped reading is seen
    // when a write fails, so nothing new for a while sends an SSE comment (also while the
    // request still waits in the queue).
    if (ex.client_gone()) return gone();
    if (Clock::now() - last_write >= kKeepAliveComment) {
      if (!ex.write_chunk(": keep-alive\n\n")) return gone();
      last_write = Clock::now();
    }
  }
}

// /v1/responses: the body becomes the equivalent chat request, answered as a Response.
void Server::Impl::handle_responses(const HttpRequest& req, HttpExchange& ex) {
  ParseLimits limits;
  if (!valid_utf8(req.body)) {
    return send_error(ex, bad_request("the request body is not valid UTF-8", {}, "invalid_utf8"));
  }
  if (auto e = check_json_shape(req.body, limits)) return send_error(ex, *e);
  auto chat = responses_to_chat(req.body);
  if (auto* e = std::get_if<ApiError>(&chat)) return send_error(ex, *e);
  HttpRequest as_chat = req;
  as_chat.body = std::move(std::get<std::string>(chat));
  handle_generate(as_chat, ex, Endpoint::kChat, /*responses=*/true);
}

void Server::Impl::handle_generate(const HttpRequest& req, HttpExchange& res, Endpoint ep,
                                   bool responses) {
  const Clock::time_point arrived = Clock::now();
  Engine* eng = engine.load();
  if (eng == nullptr) return send_error(res, unavailable("the model is still loading"));
  if (shutting_down.load()) return send_error(res, unavailable("the server is shutting down"));

  ParseLimits limits;
  limits.max_model_len = eng->model_info().max_model_len;
  auto parsed = parse_request(req.body, ep, limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, *e);
  ParsedRequest& p = std::get<ParsedRequest>(parsed);
  if (!model_known(p.model)) {
    return send_error(res, not_found("the model '" + p.model +
                                         "' does not exist (this server "
                                         "serves '" +
                                         model_name + "')",
                                     "model", "model_not_found"));
  }
  auto fl = std::make_shared<Flight>();
  std::vector<int32_t> prompt;
  if (auto e = tokenize(*eng, p, prompt, *fl)) return send_error(res, *e);
  // Structured output and forced tool calls: enforced by the grammar, or a 400.
  auto og = output_grammar(p, fl->tool_syntax, fl->forced_prefix);
  if (auto* e = std::get_if<ApiError>(&og)) return send_error(res, *e);
  if (prompt.empty()) return send_error(res, bad_request("the prompt is empty", "prompt"));
  const int64_t max_len = eng->model_info().max_model_len;
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (max_len > 0 && n_prompt >= max_len) {
    return send_error(
        res, too_large("the prompt has " + std::to_string(n_prompt) +
                           " tokens; this server's --max-model-len is " + std::to_string(max_len) +
                           " (prompt plus at least one generated token)",
                       ep == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded"));
  }
  // Defaults as OpenAI: 16 for completions, the rest of the context for chat.
  const int64_t room = max_len > 0 ? max_len - n_prompt : INT32_MAX;
  int64_t max_tokens = p.max_tokens ? *p.max_tokens : (ep == Endpoint::kChat ? room : 16);
  max_tokens = std::min(max_tokens, room);

  fl->id = next_id.fetch_add(1);
  fl->arrived = arrived;
  fl->prompt_tokens = n_prompt;
  fl->include_usage = p.stream && p.include_usage;
  fl->ctx.endpoint = ep;
  fl->responses = responses;
  fl->ctx.id = (responses               ? "resp_"
                : ep == Endpoint::kChat ? "chatcmpl-"
                                        : "cmpl-") +
               std::to_string(fl->id);
  fl->ctx.created = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  fl->ctx.model = model_name;
  fl->ctx.model_sha256 = eng->model_info().sha256;
  fl->ctx.logprobs = p.logprobs;
  fl->ctx.tok = &eng->tokenizer();

  EngineRequest er = std::move(p.engine);
  er.prompt = std::move(prompt);
  er.grammar = std::get<OutputGrammar>(og).grammar;
  er.grammar_prefix = std::get<OutputGrammar>(og).prefix;
  er.max_tokens = static_cast<int32_t>(max_tokens);
  fl->ctx.kv_regime = eng->kv_regime_for(er);

  fl->n = er.n;
  if (p.echo) {
    fl->echo = p.prompt_is_tokens ? eng->tokenizer().decode(er.prompt) : p.prompt_text;
  }
  auto rs = std::make_shared<RequestStream>(er.n);
  RequestCallbacks cb;
  auto last_token = std::make_shared<Clock::time_point>();
  cb.on_token = [this, fl, rs, last_token](const TokenEvent& ev) {
    const Clock::time_point now = Clock::now();
    if (fl->ttft.load() < 0) {
      const double t = std::chrono::duration<double>(now - fl->arrived).count();
      fl->ttft.store(t);
      metrics.observe_ttft(t);
    } else {
      metrics.observe_inter_token(std::chrono::duration<double>(now - *last_token).count());
    }
    *last_token = now;
    return rs->push_token(ev);
  };
  cb.on_finish = [this, fl, rs](const FinishEvent& f) {
    if (f.index == 0) metrics.observe_e2e(seconds_since(fl->arrived));
    log_finish(*fl, f);
    rs->push_finish(f);
  };
  if (auto failure = eng->submit(fl->id, std::move(er), std::move(cb))) {
    return send_error(res, submit_error(*failure));
  }
  if (p.stream) return stream_response(res, *eng, *fl, *rs);
  whole_response(res, *eng, *fl, *rs);
}

bool Server::Impl::check_access(const HttpRequest& req, HttpExchange& ex) const {
  const bool api = req.path.rfind("/v1/", 0) == 0;
  const bool admin = req.path.rfind("/admin/", 0) == 0;
  if ((api || admin) && !authorized(req.header("Authorization"), cfg.api_key)) {
    send_error(ex, unauthorized("missing or incorrect API key (send 'Authorization: Bearer "
                                "<key>')"));
    return false;
  }
  // Without an API key the admin endpoints answer only on loopback.
  if (admin && cfg.api_key.empty() && req.remote_addr != "127.0.0.1" && req.remote_addr != "::1") {
    send_error(ex, forbidden("/admin/ needs --api-key when reached from another host"));
    return false;
  }
  return true;
}

namespace {

json kv_policy_json(const KvPolicyInfo& p) {
  json regimes = json::array();
  for (const KvRegimeInfo& r : p.regimes) {
    regimes.push_back({{"name", r.name}, {"kv", r.label}, {"max_tokens", r.tokens_fit}});
  }
  return json{{"force_f16", p.force_f16},
              {"policy", p.policy},
              {"default", p.regimes.empty() ? json() : json(p.regimes[0].label)},
              {"budget_bytes", p.budget_bytes},
              {"regimes", regimes}};
}

}  // namespace

// Operations (BRIEF §3): the KV kill switch. GET shows the regimes and the policy; POST
// {"force_f16": true} sends every new request to f16 KV at once (false: back to the policy).
// Always behind the API key when one is set.
void Server::Impl::kv_policy(const HttpRequest& req, HttpExchange& ex) {
  Engine* eng = engine.load();
  if (eng == nullptr) return send_error(ex, unavailable("the model is still loading"));
  if (req.method == "GET") return send_json(ex, 200, kv_policy_json(eng->kv_policy()));
  if (auto e = check_json_shape(req.body, ParseLimits{})) return send_error(ex, *e);
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {
    return send_error(ex, bad_request(std::string("the body is not valid JSON: ") + e.what(), {},
                                      "invalid_json"));
  }
  if (!body.is_object() || !body.contains("force_f16") || !body["force_f16"].is_boolean()) {
    return send_error(
        ex, bad_request("expected {\"force_f16\": true|false}", "force_f16", "invalid_type"));
  }
  const bool on = body["force_f16"].get<bool>();
  eng->set_force_f16(on);
  spdlog::warn("kv-policy: force_f16 {} (new requests: {})", on ? "on" : "off", eng->kv_regime());
  send_json(ex, 200, kv_policy_json(eng->kv_policy()));
}

// Access was checked from the headers (HttpHandlers::on_headers) before the body was read.
void Server::Impl::dispatch(const HttpRequest& req, HttpExchange& ex) {
  const std::string& path = req.path;
  const std::string& m = req.method;
  // One row per route: its methods and its handler.
  const auto route = [&](std::initializer_list<const char*> methods, auto&& handler) {
    for (const char* allowed : methods) {
      if (m == allowed) return handler();
    }
    ApiError e =
        bad_request("method " + m + " is not allowed on " + path, {}, "method_not_allowed");
    e.status = 405;
    send_error(ex, e);
  };
  if (path == "/health") {
    return route({"GET"}, [&] {
      if (shutting_down.load()) return send_json(ex, 503, {{"status", "shutting_down"}});
      if (engine.load() == nullptr) return send_json(ex, 503, {{"status", "loading"}});
      send_json(ex, 200, {{"status", "ok"}});
    });
  }
  if (path == "/metrics") {
    return route({"GET"}, [&] {
      Engine* eng = engine.load();
      std::optional<EngineMetrics> mt;
      if (eng != nullptr) mt = eng->metrics();
      ex.send(200, "text/plain; version=0.0.4; charset=utf-8",
              metrics.render(mt ? &*mt : nullptr, eng ? model_name : cfg.served_model_name));
    });
  }
  if (path == "/v1/models") {
    return route({"GET"}, [&] {
      Engine* eng = engine.load();
      if (eng == nullptr) return send_error(ex, unavailable("the model is still loading"));
      const ModelInfo& mi = eng->model_info();
      json model = {{"id", model_name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "bie"},
                    {"max_model_len", mi.max_model_len},
                    {"bie", {{"kv", eng->kv_regime()}, {"model_sha256", mi.sha256}}}};
      send_json(ex, 200, {{"object", "list"}, {"data", json::array({model})}});
    });
  }
  if (path == "/admin/kv-policy") return route({"GET", "POST"}, [&] { kv_policy(req, ex); });
  if (path == "/admin/prefix-cache") {
    // Debug: every block of every regime's prefix index, as KV events name them (medium, chain
    // hash); what a subscriber to --kv-events-endpoint should hold.
    return route({"GET"}, [&] {
      Engine* eng = engine.load();
      if (eng == nullptr) return send_error(ex, unavailable("the model is still loading"));
      json stores = json::array();
      size_t total = 0;
      for (const PrefixCacheListing& l : eng->prefix_cache_index()) {
        total += l.hashes.size();
        stores.push_back(
            {{"medium", l.medium}, {"block_size", l.block_size}, {"hashes", l.hashes}});
      }
      send_json(ex, 200, {{"blocks", total}, {"stores", stores}});
    });
  }
  if (path == "/v1/completions") {
    return route({"POST"}, [&] { handle_generate(req, ex, Endpoint::kCompletions); });
  }
  if (path == "/v1/chat/completions") {
    return route({"POST"}, [&] { handle_generate(req, ex, Endpoint::kChat); });
  }
  if (path == "/v1/responses") return route({"POST"}, [&] { handle_responses(req, ex); });
  send_error(ex, not_found("no route " + m + " " + path, {}, "unknown_route"));
}

Server::Server(ServerConfig cfg) : impl_(std::make_unique<Impl>(std::move(cfg))) {}

Server::~Server() {
  begin_shutdown();
  stop();
}

Status Server::start() {
  // A client that goes away mid-write must not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  Impl& s = *impl_;
  s.model_name = s.cfg.served_model_name;
  const auto ms = [](double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
  };
  HttpLimits limits;
  limits.max_body_bytes = s.cfg.max_body_bytes;
  limits.max_header_bytes = s.cfg.max_header_bytes;
  limits.max_connections = std::max(1, s.cfg.max_connections);
  limits.keep_alive_timeout = ms(s.cfg.keep_alive_seconds);
  limits.header_timeout = ms(s.cfg.header_timeout_seconds);
  limits.body_timeout = ms(s.cfg.body_timeout_seconds);
  limits.write_timeout = ms(s.cfg.write_timeout_seconds);
  HttpHandlers h;
  // Access is decided from the headers alone: a refused client never gets its body read.
  h.on_headers = [&s](const HttpRequest& req, HttpExchange& ex) {
    if (s.check_access(req, ex)) return false;
    s.metrics.count_response(req.path, ex.status());
    return true;
  };
  h.on_request = [&s](const HttpRequest& req, HttpExchange& ex) {
    try {
      s.dispatch(req, ex);
    } catch (const std::exception& e) {
      if (!ex.responded()) send_error(ex, internal_error(e.what()));
    }
    s.metrics.count_response(req.path, ex.status());
  };
  h.on_transport_error = [&s](int status) { s.metrics.count_response({}, status); };
  s.http = std::make_unique<HttpServer>(limits, std::move(h));
  return s.http->start(s.cfg.host, s.cfg.port);
}

int Server::port() const {
  return impl_->http ? impl_->http->port() : -1;
}

void Server::set_engine(Engine* engine) {
  Impl& s = *impl_;
  if (s.model_name.empty()) s.model_name = engine->model_info().id;
  s.chat_template.emplace(
      tokenizer::ChatTemplate::detect(engine->model_info().chat_template, engine->tokenizer()));
  if (s.chat_template->ok()) s.tool_syntax = tool_call_syntax_of((*s.chat_template)->source());
  s.engine.store(engine);
}

void Server::begin_shutdown() {
  // Keeps listening: /health answers 503 while running requests drain, new requests get 503.
  impl_->shutting_down.store(true);
}

void Server::stop() {
  Impl& s = *impl_;
  s.shutting_down.store(true);
  if (s.http) s.http->stop();
}

}  // namespace bie::server
