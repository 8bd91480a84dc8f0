// The field table: every config key once, with a reference to its member and its documentation.
// Parsing, overriding, printing, unknown-key detection and docs/CONFIG.md all walk this table.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace gpt::config {

// An enum-valued key: its value as an index into its names (EnumNames, base/common.hpp).
struct EnumRef {
  uint8_t* value;  // the enum member, seen as its underlying uint8_t
  const char* const* names;
  int n;
  bool bool_names = false;  // `false` / `true` read as names[0] / names[1] (a key that was a boolean once)
  template <class E>
  EnumRef(E* e) : value(reinterpret_cast<uint8_t*>(e)), names(EnumNames<E>::names),
                  n(int(sizeof(EnumNames<E>::names) / sizeof(const char*))) {
    if constexpr (has_bool_names<E>(0)) bool_names = EnumNames<E>::bool_names;
  }
  template <class E>
  static constexpr bool has_bool_names(decltype(EnumNames<E>::bool_names)) { return true; }
  template <class E>
  static constexpr bool has_bool_names(...) { return false; }
  std::string choices() const;  // "bf16, fp32, fp8"
};
using FieldRef = std::variant<int*, int64_t*, uint64_t*, float*, bool*, std::string*, MicroBatch*,
                              EvalBatches*, EnumRef>;
struct Field {
  const char* key;  // dotted: section.name
  FieldRef ref;
  const char* doc;  // one line, Markdown
};

std::vector<Field> fields_of(Config& c);
const Field* find_field(const std::vector<Field>& fs, const std::string& key);
std::string section_of(const std::string& key);

// Sets a field from a YAML scalar; `line` (0-based, or -1) goes into the error message.
void set_field(const Field& f, const YAML::Node& n, int line);
// The field's value as a YAML scalar.
std::string field_text(const Field& f);
// "int", "float", "bool", "string", "int or `max`", "int or `all`", "`bf16` / `fp32` / `fp8`"
std::string type_name(const Field& f);

}  // namespace gpt::config
