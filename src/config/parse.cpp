// YAML in and out, and command-line overrides, over the field table.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

#include "base/common.hpp"
#include "config/config_io.hpp"
#include "config/fields.hpp"

namespace gpt {

using config::Field;
using config::fields_of;
using config::find_field;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot read '" + path + "': no such file or not readable");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool is_config_key(const std::string& key) {
  Config c;
  return find_field(fields_of(c), key) != nullptr;
}

namespace {

// "known sections: a b c" / "keys of 'x': a b c", for unknown-key messages
std::string known_sections(const std::vector<Field>& fs) {
  std::set<std::string> sections;
  for (auto& f : fs) sections.insert(config::section_of(f.key));
  std::string known;
  for (auto& s : sections) known += " " + s;
  return known;
}
std::string keys_of(const std::vector<Field>& fs, const std::string& section) {
  std::string known;
  for (auto& g : fs)
    if (config::section_of(g.key) == section) known += " " + std::string(g.key).substr(section.size() + 1);
  return known;
}

void read_section(const std::vector<Field>& fs, const std::string& sname, int sline, const YAML::Node& body) {
  if (body.IsNull()) return;
  if (!body.IsMap())
    throw input_error("config error: section '" + sname + "' (line " + std::to_string(sline + 1) +
                      ") must be a mapping");
  for (const auto& kv : body) {
    const std::string key = sname + "." + kv.first.as<std::string>();
    const Field* f = find_field(fs, key);
    if (!f)
      throw input_error("config error: unknown key '" + key + "' (line " + std::to_string(kv.first.Mark().line + 1) +
                        "); keys of '" + sname + "':" + keys_of(fs, sname));
    config::set_field(*f, kv.second, kv.first.Mark().line);
  }
}

}  // namespace

Config config_from_yaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw input_error("malformed YAML in " + source + " at line " + std::to_string(e.mark.line + 1) +
                      ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  Config cfg;
  if (root.IsNull()) return cfg;
  if (!root.IsMap()) throw input_error("config error: " + source + ": the top level must be a mapping of sections");
  const auto fs = fields_of(cfg);
  const std::string known = known_sections(fs);
  for (const auto& sec : root) {
    const std::string sname = sec.first.as<std::string>();
    const int sline = sec.first.Mark().line;
    if (sname == "sweep") continue;
    if (keys_of(fs, sname).empty())
      throw input_error("config error: unknown section '" + sname + "' (line " + std::to_string(sline + 1) +
                        "); known sections:" + known + " sweep");
    read_section(fs, sname, sline, sec.second);
  }
  return cfg;
}

Override parse_override(const std::string& s) {
  auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw input_error("bad --set '" + s + "': expected key.path=value, e.g. training.lr=3e-4");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

void apply_override(Config& cfg, const Override& ov) {
  const auto fs = fields_of(cfg);
  const Field* f = find_field(fs, ov.key);
  if (!f) throw input_error("config error: unknown key '" + ov.key + "' (in an override)");
  YAML::Node n;
  try {
    n = YAML::Load(ov.value);
  } catch (const YAML::ParserException& e) {
    throw input_error("config error: " + ov.key + ": value '" + ov.value + "' is not valid YAML: " + e.msg);
  }
  if (n.IsNull() && std::holds_alternative<std::string*>(f->ref)) n = YAML::Node(std::string());
  config::set_field(*f, n, -1);
}

std::string config_to_yaml(const Config& cfg) {
  Config c = cfg;
  std::ostringstream os;
  std::string section;
  for (auto& f : fields_of(c)) {
    const std::string k = f.key, s = config::section_of(k);
    if (s != section) {
      os << s << ":\n";
      section = s;
    }
    os << "  " << k.substr(s.size() + 1) << ": " << config::field_text(f) << "\n";
  }
  return os.str();
}

std::string run_dir(const Config& cfg) { return cfg.run.out_dir + "/" + cfg.run.name; }

}  // namespace gpt
