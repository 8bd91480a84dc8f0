// docs/CONFIG.md, generated from the field table (`./train --config-reference`; a test keeps the
// committed file equal to this output).
#include <sstream>

#include "config/config_io.hpp"
#include "config/fields.hpp"

namespace gpt {

namespace {
const char* kIntro =
    "# Configuration reference\n"
    "\n"
    "Every key of the experiment YAML, with its type, default and meaning. This file is generated from the\n"
    "field table in `src/config/fields.cpp` by `./train --config-reference` (a test checks that it matches).\n"
    "Override any key on the command line with `--set section.key=value`; `./train --yaml F --dry-run` prints\n"
    "the resolved config. Unknown keys (with the closest known one), keys or sections given twice, wrong types\n"
    "and impossible combinations are errors naming the key and the line. A string holding `: ` is quoted\n"
    "(`sample_prompt: \"ROMEO: hi\"`, `--set 'eval.sample_prompt=\"ROMEO: hi\"'`).\n";

const char* kSweep =
    "\n## `sweep`\n"
    "\n"
    "| key | meaning |\n"
    "| --- | --- |\n"
    "| `grid` | mapping of dotted keys to lists: the cartesian product of all lists (last key varies fastest) |\n"
    "| `zip` | mapping of dotted keys to lists of equal length, varied together; combined with `grid` as one "
    "more dimension |\n"
    "\n"
    "Each point runs in `<out_dir>/<name>/pNNN/`; a whole sweep writes `summary.h5` and `summary.csv` beside "
    "them\n"
    "(`--summarize` rewrites them, e.g. after the points ran as separate array tasks). So a sweep cannot vary\n"
    "`run.name` or `run.out_dir` (one that lists them is refused); a sweep over `model.preset` replaces the\n"
    "file's dims, as a preset on the command line does.\n";
}  // namespace

std::string config_reference() {
  Config c;
  std::ostringstream os;
  os << kIntro;
  std::string section;
  for (auto& f : config::fields_of(c)) {
    const std::string k = f.key, s = config::section_of(k);
    if (s != section) {
      os << "\n## `" << s << "`\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
      section = s;
    }
    os << "| `" << k.substr(s.size() + 1) << "` | " << config::type_name(f) << " | `" << config::field_text(f)
       << "` | " << f.doc << " |\n";
  }
  os << kSweep;
  return os.str();
}

}  // namespace gpt
