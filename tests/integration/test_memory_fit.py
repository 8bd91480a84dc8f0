"""training.memory_fit: auto on the command line: the dry run and a 2-step CPU run print the same choice
and runner-up for a budget that rules out the defaults, the run log's resolved config holds the choice,
--resume keeps the checkpoint's choice under another budget, and the bad cases end with their exit code
and a first line naming the key."""
import re
import sys

import yaml

from conftest import ROOT, run_train, write_yaml

sys.path.insert(0, str(ROOT / "scripts"))
import h5log  # noqa: E402

# 256 tokens a step (16 sequences of 16), the split, the state, the level left to the chooser
FIT = """run: {{name: fit, out_dir: {out}, seed: 7}}
model: {{n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 64, max_seq_len: 32}}
data: {{synthetic: true, synthetic_vocab: 64}}
training: {{device: cpu, seq_len: 16, total_batch_tokens: 256, steps: {steps}, lr: 1.0e-2, memory_fit: auto{extra}}}
log: {{every: 1, progress: false}}
checkpoint: {{every: 2}}
"""
# 943.72 KiB a rank: below every fp32-state combination of this model (its checkpoint snapshot included)
TIGHT = 0.0009
CHOSEN = re.compile(r"chosen: +optimizer_state (\w+), recompute (\d), master_weights (\w+), micro_batch (\d+) x grad_accum (\d+): "
                    r"([\d.]+ \w+) \(")


def fit_yaml(tmp_path, extra="", steps=2):
    return write_yaml(tmp_path / "fit.yaml", FIT.format(out=tmp_path / "runs", extra=extra, steps=steps))


def train(tmp_path, *args, extra=f", memory_limit_gb: {TIGHT}", steps=2):
    return run_train(["--yaml", fit_yaml(tmp_path, extra, steps), *args], env={"OMP_NUM_THREADS": "1"}, timeout=120)


def choice(out):
    """The printed choice (state, recompute, master, micro_batch, grad_accum, total) and the runner-up line."""
    m = CHOSEN.search(out)
    assert m, out
    runner = re.search(r"^\| runner-up: .*$", out, re.M)
    assert runner, out
    return m.groups(), runner.group(0)


def first_error(p):
    return p.stderr.strip().splitlines()[0]


