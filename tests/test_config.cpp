// The JSON parser and typed config access: values, escapes, positions in syntax
// errors, and key-naming type errors.
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "dtensor/config.h"
#include "test_helpers.h"

using namespace dtensor;

TEST(Json, ParsesEveryKindOfValue) {
  const JsonValue v = parse_json(R"( {"a": [1, -2.5e1, true, false, null], "s": "q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00",
                                      "big": 9007199254740993, "nested": {"x": {}}, "empty": []} )");
  ASSERT_TRUE(v.is_object());
  const std::vector<JsonValue>& a = v.find("a")->as_array();
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[0].as_int(), 1);
  EXPECT_TRUE(a[0].is_integer());
  EXPECT_DOUBLE_EQ(a[1].as_double(), -25.0);
  EXPECT_FALSE(a[1].is_integer());
  EXPECT_TRUE(a[2].as_bool());
  EXPECT_FALSE(a[3].as_bool());
  EXPECT_TRUE(a[4].is_null());
  EXPECT_EQ(v.find("s")->as_string(), "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.find("big")->as_int(), 9007199254740993LL);  // exact beyond 2^53
  EXPECT_TRUE(v.find("nested")->find("x")->is_object());
  EXPECT_TRUE(v.find("empty")->as_array().empty());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(parse_json("[1,\"a\\n\",{\"k\":null}]").dump(), "[1,\"a\\n\",{\"k\":null}]");
  EXPECT_EQ(parse_json("1e3").as_int(), 1000);
}

TEST(Json, SyntaxErrorsNameLineAndColumn) {
  EXPECT_THROW_MSG(parse_json("{\n  \"a\": 1,\n  \"b\" 2\n}", "cfg.json"), std::invalid_argument,
                   "[json] cfg.json:3:7: expected ':' after the key, got '2'");
  EXPECT_THROW_MSG(parse_json("{\"a\": 1 \"b\": 2}"), std::invalid_argument,
                   "<string>:1:9: expected ',' or '}' after an object member, got '\"'");
  EXPECT_THROW_MSG(parse_json("[1, 2"), std::invalid_argument, "expected ',' or ']' after an array element, got the end of the input");
  EXPECT_THROW_MSG(parse_json("{\"a\": tru}"), std::invalid_argument, "1:7: expected a value");
  EXPECT_THROW_MSG(parse_json("\"abc"), std::invalid_argument, "expected a closing '\"', got the end of the input");
  EXPECT_THROW_MSG(parse_json("\"\\x\""), std::invalid_argument, "1:3: expected one of");
  EXPECT_THROW_MSG(parse_json("012"), std::invalid_argument, "expected no leading zeros");
  EXPECT_THROW_MSG(parse_json("1."), std::invalid_argument, "expected a digit after '.'");
  EXPECT_THROW_MSG(parse_json("{} x"), std::invalid_argument, "1:4: expected the end of the document, got 'x'");
  EXPECT_THROW_MSG(parse_json("{\"a\":1,\"a\":2}"), std::invalid_argument, "expected unique keys, got \"a\" a second time");
  EXPECT_THROW_MSG(parse_json("\"\\ud800x\""), std::invalid_argument, "low surrogate");
  EXPECT_THROW_MSG(parse_json(""), std::invalid_argument, "expected a value, got the end of the input");
  EXPECT_THROW_MSG(parse_json(std::string(300, '[')), std::invalid_argument, "nesting of at most 256 levels");
  // Found by tests/fuzz/fuzz_config: JSON has no infinity, and "inf" never parses back.
  EXPECT_THROW_MSG(parse_json("[5e1103]"), std::invalid_argument,
                   "1:2: expected a number within the range of a double, got 5e1103");
  EXPECT_THROW_MSG(parse_json("-1e400"), std::invalid_argument, "range of a double");
  EXPECT_EQ(parse_json("1e308").dump(), parse_json(parse_json("1e308").dump()).dump());
  // Also found by fuzz_config: -0 dumped as "-0", which reads back as the integer 0.
  EXPECT_EQ(parse_json("[1, -0e0]").dump(), "[1,-0.0]");
  EXPECT_EQ(parse_json(parse_json("-0.0").dump()).dump(), "-0.0");
}

