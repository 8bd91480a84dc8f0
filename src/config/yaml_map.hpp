// Reading the experiment YAML's mappings strictly. yaml-cpp takes a list or a mapping as a key (and then
// fails to convert it with a bare "bad conversion"), and keeps both entries of a key given twice (lookups
// find the first, loops see both, so the last silently wins): every reader of the file goes through here.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace gpt {

struct YamlEntry {
  std::string key;
  int line = 0;  // of the key, 0-based
  YAML::Node value;
};

// The entries of `map` in file order. An input error names `what` (e.g. "section 'training'") with the
// line of a key that is not a plain name, and both lines of a key given twice.
std::vector<YamlEntry> yaml_entries(const YAML::Node& map, const std::string& what);

// The one of `known` closest to `word` by edit distance when it is near enough to be a typo of it
// (a quarter of its length in edits, at least 2 but at most half of it), else "". Ties go to the earlier
// name.
std::string closest_name(const std::string& word, const std::vector<std::string>& known);

// "; did you mean 'x'?" for closest_name's answer, or "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& known);

}  // namespace gpt
