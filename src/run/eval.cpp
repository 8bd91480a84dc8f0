#include "run/eval.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "parallel/agree.hpp"
#include "run/generate.hpp"
#include "run/hellaswag.hpp"
#include "run/signals.hpp"

namespace gpt {

std::vector<int> sample_prompt_ids(const std::string& prompt, const Gpt2Vocab* vocab, int vocab_size) {
  if (prompt.find_first_not_of(" \t") == std::string::npos) return {vocab_size - 1};
  std::vector<int> ids;
  if (prompt.find_first_not_of("0123456789, \t") == std::string::npos) {
    std::string p = prompt;
    for (char& c : p)
      if (c == ',') c = ' ';
    std::istringstream in(p);
    for (long long id; in >> id;) {
      if (id >= vocab_size)
        throw input_error("config error: eval.sample_prompt: token id " + std::to_string(id) +
                          " is outside the vocabulary (" + std::to_string(vocab_size) + ")");
      ids.push_back(int(id));
    }
    return ids;
  }
  if (!vocab)
    throw input_error("config error: eval.sample_prompt: '" + prompt +
                      "' is text, which needs eval.vocab (a folder with GPT-2's vocab.json and merges.txt, or "
                      "vocab.json itself with eval.merges); "
                      "or give token ids such as 50256,464");
  ids = vocab->encode(prompt);
  for (int id : ids)
    if (id >= vocab_size)
      throw input_error("config error: eval.sample_prompt encodes to token id " + std::to_string(id) +
                        ", outside the model's vocabulary (" + std::to_string(vocab_size) + ")");
  return ids;
}

namespace {
// eval.vocab (and eval.merges), no larger than the model's vocabulary
std::unique_ptr<Gpt2Vocab> load_vocab(const EvalConfig& ec, int V) {
  if (ec.vocab.empty()) return nullptr;
  const auto [vocab_json, merges_txt] = gpt2_vocab_files(ec.vocab, ec.merges, "eval.vocab", "eval.merges");
  auto vocab = ec.merges.empty() ? std::make_unique<Gpt2Vocab>(ec.vocab) : std::make_unique<Gpt2Vocab>(vocab_json, merges_txt);
  if (vocab->size() > V)
    throw input_error("config error: eval.vocab: '" + ec.vocab + "' has " + std::to_string(vocab->size()) +
                      " tokens, more than model.vocab_size " + std::to_string(V));
  return vocab;
}
}  // namespace

void check_eval_inputs(const Config& cfg, const Plan& plan, std::set<std::string>& checked) {
  const int V = plan.model.dims.vocab_size;
  const auto once = [&](const std::string& what) { return checked.insert(what + "\n" + std::to_string(V)).second; };
  if (!cfg.data.synthetic && !cfg.data.val.empty() && once("val\n" + cfg.data.val)) {
    try {
      if (plan.micro_batch > 0)  // each shard holds a global micro-batch (unknown yet under micro_batch: max)
        make_shard_source(cfg.data.val, plan.micro_batch, plan.seq_len, 0, plan.world, V);
      for (const std::string& path : expand_glob(cfg.data.val)) check_shard_tokens(read_shard_header(path), V);
    } catch (const Error& e) {
      throw Error(e.code(), std::string("data.val: ") + e.what());
    }
  }
  if (!cfg.eval.hellaswag.empty() && once("hellaswag\n" + cfg.eval.hellaswag)) read_choice_file(cfg.eval.hellaswag, V);
  const bool prompt = cfg.eval.sample_tokens > 0;
  if ((prompt || !cfg.eval.vocab.empty()) && once("vocab\n" + cfg.eval.vocab + "\n" + cfg.eval.merges + "\n" + (prompt ? cfg.eval.sample_prompt : ""))) {
    const std::unique_ptr<Gpt2Vocab> vocab = load_vocab(cfg.eval, V);
    if (prompt) sample_prompt_ids(cfg.eval.sample_prompt, vocab.get(), V);
  }
}

Evaluator::Evaluator(const Config& cfg, const Plan& plan, HostComm& host)
    : ec_(cfg.eval), seed_(cfg.run.seed), host_(host) {
  const int B = plan.micro_batch, T = plan.seq_len, V = plan.model.dims.vocab_size;
  tok_.resize(size_t(B) * T);
  tgt_.resize(size_t(B) * T);
  if (cfg.data.synthetic)
    val_ = make_synthetic_source(cfg.data, cfg.run.seed, 1, B, T, host.rank(), host.world());
  else if (!cfg.data.val.empty())
    val_ = make_shard_source(cfg.data.val, B, T, host.rank(), host.world(), V);  // never shuffled
  if (!ec_.hellaswag.empty()) hellaswag_ = read_choice_file(ec_.hellaswag, V);
  vocab_ = load_vocab(ec_, V);
  if (ec_.sample_tokens > 0) prompt_ = sample_prompt_ids(ec_.sample_prompt, vocab_.get(), V);
}

std::string Evaluator::describe() const {
  std::string s = val_ ? "val data: " + val_->describe() : std::string();
  if (!hellaswag_.empty())
    s += (s.empty() ? "" : "; ") + std::string("hellaswag: ") + std::to_string(hellaswag_.size()) + " examples";
  return s;
}

bool Evaluator::stopping() { return host_.max(stop_requested() ? 1L : 0L) != 0; }

double Evaluator::val_loss(GPT& model, ParamStore& ps) {
  const int64_t n = ec_.batches.all ? val_->epoch_batches() : ec_.batches.count;
  if (n <= 0) return NAN;
  val_->seek(DataPosition{});  // the same batches every time
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (stopping()) {
      stopped_ = "the validation loss (after " + std::to_string(i) + " of " + std::to_string(n) + " batches)";
      return NAN;
    }
    // agreed: a bad shard or token id may be in one rank's rows only
    agreed(host_, "reading the validation data", [&] { val_->next(tok_.data(), tgt_.data()); });
    sum += model.forward(ps, tok_.data(), tgt_.data(), false, 0.0f);
  }
  return host_.sum(sum / double(n)) / host_.world();
}

std::string Evaluator::sample(GPT& model, ParamStore& ps, int64_t step) {
  const std::vector<int> ids = generate(model, ps, prompt_, ec_.sample_tokens, ec_.sample_temperature,
                                        splitmix64(seed_ ^ 0x5A3D1E00ull ^ uint64_t(step)), &host_);
  if (vocab_) return vocab_->decode(ids);
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

EvalRow Evaluator::run(GPT& model, ParamStore& ps, int64_t step) {
  EvalRow r;
  r[EvalMetric::step] = double(step);
  stopped_.clear();
  if (val_) r[EvalMetric::val_loss] = val_loss(model, ps);
  if (!hellaswag_.empty() && stopped_.empty()) {
    const ChoiceAccuracy a = score_choices(hellaswag_, model, ps, host_, [this] { return stopping(); });
    if (a.stopped) stopped_ = "HellaSwag";
    r[EvalMetric::hellaswag_acc] = a.acc;
    r[EvalMetric::hellaswag_acc_norm] = a.acc_norm;
  }
  if (ec_.sample_tokens > 0 && stopped_.empty()) {
    if (stopping()) stopped_ = "the sample";
    else r.sample = sample(model, ps, step);
  }
  return r;
}


}  // namespace gpt
