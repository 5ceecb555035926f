// Grammar-constrained decoding: JSON Schema -> grammar -> matcher, exact accept/reject cases per
// keyword, the errors for what is not supported, and token masks on a tiny fake vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bie/grammar/grammar_constraint.h"
#include "bie/grammar/json_schema.h"
#include "bie/grammar/matcher.h"
#include "bie/grammar/token_trie.h"
#include "bie/sampling/sampler.h"

namespace bie::grammar {
namespace {

using json = nlohmann::ordered_json;

Grammar compile(const json& schema) {
  auto g = compile_json_schema(schema);
  if (!g.ok()) {
    ADD_FAILURE() << g.error();
    return json_object_grammar();
  }
  return std::move(g.value());
}

// Whether the whole of `text` is a complete match.
bool full_match(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g);
  const auto s = m.accepts(m.initial(), text);
  return s.has_value() && GrammarMatcher::is_complete(*s);
}

// Whether `text` is a prefix some continuation could complete.
bool prefix_ok(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accepts(m.initial(), text).has_value();
}

std::string error_of(const json& schema) {
  auto g = compile_json_schema(schema);
  return g.ok() ? std::string("<compiled>") : g.error();
}

TEST(GrammarSchema, StringLengths) {
  const Grammar g = compile({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}});
  EXPECT_FALSE(full_match(g, R"("a")"));
  EXPECT_TRUE(full_match(g, R"("ab")"));
  EXPECT_TRUE(full_match(g, R"("abc")"));
  EXPECT_FALSE(full_match(g, R"("abcd")"));
  EXPECT_FALSE(prefix_ok(g, R"("abcd)"));
  // Characters, not bytes: two 2-byte characters and an escape count as three.
  EXPECT_TRUE(full_match(g, "\"\xC3\xA9\xC3\xA9\\n\""));
  EXPECT_TRUE(full_match(g, R"("\u00e9x")"));
}

TEST(GrammarSchema, StringCharacters) {
  const Grammar g = compile({{"type", "string"}});
  EXPECT_TRUE(full_match(g, R"("")"));
  EXPECT_TRUE(full_match(g, R"("a \"q\" \\ \/ \b\f\n\r\t")"));
  EXPECT_TRUE(full_match(g, "\"\xE2\x82\xAC \xF0\x9F\x98\x80\""));  // euro sign, emoji
  EXPECT_FALSE(prefix_ok(g, "\"\n"));                               // raw control byte
  EXPECT_FALSE(prefix_ok(g, R"("\x)"));                             // unknown escape
  EXPECT_FALSE(prefix_ok(g, R"("\ud800)"));                         // surrogate escape
  EXPECT_FALSE(prefix_ok(g, "\"\xC0"));                             // overlong lead byte
  EXPECT_FALSE(prefix_ok(g, "\"\xED\xA0"));                         // UTF-8 surrogate
  EXPECT_FALSE(prefix_ok(g, "\"\x80"));                             // stray continuation
  EXPECT_FALSE(full_match(g, "\"\xC3\""));                          // truncated character
  EXPECT_FALSE(full_match(g, R"("abc)"));
}

TEST(GrammarSchema, IntegerBounds) {
  const Grammar g = compile({{"type", "integer"}, {"minimum", -12}, {"maximum", 305}});
  for (int v = -20; v <= 320; ++v) {
    EXPECT_EQ(full_match(g, std::to_string(v)), v >= -12 && v <= 305) << v;
  }
  EXPECT_FALSE(full_match(g, "007"));
  EXPECT_FALSE(full_match(g, "-0"));
  EXPECT_FALSE(full_match(g, "1.5"));
  EXPECT_FALSE(full_match(g, "1e2"));
  const Grammar ex =
      compile({{"type", "integer"}, {"exclusiveMinimum", 0}, {"exclusiveMaximum", 10}});
  for (int v = -3; v <= 13; ++v) EXPECT_EQ(full_match(ex, std::to_string(v)), v > 0 && v < 10) << v;
  const Grammar nonneg = compile({{"type", "integer"}, {"minimum", 0}});
  EXPECT_TRUE(full_match(nonneg, "0"));
  EXPECT_TRUE(full_match(nonneg, "123456789012345678"));
  EXPECT_FALSE(full_match(nonneg, "1234567890123456789"));  // 19 digits: over the cap
  EXPECT_FALSE(prefix_ok(nonneg, "-"));
  const Grammar any = compile({{"type", "integer"}});
  EXPECT_TRUE(full_match(any, "-42"));
  EXPECT_TRUE(full_match(any, "0"));
  EXPECT_FALSE(full_match(any, "01"));
}

TEST(GrammarSchema, NumberBounds) {
  const Grammar any = compile({{"type", "number"}});
  for (const char* ok : {"0", "-0", "1.5", "-12.25e3", "3E-2", "7e+1", "100"}) {
    EXPECT_TRUE(full_match(any, ok)) << ok;
  }
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "--1", "1.5.2"}) {
    EXPECT_FALSE(full_match(any, bad)) << bad;
  }
  // [0, 10]: every generated value is in range; 10 itself but no 10.5.
  const Grammar g = compile({{"type", "number"}, {"minimum", 0}, {"maximum", 10}});
  for (const char* ok : {"0", "0.5", "9.99", "10", "3"}) EXPECT_TRUE(full_match(g, ok)) << ok;
  for (const char* bad : {"-1", "-0.5", "10.5", "11", "1e1"})
    EXPECT_FALSE(full_match(g, bad)) << bad;
  // [-2.5, -1): magnitudes in (1, 2.5]: conservative (1.5 is valid but not generated).
  const Grammar neg = compile({{"type", "number"}, {"minimum", -2.5}, {"exclusiveMaximum", -1}});
  for (const char* ok : {"-2", "-2.0"})
    EXPECT_EQ(full_match(neg, ok), std::string(ok) == "-2") << ok;
  for (const char* bad : {"-1", "-3", "-2.6", "0", "1"}) EXPECT_FALSE(full_match(neg, bad)) << bad;
  const Grammar pos = compile({{"type", "number"}, {"exclusiveMinimum", 0}});
  EXPECT_TRUE(full_match(pos, "1.25"));
  EXPECT_FALSE(full_match(pos, "0"));
  EXPECT_FALSE(full_match(pos, "-1"));
}

TEST(GrammarSchema, BooleanNullEnumConst) {
  const Grammar b = compile({{"type", "boolean"}});
  EXPECT_TRUE(full_match(b, "true"));
  EXPECT_TRUE(full_match(b, "false"));
  EXPECT_FALSE(full_match(b, "null"));
  EXPECT_TRUE(full_match(compile({{"type", "null"}}), "null"));
  const Grammar e = compile({{"enum", {"red", "green", 3, nullptr}}});
  for (const char* ok : {R"("red")", R"("green")", "3", "null"})
    EXPECT_TRUE(full_match(e, ok)) << ok;
  for (const char* bad : {R"("blue")", R"("re")", "4", "true"})
    EXPECT_FALSE(full_match(e, bad)) << bad;
  const Grammar c = compile({{"const", {{"a", 1}}}});
  EXPECT_TRUE(full_match(c, R"({"a":1})"));
  EXPECT_FALSE(full_match(c, R"({"a":2})"));
  const Grammar nullable = compile({{"type", {"string", "null"}}, {"maxLength", 1}});
  EXPECT_TRUE(full_match(nullable, "null"));
  EXPECT_TRUE(full_match(nullable, R"("x")"));
  EXPECT_FALSE(full_match(nullable, R"("xy")"));
}

TEST(GrammarSchema, ObjectRequiredOptionalInOrder) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    "required": ["b"], "additionalProperties": false})");
  const Grammar g = compile(schema);
  for (const char* ok : {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})",
                         R"({"a":1,"b":"x","c":false})", "{ \"a\" : 1 ,\n\"b\":\"\" }"}) {
    EXPECT_TRUE(full_match(g, ok)) << ok;
  }
  for (const char* bad : {"{}", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x",})",
                          R"({"b":"x","d":1})", R"({"b":"x""c":true})", R"({,"b":"x"})"}) {
    EXPECT_FALSE(full_match(g, bad)) << bad;
  }
  // All optional: the empty object, and any ordered subset.
  const Grammar opt = compile(
      json::parse(R"({"type":"object","properties":{"x":{"type":"null"},"y":{"type":"null"}}})"));
  for (const char* ok : {"{}", R"({"x":null})", R"({"y":null})", R"({"x":null,"y":null})"}) {
    EXPECT_TRUE(full_match(opt, ok)) << ok;
  }
  EXPECT_FALSE(full_match(opt, R"({"y":null,"x":null})"));
}

