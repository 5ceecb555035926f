// The HTTP layer (routes, OpenAI JSON, SSE framing, errors, auth, metrics) against a FakeEngine:
// a real server on a loopback port, driven by httplib's client and raw sockets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "bie/server/server.h"
#include "server/auth.h"
#include "support/fake_engine.h"

namespace bie::server {
namespace {

using nlohmann::json;
using test::FakeEngine;
using test::FakeEngineConfig;

const char* kChatml =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";

struct Harness {
  explicit Harness(FakeEngineConfig ec = {}, ServerConfig sc = {}, bool load = true) {
    if (ec.chat_template.empty()) ec.chat_template = kChatml;
    engine = std::make_unique<FakeEngine>(ec);
    sc.port = 0;
    sc.max_connections = 64;
    sc.keep_alive_seconds = 1;
    server = std::make_unique<Server>(sc);
    const Status st = server->start();
    EXPECT_TRUE(st.ok()) << st.error();
    if (load) server->set_engine(engine.get());
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(10, 0);
  }
  ~Harness() {
    server->begin_shutdown();
    engine->shutdown(true);
    server->stop();
  }
  httplib::Result post(const std::string& path, const std::string& body,
                       const httplib::Headers& h = {}) {
    return client->Post(path.c_str(), h, body, "application/json");
  }
  httplib::Result post(const std::string& path, const json& body) {
    return post(path, body.dump());
  }

  std::unique_ptr<FakeEngine> engine;
  std::unique_ptr<Server> server;
  std::unique_ptr<httplib::Client> client;
};

// Status and the error object of a failed request.
void expect_error(const httplib::Result& r, int status, const std::string& param = {},
                  const std::string& contains = {}) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body);
  ASSERT_TRUE(j.contains("error")) << r->body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r->body;
  }
  if (!contains.empty()) {
    EXPECT_NE(e["message"].get<std::string>().find(contains), std::string::npos) << r->body;
  }
}

TEST(Server, HealthIs503WhileLoadingThen200) {
  Harness h({}, {}, /*load=*/false);
  auto r = h.client->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["status"], "loading");
  expect_error(h.post("/v1/completions", json{{"prompt", "hi"}}), 503);
  h.server->set_engine(h.engine.get());
  r = h.client->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body), json({{"status", "ok"}}));
}

