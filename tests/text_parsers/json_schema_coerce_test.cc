#include "text/json_schema_coerce.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace m3::text {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// Coerces `text` against a bare schema (its own root for $refs).
ojson coerce(const json& schema, std::string_view text) { return coerce_text({&schema, &schema}, text); }

MarkupElement leaf(std::string name, std::string raw) { return {std::move(name), std::move(raw), {}, false}; }

MarkupElement node(std::string name, std::vector<MarkupElement> children, std::string raw = "<markup>") {
  return {std::move(name), std::move(raw), std::move(children), false};
}

TEST(JsonSchemaCoerce, StringsKeepTheTextExactly) {
  EXPECT_EQ(coerce({{"type", "string"}}, "  42\n"), "  42\n");
  EXPECT_EQ(coerce({{"type", "string"}}, "null"), "null");
  EXPECT_EQ(coerce({{"enum", {"a", "b"}}}, " true"), " true");
}

TEST(JsonSchemaCoerce, IntegersAreParsedStrictly) {
  const json integer = {{"type", "integer"}};
  EXPECT_EQ(coerce(integer, "42"), 42);
  EXPECT_EQ(coerce(integer, " -7\n"), -7);
  EXPECT_EQ(coerce(integer, "018956"), 18956);
  EXPECT_EQ(coerce(integer, "5.0"), 5);
  EXPECT_EQ(coerce(integer, "1e3"), 1000);
  EXPECT_EQ(coerce(integer, "18446744073709551615"), 18446744073709551615ull);
  EXPECT_EQ(coerce(integer, "5.5"), "5.5");
  EXPECT_EQ(coerce(integer, "five"), "five");
  EXPECT_EQ(coerce(integer, "42abc"), "42abc");
  EXPECT_EQ(coerce(integer, "+1"), "+1");
  EXPECT_EQ(coerce(integer, "99999999999999999999999"), "99999999999999999999999");
}

TEST(JsonSchemaCoerce, NumbersAreParsedStrictly) {
  const json number = {{"type", "number"}};
  EXPECT_EQ(coerce(number, "3.25"), 3.25);
  EXPECT_EQ(coerce(number, "-1e-3"), -0.001);
  EXPECT_EQ(coerce(number, "7"), 7);
  EXPECT_TRUE(coerce(number, "7").is_number_integer());
  EXPECT_EQ(coerce(number, ".5"), ".5");
  EXPECT_EQ(coerce(number, "1."), "1.");
  EXPECT_EQ(coerce(number, "NaN"), "NaN");
  EXPECT_EQ(coerce(number, "1e999"), "1e999");
  EXPECT_EQ(coerce(number, "0x10"), "0x10");
}

TEST(JsonSchemaCoerce, BooleansAndNull) {
  EXPECT_EQ(coerce({{"type", "boolean"}}, "true"), true);
  EXPECT_EQ(coerce({{"type", "boolean"}}, " FALSE "), false);
  EXPECT_EQ(coerce({{"type", "boolean"}}, "yes"), "yes");
  EXPECT_EQ(coerce({{"type", "boolean"}}, "1"), "1");
  EXPECT_TRUE(coerce({{"type", {"integer", "null"}}}, "null").is_null());
  EXPECT_EQ(coerce({{"type", {"integer", "null"}}}, "3"), 3);
  EXPECT_TRUE(coerce({{"type", "string"}, {"nullable", true}}, "null").is_null());
  EXPECT_EQ(coerce({{"type", "string"}, {"nullable", true}}, " abc"), " abc");
}

