#include "server/json_parse.h"

#include <gtest/gtest.h>

#include <string>

#include "server/api_error.h"

namespace m3::server {
namespace {

ApiError error_of(const std::string& text, std::string_view field = {}) {
  try {
    parse_client_json(text, "the request body", field);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "parsed: " << text.substr(0, 100);
  return ApiError(0, "");
}

TEST(ClientJson, ParsesLikeNlohmann) {
  const std::string text = R"({"b":[1,2.5,"x",null,true,{"c":{}}],"a":-3,"e":[],"b2":{"z":1,"y":[[]]}})";
  EXPECT_EQ(parse_client_json(text, "body"), Json::parse(text));
  EXPECT_EQ(parse_client_json(text, "body").dump(), Json::parse(text).dump());  // key order kept
  EXPECT_EQ(parse_client_json("7", "body"), Json(7));
  EXPECT_EQ(parse_client_json(R"({"k":1,"k":2})", "body"), Json::parse(R"({"k":1,"k":2})"));
}

TEST(ClientJson, NestingIsCappedWhileParsing) {
  const std::string at_cap = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(parse_client_json(at_cap, "body"), Json::parse(at_cap));
  const std::string deep = std::string(50000, '[') + std::string(50000, ']');
  ApiError e = error_of(deep);
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("more than 128 levels"), std::string::npos) << e.what();
  // The path names where it happened, bounded by the cap.
  ApiError in_field = error_of(R"({"messages":[{"content":)" + deep + "}]}");
  EXPECT_EQ(in_field.param().rfind("messages[0].content[0][0]", 0), 0u) << in_field.param();
  EXPECT_LT(in_field.param().size(), 1000u);
}

TEST(ClientJson, OverflowingNumbersNameTheField) {
  ApiError top = error_of(R"({"prompt":"x","temperature":1e999})");
  EXPECT_EQ(top.status(), 400);
  EXPECT_EQ(top.param(), "temperature");
  EXPECT_EQ(error_of(R"({"logit_bias":{"5":-1e999}})").param(), "logit_bias.5");
  EXPECT_EQ(error_of(R"({"a":[1,2,1e400]})").param(), "a[2]");
  EXPECT_EQ(error_of(R"({"x":1e999})", "messages[1].tool_calls[0].function.arguments").param(),
            "messages[1].tool_calls[0].function.arguments.x");
}

TEST(ClientJson, SyntaxErrorsAre400WithTheField) {
  ApiError e = error_of("{\"a\":", "tools");
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "tools");
  EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace m3::server
