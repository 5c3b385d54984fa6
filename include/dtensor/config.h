// JSON values and configuration files (the `--config FILE` of the examples, in the
// manner of DeepSpeed configs).
//
//   Config config = Config::from_file("train.json");
//   int64_t steps = config.get_int("steps", 100);        // default when absent
//   Config optim = config.get_object("optimizer");        // errors say "optimizer.lr"
//   for (const std::string& key : config.unknown_keys({"steps", "optimizer"})) ...
//
// The parser takes standard JSON (RFC 8259): objects, arrays, strings with every
// escape including \uXXXX surrogate pairs, numbers, true, false, null. Syntax errors
// name the source, line and column: `[json] train.json:3:12: expected ',' or '}'
// after an object member, got '"'`. Typed access names the key and what was expected
// against what was found: `[config] key "steps": expected an integer, got "ten"`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtensor {

class JsonValue {
 public:
  enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };

  JsonValue() = default;  // null
  static JsonValue boolean(bool value);
  static JsonValue number(double value, bool is_integer = false, int64_t integer = 0);
  static JsonValue string(std::string value);
  static JsonValue array(std::vector<JsonValue> items);
  static JsonValue object(std::vector<std::pair<std::string, JsonValue>> members);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_number() const { return kind_ == Kind::Number; }
  // A number written without fraction or exponent that fits in int64 (exact).
  bool is_integer() const { return kind_ == Kind::Number && is_integer_; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Unchecked-kind accessors throw std::invalid_argument ("[json] expected ..., got ...").
  bool as_bool() const;
  double as_double() const;
  int64_t as_int() const;  // integers, and numbers like 1e3 that are whole and in range
  const std::string& as_string() const;
  const std::vector<JsonValue>& as_array() const;
  // Members in file order (duplicate keys are rejected by the parser).
  const std::vector<std::pair<std::string, JsonValue>>& as_object() const;
  // The member `key` of an object, or nullptr.
  const JsonValue* find(std::string_view key) const;

  // Compact JSON text of this value; a string value quoted.
  std::string dump() const;
  static const char* kind_name(Kind kind);  // "null", "a boolean", ...

 private:
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  bool is_integer_ = false;
  double number_ = 0;
  int64_t integer_ = 0;
  std::string string_;
  std::shared_ptr<const std::vector<JsonValue>> array_;
  std::shared_ptr<const std::vector<std::pair<std::string, JsonValue>>> object_;
};

// Parses one JSON document (surrounding whitespace allowed, nothing after it).
// `source` names the text in errors (a file path, or "<string>").
JsonValue parse_json(std::string_view text, const std::string& source = "<string>");

// Typed, key-checked access to a JSON object.
class Config {
 public:
  Config() : Config(JsonValue::object({}), "") {}
  // Throws when the document is not an object.
  static Config parse(std::string_view text, const std::string& source = "<string>");
  // Throws std::invalid_argument naming the path when it cannot be read.
  static Config from_file(const std::string& path);

  bool has(std::string_view key) const;
  std::vector<std::string> keys() const;  // in file order
  // Keys present but not in `known` (to report typos such as "stpes").
  std::vector<std::string> unknown_keys(const std::vector<std::string>& known) const;

  // Without a default the key must be present. With one, an absent key (or null)
  // gives the default; a present value of the wrong type is still an error.
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key) const;  // integers are accepted
  double get_double(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, const std::string& fallback) const;
  bool get_bool(std::string_view key) const;
  bool get_bool(std::string_view key, bool fallback) const;
  // A nested object (an empty Config when absent); its errors name "outer.inner".
  Config get_object(std::string_view key) const;
  // The raw value; throws when absent.
  const JsonValue& get(std::string_view key) const;

  const JsonValue& value() const { return value_; }
  const std::string& source() const { return source_; }

 private:
  Config(JsonValue value, std::string prefix, std::string source = "");
  const JsonValue* lookup(std::string_view key) const;
  bool present(std::string_view key) const;
  const JsonValue& get_checked(std::string_view key, bool (JsonValue::*is_kind)() const,
                               const char* expected) const;
  std::string full_key(std::string_view key) const;
  [[noreturn]] void type_error(std::string_view key, const char* expected, const JsonValue& got) const;

  JsonValue value_;
  std::string prefix_;  // "optimizer." for a nested object
  std::string source_;
};

}  // namespace dtensor