TEST(GrammarSchema, DeclaredOrderWithOrderedJson) {
  const char* text = R"({"type":"object","properties":{"b":{"type":"null"},"a":{"type":"null"}},
                         "required":["a","b"]})";
  const Grammar ordered = compile(json::parse(text));
  EXPECT_TRUE(full_match(ordered, R"({"b":null,"a":null})"));
  EXPECT_FALSE(full_match(ordered, R"({"a":null,"b":null})"));
  // nlohmann::json has sorted the keys before the compiler sees them.
  auto sorted = compile_json_schema(nlohmann::json::parse(text));
  ASSERT_TRUE(sorted.ok());
  EXPECT_TRUE(full_match(*sorted, R"({"a":null,"b":null})"));
  EXPECT_FALSE(full_match(*sorted, R"({"b":null,"a":null})"));
}

TEST(GrammarSchema, Pattern) {
  const auto p = [](const char* pattern) {
    return compile({{"type", "string"}, {"pattern", pattern}});
  };
  const Grammar code = p(R"(^[A-Z]{3}-\d{2,4}$)");
  EXPECT_TRUE(full_match(code, R"("ABC-12")"));
  EXPECT_TRUE(full_match(code, R"("XYZ-1234")"));
  EXPECT_FALSE(full_match(code, R"("ABC-12345")"));
  EXPECT_FALSE(full_match(code, R"("AB-12")"));
  EXPECT_FALSE(full_match(code, R"("abc-12")"));
  const Grammar pets = p("^(cat|dog)s?$");
  for (const char* ok : {R"("cat")", R"("dogs")"}) EXPECT_TRUE(full_match(pets, ok)) << ok;
  for (const char* bad : {R"("cow")", R"("cats!")", R"("")"}) EXPECT_FALSE(full_match(pets, bad));
  // Unanchored: JSON Schema searches, so anything may surround the match.
  const Grammar search = p("ab");
  EXPECT_TRUE(full_match(search, R"("xxab yy")"));
  EXPECT_TRUE(full_match(search, R"("ab")"));
  EXPECT_FALSE(full_match(search, R"("a b")"));
  // '.' is any character but a line break, written as JSON writes it.
  const Grammar dot = p("^a.c$");
  EXPECT_TRUE(full_match(dot, R"("abc")"));
  EXPECT_TRUE(full_match(dot,
                         "\"a\xC3\xA9"
                         "c\""));
  EXPECT_TRUE(full_match(dot, R"("a\"c")"));
  EXPECT_FALSE(full_match(dot, R"("a\nc")"));
  // Negated class: no '"' inside; a quote in the pattern is generated escaped.
  const Grammar noquote = p(R"(^[^"]+$)");
  EXPECT_TRUE(full_match(noquote, R"("a b\n")"));
  EXPECT_FALSE(full_match(noquote, R"("a\"b")"));
  const Grammar not_a = p("^[^a]$");
  EXPECT_TRUE(full_match(not_a, "\"\xC3\xA9\""));  // a non-ASCII character is not 'a'
  EXPECT_FALSE(full_match(not_a, R"("a")"));
  const Grammar quoted = p(R"(^say "hi"$)");
  EXPECT_TRUE(full_match(quoted, R"("say \"hi\"")"));
  const Grammar email = p(R"(^[\w.+-]+@\w+\.(com|org)$)");
  EXPECT_TRUE(full_match(email, R"("a.b+c_d@x.org")"));
  EXPECT_FALSE(full_match(email, R"("a@x.net")"));
  const Grammar counts = p("^x{2}y{1,}z{0,2}$");
  for (const char* ok : {R"("xxy")", R"("xxyyyzz")"}) EXPECT_TRUE(full_match(counts, ok)) << ok;
  for (const char* bad : {R"("xy")", R"("xxzz")", R"("xxyzzz")"}) {
    EXPECT_FALSE(full_match(counts, bad)) << bad;
  }
}

TEST(GrammarSchema, WhitespaceIsBounded) {
  const Grammar g = compile({{"type", "array"}, {"items", {{"type", "integer"}}}});
  EXPECT_TRUE(full_match(g, "[1,2]"));
  EXPECT_TRUE(full_match(g, "[  1 ,\n 2\n]"));
  EXPECT_FALSE(prefix_ok(g, "[   "));      // a third whitespace byte
  EXPECT_FALSE(prefix_ok(g, "[1 , \n "));  // three after the comma
  EXPECT_FALSE(prefix_ok(g, "[\t"));       // tabs are not generated
  EXPECT_FALSE(full_match(g, " [1]"));     // no leading whitespace
}

TEST(GrammarSchema, ArrayBounds) {
  const Grammar g = compile(
      {{"type", "array"}, {"items", {{"type", "boolean"}}}, {"minItems", 1}, {"maxItems", 3}});
  EXPECT_FALSE(full_match(g, "[]"));
  EXPECT_TRUE(full_match(g, "[true]"));
  EXPECT_TRUE(full_match(g, "[true,false,true]"));
  EXPECT_FALSE(full_match(g, "[true,false,true,true]"));
  EXPECT_FALSE(full_match(g, "[1]"));
  const Grammar empty = compile({{"type", "array"}, {"maxItems", 0}});
  EXPECT_TRUE(full_match(empty, "[]"));
  EXPECT_FALSE(full_match(empty, "[1]"));
  const Grammar any = compile({{"type", "array"}});
  EXPECT_TRUE(full_match(any, R"([1,"a",{"k":[null]},[]])"));
}

TEST(GrammarSchema, AnyOfRefNested) {
  const json schema = json::parse(R"({
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"},
              "y": {"type": "number"}}, "required": ["x", "y"]}},
    "type": "object",
    "properties": {
      "where": {"$ref": "#/$defs/point"},
      "tag": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 0}]},
      "path": {"type": "array", "items": {"$ref": "#/$defs/point"}}},
    "required": ["where", "tag"]})");
  const Grammar g = compile(schema);
  EXPECT_TRUE(full_match(g, R"({"where":{"x":1,"y":-2.5},"tag":"ab"})"));
  EXPECT_TRUE(full_match(g, R"({"where":{"x":1,"y":2},"tag":7,"path":[{"x":0,"y":0}]})"));
  EXPECT_FALSE(full_match(g, R"({"where":{"x":1},"tag":7})"));
  EXPECT_FALSE(full_match(g, R"({"where":{"x":1,"y":2},"tag":-7})"));
  EXPECT_FALSE(full_match(g, R"({"where":{"x":1,"y":2},"tag":"abc"})"));
  const Grammar defs = compile(json::parse(
      R"({"definitions":{"e":{"enum":["a","b"]}},"type":"array","items":{"$ref":"#/definitions/e"}})"));
  EXPECT_TRUE(full_match(defs, R"(["a","b"])"));
  EXPECT_FALSE(full_match(defs, R"(["c"])"));
  const Grammar one = compile(json::parse(R"({"oneOf":[{"type":"null"},{"type":"boolean"}]})"));
  EXPECT_TRUE(full_match(one, "null"));
  EXPECT_TRUE(full_match(one, "true"));
  EXPECT_FALSE(full_match(one, "1"));
}

TEST(GrammarSchema, JsonObjectMode) {
  const Grammar g = json_object_grammar();
  EXPECT_TRUE(full_match(g, "{}"));
  EXPECT_TRUE(full_match(g, R"({"a":[1,2,{"b":null}],"c":"d","e":-1.5e3,"f":true})"));
  EXPECT_FALSE(full_match(g, "[]"));
  EXPECT_FALSE(full_match(g, R"("x")"));
  EXPECT_FALSE(full_match(g, R"({"a":})"));
  EXPECT_FALSE(full_match(g, R"({"a":1,})"));
  EXPECT_FALSE(full_match(g, R"({"a" 1})"));
  EXPECT_TRUE(full_match(compile(json::object()), "[1]"));  // {} accepts any value
}

TEST(GrammarSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  const auto has = [](const json& schema, const std::string& word) {
    const std::string e = error_of(schema);
    EXPECT_NE(e.find(word), std::string::npos) << e;
  };
  has({{"type", "string"}, {"pattern", "^(?=a)"}}, "lookaround");
  has({{"type", "string"}, {"pattern", "^(a)\\1$"}}, "'\\1'");
  has({{"type", "string"}, {"pattern", "^a{2000}$"}}, "above 1000");
  has({{"type", "string"}, {"pattern", "^a|b$"}}, "^(a|b)$");
  has({{"type", "string"}, {"pattern", "^((a*)*)*$"}}, "empty string");
  has({{"type", "string"}, {"pattern", "^(a?|b){2,}$"}}, "empty string");
  has({{"type", "string"}, {"pattern", "a"}, {"maxLength", 3}}, "'pattern' together");
  has({{"type", "string"}, {"format", "date-time"}}, "'format'");
  has({{"type", "object"}, {"patternProperties", json::object()}}, "'patternProperties'");
  has({{"type", "object"}, {"additionalProperties", {{"type", "string"}}}},
      "'additionalProperties'");
  has({{"type", "array"}, {"uniqueItems", true}}, "'uniqueItems'");
  has({{"type", "array"}, {"items", json::array({{{"type", "string"}}})}}, "tuple 'items'");
  has({{"type", "number"}, {"multipleOf", 2}}, "'multipleOf'");
  has({{"allOf", json::array({{{"type", "string"}}, {{"maxLength", 3}}})}}, "'allOf'");
  has({{"type", "objekt"}}, "unknown type 'objekt'");
  has({{"maxLength", 3}}, "needs a 'type'");
  has({{"type", "object"}, {"properties", {{"a", {{"not", json::object()}}}}}},
      "'not' at #/properties/a");
  has({{"$ref", "https://example.com/s.json"}}, "only local references");
  has({{"$ref", "#/$defs/missing"}}, "does not resolve");
  has(json::parse(R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},
                      "$ref":"#/$defs/n"})"),
      "recursive '$ref'");
  has({{"type", "integer"}, {"minimum", 5}, {"maximum", 4}}, "no integer satisfies");
  has({{"type", "string"}, {"maxLength", 1'000'000}}, "bound above");
  has({{"type", "object"}, {"properties", {{"a", {{"type", "null"}}}}}, {"required", {"b"}}},
      "required property \"b\"");
  has(false, "can never be satisfied");
}

