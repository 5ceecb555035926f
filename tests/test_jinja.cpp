// bie::jinja::Template's own contract: errors name a line and column, hostile templates meet
// the depth/step/size limits instead of crashing, and the API edges (context must be an
// object, strftime_now uses the given time). Rendering semantics are held to jinja2 by
// test_template_parity.cpp.
#include <gtest/gtest.h>

#include <string>

#include "bie/template/jinja.h"

namespace bie::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& src, const ojson& ctx = ojson::object(),
                   const RenderOptions& o = {}) {
  auto t = Template::parse(src);
  if (!t.ok()) return "PARSE: " + t.error();
  auto r = t->render(ctx, o);
  return r.ok() ? *r : "RENDER: " + r.error();
}

TEST(Jinja, RendersContextValuesInOrder) {
  ojson ctx = ojson::parse(R"({"z": 1, "a": {"y": [1, 2.5, "x"], "b": null}})");
  EXPECT_EQ(render("{{ a }}|{{ a|tojson }}|{% for k in a %}{{ k }}{% endfor %}", ctx),
            "{'y': [1, 2.5, 'x'], 'b': None}|{\"y\": [1, 2.5, \"x\"], \"b\": null}|yb");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(render("line one\n  {{ 1 + }}"), "PARSE: line 2, column 10: unexpected '}}'");
  EXPECT_EQ(render("{% if x %}\n{% endfor %}"),
            "PARSE: line 2, column 4: unknown or unsupported statement 'endfor'");
  EXPECT_EQ(render("{% for x in y %}"),
            "PARSE: line 1, column 17: unexpected end of template, expected '{% endfor %}'");
  EXPECT_EQ(render("ok\n{{ x | nosuchfilter }}"),
            "PARSE: line 2, column 8: no filter named 'nosuchfilter'");
  EXPECT_EQ(render("{% extends 'base' %}"),
            "PARSE: line 1, column 4: unknown or unsupported statement 'extends'");
  EXPECT_EQ(render("{{ 'open }}"), "PARSE: line 1, column 4: unterminated string literal");
}

TEST(Jinja, RenderErrorsNameWhereTheyHappened) {
  EXPECT_EQ(render("a\n\n  {{ raise_exception('roles must alternate') }}"),
            "RENDER: line 3, column 6: roles must alternate");
  EXPECT_EQ(render("{{ messages[0].content }}", ojson::parse(R"({"messages": []})")),
            "RENDER: line 1, column 15: list index out of range");
  EXPECT_EQ(render("{% for m in x %}{{ m.y.z }}{% endfor %}", ojson::parse(R"({"x": [{}]})")),
            "RENDER: line 1, column 23: 'dict object' has no attribute 'y'");
  EXPECT_EQ(render("{{ 'a' + 1 }}"),
            "RENDER: line 1, column 8: unsupported operand type(s) for +: 'str' and 'int'");
}

TEST(Jinja, ContextMustBeAnObjectAndTheTemplateParsed) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(ojson::array()).ok());
  EXPECT_FALSE(Template().render(ojson::object()).ok());
}

TEST(Jinja, DeepNestingIsAnErrorNotAStackOverflow) {
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(render(deep).find("nested too deeply"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 3000; ++i) blocks += "{% if true %}";
  EXPECT_NE(render(blocks).find("nested too deeply"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(3000, '-') + "1 }}").find("nested too deeply"),
            std::string::npos);
}

TEST(Jinja, UnboundedRecursionMeetsTheCallDepth) {
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
                .find("maximum macro call depth (100) exceeded"),
            std::string::npos);
  // Within the limit recursion works (recursive schema printers need some).
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                   "{{ f(50)|length }}"),
            "91");
}

TEST(Jinja, EndlessWorkMeetsTheStepLimit) {
  RenderOptions o;
  o.limits.max_steps = 100000;
  const std::string r =
      render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
             ojson::object(), o);
  EXPECT_NE(r.find("more than 100000 steps"), std::string::npos) << r;
}

TEST(Jinja, GrowingStringsMeetTheSizeLimit) {
  RenderOptions o;
  o.limits.max_output_bytes = 1 << 20;
  const std::string doubling =
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s|length }}";
  EXPECT_NE(render(doubling, ojson::object(), o).find("limit of 1048576 bytes"), std::string::npos);
  EXPECT_NE(render("{{ 'ab' * 100000000 }}", ojson::object(), o).find("limit"), std::string::npos);
  EXPECT_NE(render("{% for i in range(100000) %}0123456789abcdef{% endfor %}", ojson::object(), o)
                .find("limit"),
            std::string::npos);
  EXPECT_NE(render("{{ range(1000000) }}").find("range too big"), std::string::npos);
}

TEST(Jinja, StrftimeNowUsesTheGivenTime) {
  RenderOptions o;
  std::tm tm{};
  tm.tm_year = 124;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  o.now = tm;
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}", ojson::object(), o), "26 Jul 2024");
  // Without a fixed time it formats the clock: a four-digit year at least.
  EXPECT_EQ(render("{{ strftime_now('%Y')|length }}"), "4");
}

TEST(Jinja, WhitespaceOptionsCanBeTurnedOff) {
  TemplateOptions plain;
  plain.trim_blocks = false;
  plain.lstrip_blocks = false;
  auto t = Template::parse("  {% if true %}\nx\n  {% endif %}\n", plain);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->render(ojson::object()).value(), "  \nx\n  ");
  auto hf = Template::parse("  {% if true %}\nx\n  {% endif %}\n");
  ASSERT_TRUE(hf.ok());
  EXPECT_EQ(hf->render(ojson::object()).value(), "x\n");
}

}  // namespace
}  // namespace bie::jinja