TEST(Server, CompletionEchoesWithUsageAndBieObject) {
  Harness h;
  auto r = h.post(
      "/v1/completions",
      json{{"model", "fake-model"}, {"prompt", "hello"}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["choices"][0]["text"], "hell");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(j["bie"]["kv"], "int4_asym");
  EXPECT_EQ(j["bie"]["model_sha256"], std::string(64, 'a'));
  EXPECT_EQ(h.engine->last_request().sampling.temperature, 0.0f);
  EXPECT_EQ(h.engine->last_request().max_tokens, 4);
}

TEST(Server, CompletionDefaultsToSixteenTokensAndPassesSampling) {
  Harness h;
  auto r = h.post("/v1/completions", json{{"prompt", "abcdefghijklmnopqrstuvwxyz"},
                                          {"top_p", 0.5},
                                          {"top_k", 7},
                                          {"min_p", 0.1},
                                          {"seed", 42},
                                          {"stop", {"zz", "yy"}},
                                          {"presence_penalty", 0.5},
                                          {"frequency_penalty", 0.25},
                                          {"repetition_penalty", 1.1}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "abcdefghijklmnop");
  const EngineRequest& er = h.engine->last_request();
  EXPECT_EQ(er.max_tokens, 16);
  EXPECT_FLOAT_EQ(er.sampling.top_p, 0.5f);
  EXPECT_EQ(er.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(er.sampling.min_p, 0.1f);
  EXPECT_EQ(er.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(er.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(er.sampling.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(er.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(er.stop, (std::vector<std::string>{"zz", "yy"}));
}

TEST(Server, StopStringEndsWithStop) {
  Harness h;
  auto r = h.post("/v1/completions", json{{"prompt", "abcdef"}, {"stop", "cd"}});
  ASSERT_TRUE(r);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST(Server, ChatRendersTemplateAndStopsAtEndOfTurn) {
  Harness h;
  auto r = h.post("/v1/chat/completions",
                  json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 9}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  // The fake echoes the prompt; control tokens have no text: "<|im_start|>system\nBe brief.".
  EXPECT_EQ(j["choices"][0]["message"]["content"], "system\nB");
  const EngineRequest& er = h.engine->last_request();
  EXPECT_EQ(er.stop.back(), "<|im_end|>");
  // <|im_start|> is one token (parse_special), then "system\n" as bytes.
  EXPECT_EQ(er.prompt[0], 257);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(er.prompt.size()));
}

TEST(Server, ChatContentPartsAndDeveloperRole) {
  Harness h;
  auto r = h.post(
      "/v1/chat/completions",
      json{
          {"messages",
           {{{"role", "developer"}, {"content", "x"}},
            {{"role", "user"},
             {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
          {"max_tokens", 1}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST(Server, Logprobs) {
  Harness h;
  auto r = h.post("/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 2}, {"logprobs", 2}});
  ASSERT_TRUE(r);
  json lp = json::parse(r->body)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["token_logprobs"].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  EXPECT_EQ(h.engine->last_request().logprobs, 2);

  r = h.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "q"}}}},
                                          {"max_tokens", 3},
                                          {"logprobs", true},
                                          {"top_logprobs", 1}});
  ASSERT_TRUE(r);
  lp = json::parse(r->body)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["content"].size(), 3u);
  EXPECT_EQ(lp["content"][0]["top_logprobs"].size(), 1u);
  EXPECT_TRUE(lp["content"][0]["bytes"].is_array());

  r = h.post("/v1/completions", json{{"prompt", "ab"}, {"max_tokens", 2}});
  EXPECT_TRUE(json::parse(r->body)["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(h.engine->last_request().logprobs, -1);
}

TEST(Server, BadInputIs400WithParam) {
  Harness h;
  expect_error(h.post("/v1/completions", std::string("{\"prompt\": \"x\",")), 400, {},
               "malformed JSON");
  expect_error(h.post("/v1/completions", std::string("[1, 2]")), 400);
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", "5"}}), 400,
               "max_tokens", "integer");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2.5}}), 400,
               "max_tokens");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", -1}}), 400,
               "max_tokens");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 0}}), 400,
               "max_tokens");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1000000000000}}), 400,
               "max_tokens");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 257}}), 400,
               "max_tokens");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"max_completion_tokens", -3}}), 400,
               "max_completion_tokens");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"temperature", -0.5}}), 400,
               "temperature");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"temperature", "hot"}}), 400,
               "temperature");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"top_p", 1.5}}), 400, "top_p");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"top_p", 0}}), 400, "top_p");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"n", 0}}), 400, "n");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"n", 129}}), 400, "n");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"stream", "yes"}}), 400, "stream");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"stop", 5}}), 400, "stop");
  expect_error(h.post("/v1/completions", json{{"prompt", 5}}), 400, "prompt");
  expect_error(h.post("/v1/completions", json{{"prompt", {"a", "b"}}}), 400, "prompt");
  expect_error(h.post("/v1/completions", json{{"prompt", {1, 100000}}}), 400, "prompt");
  expect_error(h.post("/v1/completions", json{{"prompt", ""}}), 400, "prompt");
  expect_error(h.post("/v1/completions", json{{"max_tokens", 3}}), 400, "prompt");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"logprobs", 21}}), 400, "logprobs");
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}, {"model", 7}}), 400, "model");
  // Chat.
  expect_error(h.post("/v1/chat/completions", json{{"messages", json::array()}}), 400, "messages",
               "empty");
  expect_error(h.post("/v1/chat/completions", json{{"messages", "hi"}}), 400, "messages");
  expect_error(h.post("/v1/chat/completions", json{{"prompt", "hi"}}), 400, "messages");
  expect_error(
      h.post("/v1/chat/completions", json{{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}),
      400, "messages[0].role", "wizard");
  expect_error(h.post("/v1/chat/completions", json{{"messages", {{{"content", "x"}}}}}), 400,
               "messages[0].role");
  expect_error(
      h.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 3}}}}}), 400,
      "messages[0].content");
  expect_error(
      h.post("/v1/chat/completions",
             json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}),
      400, "top_logprobs");
  // Nothing reached the engine.
  EXPECT_TRUE(h.engine->submitted_ids().empty());
}

TEST(Server, InvalidUtf8Is400) {
  Harness h;
  expect_error(h.post("/v1/completions", std::string("{\"prompt\": \"a\xff\xfe b\"}")), 400, {},
               "UTF-8");
  expect_error(h.post("/v1/chat/completions",
                      std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\"}]}")),
               400, {}, "UTF-8");
  // A lone surrogate escape is invalid too (the JSON parser refuses it).
  expect_error(h.post("/v1/completions", std::string("{\"prompt\": \"\\udc00\"}")), 400);
}

