#include "run/resume.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "config/config_io.hpp"
#include "config/presets.hpp"
#include "io/data.hpp"

namespace gpt {

namespace {
std::string quoted(const std::string& s) { return "'" + s + "'"; }
// a path as compared on resume: dir//b1.bin and dir/./b1.bin are dir/b1.bin
std::string lexical(const std::string& p) {
  return p.empty() ? p : std::filesystem::path(p).lexically_normal().string();
}

// The tokens per optimizer step a config and world size make (micro_batch resolved, as checkpoints store it).
int64_t tokens_per_step(const TrainingConfig& t, int64_t world) {
  if (t.total_batch_tokens > 0) return t.total_batch_tokens;
  return int64_t(t.micro_batch.size) * t.seq_len * t.grad_accum * world;
}

struct FileMark {
  std::string size, hash;
};
// data_files_text's lines by path
std::map<std::string, FileMark> parse_files(const std::string& text) {
  std::map<std::string, FileMark> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    FileMark m;
    std::string path;
    l >> m.size >> m.hash;
    std::getline(l >> std::ws, path);
    if (!path.empty()) out[lexical(path)] = m;
  }
  return out;
}

// "\n  data.train's file 'x' ..." for every file added, removed or changed since `old`.
std::string file_changes(const std::string& old, const std::string& now) {
  const auto a = parse_files(old), b = parse_files(now);
  std::string out;
  for (const auto& [path, m] : a) {
    const auto it = b.find(path);
    if (it == b.end()) out += "\n  data.train's file " + quoted(path) + " is gone";
    else if (it->second.size != m.size)
      out += "\n  data.train's file " + quoted(path) + " was " + m.size + " bytes and is " + it->second.size + " now";
    else if (it->second.hash != m.hash)
      out += "\n  data.train's file " + quoted(path) + " holds other bytes now (same size, " + m.size + " bytes)";
  }
  for (const auto& [path, m] : b)
    if (!a.count(path)) out += "\n  data.train's file " + quoted(path) + " is new (" + m.size + " bytes)";
  return out;
}
}  // namespace