TEST(JsonSchemaCoerce, ObjectsAndArraysFromJsonText) {
  EXPECT_EQ(coerce({{"type", "object"}}, R"({"a": [1, 2]})"), ojson::parse(R"({"a":[1,2]})"));
  EXPECT_EQ(coerce({{"type", "array"}}, " [1, \"x\"] "), ojson::parse(R"([1,"x"])"));
  EXPECT_EQ(coerce({{"type", "object"}}, ""), ojson::object());
  EXPECT_EQ(coerce({{"type", "array"}}, "\n"), ojson::array());
  EXPECT_EQ(coerce({{"type", "object"}}, "[1]"), "[1]");
  EXPECT_EQ(coerce({{"type", "array"}}, "{not json"), "{not json");
  // Key order of the model's JSON is kept.
  EXPECT_EQ(to_json_text(coerce({{"type", "object"}}, R"({"z":1,"a":2})")), R"({"z":1,"a":2})");
}

TEST(JsonSchemaCoerce, UnionsTryTypesInAFixedOrder) {
  const json any_of = {{"anyOf", {{{"type", "string"}}, {{"type", "integer"}}}}};
  EXPECT_EQ(coerce(any_of, "12"), 12);
  EXPECT_EQ(coerce(any_of, "twelve"), "twelve");
  EXPECT_EQ(coerce(any_of, ""), "");
  const json one_of = {{"oneOf", {{{"type", "boolean"}}, {{"type", "array"}}}}};
  EXPECT_EQ(coerce(one_of, "[true]"), ojson::parse("[true]"));
  EXPECT_EQ(coerce(one_of, "True"), true);
  EXPECT_EQ(coerce({{"type", {"number", "string"}}}, "2.5"), 2.5);
  EXPECT_EQ(coerce({{"enum", {1, 2, 3}}}, "2"), 2);
  EXPECT_EQ(coerce({{"const", false}}, "false"), false);
}

TEST(JsonSchemaCoerce, SchemaWithoutTypesTakesJsonText) {
  EXPECT_EQ(coerce(json::object(), "5"), 5);
  EXPECT_EQ(coerce({{"description", "anything"}}, "{\"a\":1}"), ojson::parse("{\"a\":1}"));
  EXPECT_EQ(coerce(json::object(), "hello"), "hello");
  EXPECT_EQ(coerce(json::object(), " \"quoted\" "), "quoted");
  EXPECT_EQ(coerce({{"type", "frobnicate"}}, "7"), 7);
}

TEST(JsonSchemaCoerce, UnknownParametersKeepTheirText) {
  EXPECT_EQ(coerce_text({}, "42"), "42");
  EXPECT_EQ(coerce_text({}, "{\"a\":1}"), "{\"a\":1}");
}

TEST(JsonSchemaCoerce, LocalRefsAreFollowed) {
  const json root = json::parse(R"({
    "type": "object",
    "$defs": {"Count": {"type": "integer"}, "Loop": {"$ref": "#/$defs/Loop"}},
    "definitions": {"Point": {"type": "object", "properties": {"x": {"$ref": "#/$defs/Count"}}}},
    "properties": {"n": {"$ref": "#/$defs/Count"}, "p": {"$ref": "#/definitions/Point"},
                   "loop": {"$ref": "#/$defs/Loop"}, "dangling": {"$ref": "#/$defs/Nope"}}
  })");
  const json tools = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", root}}}}};
  const ToolSchemas schemas(tools);
  EXPECT_EQ(coerce_text(schemas.parameter("f", "n"), "3"), 3);
  EXPECT_EQ(coerce_element(schemas.parameter("f", "p"), node("p", {leaf("x", "4")})), ojson::parse(R"({"x":4})"));
  EXPECT_EQ(coerce_text(schemas.parameter("f", "loop"), "3"), 3);      // cycle: no type known
  EXPECT_EQ(coerce_text(schemas.parameter("f", "dangling"), "3"), 3);  // unresolved: no type known
  EXPECT_EQ(schemas.parameter("f", "missing").node, nullptr);
  EXPECT_EQ(schemas.parameter("g", "n").node, nullptr);
  EXPECT_TRUE(schemas.has_tool("f"));
}

