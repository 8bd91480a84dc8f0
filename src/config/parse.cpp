// YAML in and out, and command-line overrides, over the field table.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/common.hpp"
#include "base/input_file.hpp"
#include "config/config_io.hpp"
#include "config/fields.hpp"
#include "config/yaml_map.hpp"

namespace gpt {

using config::Field;
using config::fields_of;
using config::find_field;

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  // an ifstream opens a folder and reads it as empty, which would pass for a config of defaults
  if (std::filesystem::is_directory(path, ec)) throw input_error("cannot read '" + path + "': it is a folder, not a file");
  check_input_file(path, "--yaml");
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

std::vector<std::string> config_keys() {
  Config c;
  std::vector<std::string> keys;
  for (auto& f : fields_of(c)) keys.push_back(f.key);
  return keys;
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

const char* node_kind(const YAML::Node& n) {
  return n.IsSequence() ? "a list" : n.IsMap() ? "a mapping" : n.IsNull() ? "empty" : "a value";
}

}  // namespace

std::string closest_name(const std::string& word, const std::vector<std::string>& known) {
  const size_t limit = std::min(std::max<size_t>(2, word.size() / 4), word.size() / 2);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(word, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& known) {
  const std::string c = closest_name(word, known);
  return c.empty() ? std::string() : "; did you mean '" + c + "'?";
}

std::vector<YamlEntry> yaml_entries(const YAML::Node& map, const std::string& what) {
  std::vector<YamlEntry> out;
  std::map<std::string, std::pair<int, int>> first_seen;  // line, column
  for (const auto& kv : map) {
    const int line = kv.first.Mark().line;
    if (!kv.first.IsScalar())
      throw input_error("config error: " + what + " (line " + std::to_string(line + 1) + "): a key must be a plain name, got " +
                        node_kind(kv.first));
    const std::string key = kv.first.Scalar();
    const int column = kv.first.Mark().column;
    auto [it, fresh] = first_seen.emplace(key, std::make_pair(line, column));
    if (!fresh) {
      const auto [line0, column0] = it->second;
      throw input_error("config error: " + what + ": '" + key + "' is given twice (" +
                        (line0 == line ? "line " + std::to_string(line + 1) + ", columns " + std::to_string(column0 + 1) +
                                             " and " + std::to_string(column + 1)
                                       : "lines " + std::to_string(line0 + 1) + " and " + std::to_string(line + 1)) +
                        "); keep one");
    }
    out.push_back({key, line, kv.second});
  }
  return out;
}

namespace {

// "; did you mean 'x'? Keys of ...", or "; keys of ..." without a suggestion
std::string with_suggestion(const std::string& suggestion, std::string list) {
  if (suggestion.empty()) return "; " + list;
  list[0] = char(std::toupper(static_cast<unsigned char>(list[0])));
  return suggestion + " " + list;
}

std::vector<std::string> section_names(const std::vector<Field>& fs) {
  std::vector<std::string> out;
  for (auto& f : fs)
    if (std::find(out.begin(), out.end(), config::section_of(f.key)) == out.end()) out.push_back(config::section_of(f.key));
  return out;
}
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

void read_section(Config& cfg, const std::vector<Field>& fs, const std::string& sname, int sline,
                  const YAML::Node& body) {
  if (body.IsNull()) return;
  if (!body.IsMap())
    throw input_error("config error: section '" + sname + "' (line " + std::to_string(sline + 1) +
                      ") must be a mapping");
  for (const YamlEntry& e : yaml_entries(body, "section '" + sname + "'")) {
    const std::string key = sname + "." + e.key;
    const Field* f = find_field(fs, key);
    if (!f)
      throw input_error("config error: unknown key '" + key + "' (line " + std::to_string(e.line + 1) + ")" +
                        with_suggestion(did_you_mean(key, config_keys()), "keys of '" + sname + "':" + keys_of(fs, sname)));
    config::set_field(*f, e.value, e.line);
    cfg.set_keys.insert(key);
  }
}

// yaml-cpp's "illegal map value" for `key: text: more`: the value holds ': ', which YAML reads as a
// second mapping; the hint shows the line with its value quoted.
std::string quoting_hint(const std::string& text, int line) {
  std::istringstream in(text);
  std::string l;
  for (int i = 0; i <= line && std::getline(in, l); ++i) {
  }
  const size_t start = l.find_first_not_of(" \t"), colon = l.find(": ");
  if (start == std::string::npos || colon == std::string::npos || colon < start) return "";
  std::string value = l.substr(l.find_first_not_of(' ', colon + 1));
  value.erase(value.find_last_not_of(" \t\r") + 1);
  std::string quoted;
  for (char c : value) quoted += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return "; a string value containing ': ' must be quoted: " + l.substr(start, colon - start) + ": \"" + quoted + "\"";
}

}  // namespace

Config config_from_yaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw input_error("malformed YAML in " + source + " at line " + std::to_string(e.mark.line + 1) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg +
                      (e.msg == YAML::ErrorMsg::MAP_VALUE ? quoting_hint(text, e.mark.line) : std::string()));
  }
  Config cfg;
  if (root.IsNull()) return cfg;
  if (!root.IsMap()) throw input_error("config error: " + source + ": the top level must be a mapping of sections");
  const auto fs = fields_of(cfg);
  const std::string known = known_sections(fs);
  std::vector<std::string> sections = section_names(fs);
  sections.push_back("sweep");
  for (const YamlEntry& sec : yaml_entries(root, source)) {
    if (sec.key == "sweep") continue;
    if (keys_of(fs, sec.key).empty())
      throw input_error("config error: unknown section '" + sec.key + "' (line " + std::to_string(sec.line + 1) + ")" +
                        with_suggestion(did_you_mean(sec.key, sections), "known sections:" + known + " sweep"));
    read_section(cfg, fs, sec.key, sec.line, sec.value);
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
  if (!f)
    throw input_error("config error: unknown key '" + ov.key + "' (in an override)" + did_you_mean(ov.key, config_keys()));
  YAML::Node n;
  try {
    n = YAML::Load(ov.value);
  } catch (const YAML::ParserException& e) {
    throw input_error("config error: " + ov.key + ": value '" + ov.value + "' is not valid YAML: " + e.msg);
  }
  const bool is_string = std::holds_alternative<std::string*>(f->ref);
  if (n.IsNull() && is_string) n = YAML::Node(std::string());
  if (is_string && !n.IsScalar())
    throw input_error("config error: " + ov.key + ": value '" + ov.value + "' reads as " + node_kind(n) +
                      " in YAML (': ', '[' and '{' make structure); quote the text in YAML, e.g. --set '" + ov.key +
                      "=\"" + ov.value + "\"'");
  config::set_field(*f, n, -1);
  cfg.set_keys.insert(ov.key);
}

void apply_overrides(Config& cfg, const std::vector<Override>& ovs, const std::string& from) {
  const ModelConfig before = cfg.model;
  bool preset = false, dims = false;
  for (const Override& ov : ovs) {
    apply_override(cfg, ov);
    preset = preset || ov.key == "model.preset";
    dims = dims || ov.key == "model.n_layer" || ov.key == "model.n_head" || ov.key == "model.n_embd";
  }
  // A preset given here replaces the dims the file gave (a preset and dims from one source stay an error).
  ModelConfig& m = cfg.model;
  if (preset && !dims && !m.preset.empty() && (before.n_layer || before.n_head || before.n_embd)) {
    cfg.notes.push_back("model.preset " + m.preset + " from " + from + " replaces the file's n_layer " +
                        std::to_string(before.n_layer) + ", n_head " + std::to_string(before.n_head) + ", n_embd " +
                        std::to_string(before.n_embd));
    m.n_layer = m.n_head = m.n_embd = 0;
  }
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