def test_dry_run_and_run_take_the_same_choice_and_record_it(tmp_path):
    dry = train(tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    (state, rec, master, micro, accum, total), runner = choice(dry.stdout)
    assert re.match(r"\| runner-up: optimizer_state \w+, recompute \d, master_weights \w+, micro_batch \d+ x grad_accum \d+: "
                    r"[\d.]+ \w+ \(params .*\), [\d.e-]+ ms a step$", runner), runner
    assert state != "fp32", f"the budget must rule out fp32 state: {dry.stdout}"
    assert int(micro) * int(accum) * 16 == 256  # the global batch kept
    assert f"batch              micro {micro} x seq 16 x accum {accum} x ranks 1 = 256 tokens/step" in dry.stdout
    assert re.search(rf"fit training\.memory_limit_gb {TIGHT} ", dry.stdout), dry.stdout
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing

    run = train(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert choice(run.stdout) == ((state, rec, master, micro, accum, total), runner)
    log = h5log.read_log(tmp_path / "runs" / "fit")
    assert log["attrs"]["status"] == "ok" and len(log["train"]["loss"]) == 2
    t = yaml.safe_load(log["attrs"]["config_yaml"])["training"]
    assert (t["optimizer_state"], t["recompute"], t["master_weights"], t["micro_batch"], t["memory_fit"]) == \
        (state, int(rec), master, int(micro), "auto")
    pred, meas = log["memory"]["predicted"], log["memory"]["measured"]
    assert pred["total"] <= TIGHT * 2**30
    assert all(meas[k] == pred[k] for k in log["memory"]["components"]), (pred, meas)  # what the run allocated

    # --resume under a budget where fp32 state fits keeps the checkpoint's choice (choosing again would
    # change the optimizer state, which a resume refuses)
    dry = train(tmp_path, "--resume", "--dry-run", extra=", memory_limit_gb: 1", steps=4)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert choice(dry.stdout) == ((state, rec, master, micro, accum, total), "| runner-up: none (the only combination)")
    assert "--resume: continues from the checkpoint of step 2" in dry.stdout
    res = train(tmp_path, "--resume", extra=", memory_limit_gb: 1", steps=4)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "--resume keeps the combination of '" in res.stdout and "step_00000002" in res.stdout, res.stdout
    assert choice(res.stdout) == ((state, rec, master, micro, accum, total), "| runner-up: none (the only combination)")
    log = h5log.read_log(tmp_path / "runs" / "fit")
    assert list(log["train"]["step"]) == [1, 2, 3, 4]
    assert yaml.safe_load(log["attrs"]["config_yaml"])["training"]["optimizer_state"] == state


def test_generous_budget_keeps_the_defaults(tmp_path):
    p = train(tmp_path, "--dry-run", extra=", memory_limit_gb: 1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert choice(p.stdout)[0][:5] == ("fp32", "0", "fp32", "16", "1")


def test_bad_cases_name_the_key(tmp_path):
    # nothing fits: out of memory, before anything is written
    for args in (["--dry-run"], []):
        p = train(tmp_path, *args, extra=", memory_limit_gb: 0.0001")
        assert p.returncode == 3, p.stdout + p.stderr
        assert first_error(p).startswith("error: training.memory_fit: auto: no combination fits "
                                         "training.memory_limit_gb 0.0001 (104.86 KiB per rank): the smallest "
                                         "predicted total is "), p.stderr
        assert "with optimizer_state int8, recompute 3, master_weights fp32, micro_batch 1 x grad_accum 16" in first_error(p)
        assert not (tmp_path / "runs").exists()
    # the CPU has no memory of its own to fit
    p = train(tmp_path, "--dry-run", extra="")
    assert p.returncode == 1, p.stdout + p.stderr
    assert first_error(p).startswith("error: config: training.memory_limit_gb: training.memory_fit: auto on the CPU "
                                     "needs it > 0"), p.stderr
    # micro_batch: max is a search of its own
    p = train(tmp_path, "--dry-run", "--set", "training.micro_batch=max", "--set", "training.total_batch_tokens=0",
              extra=", memory_limit_gb: 1")
    assert p.returncode == 1, p.stdout + p.stderr
    assert first_error(p).startswith("error: config: training.micro_batch: 'max' cannot be combined with "
                                     "training.memory_fit: auto"), p.stderr


def test_sweep_dry_run_notes_each_points_choice(tmp_path):
    text = FIT.format(out=tmp_path / "runs", extra="", steps=2) + "sweep:\n  grid: {training.memory_limit_gb: [1, %s]}\n" % TIGHT
    p = run_train(["--yaml", write_yaml(tmp_path / "s.yaml", text), "--dry-run"], env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    notes = dict(re.findall(r"^\(point (\d): memory_fit: auto: .*?; chosen: +optimizer_state (\w+), ", p.stdout, re.M))
    assert notes["0"] == "fp32" and notes["1"] != "fp32", p.stdout
    assert not (tmp_path / "runs").exists()


# eight layers (a bucket is an eighth of the gradients: gradient release's buffers, four buckets' worth, are
# half of them), 4 sequences a step, clipping off: one micro-batch of 4 with gradient release fits 1.84 MiB
# where without it only micro-batches of 2 x 2 do (more micro-steps: slower in the model)
RELEASE = ["--set", "model.n_layer=8", "--set", "training.total_batch_tokens=64", "--set", "training.grad_clip=0.0"]
RELEASE_BUDGET = 0.0018


def test_gradient_release_is_chosen_where_it_lets_the_faster_split_fit(tmp_path):
    dry = train(tmp_path, "--dry-run", *RELEASE, extra=f", memory_limit_gb: {RELEASE_BUDGET}")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    chosen = re.search(r"^\| chosen: +(.*)$", dry.stdout, re.M).group(1)
    assert "gradient_release, micro_batch 4 x grad_accum 1:" in chosen, dry.stdout
    runner = re.search(r"^\| runner-up: +(.*)$", dry.stdout, re.M).group(1)
    assert "gradient_release" not in runner and "micro_batch 2 x grad_accum 2" in runner, runner
    run = train(tmp_path, *RELEASE, extra=f", memory_limit_gb: {RELEASE_BUDGET}")
    assert run.returncode == 0, run.stdout + run.stderr
    log = h5log.read_log(tmp_path / "runs" / "fit")
    t = yaml.safe_load(log["attrs"]["config_yaml"])["training"]
    assert t["gradient_release"] is True and t["micro_batch"] == 4 and len(log["train"]["loss"]) == 2
    pred, meas = log["memory"]["predicted"], log["memory"]["measured"]
    assert pred["grads"] == 0 and pred["total"] <= RELEASE_BUDGET * 2**30
    assert all(meas[k] == pred[k] for k in log["memory"]["components"]), (pred, meas)
    # with clipping (GPT-2's 1.0) it is no choice: the same budget takes the two micro-batches
    dry = train(tmp_path, "--dry-run", *RELEASE[:4], extra=f", memory_limit_gb: {RELEASE_BUDGET}")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "gradient_release" not in dry.stdout.split("+-- memory fit")[1], dry.stdout
    # and where the budget is generous it is not taken: the same step without it comes first
    dry = train(tmp_path, "--dry-run", *RELEASE, extra=", memory_limit_gb: 1")
    assert "gradient_release" not in re.search(r"^\| chosen: +(.*)$", dry.stdout, re.M).group(1), dry.stdout


def test_gradient_release_is_weighed_on_two_ranks(tmp_path):
    """Two ranks, each with 4 sequences a step (the global batch doubled) and half the checkpoint snapshot:
    in 1.5 MiB a rank gradient release with one micro-batch of 4 fits where without it nothing as fast does,
    and the run takes it on both ranks."""
    two = [*RELEASE[:2], "--set", "training.total_batch_tokens=128", *RELEASE[4:]]
    y = fit_yaml(tmp_path, ", memory_limit_gb: 0.0015")
    dry = run_train(["--yaml", y, "--dry-run", *two], ranks=2, env={"OMP_NUM_THREADS": "1"}, timeout=120)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    chosen = re.search(r"^\| chosen: +(.*)$", dry.stdout, re.M).group(1)
    assert "gradient_release, micro_batch 4 x grad_accum 1:" in chosen, dry.stdout
    run = run_train(["--yaml", y, *two], ranks=2, env={"OMP_NUM_THREADS": "1"}, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    log = h5log.read_log(tmp_path / "runs" / "fit")
    t = yaml.safe_load(log["attrs"]["config_yaml"])["training"]
    assert t["gradient_release"] is True and t["micro_batch"] == 4 and len(log["train"]["loss"]) == 2
    assert log["memory"]["measured"]["grads"] == 0


def test_gradient_release_given_keeps_one_micro_batch_a_step(tmp_path):
    """gradient_release: true with memory_fit: auto and the split left open: memory_fit chooses among the
    combinations of one micro-batch a step; with the split given as two micro-batches it is refused."""
    p = train(tmp_path, "--dry-run", *RELEASE, "--set", "training.gradient_release=true", extra=", memory_limit_gb: 1")
    assert p.returncode == 0, p.stdout + p.stderr
    chosen = re.search(r"^\| chosen: +(.*)$", p.stdout, re.M).group(1)
    assert "gradient_release, micro_batch 4 x grad_accum 1:" in chosen and "kept as given: training.gradient_release" in p.stdout
    p = train(tmp_path, "--dry-run", *RELEASE, "--set", "training.gradient_release=true", "--set",
              "training.micro_batch=2", extra=", memory_limit_gb: 1")
    assert p.returncode == 1 and first_error(p).startswith(
        "error: config: training.gradient_release: 'true' needs one micro-batch a step"), p.stderr