TEST(JsonSchemaCoerce, NestedElementsFollowTheSchema) {
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "city": {"type": "string"}, "zip": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string"}},
      "points": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
      "extra": {"type": "object", "additionalProperties": {"type": "boolean"}}
    }
  })");
  const MarkupElement order = node(
      "shipping", {leaf("city", "Singapore"), leaf("zip", "018956"),
                   node("tags", {leaf("item", "a"), leaf("item", "7")}),
                   node("points", {node("item", {leaf("x", "1.5")}), node("item", {leaf("x", "2")})}),
                   node("extra", {leaf("fast", "true"), leaf("cheap", "no")}), leaf("unknown", "12")});
  EXPECT_EQ(to_json_text(coerce_element({&schema, &schema}, order)),
            R"({"city":"Singapore","zip":18956,"tags":["a","7"],"points":[{"x":1.5},{"x":2}],)"
            R"("extra":{"fast":true,"cheap":"no"},"unknown":"12"})");
}

TEST(JsonSchemaCoerce, RepeatedChildrenFoldIntoArrays) {
  const json schema = json::parse(R"({"type":"object","properties":{"tag":{"type":"array","items":{"type":"integer"}}}})");
  EXPECT_EQ(to_json_text(coerce_element({&schema, &schema}, node("o", {leaf("tag", "1"), leaf("tag", "2"), leaf("b", "x"), leaf("b", "y")}))),
            R"({"tag":[1,2],"b":["x","y"]})");
}

TEST(JsonSchemaCoerce, ArraysTakeChildrenWhateverTheirNames) {
  const json schema = {{"type", "array"}, {"items", {{"type", "integer"}}}};
  EXPECT_EQ(coerce_element({&schema, &schema}, node("a", {leaf("x", "1"), leaf("y", "2")})), ojson::parse("[1,2]"));
}

TEST(JsonSchemaCoerce, WithoutSchemaItemsMakeArraysAndOtherNamesObjects) {
  EXPECT_EQ(coerce_element({}, node("a", {leaf("item", "1"), leaf("item", "2")})), ojson::parse(R"(["1","2"])"));
  EXPECT_EQ(coerce_element({}, node("a", {leaf("k", "1"), leaf("item", "2")})), ojson::parse(R"({"k":"1","item":"2"})"));
}

TEST(JsonSchemaCoerce, StructureWhereOnlyScalarsFitKeepsTheRawText) {
  const json schema = {{"type", "integer"}};
  EXPECT_EQ(coerce_element({&schema, &schema}, node("n", {leaf("x", "1")}, "raw <x>1</x>")), "raw <x>1</x>");
  MarkupElement mixed = node("o", {leaf("x", "1")}, "text and <x>1</x>");
  mixed.has_text = true;
  const json object = {{"type", "object"}};
  EXPECT_EQ(coerce_element({&object, &object}, mixed), "text and <x>1</x>");
}

TEST(JsonSchemaCoerce, EscapingMatchesNlohmann) {
  std::string raw = "q\"b\\s/\b\f\n\r\t";
  raw += '\x01';
  raw += '\x1f';
  raw += "\x7f é🙂";
  std::string mine;
  append_json_string_body(mine, raw);
  EXPECT_EQ("\"" + mine + "\"", json(raw).dump());
}

TEST(JsonSchemaCoerce, ToolsMustHaveNames) {
  EXPECT_NO_THROW(ToolSchemas(json(nullptr)));
  EXPECT_NO_THROW(ToolSchemas(json::array()));
  EXPECT_NO_THROW(ToolSchemas(json::parse(R"([{"name":"bare","parameters":{}}])")));
  EXPECT_THROW(ToolSchemas(json::parse(R"([{"type":"function","function":{"parameters":{}}}])")), m3::Error);
  EXPECT_THROW(ToolSchemas(json::parse(R"({"type":"function"})")), m3::Error);
}

}  // namespace
}  // namespace m3::text