TEST(Config, TypedAccessDefaultsAndErrorsNamingTheKey) {
  const Config c = Config::parse(R"({"steps": "ten", "lr": 3e-4, "batch": 16, "name": "gpt", "bf16": true,
                                     "ratio": 2.5, "optimizer": {"beta1": "x", "eps": 1e-8}, "unset": null})");
  EXPECT_EQ(c.get_int("batch"), 16);
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 3e-4);
  EXPECT_DOUBLE_EQ(c.get_double("batch"), 16.0);  // an integer is a number
  EXPECT_EQ(c.get_string("name"), "gpt");
  EXPECT_TRUE(c.get_bool("bf16"));
  EXPECT_EQ(c.get_int("absent", 7), 7);
  EXPECT_EQ(c.get_int("unset", 8), 8);  // null means "use the default"
  EXPECT_EQ(c.get_string("absent", "x"), "x");
  EXPECT_FALSE(c.get_bool("absent", false));
  EXPECT_DOUBLE_EQ(c.get_object("optimizer").get_double("eps"), 1e-8);
  EXPECT_TRUE(c.get_object("absent").keys().empty());

  EXPECT_THROW_MSG(c.get_int("steps"), std::invalid_argument, "[config] key \"steps\": expected an integer, got \"ten\"");
  EXPECT_THROW_MSG(c.get_int("steps", 5), std::invalid_argument, "expected an integer, got \"ten\"");
  EXPECT_THROW_MSG(c.get_int("ratio"), std::invalid_argument, "key \"ratio\": expected an integer, got 2.5");
  EXPECT_THROW_MSG(c.get_double("name"), std::invalid_argument, "key \"name\": expected a number, got \"gpt\"");
  EXPECT_THROW_MSG(c.get_bool("batch"), std::invalid_argument, "key \"batch\": expected true or false, got 16");
  EXPECT_THROW_MSG(c.get_string("bf16"), std::invalid_argument, "key \"bf16\": expected a string, got true");
  EXPECT_THROW_MSG(c.get_object("lr"), std::invalid_argument, "key \"lr\": expected an object, got 0.0003");
  EXPECT_THROW_MSG(c.get_object("optimizer").get_double("beta1"), std::invalid_argument,
                   "key \"optimizer.beta1\": expected a number, got \"x\"");
  EXPECT_THROW_MSG(c.get_int("stpes"), std::invalid_argument, "key \"stpes\": missing");

  EXPECT_EQ(c.keys(), (std::vector<std::string>{"steps", "lr", "batch", "name", "bf16", "ratio", "optimizer", "unset"}));
  EXPECT_EQ(c.unknown_keys({"steps", "lr", "batch", "name", "bf16", "optimizer"}),
            (std::vector<std::string>{"ratio", "unset"}));
  EXPECT_EQ(c.get_object("optimizer").unknown_keys({"eps"}), (std::vector<std::string>{"optimizer.beta1"}));
  EXPECT_THROW_MSG(Config::parse("[1]", "a.json"), std::invalid_argument,
                   "a.json: expected a JSON object at the top level, got an array");
}

TEST(Config, FromFile) {
  const std::string path = ::testing::TempDir() + "dtensor_config_" + std::to_string(::getpid()) + ".json";
  { std::ofstream out(path); out << "{\n  \"steps\": 20,\n  \"mesh\": \"dp=2\"\n}\n"; }
  const Config c = Config::from_file(path);
  EXPECT_EQ(c.get_int("steps"), 20);
  EXPECT_EQ(c.get_string("mesh"), "dp=2");
  EXPECT_EQ(c.source(), path);
  { std::ofstream out(path); out << "{\n  \"steps\": 20,\n}\n"; }
  EXPECT_THROW_MSG(Config::from_file(path), std::invalid_argument, path + ":3:1: expected a string key, got '}'");
  std::remove(path.c_str());
  EXPECT_THROW_MSG(Config::from_file("/nonexistent/c.json"), std::invalid_argument,
                   "[config] cannot open config file \"/nonexistent/c.json\"");
}