TEST(GrammarSchema, HostileSchemasAreBounded) {
  // Deep nesting: an error, not a stack overflow.
  json deep = {{"type", "string"}};
  for (int i = 0; i < 1000; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_NE(error_of(deep).find("deeper than"), std::string::npos);
  // Many large bounded strings: the grammar size cap.
  json props = json::object();
  for (int i = 0; i < 100; ++i)
    props["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 9000 + i}};
  EXPECT_NE(error_of({{"type", "object"}, {"properties", props}}).find("too large"),
            std::string::npos);
  // A wide anyOf of equal alternatives: equal subschemas share one rule, so the parse stacks
  // stay those of a single string (one per way a character can start, plus the closing quote).
  json alts = json::array();
  for (int i = 0; i < 200; ++i) alts.push_back({{"type", "string"}});
  const Grammar g = compile({{"anyOf", alts}});
  const Grammar one = compile({{"type", "string"}});
  GrammarMatcher m(g), m1(one);
  const auto s = m.accepts(m.initial(), "\"abc");
  const auto s1 = m1.accepts(m1.initial(), "\"abc");
  ASSERT_TRUE(s.has_value() && s1.has_value());
  EXPECT_EQ(s->n_stacks(), s1->n_stacks());
  EXPECT_TRUE(full_match(g, "\"abc\""));
}

TEST(GrammarMatcher, StateCopiesAreIndependent) {
  const Grammar g = compile({{"enum", {"ab", "ac"}}});
  GrammarMatcher m(g);
  const auto s = m.accepts(m.initial(), "\"a");
  ASSERT_TRUE(s.has_value());
  GrammarMatcher::State copy = *s;
  const auto b = m.accepts(copy, "b\"");
  const auto c = m.accepts(*s, "c\"");
  ASSERT_TRUE(b && c);
  EXPECT_TRUE(GrammarMatcher::is_complete(*b));
  EXPECT_TRUE(GrammarMatcher::is_complete(*c));
  EXPECT_EQ(copy, *s);
  EXPECT_FALSE(m.accepts(*s, "d").has_value());
}

// ---- token masks on a tiny vocabulary ---------------------------------------------------------

std::vector<int32_t> allowed_ids(GrammarConstraint& c, int32_t n) {
  std::vector<uint64_t> bits;
  c.compute_mask(bits);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i) {
    if ((bits[i >> 6] >> (i & 63)) & 1u) ids.push_back(i);
  }
  return ids;
}

TEST(GrammarMask, TinyVocabulary) {
  //                               0     1      2    3     4    5    6       7     8   9
  const std::vector<std::string> v = {"{", "{\"", "\"", "a", "\"a", "}", "\"a\"", ":", "1", "12",
                                      //  10      11   12  13(eos)
                                      "\":1}", " ", "", ""};
  const TokenTrie trie(v, {13});
  const Grammar g = compile(json::parse(
      R"({"type":"object","properties":{"a":{"type":"integer","maximum":15}},"required":["a"]})"));
  GrammarConstraint c(g, trie);
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(c.accept(1));  // {"
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{3}));
  ASSERT_TRUE(c.accept(3));  // a
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{2, 10}));
  ASSERT_TRUE(c.accept(2));  // "
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{7, 11}));
  ASSERT_TRUE(c.accept(7));
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{8, 9, 11}));
  ASSERT_TRUE(c.accept(9));   // 12
  EXPECT_FALSE(c.allows(8));  // 121 > 15
  EXPECT_FALSE(c.accept(8));  // rejected: unchanged
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{5, 11}));
  EXPECT_FALSE(c.allows(13));
  ASSERT_TRUE(c.accept(5));
  EXPECT_TRUE(c.is_complete());
  EXPECT_EQ(allowed_ids(c, 14), (std::vector<int32_t>{13}));  // only EOS; the empty piece never
  // allows() agrees with the mask for every token in every state reached above.
}

