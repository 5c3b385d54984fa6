// A small recursive-descent JSON parser (RFC 8259) and typed config access.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "dtensor/config.h"
#include "dtensor/error.h"

namespace dtensor {

// ---- JsonValue -----------------------------------------------------------------------------

JsonValue JsonValue::boolean(bool value) {
  JsonValue v;
  v.kind_ = Kind::Bool;
  v.bool_ = value;
  return v;
}

JsonValue JsonValue::number(double value, bool is_integer, int64_t integer) {
  JsonValue v;
  v.kind_ = Kind::Number;
  v.number_ = value;
  v.is_integer_ = is_integer;
  v.integer_ = is_integer ? integer : 0;
  return v;
}

JsonValue JsonValue::string(std::string value) {
  JsonValue v;
  v.kind_ = Kind::String;
  v.string_ = std::move(value);
  return v;
}

JsonValue JsonValue::array(std::vector<JsonValue> items) {
  JsonValue v;
  v.kind_ = Kind::Array;
  v.array_ = std::make_shared<const std::vector<JsonValue>>(std::move(items));
  return v;
}

JsonValue JsonValue::object(std::vector<std::pair<std::string, JsonValue>> members) {
  JsonValue v;
  v.kind_ = Kind::Object;
  v.object_ = std::make_shared<const std::vector<std::pair<std::string, JsonValue>>>(std::move(members));
  return v;
}

const char* JsonValue::kind_name(Kind kind) {
  switch (kind) {
    case Kind::Null: return "null";
    case Kind::Bool: return "a boolean";
    case Kind::Number: return "a number";
    case Kind::String: return "a string";
    case Kind::Array: return "an array";
    case Kind::Object: return "an object";
  }
  return "?";
}

bool JsonValue::as_bool() const {
  DT_CHECK_ARG(is_bool(), "json", "expected a boolean, got ", dump());
  return bool_;
}

double JsonValue::as_double() const {
  DT_CHECK_ARG(is_number(), "json", "expected a number, got ", dump());
  return is_integer_ ? static_cast<double>(integer_) : number_;
}

int64_t JsonValue::as_int() const {
  DT_CHECK_ARG(is_number(), "json", "expected an integer, got ", dump());
  if (is_integer_) return integer_;
  // 1e3 is a whole number written with an exponent: accept it when exact.
  DT_CHECK_ARG(std::isfinite(number_) && std::floor(number_) == number_ && std::fabs(number_) < 9.007e15,
               "json", "expected an integer, got ", dump());
  return static_cast<int64_t>(number_);
}

const std::string& JsonValue::as_string() const {
  DT_CHECK_ARG(is_string(), "json", "expected a string, got ", dump());
  return string_;
}

const std::vector<JsonValue>& JsonValue::as_array() const {
  DT_CHECK_ARG(is_array(), "json", "expected an array, got ", dump());
  return *array_;
}

const std::vector<std::pair<std::string, JsonValue>>& JsonValue::as_object() const {
  DT_CHECK_ARG(is_object(), "json", "expected an object, got ", dump());
  return *object_;
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : *object_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

void dump_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

}  // namespace

std::string JsonValue::dump() const {
  std::string out;
  switch (kind_) {
    case Kind::Null: return "null";
    case Kind::Bool: return bool_ ? "true" : "false";
    case Kind::Number: {
      if (is_integer_) return std::to_string(integer_);
      // -0 would read back as the integer 0; keep it a double, sign and all.
      if (number_ == 0 && std::signbit(number_)) return "-0.0";
      // The shortest form that reads back exactly: 3e-4 prints as 0.0003, not as
      // 0.00029999999999999997.
      char buf[32];
      for (int precision = 15; precision <= 17; ++precision) {
        std::snprintf(buf, sizeof(buf), "%.*g", precision, number_);
        if (std::strtod(buf, nullptr) == number_) break;
      }
      return buf;
    }
    case Kind::String: dump_string(out, string_); return out;
    case Kind::Array:
      out = "[";
      for (size_t i = 0; i < array_->size(); ++i) {
        if (i) out.push_back(',');
        out += (*array_)[i].dump();
      }
      return out + "]";
    case Kind::Object:
      out = "{";
      for (size_t i = 0; i < object_->size(); ++i) {
        if (i) out += ",";
        dump_string(out, (*object_)[i].first);
        out.push_back(':');
        out += (*object_)[i].second.dump();
      }
      return out + "}";
  }
  return out;
}

// ---- parser ------------------------------------------------------------------------------

namespace {

// Nesting beyond this is surely a broken file, and recursion must stay bounded.
constexpr int kMaxDepth = 256;

class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  JsonValue document() {
    skip_space();
    JsonValue v = value(0);
    skip_space();
    if (pos_ < text_.size()) fail("the end of the document", describe_here());
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected, const std::string& got) const {
    // Line and column of pos_, both 1-based; columns count bytes.
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw std::invalid_argument(detail::concat("[json] ", source_, ":", line, ":", column, ": expected ",
                                               expected, ", got ", got));
  }