TEST(Server, UnknownModelAndRouteAre404) {
  Harness h;
  expect_error(h.post("/v1/completions", json{{"model", "gpt-9"}, {"prompt", "x"}}), 404, "model",
               "gpt-9");
  auto r = h.client->Get("/v1/nothing");
  expect_error(r, 404);
  r = h.client->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "fake-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST(Server, ServedModelName) {
  ServerConfig sc;
  sc.served_model_name = "my-model";
  Harness h({}, sc);
  auto r =
      h.post("/v1/completions", json{{"model", "my-model"}, {"prompt", "x"}, {"max_tokens", 1}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["model"], "my-model");
}

TEST(Server, PromptLongerThanMaxModelLenIs413) {
  Harness h;  // max_model_len 256
  expect_error(h.post("/v1/completions", json{{"prompt", std::string(300, 'a')}}), 413, "prompt",
               "max-model-len");
  expect_error(h.post("/v1/completions", json{{"prompt", std::string(256, 'a')}}), 413);
  // Room for generation is clamped, not refused.
  auto r = h.post("/v1/completions", json{{"prompt", std::string(250, 'a')}, {"max_tokens", 100}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(h.engine->last_request().max_tokens, 6);
}

TEST(Server, BodyOverLimitIs413) {
  ServerConfig sc;
  sc.max_body_bytes = 1 << 20;
  Harness h({}, sc);
  const std::string big = "{\"prompt\": \"" + std::string(2 << 20, 'a') + "\"}";
  auto r = h.post("/v1/completions", big);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  // Announced with "Expect: 100-continue": refused before the body is sent.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(h.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n"
      "Expect: 100-continue\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
  // The server is still fine.
  r = h.post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 1}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Server, QueueFullIs429AndShuttingDownIs503) {
  FakeEngineConfig ec;
  ec.max_queue = 0;
  Harness h(ec);
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}}), 429);
  h.server->begin_shutdown();
  auto r = h.client->Get("/health");  // still listening while draining: 503
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  expect_error(h.post("/v1/completions", json{{"prompt", "x"}}), 503);
}

TEST(Server, ApiKey) {
  ServerConfig sc;
  sc.api_key = "sekret";
  Harness h({}, sc);
  const json body = {{"prompt", "x"}, {"max_tokens", 1}};
  expect_error(h.post("/v1/completions", body.dump()), 401);
  expect_error(h.post("/v1/completions", body.dump(), {{"Authorization", "Bearer nope"}}), 401);
  expect_error(h.post("/v1/completions", body.dump(), {{"Authorization", "sekret"}}), 401);
  auto r = h.post("/v1/completions", body.dump(), {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = h.client->Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = h.client->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Server, AuthorizedHelper) {
  EXPECT_TRUE(authorized("", ""));
  EXPECT_TRUE(authorized("anything", ""));
  EXPECT_TRUE(authorized("Bearer k", "k"));
  EXPECT_TRUE(authorized("bearer k", "k"));
  EXPECT_FALSE(authorized("Bearer kk", "k"));
  EXPECT_FALSE(authorized("Bearer ", "k"));
  EXPECT_FALSE(authorized("Basic k", "k"));
}

// Splits an SSE body into its data payloads, checking the framing.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind(':', 0) == 0) continue;  // comment
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
  }
  return out;
}

TEST(Server, StreamingFramingMatchesWholeResponse) {
  Harness h;
  const json req = {{"prompt", "streaming!"}, {"max_tokens", 8}};
  auto whole = h.post("/v1/completions", req);
  ASSERT_TRUE(whole);
  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto r = h.post("/v1/completions", sreq);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  const auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["bie"]["kv"], "int4_asym");
    if (c["choices"].empty()) {  // the usage chunk, last before [DONE]
      EXPECT_EQ(i + 2, events.size());
      EXPECT_EQ(c["usage"]["completion_tokens"], 8);
      EXPECT_EQ(c["usage"]["prompt_tokens"], 10);
      continue;
    }
    EXPECT_TRUE(c["usage"].is_null());
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, json::parse(whole->body)["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
}

TEST(Server, ChatStreamingChunks) {
  Harness h;
  auto r =
      h.post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "yo"}}}},
                                          {"max_tokens", 5},
                                          {"stream", true}});
  ASSERT_TRUE(r);
  const auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 3u);
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(first.contains("usage"));
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, "syst");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back(), "[DONE]");
}

int64_t used_blocks(Harness& h) {
  int64_t used = 0;
  for (const auto& p : h.engine->metrics().pools) used += p.blocks_used;
  return used;
}