TEST(GrammarMask, AllowsAgreesWithMaskEverywhere) {
  std::vector<std::string> v;
  for (const char* p :
       {"{",   "}",   "\"",   ",",    ":",        " ",      "\n",     "[",    "]",   "1",  "0",
        "-",   ".",   "e",    "a",    "b",        "\"a\":", "\"b\":", "true", "tr",  "ue", "null",
        "{\"", "\"}", "\xC3", "\xA9", "\xC3\xA9", "\\",     "n",      "u",    "00e9"}) {
    v.push_back(p);
  }
  v.push_back("");  // eos
  const auto eos = static_cast<int32_t>(v.size() - 1);
  const TokenTrie trie(v, {eos});
  const Grammar g = compile(json::parse(R"({"type":"object","properties":{
      "a":{"type":"array","items":{"type":"number"}},"b":{"type":"string"}}})"));
  GrammarConstraint c(g, trie);
  // A fixed walk through the grammar; at each step compare allows() with the mask bit.
  // {"a":[1.1,-10e1],"b":"\u00e9\n\u00e9\u00e9"} with the last character split into bytes.
  const std::vector<int32_t> path = {22, 14, 2,  4, 7,  9,  12, 9,  3,  11, 9,  10, 13, 9,
                                     8,  3,  17, 2, 26, 27, 28, 27, 29, 30, 24, 25, 23};
  for (size_t step = 0; step <= path.size(); ++step) {
    std::vector<uint64_t> bits;
    c.compute_mask(bits);
    for (int32_t id = 0; id < static_cast<int32_t>(v.size()); ++id) {
      EXPECT_EQ(c.allows(id), static_cast<bool>((bits[id >> 6] >> (id & 63)) & 1u))
          << "step " << step << " token " << id;
    }
    if (step < path.size()) {
      ASSERT_TRUE(c.accept(path[step])) << "step " << step;
    }
  }
  EXPECT_TRUE(c.is_complete());
}

