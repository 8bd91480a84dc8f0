#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "config/config_io.hpp"
#include "base/common.hpp"
#include "model/gpt.hpp"

namespace gpt {
namespace {

// Every config field, by dotted key. This list is the single place a field is named: parsing,
// overriding, printing and unknown-key detection all walk it.
using FieldRef = std::variant<int*, int64_t*, uint64_t*, float*, bool*, std::string*>;
struct Field {
  const char* key;
  FieldRef ref;
};

std::vector<Field> fields_of(Config& c) {
  return {
      {"run.name", &c.run.name},
      {"run.out_dir", &c.run.out_dir},
      {"run.seed", &c.run.seed},
      {"model.preset", &c.model.preset},
      {"model.n_layer", &c.model.n_layer},
      {"model.n_head", &c.model.n_head},
      {"model.n_embd", &c.model.n_embd},
      {"model.vocab_size", &c.model.vocab_size},
      {"model.max_seq_len", &c.model.max_seq_len},
      {"model.init_from", &c.model.init_from},
      {"model.init_std", &c.model.init_std},
      {"data.train", &c.data.train},
      {"data.val", &c.data.val},
      {"data.synthetic", &c.data.synthetic},
      {"data.synthetic_vocab", &c.data.synthetic_vocab},
      {"data.synthetic_branching", &c.data.synthetic_branching},
      {"training.device", &c.training.device},
      {"training.precision", &c.training.precision},
      {"training.master_weights", &c.training.master_weights},
      {"training.stochastic_rounding", &c.training.stochastic_rounding},
      {"training.micro_batch", &c.training.micro_batch},
      {"training.seq_len", &c.training.seq_len},
      {"training.grad_accum", &c.training.grad_accum},
      {"training.total_batch_tokens", &c.training.total_batch_tokens},
      {"training.steps", &c.training.steps},
      {"training.lr", &c.training.lr},
      {"training.warmup_steps", &c.training.warmup_steps},
      {"training.schedule", &c.training.schedule},
      {"training.min_lr_frac", &c.training.min_lr_frac},
      {"training.beta1", &c.training.beta1},
      {"training.beta2", &c.training.beta2},
      {"training.eps", &c.training.eps},
      {"training.weight_decay", &c.training.weight_decay},
      {"training.grad_clip", &c.training.grad_clip},
      {"training.zero_stage", &c.training.zero_stage},
      {"training.recompute", &c.training.recompute},
      {"training.memory_limit_gb", &c.training.memory_limit_gb},
      {"training.deterministic", &c.training.deterministic},
      {"training.matmul_search_s", &c.training.matmul_search_s},
      {"eval.every", &c.eval.every},
      {"eval.batches", &c.eval.batches},
      {"log.every", &c.log.every},
      {"log.progress", &c.log.progress},
      {"log.op_profile", &c.log.op_profile},
      {"checkpoint.every", &c.checkpoint.every},
      {"checkpoint.keep_last", &c.checkpoint.keep_last},
      {"checkpoint.resume", &c.checkpoint.resume},
  };
}

const Field* find_field(std::vector<Field>& fs, const std::string& key) {
  for (auto& f : fs)
    if (key == f.key) return &f;
  return nullptr;
}

std::string where(const std::string& key, int line) {
  return line >= 0 ? key + " (line " + std::to_string(line + 1) + ")" : key;
}

template <class T>
T scalar_as(const YAML::Node& n, const std::string& key, int line, const char* type_name) {
  if (!n.IsScalar())
    throw input_error("config error: " + where(key, line) + ": expected a " + type_name + ", got a " +
                      (n.IsSequence() ? "list" : n.IsMap() ? "mapping" : "null"));
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw input_error("config error: " + where(key, line) + ": expected a " + type_name + ", got '" +
                      n.Scalar() + "'");
  }
}

void set_field(const Field& f, const YAML::Node& n, int line) {
  const std::string key = f.key;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = scalar_as<std::string>(n, key, line, "string");
        } else if constexpr (std::is_same_v<T, bool>) {
          *p = scalar_as<bool>(n, key, line, "boolean (true/false)");
        } else if constexpr (std::is_same_v<T, float>) {
          double d = scalar_as<double>(n, key, line, "number");
          *p = static_cast<float>(d);
        } else if constexpr (std::is_same_v<T, int>) {
          if (key == "training.micro_batch" && n.IsScalar() && n.Scalar() == "max") {
            *p = -1;  // the largest micro-batch that fits, found at start
            return;
          }
          long long v = scalar_as<long long>(n, key, line, "integer");
          if (v < INT32_MIN || v > INT32_MAX)
            throw input_error("config error: " + where(key, line) + ": " + n.Scalar() + " is out of range");
          *p = static_cast<int>(v);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          *p = scalar_as<uint64_t>(n, key, line, "non-negative integer");
        } else {
          *p = scalar_as<T>(n, key, line, "integer");
        }
      },
      f.ref);
}

