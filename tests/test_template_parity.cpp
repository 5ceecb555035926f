// BIE's Jinja engine against Python's jinja2 (configured as transformers renders chat
// templates): every template in tests/golden/templates/ over every conversation, and every
// feature snippet, must render byte-identically, and where jinja2 refuses (a template's
// raise_exception, a type error, a syntax error) BIE must refuse too.
// Goldens: scripts/make_template_goldens.py -> tests/golden/templates/goldens.json.
#include <gtest/gtest.h>

#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "bie/template/jinja.h"
#include "support/paths.h"

namespace bie::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string dir() {
  return test::source_dir() + "/tests/golden/templates/";
}

ojson load(const std::string& name) {
  const std::string text = test::read_file(dir() + name);
  EXPECT_FALSE(text.empty()) << "missing " << dir() + name;
  return ojson::parse(text);
}

// The time the generator gives strftime_now(): 2026-03-14 09:26:53 (a Saturday).
RenderOptions fixed_time() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 9;
  tm.tm_min = 26;
  tm.tm_sec = 53;
  const std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);  // fills the weekday and day of the year
  RenderOptions o;
  o.now = tm;
  return o;
}

// Renders and compares one case; returns whether it matched jinja2.
bool check(const std::string& what, const std::string& source, const ojson& context,
           const ojson& want) {
  auto t = Template::parse(source);
  Result<std::string> out =
      t.ok() ? t->render(context, fixed_time()) : Result<std::string>(Error{t.error()});
  if (want.contains("error")) {
    EXPECT_FALSE(out.ok()) << what << ": jinja2 refused (" << want["error"].get<std::string>()
                           << ") but BIE rendered:\n"
                           << (out.ok() ? *out : "");
    return !out.ok();
  }
  if (!out.ok()) {
    ADD_FAILURE() << what << ": BIE refused: " << out.error();
    return false;
  }
  const std::string& text = want["text"].get_ref<const std::string&>();
  EXPECT_EQ(*out, text) << what;
  return *out == text;
}

TEST(TemplateParity, RealTemplatesOverTheConversationCorpus) {
  const ojson manifest = load("templates.json");
  const ojson corpus = load("conversations.json");
  const ojson golden = load("goldens.json");
  std::map<std::string, std::string> sources;
  for (const auto& [name, meta] : manifest.items()) {
    sources[name] = test::read_file(dir() + name);
    ASSERT_FALSE(sources[name].empty()) << name;
  }
  std::map<std::string, ojson> convs;
  for (const ojson& c : corpus["conversations"]) convs[c["name"].get<std::string>()] = c;
  int total = 0;
  int same = 0;
  int refused = 0;
  for (const ojson& c : golden["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const ojson& conv = convs.at(c["conversation"].get<std::string>());
    const ojson& meta = manifest[name];
    ojson ctx = ojson::object();
    ctx["messages"] = conv["messages"];
    ctx["tools"] =
        conv.contains("tools") ? corpus["tools"][conv["tools"].get<std::string>()] : ojson(nullptr);
    ctx["documents"] = conv.contains("documents") ? conv["documents"] : ojson(nullptr);
    ctx["add_generation_prompt"] = c["add_generation_prompt"];
    if (!meta["bos"].is_null()) ctx["bos_token"] = meta["bos"];
    if (!meta["eos"].is_null()) ctx["eos_token"] = meta["eos"];
    const std::string what = name + " / " + c["conversation"].get<std::string>() +
                             (c["add_generation_prompt"].get<bool>() ? " / +gen" : " / -gen");
    ++total;
    same += check(what, sources[name], ctx, c) ? 1 : 0;
    refused += c.contains("error") ? 1 : 0;
  }
  std::printf(
      "template parity: %d/%d (template, conversation) pairs as jinja2 (%d refused by both)\n",
      same, total, refused);
  EXPECT_EQ(manifest.size(), 17u);
  EXPECT_EQ(total, 612);  // 17 templates x 18 conversations x add_generation_prompt on/off
  EXPECT_EQ(same, total);
}

TEST(TemplateParity, FeatureSnippets) {
  const ojson file = load("features.json");
  const ojson& features = file["features"];
  const ojson golden = load("goldens.json");
  ASSERT_EQ(features.size(), golden["features"].size());
  int same = 0;
  for (size_t i = 0; i < features.size(); ++i) {
    const ojson& f = features[i];
    ASSERT_EQ(f["name"], golden["features"][i]["name"]);
    same += check(f["name"].get<std::string>(), f["template"].get<std::string>(), file["context"],
                  golden["features"][i])
                ? 1
                : 0;
  }
  std::printf("feature parity: %d/%zu snippets as jinja2\n", same, features.size());
  EXPECT_EQ(features.size(), 106u);
  EXPECT_EQ(same, static_cast<int>(features.size()));
}

}  // namespace
}  // namespace bie::jinja
