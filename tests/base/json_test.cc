// base/json.h: parse_json_strict's checks (a key named twice, nesting past kMaxJsonDepth, NUL
// bytes) and its cost: linear in the input. A request or data line of many sibling objects took
// quadratic time in nlohmann's callback parser (200k objects 16 s, a 15 MB line hours); 500k
// sibling objects here parse in well under a second, far inside the test's time limit.
#include "base/json.h"

#include <gtest/gtest.h>

#include <string>

#include "base/check.h"

namespace tt {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_json_strict(text);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Json, TheStrictChecks) {
  EXPECT_EQ(parse_json_strict(R"({"a": [1, {"b": 2}], "c": "d"})")["a"][1]["b"], 2);
  EXPECT_EQ(error_of(R"({"a": 1, "b": {"a": 2, "a": 3}})"),
            "duplicate key \"a\": a JSON object names each key once (a second value would silently replace the first)");
  EXPECT_EQ(error_of(std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']')),
            "arrays and objects nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  EXPECT_EQ(error_of(std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']')), "");
  EXPECT_EQ(error_of(std::string("[1,\0 2]", 7)), "a NUL byte at offset 3 (JSON text has none)");
  // Invalid JSON keeps nlohmann's own message, even with a duplicate key before the error.
  EXPECT_NE(error_of(R"({"a": 1, "a": 2, )").find("parse error"), std::string::npos);
}

TEST(Json, ManySiblingObjectsParseInLinearTime) {
  const int n = 500000;
  std::string text = "[";
  for (int i = 0; i < n; ++i) text += i ? ",{}" : "{}";
  text += "]";
  EXPECT_EQ(parse_json_strict(text).size(), (size_t)n);
  std::string obj = "{";
  for (int i = 0; i < n; ++i) obj += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":{}";
  obj += "}";
  EXPECT_EQ(parse_json_strict(obj).size(), (size_t)n);
}

}  // namespace
}  // namespace tt
