// The field table: every config key once, with a reference to its member and its documentation.
// Parsing, overriding, printing, unknown-key detection and docs/CONFIG.md all walk this table.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace gpt::config {

using FieldRef = std::variant<int*, int64_t*, uint64_t*, float*, bool*, std::string*, MicroBatch*,
                              EvalBatches*>;
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
// "int", "float", "bool", "string", "int or `max`", "int or `all`"
const char* type_name(const Field& f);

}  // namespace gpt::config