std::string check_resumable(const Config& now, const Plan& plan, const TrainState& ck, const std::string& files_now,
                            const std::string& what) {
  const Config old = config_from_yaml(ck.config_yaml, "the config of " + what);
  const std::string head = "cannot resume from " + what;
  if (now.training.steps < ck.step)
    throw ResumeMismatch(kExitBadInput, head + ": training.steps is " + std::to_string(now.training.steps) +
                                            ", below the step the run has reached (a resumed run does not go back; "
                                            "set training.steps to " + std::to_string(ck.step) +
                                            " or more, or train the shorter run under another run.name)");
  std::string diffs;
  auto same = [&](const char* key, const std::string& was, const std::string& is) {
    if (was != is) diffs += std::string("\n  ") + key + " was " + was + " and is " + is + " now";
  };
  same("run.seed", std::to_string(old.run.seed), std::to_string(now.run.seed));
  same("training.seq_len", std::to_string(old.training.seq_len), std::to_string(now.training.seq_len));
  same("tokens per step (micro_batch x seq_len x grad_accum x world size)",
       std::to_string(tokens_per_step(old.training, ck.world)), std::to_string(plan.tokens_per_step));
  if (lexical(old.data.train) != lexical(now.data.train))
    same("data.train", quoted(old.data.train), quoted(now.data.train));
  same("training.optimizer", old.training.optimizer, now.training.optimizer);  // its state means another thing
  same("training.optimizer_state", old.training.optimizer_state, now.training.optimizer_state);  // its rounding
  same("data.synthetic", old.data.synthetic ? "true" : "false", now.data.synthetic ? "true" : "false");
  if (!now.data.synthetic && !old.data.synthetic)  // the data position is in the order it was saved in
    same("data.shuffle", ck.data.shuffled ? "true" : "false", now.data.shuffle ? "true" : "false");
  if (now.data.synthetic) {
    same("data.synthetic_vocab", std::to_string(old.data.synthetic_vocab), std::to_string(now.data.synthetic_vocab));
    same("data.synthetic_branching", std::to_string(old.data.synthetic_branching),
         std::to_string(now.data.synthetic_branching));
  }
  // the files behind the same glob (checkpoints from before they were recorded have none to compare)
  std::string files;
  if (diffs.empty() && !now.data.synthetic && !ck.data_files.empty()) files = file_changes(ck.data_files, files_now);
  if (!files.empty() && !now.data.allow_changed_files) diffs += files;
  if (!diffs.empty())
    throw ResumeMismatch(kExitBadInput, head + ": settings that may not change on resume differ (docs/FORMATS.md)" +
                                            diffs + (files.empty() ? "" : "\n  (data.allow_changed_files: true "
                                                                         "resumes on the changed files anyway)"));
  std::string warning;
  if (!files.empty())
    warning = "warning: the files behind data.train changed since " + what +
              " (data.allow_changed_files: true, so the run resumes on them):" + files;
  // An FP8 run written before the FP8 classifier became the default, resumed without the key: said, since
  // the classifier's products change precision from here (their scales calibrate as a new tensor's do).
  if (old.training.precision == Precision::fp8 && now.training.precision == Precision::fp8 &&
      old.training.fp8_classifier != now.training.fp8_classifier)
    warning += std::string(warning.empty() ? "" : "\n") + "note: training.fp8_classifier was " +
               (old.training.fp8_classifier ? "true" : "false") + " in " + what + " and is " +
               (now.training.fp8_classifier ? "true" : "false") + " now: the classifier's products run in " +
               (now.training.fp8_classifier ? "FP8" : "bf16") + " from here (set training.fp8_classifier: " +
               (old.training.fp8_classifier ? "true" : "false") + " to keep them as they were)";
  // other layers in FP8: the scales of layers new to FP8 calibrate as a new tensor's do; those of layers
  // now in bf16 are left behind
  // The sets as the checkpoint recorded them (from its config where it predates the record), both sides
  // canonical: "0-2" and "all" on three layers are the same set.
  const int n_layer = plan.model.dims.n_layer;
  const std::vector<PrecisionAttr> was_p = ck.precision.empty() ? precision_attrs(precision_policy(old.training, n_layer), n_layer)
                                                                : ck.precision,
                                   is_p = precision_attrs(plan.model.precision, n_layer);
  const std::string layers_was = precision_attr(was_p, "fp8_layers"), layers_is = precision_attr(is_p, "fp8_layers");
  const std::string products_was = precision_attr(was_p, "fp8_products"),
                    products_is = precision_attr(is_p, "fp8_products");
  if (old.training.precision == Precision::fp8 && now.training.precision == Precision::fp8 && layers_was != layers_is)
    warning += std::string(warning.empty() ? "" : "\n") + "note: training.fp8_layers was '" + layers_was + "' in " +
               what + " and is '" + layers_is + "' now: the block products of the layers it " +
               "adds run in FP8 from here, their scales calibrated first; those it drops run in bf16";
  if (old.training.precision == Precision::fp8 && now.training.precision == Precision::fp8 &&
      products_was != products_is)
    warning += std::string(warning.empty() ? "" : "\n") + "note: training.fp8_products was '" + products_was +
               "' in " + what + " and is '" + products_is +
               "' now: the products it adds run in FP8 from here, their scales calibrated first; those it drops run "
               "in bf16";
  // master weights held another way: the checkpoint's fp32 master values are taken as this kind holds them
  if (old.training.master_weights != now.training.master_weights && plan.act == DType::BF16) {
    const char* was = name_of(old.training.master_weights);
    const char* is = name_of(now.training.master_weights);
    const char* how = now.training.master_weights == MasterWeights::compensated
                          ? "its master values are kept to about 16 significant bits (a bf16 parameter and residual)"
                      : now.training.master_weights == MasterWeights::none
                          ? "the parameters are updated in bf16 alone from here"
                          : "its master values continue in fp32";
    warning += std::string(warning.empty() ? "" : "\n") + "note: training.master_weights was " + was + " in " + what +
               " and is " + is + " now: " + how;
  }
  return warning;
}