std::string field_text(const Field& f) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        std::ostringstream os;
        if constexpr (std::is_same_v<T, std::string>) {
          YAML::Emitter e;
          e << YAML::DoubleQuoted << *p;
          return e.c_str();
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, float>) {
          os.precision(9);
          os << *p;
          return os.str();
        } else if constexpr (std::is_same_v<T, int>) {
          if (std::string(f.key) == "training.micro_batch" && *p == -1) return "max";
          os << *p;
          return os.str();
        } else {
          os << *p;
          return os.str();
        }
      },
      f.ref);
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("cannot read '" + path + "': no such file or not readable");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool is_config_key(const std::string& key) {
  Config c;
  auto fs = fields_of(c);
  return find_field(fs, key) != nullptr;
}

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
  auto fs = fields_of(cfg);
  std::set<std::string> sections;
  for (auto& f : fs) sections.insert(std::string(f.key).substr(0, std::string(f.key).find('.')));
  for (const auto& sec : root) {
    const std::string sname = sec.first.as<std::string>();
    const int sline = sec.first.Mark().line;
    if (sname == "sweep") continue;
    if (!sections.count(sname)) {
      std::string known;
      for (auto& s : sections) known += " " + s;
      throw input_error("config error: unknown section '" + sname + "' (line " + std::to_string(sline + 1) +
                        "); known sections:" + known + " sweep");
    }
    if (sec.second.IsNull()) continue;
    if (!sec.second.IsMap())
      throw input_error("config error: section '" + sname + "' (line " + std::to_string(sline + 1) +
                        ") must be a mapping");
    for (const auto& kv : sec.second) {
      const std::string key = sname + "." + kv.first.as<std::string>();
      const Field* f = find_field(fs, key);
      if (!f) {
        std::string known;
        for (auto& g : fs)
          if (std::string(g.key).rfind(sname + ".", 0) == 0) known += " " + std::string(g.key).substr(sname.size() + 1);
        throw input_error("config error: unknown key '" + key + "' (line " + std::to_string(kv.first.Mark().line + 1) +
                          "); keys of '" + sname + "':" + known);
      }
      set_field(*f, kv.second, kv.first.Mark().line);
    }
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
  auto fs = fields_of(cfg);
  const Field* f = find_field(fs, ov.key);
  if (!f) throw input_error("config error: unknown key '" + ov.key + "' (in an override)");
  YAML::Node n;
  try {
    n = YAML::Load(ov.value);
  } catch (const YAML::ParserException& e) {
    throw input_error("config error: " + ov.key + ": value '" + ov.value + "' is not valid YAML: " + e.msg);
  }
  if (n.IsNull() && std::holds_alternative<std::string*>(f->ref)) n = YAML::Node(std::string());
  set_field(*f, n, -1);
}

std::string config_value(const Config& cfg, const std::string& key) {
  Config c = cfg;
  auto fs = fields_of(c);
  const Field* f = find_field(fs, key);
  if (!f) throw input_error("unknown key '" + key + "'");
  return field_text(*f);
}

std::string config_to_yaml(const Config& cfg) {
  Config c = cfg;
  auto fs = fields_of(c);
  std::ostringstream os;
  std::string section;
  for (auto& f : fs) {
    std::string k = f.key;
    std::string s = k.substr(0, k.find('.'));
    if (s != section) {
      os << s << ":\n";
      section = s;
    }
    os << "  " << k.substr(s.size() + 1) << ": " << field_text(f) << "\n";
  }
  return os.str();
}

std::string run_dir(const Config& cfg) { return cfg.run.out_dir + "/" + cfg.run.name; }

