// Numbers as text: the shortest form that reads back as the same value (std::to_chars), so a config's
// 3e-4 prints as 0.0003 and not as its float's nine digits, in the terminal, YAML, CSV and JSON alike.
#pragma once
#include <string>
#include <vector>

namespace gpt {

std::string shortest(double v);  // "0.0003", "1e-08", "nan", "inf"
std::string shortest(float v);   // the float's own shortest form: 3e-4f -> "0.0003"
// A float for YAML that every YAML 1.1 reader (PyYAML included) reads back as a float: a '.' always,
// a signed exponent ("1.0e-08", "2.0", ".nan", ".inf").
std::string yaml_float(float v);
// Ascending integers with their runs collapsed: "0-3", "0,2,4", "1-3,5" ("" for none).
std::string ranges_text(const std::vector<int>& sorted);

}  // namespace gpt
