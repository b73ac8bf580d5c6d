#include "core/json.h"

#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace revolta {

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  Json parse_document() {
    Json v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) {
    throw std::runtime_error(str_cat("invalid JSON at offset ", pos_, ": ", what));
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' ||
                                s_[pos_] == '\t'))
      ++pos_;
  }
  bool consume(const char* lit) {
    size_t n = std::char_traits<char>::length(lit);
    if (s_.compare(pos_, n, lit) == 0) {
      pos_ += n;
      return true;
    }
    return false;
  }

  Json parse_value(int depth) {
    if (depth > 256) fail("nesting too deep");
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    Json v;
    char c = s_[pos_];
    if (c == '{') {
      v.type_ = Json::Type::kObject;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected key");
        std::string key = parse_string();
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':'");
        ++pos_;
        v.object_[key] = parse_value(depth + 1);
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type_ = Json::Type::kArray;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        v.array_.push_back(parse_value(depth + 1));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type_ = Json::Type::kString;
      v.string_ = parse_string();
      return v;
    }
    if (consume("true")) {
      v.type_ = Json::Type::kBool;
      v.bool_ = true;
      return v;
    }
    if (consume("false")) {
      v.type_ = Json::Type::kBool;
      return v;
    }
    if (consume("null")) return v;
    // Python's json writes these for non-finite floats; accept them.
    if (consume("NaN")) return number(std::numeric_limits<double>::quiet_NaN());
    if (consume("Infinity")) return number(std::numeric_limits<double>::infinity());
    if (consume("-Infinity")) return number(-std::numeric_limits<double>::infinity());
    const char* begin = s_.c_str() + pos_;
    char* end = nullptr;
    double d = std::strtod(begin, &end);
    if (end == begin) fail("unexpected character");
    pos_ += size_t(end - begin);
    return number(d);
  }

  static Json number(double d) {
    Json v;
    v.type_ = Json::Type::kNumber;
    v.number_ = d;
    return v;
  }

  void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("bad \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') v |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= uint32_t(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xd800 && cp < 0xdc00 && consume("\\u")) {
            uint32_t lo = parse_hex4();
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
    fail("unterminated string");
  }

  const std::string& s_;
  size_t pos_ = 0;
};

Json Json::parse(const std::string& text) { return JsonParser(text).parse_document(); }

double Json::as_number() const {
  RV_CHECK(type_ == Type::kNumber, "JSON value is not a number");
  return number_;
}
int64_t Json::as_int() const { return int64_t(as_number()); }
bool Json::as_bool() const {
  RV_CHECK(type_ == Type::kBool, "JSON value is not a boolean");
  return bool_;
}
const std::string& Json::as_string() const {
  RV_CHECK(type_ == Type::kString, "JSON value is not a string");
  return string_;
}
const std::vector<Json>& Json::as_array() const {
  RV_CHECK(type_ == Type::kArray, "JSON value is not an array");
  return array_;
}
const std::map<std::string, Json>& Json::as_object() const {
  RV_CHECK(type_ == Type::kObject, "JSON value is not an object");
  return object_;
}
bool Json::contains(const std::string& key) const {
  return type_ == Type::kObject && object_.count(key) > 0;
}
const Json& Json::operator[](const std::string& key) const {
  static const Json null_value;
  if (type_ != Type::kObject) return null_value;
  auto it = object_.find(key);
  return it == object_.end() ? null_value : it->second;
}
double Json::get_number(const std::string& key, double def) const {
  const Json& v = (*this)[key];
  return v.is_null() ? def : v.as_number();
}
int64_t Json::get_int(const std::string& key, int64_t def) const {
  const Json& v = (*this)[key];
  return v.is_null() ? def : v.as_int();
}
bool Json::get_bool(const std::string& key, bool def) const {
  const Json& v = (*this)[key];
  return v.is_null() ? def : v.as_bool();
}
std::string Json::get_string(const std::string& key, const std::string& def) const {
  const Json& v = (*this)[key];
  return v.is_null() ? def : v.as_string();
}

}  // namespace revolta