  std::string describe_here() const {
    if (pos_ >= text_.size()) return "the end of the input";
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c < 0x20) return detail::concat("control character 0x", std::hex, static_cast<int>(c));
    return detail::concat("'", text_[pos_], "'");
  }

  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  // After an element of an object or array: true at ',' (another follows), false at
  // the closing bracket; anything else is an error.
  bool another_element(char close, const char* expected) {
    skip_space();
    if (consume(',')) return true;
    if (consume(close)) return false;
    fail(expected, describe_here());
  }

  bool consume_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail(detail::concat("nesting of at most ", kMaxDepth, " levels"), "deeper");
    if (pos_ >= text_.size()) fail("a value", "the end of the input");
    const char c = text_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return JsonValue::string(string());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (consume_literal("true")) return JsonValue::boolean(true);
    if (consume_literal("false")) return JsonValue::boolean(false);
    if (consume_literal("null")) return JsonValue();
    fail("a value (object, array, string, number, true, false or null)", describe_here());
  }

  JsonValue object(int depth) {
    ++pos_;  // '{'
    std::vector<std::pair<std::string, JsonValue>> members;
    skip_space();
    if (consume('}')) return JsonValue::object(std::move(members));
    do {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != '"') fail("a string key", describe_here());
      const size_t key_pos = pos_;
      std::string key = string();
      for (const auto& member : members) {
        if (member.first == key) {
          pos_ = key_pos;
          fail("unique keys", detail::concat("\"", key, "\" a second time"));
        }
      }
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] != ':') fail("':' after the key", describe_here());
      ++pos_;
      skip_space();
      JsonValue v = value(depth + 1);
      members.emplace_back(std::move(key), std::move(v));
    } while (another_element('}', "',' or '}' after an object member"));
    return JsonValue::object(std::move(members));
  }

  JsonValue array(int depth) {
    ++pos_;  // '['
    std::vector<JsonValue> items;
    skip_space();
    if (consume(']')) return JsonValue::array(std::move(items));
    do {
      skip_space();
      items.push_back(value(depth + 1));
    } while (another_element(']', "',' or ']' after an array element"));
    return JsonValue::array(std::move(items));
  }

  uint32_t hex4() {
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      if (pos_ >= text_.size()) fail("4 hex digits after \\u", "the end of the input");
      const char h = text_[pos_];
      const int digit = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
      if (digit < 0) fail("4 hex digits after \\u", describe_here());
      code = code * 16 + static_cast<uint32_t>(digit);
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("a closing '\"'", "the end of the input");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("an escaped control character in a string", describe_here());
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) fail("an escape character after '\\'", "the end of the input");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t code = hex4();
          if (code >= 0xD800 && code <= 0xDBFF) {
            // A high surrogate must be followed by \u and a low one.
            if (!consume_literal("\\u")) fail("a low surrogate \\uDC00-\\uDFFF after a high one", describe_here());
            const uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("a low surrogate \\uDC00-\\uDFFF", detail::concat("\\u", std::hex, low));
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            fail("a high surrogate before a low one", detail::concat("\\u", std::hex, code));
          }
          append_utf8(out, code);
          break;
        }
        default:
          --pos_;
          fail("one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u", describe_here());
      }
    }
  }

  JsonValue number() {
    const size_t start = pos_;
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    if (pos_ >= text_.size() || !(text_[pos_] >= '0' && text_[pos_] <= '9')) fail("a digit", describe_here());
    if (text_[pos_] == '0') {
      ++pos_;
      if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') fail("no leading zeros", describe_here());
    } else {
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (pos_ >= text_.size() || !(text_[pos_] >= '0' && text_[pos_] <= '9')) fail("a digit after '.'", describe_here());
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (pos_ >= text_.size() || !(text_[pos_] >= '0' && text_[pos_] <= '9')) fail("a digit in the exponent", describe_here());
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    }
    const std::string literal(text_.substr(start, pos_ - start));
    const double value = std::strtod(literal.c_str(), nullptr);
    // JSON has no infinities: 1e400 would dump as "inf", which no parser reads back.
    if (!std::isfinite(value)) {
      pos_ = start;
      fail("a number within the range of a double", literal);
    }
    if (integral) {
      errno = 0;
      const long long integer = std::strtoll(literal.c_str(), nullptr, 10);
      // Out of int64 range: keep it as a (rounded) double rather than failing.
      if (errno != ERANGE) return JsonValue::number(value, true, integer);
    }
    return JsonValue::number(value);
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

JsonValue parse_json(std::string_view text, const std::string& source) {
  return Parser(text, source).document();
}

// ---- Config ------------------------------------------------------------------------------

Config::Config(JsonValue value, std::string prefix, std::string source)
    : value_(std::move(value)), prefix_(std::move(prefix)), source_(std::move(source)) {}

Config Config::parse(std::string_view text, const std::string& source) {
  JsonValue v = parse_json(text, source);
  DT_CHECK_ARG(v.is_object(), "config", source, ": expected a JSON object at the top level, got ",
               JsonValue::kind_name(v.kind()));
  return Config(std::move(v), "", source);
}

Config Config::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DT_CHECK_ARG(in.good(), "config", "cannot open config file \"", path, "\"");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(text, path);
}