TEST(GrammarMask, CachedMaskKeysOnCompleteness) {
  // Two states with the same stacks, one complete: the mask cache must not confuse them (only the
  // complete one allows EOS).
  const std::vector<std::string> v = {"1", "2", ""};
  const TokenTrie trie(v, {2});
  const Grammar g = compile({{"type", "integer"}, {"minimum", 0}});
  GrammarConstraint c(g, trie);
  ASSERT_TRUE(c.accept(0));
  ASSERT_TRUE(c.is_complete());
  GrammarMatcher::State incomplete = c.state();
  incomplete.complete = false;
  GrammarConstraint other(c);
  other.set_state(incomplete);
  EXPECT_EQ(allowed_ids(other, 3), (std::vector<int32_t>{0, 1}));
  other.set_state(c.state());  // same caches, now the complete state
  EXPECT_EQ(allowed_ids(other, 3), (std::vector<int32_t>{0, 1, 2}));
}

TEST(GrammarMask, SamplerHookIsLazyAndMasks) {
  const std::vector<std::string> v = {"x", "[", "]", "1", ""};
  const TokenTrie trie(v, {4});
  const Grammar g = compile({{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 1}});
  GrammarConstraint c(g, trie);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler s(greedy, 5);
  std::vector<float> logits = {5, 1, 0, 0, 0};  // "x" is best but not allowed
  EXPECT_EQ(s.sample(logits.data(), {}, &c), 1);
  EXPECT_EQ(logits[0], -std::numeric_limits<float>::infinity());  // masked on rejection
  ASSERT_TRUE(c.accept(1));
  logits = {0, 0, 1, 3, 2};  // "1" allowed: taken without masking
  EXPECT_EQ(s.sample(logits.data(), {}, &c), 3);
  EXPECT_EQ(logits[4], 2.0f);
  ASSERT_TRUE(c.accept(3));
  logits = {0, 0, 1, 0, 3};  // EOS not yet: "]" or more digits
  EXPECT_EQ(s.sample(logits.data(), {}, &c), 2);
  ASSERT_TRUE(c.accept(2));
  logits = {9, 9, 9, 9, -5};  // complete: only EOS
  EXPECT_EQ(s.sample(logits.data(), {}, &c), 4);
  // Speculative verification: a draft the grammar rejects is never accepted.
  GrammarConstraint fresh(g, trie);
  logits = {5, 1, 0, 0, 0};
  const DraftVerdict d = s.verify(logits.data(), {}, 0, nullptr, &fresh);
  EXPECT_FALSE(d.accepted);
  EXPECT_EQ(d.token, 1);
  // With temperature: every draw is an allowed token.
  SamplingParams warm;
  warm.temperature = 1.0f;
  warm.top_k = 0;
  warm.top_p = 1.0f;
  warm.min_p = 0.0f;
  Sampler t(warm, 5);
  for (int i = 0; i < 200; ++i) {
    logits = {3, 0, 0, 3, 3};
    EXPECT_EQ(t.sample(logits.data(), {}, &fresh), 1);
    logits = {3, 0, 0, 3, 3};
    const DraftVerdict dv = t.verify(logits.data(), {}, 0, nullptr, &fresh);
    EXPECT_FALSE(dv.accepted);
    EXPECT_EQ(dv.token, 1);
  }
}

}  // namespace
}  // namespace bie::grammar