std::string data_files_text(const DataConfig& data) {
  if (data.synthetic || data.train.empty()) return "";
  constexpr size_t kMiB = size_t(1) << 20;
  std::string out;
  std::vector<char> buf;
  for (const std::string& path : expand_glob(data.train)) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw input_error("data.train: cannot open '" + path + "'");
    const size_t size = size_t(in.tellg());
    // the first MiB and the last (the whole file when it is smaller than two)
    const size_t head = std::min(size, kMiB), tail = std::min(size - head, kMiB);
    buf.resize(head + tail);
    in.seekg(0);
    in.read(buf.data(), std::streamsize(head));
    in.seekg(std::streamoff(size - tail));
    in.read(buf.data() + head, std::streamsize(tail));
    if (!in) throw input_error("data.train: cannot read '" + path + "'");
    char line[48];
    std::snprintf(line, sizeof line, "%zu %016llx ", size, (unsigned long long)xxh3(buf.data(), buf.size()));
    out += line + path + "\n";
  }
  return out;
}

EarlierRun check_earlier_run(const std::string& dir, int steps) {
  EarlierRun e;
  e.log = read_logged_run(dir + "/log.h5");
  e.has_checkpoint = !list_checkpoints(dir).empty();
  if (!e.log.exists || e.log.status != "ok") return e;
  const int64_t at = e.log.last_step;
  const std::string was = "the run in '" + dir + "' completed " + std::to_string(at) + " step(s) (log.h5 status ok)";
  // Nothing to train, whatever else changed (the world size of a resubmitted job, say): nothing is
  // touched. More steps go on from the final checkpoint, which check_resumable judges then.
  if (steps == at) {
    e.complete_at = at;
  } else if (steps < at) {
    throw input_error("--resume: training.steps is " + std::to_string(steps) + " but " + was +
                      ": a resumed run does not go back; leave training.steps at " + std::to_string(at) +
                      " to keep it as it is, or train the shorter run under another run.name");
  } else if (!e.has_checkpoint) {
    throw input_error("--resume: training.steps is " + std::to_string(steps) + " but " + was +
                      " and left no checkpoint to continue from (checkpoint.every was 0), so it cannot be "
                      "extended; train the longer run under another run.name, or without --resume and with "
                      "run.overwrite: true to replace this one");
  }
  return e;
}

std::string check_resume(const Config& cfg, const Plan& plan) {
  const std::string dir = run_dir(cfg);
  const EarlierRun e = check_earlier_run(dir, cfg.training.steps);
  if (e.complete_at >= 0)
    return "--resume: nothing to do, the run in '" + dir + "' is complete at step " + std::to_string(e.complete_at);
  std::string skipped;
  for (const std::string& ck : list_checkpoints(dir)) {
    TrainState st;
    try {
      st = read_checkpoint_state(ck, ParamLayout(plan.model.dims), cfg.checkpoint.threads);
    } catch (const ResumeMismatch&) {
      throw;
    } catch (const Error& ex) {
      if (ex.code() != kExitBadInput) throw;
      skipped += "; checkpoint '" + ck + "' is unusable (" + ex.what() + ")";
      continue;
    }
    if (plan.micro_batch_max && plan.micro_batch == 0)  // the tokens per step are known once the run finds the size
      return "--resume: continues from '" + ck + "' if micro_batch: max finds the tokens per step it has" + skipped;
    const std::string warning = check_resumable(cfg, plan, st, data_files_text(cfg.data),
                                                "the checkpoint of step " + std::to_string(st.step));
    return "--resume: continues from the checkpoint of step " + std::to_string(st.step) + " ('" + ck + "')" +
           skipped + (warning.empty() ? "" : "\n" + warning);
  }
  if (!skipped.empty()) throw input_error("no usable checkpoint in " + dir + "/checkpoints" + skipped);
  return "--resume: no checkpoint in '" + dir + "/checkpoints': the run starts from scratch" +
         (e.log.exists ? " (the earlier run's log is kept as log.N.h5)" : "");
}

}  // namespace gpt