const JsonValue* Config::lookup(std::string_view key) const { return value_.find(key); }

std::string Config::full_key(std::string_view key) const { return prefix_ + std::string(key); }

bool Config::has(std::string_view key) const { return lookup(key) != nullptr; }

// A null value counts as absent, so "steps": null asks for the default.
bool Config::present(std::string_view key) const {
  const JsonValue* v = lookup(key);
  return v != nullptr && !v->is_null();
}

std::vector<std::string> Config::keys() const {
  std::vector<std::string> out;
  for (const auto& member : value_.as_object()) out.push_back(member.first);
  return out;
}

std::vector<std::string> Config::unknown_keys(const std::vector<std::string>& known) const {
  std::vector<std::string> out;
  for (const std::string& key : keys()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) out.push_back(full_key(key));
  }
  return out;
}

void Config::type_error(std::string_view key, const char* expected, const JsonValue& got) const {
  throw std::invalid_argument(detail::concat("[config] key \"", full_key(key), "\": expected ", expected,
                                             ", got ", got.dump()));
}

const JsonValue& Config::get(std::string_view key) const {
  const JsonValue* v = lookup(key);
  DT_CHECK_ARG(v != nullptr, "config", "key \"", full_key(key), "\": missing",
               source_.empty() ? std::string() : detail::concat(" in ", source_));
  return *v;
}

const JsonValue& Config::get_checked(std::string_view key, bool (JsonValue::*is_kind)() const,
                                     const char* expected) const {
  const JsonValue& v = get(key);
  if (!(v.*is_kind)()) type_error(key, expected, v);
  return v;
}

int64_t Config::get_int(std::string_view key) const {
  const JsonValue& v = get_checked(key, &JsonValue::is_number, "an integer");
  try {
    return v.as_int();
  } catch (const std::invalid_argument&) {  // a fraction: name the key in the message
    type_error(key, "an integer", v);
  }
}

double Config::get_double(std::string_view key) const {
  return get_checked(key, &JsonValue::is_number, "a number").as_double();
}

std::string Config::get_string(std::string_view key) const {
  return get_checked(key, &JsonValue::is_string, "a string").as_string();
}

bool Config::get_bool(std::string_view key) const {
  return get_checked(key, &JsonValue::is_bool, "true or false").as_bool();
}

int64_t Config::get_int(std::string_view key, int64_t fallback) const {
  return present(key) ? get_int(key) : fallback;
}

double Config::get_double(std::string_view key, double fallback) const {
  return present(key) ? get_double(key) : fallback;
}

std::string Config::get_string(std::string_view key, const std::string& fallback) const {
  return present(key) ? get_string(key) : fallback;
}

bool Config::get_bool(std::string_view key, bool fallback) const {
  return present(key) ? get_bool(key) : fallback;
}

Config Config::get_object(std::string_view key) const {
  if (!present(key)) return Config(JsonValue::object({}), full_key(key) + ".", source_);
  return Config(get_checked(key, &JsonValue::is_object, "an object"), full_key(key) + ".", source_);
}

}  // namespace dtensor