TEST(Server, ClientDisconnectMidStreamCancels) {
  FakeEngineConfig ec;
  ec.step_delay = std::chrono::milliseconds(10);
  ec.max_model_len = 100000;
  Harness h(ec);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(h.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string body = json{{"prompt", "abc"}, {"max_tokens", 50000}, {"stream", true}}.dump();
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[4096];
  std::string got;
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_GT(used_blocks(h), 0);
  ::close(fd);
  // The engine hears about it and frees the request's blocks.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.engine->metrics().requests_running > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(h.engine->metrics().requests_running, 0);
  EXPECT_EQ(used_blocks(h), 0);
  // Other requests are unaffected.
  auto r = h.post("/v1/completions", json{{"prompt", "ok"}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Server, MetricsText) {
  Harness h;
  auto r = h.client->Get("/metrics");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  ASSERT_TRUE(h.post("/v1/completions", json{{"prompt", "abc"}, {"max_tokens", 3}}));
  // The server counts a response once it has been sent, so a scrape right after the reply may
  // come first: scrape until the completion is counted (at most ~5 s).
  const std::string counted =
      "bie_http_responses_total{route=\"/v1/completions\",status=\"200\"} 1";
  std::string m;
  for (int i = 0; i < 250 && m.find(counted) == std::string::npos; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r = h.client->Get("/metrics");
    ASSERT_TRUE(r);
    m = r->body;
  }
  for (const char* line :
       {"bie_model_loaded{model=\"fake-model\"} 1", "bie_kv_blocks_total{format=\"f16\"} 64",
        "bie_kv_blocks_used{format=\"f16\"} 0", "bie_kv_blocks_free{format=\"f16\"} 64",
        "bie_prefix_cache_hit_rate 0.4", "bie_prompt_tokens_total 3",
        "bie_generation_tokens_total 3", "bie_requests_running 0", "bie_requests_waiting 0",
        "bie_preemptions_total 0", "bie_admission_refusals_total 0",
        "bie_time_to_first_token_seconds_count 1", "bie_inter_token_latency_seconds_count 2",
        "bie_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
        "# TYPE bie_time_to_first_token_seconds histogram", "bie_batch_size_mean 1",
        "bie_http_responses_total{route=\"/v1/completions\",status=\"200\"} 1"}) {
    EXPECT_NE(m.find(line), std::string::npos) << "missing: " << line << "\n" << m;
  }
}

// Operations: the KV kill switch behind the API key, and a request's own KV regime.
TEST(Server, KvPolicyKillSwitchAndPerRequestRegime) {
  ServerConfig sc;
  sc.api_key = "sekret";
  Harness h({}, sc);
  const httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  expect_error(h.client->Get("/admin/kv-policy"), 401);
  expect_error(h.post("/admin/kv-policy", std::string(R"({"force_f16": true})")), 401);
  auto got = h.client->Get("/admin/kv-policy", auth);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  json p = json::parse(got->body);
  EXPECT_FALSE(p["force_f16"].get<bool>());
  EXPECT_EQ(p["regimes"].size(), 2u);
  expect_error(h.post("/admin/kv-policy", "{oops", auth), 400);
  expect_error(h.post("/admin/kv-policy", R"({"force_f16": "yes"})", auth), 400, "force_f16");

  const json body = {{"prompt", "hi"}, {"max_tokens", 2}, {"kv_cache_dtype", "f16"}};
  auto own = h.post("/v1/completions", body.dump(), auth);
  ASSERT_TRUE(own);
  EXPECT_EQ(json::parse(own->body)["bie"]["kv"], "f16");
  EXPECT_EQ(h.engine->last_request().kv_cache_dtype, "f16");
  expect_error(h.post("/v1/completions", R"({"prompt": "hi", "kv_cache_dtype": 8})", auth), 400,
               "kv_cache_dtype");
  expect_error(h.post("/v1/completions", R"({"prompt": "hi", "kv_cache_dtype": "int3"})", auth),
               400);

  auto on = h.post("/admin/kv-policy", R"({"force_f16": true})", auth);
  ASSERT_TRUE(on);
  EXPECT_EQ(on->status, 200) << on->body;
  EXPECT_TRUE(json::parse(on->body)["force_f16"].get<bool>());
  const json plain = {{"prompt", "hi"}, {"max_tokens", 2}};
  auto r = h.post("/v1/completions", plain.dump(), auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["bie"]["kv"], "f16");
  ASSERT_TRUE(h.post("/admin/kv-policy", R"({"force_f16": false})", auth));
  r = h.post("/v1/completions", plain.dump(), auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["bie"]["kv"], "int4_asym");
}

}  // namespace
}  // namespace bie::server
