// Reading, overriding, validating and printing the typed Config.
#pragma once
#include <string>
#include <vector>

#include "config/config.hpp"

namespace gpt {

// One `--set key.path=value` (or one sweep value): a dotted key and a YAML scalar.
struct Override {
  std::string key;
  std::string value;
};

// Parses YAML text into a Config: unknown keys (with the closest known one), keys that are not plain
// names, keys and sections given twice, wrong types and malformed YAML are input errors naming the key
// and the line. The top-level `sweep:` section is left to the sweep parser.
Config config_from_yaml(const std::string& yaml_text, const std::string& source_name);
void apply_override(Config& cfg, const Override& ov);
// Overrides in order, from one source (`from`: "the command line", "sweep point 3"): a model.preset
// among them replaces the dims the config had before (unless they give dims too), noted in cfg.notes.
void apply_overrides(Config& cfg, const std::vector<Override>& ovs, const std::string& from);
Override parse_override(const std::string& key_eq_value);  // "a.b=c"
bool is_config_key(const std::string& dotted_key);
std::vector<std::string> config_keys();  // every dotted key, in the field table's order
// Checks every field and every combination; throws input_error naming the key. Needs the world size
// for batch arithmetic.
void validate(const Config& cfg, int world_size);
// The resolved config as YAML (every field, documented order).
std::string config_to_yaml(const Config& cfg);
// docs/CONFIG.md: every key with its type, default and documentation, from the field table.
std::string config_reference();
// The run directory: <out_dir>/<name>.
std::string run_dir(const Config& cfg);

// The whole file; an input error naming it when it is missing, unreadable or a folder.
std::string read_text_file(const std::string& path);

}  // namespace gpt
