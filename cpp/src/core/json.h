// A small JSON reader for config.json and safetensors headers (no writer needed in the core).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace revolta {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  static Json parse(const std::string& text);  // throws std::runtime_error with the offset

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_bool() const { return type_ == Type::kBool; }

  double as_number() const;
  int64_t as_int() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const std::vector<Json>& as_array() const;
  const std::map<std::string, Json>& as_object() const;

  bool contains(const std::string& key) const;
  // Member access; a missing key returns a null Json.
  const Json& operator[](const std::string& key) const;

  // Typed lookups with defaults for optional config fields (null counts as missing).
  double get_number(const std::string& key, double def) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> array_;
  std::map<std::string, Json> object_;
};

}  // namespace revolta