void validate(const Config& cfg, int world) {
  auto bad = [](const std::string& key, const std::string& why) {
    throw input_error("config error: " + key + ": " + why);
  };
  const auto& t = cfg.training;
  const auto& m = cfg.model;
  if (cfg.run.name.empty()) bad("run.name", "must not be empty");
  if (cfg.run.name.find("..") != std::string::npos) bad("run.name", "must not contain '..'");
  if (cfg.run.out_dir.empty()) bad("run.out_dir", "must not be empty");
  // model: a preset or explicit dims
  ModelDims d;
  try {
    d = resolve_dims(m);
  } catch (const Error& e) {
    throw input_error(std::string("config error: ") + e.what());
  }
  if (t.seq_len < 1) bad("training.seq_len", "must be >= 1");
  if (t.seq_len > d.max_seq_len)
    bad("training.seq_len", std::to_string(t.seq_len) + " exceeds model.max_seq_len " + std::to_string(d.max_seq_len));
  if (t.micro_batch == 0 || t.micro_batch < -1) bad("training.micro_batch", "must be >= 1 or 'max'");
  if (t.grad_accum < 1) bad("training.grad_accum", "must be >= 1");
  if (t.total_batch_tokens < 0) bad("training.total_batch_tokens", "must be >= 0");
  if (t.total_batch_tokens > 0 && t.micro_batch > 0) {
    int64_t per = int64_t(t.micro_batch) * t.seq_len * world;
    if (t.total_batch_tokens % per != 0)
      bad("training.total_batch_tokens", std::to_string(t.total_batch_tokens) +
                                             " is not a multiple of micro_batch * seq_len * world_size = " +
                                             std::to_string(per));
  }
  if (t.steps < 1) bad("training.steps", "must be >= 1");
  if (!(t.lr >= 0) || !std::isfinite(t.lr)) bad("training.lr", "must be a finite number >= 0");
  if (t.warmup_steps < 0) bad("training.warmup_steps", "must be >= 0");
  if (t.schedule != "cosine" && t.schedule != "linear" && t.schedule != "constant")
    bad("training.schedule", "'" + t.schedule + "' is not one of cosine, linear, constant");
  if (t.min_lr_frac < 0 || t.min_lr_frac > 1) bad("training.min_lr_frac", "must be in [0, 1]");
  if (t.beta1 < 0 || t.beta1 >= 1) bad("training.beta1", "must be in [0, 1)");
  if (t.beta2 < 0 || t.beta2 >= 1) bad("training.beta2", "must be in [0, 1)");
  if (!(t.eps > 0)) bad("training.eps", "must be > 0");
  if (t.weight_decay < 0) bad("training.weight_decay", "must be >= 0");
  if (t.grad_clip < 0) bad("training.grad_clip", "must be >= 0 (0 = off)");
  if (t.zero_stage < 0 || t.zero_stage > 3) bad("training.zero_stage", "must be 0, 1, 2 or 3");
  if (t.recompute < 0 || t.recompute > 2) bad("training.recompute", "must be 0, 1 or 2");
  if (!(t.matmul_search_s >= 0 && t.matmul_search_s <= 60))
    bad("training.matmul_search_s", "must be between 0 and 60 (seconds per matmul shape; 0 = no search)");
  if (t.memory_limit_gb < 0) bad("training.memory_limit_gb", "must be >= 0 (0 = the device's memory)");
  if (t.micro_batch == -1 && t.total_batch_tokens > 0)
    bad("training.micro_batch", "'max' cannot be combined with training.total_batch_tokens (use grad_accum)");
  if (t.device != "auto" && t.device != "cpu" && t.device != "cuda")
    bad("training.device", "'" + t.device + "' is not one of auto, cpu, cuda");
  if (t.precision != "bf16" && t.precision != "fp32")
    bad("training.precision", "'" + t.precision + "' is not one of bf16, fp32");
  const auto& dc = cfg.data;
  if (dc.synthetic) {
    if (!dc.train.empty()) bad("data.synthetic", "set either data.synthetic or data.train, not both");
    if (dc.synthetic_vocab < 2 || dc.synthetic_vocab > d.vocab_size)
      bad("data.synthetic_vocab", "must be in [2, model vocab_size]");
    if (dc.synthetic_branching < 1 || dc.synthetic_branching > dc.synthetic_vocab)
      bad("data.synthetic_branching", "must be in [1, data.synthetic_vocab]");
  } else if (dc.train.empty()) {
    bad("data.train", "no training data: give a glob of token shards or set data.synthetic: true");
  }
  if (cfg.eval.every < 0) bad("eval.every", "must be >= 0");
  if (cfg.eval.batches < 0) bad("eval.batches", "must be >= 0");
  if (cfg.log.every < 1) bad("log.every", "must be >= 1");
  if (cfg.checkpoint.every < 0) bad("checkpoint.every", "must be >= 0");
  if (cfg.checkpoint.keep_last < 1) bad("checkpoint.keep_last", "must be >= 1");
  if (cfg.checkpoint.resume != "never" && cfg.checkpoint.resume != "auto")
    bad("checkpoint.resume", "'" + cfg.checkpoint.resume + "' is not one of never, auto");
  if (!(m.init_std > 0)) bad("model.init_std", "must be > 0");
}

}  // namespace gpt
