"""The command line end to end on the CPU: bad input, dry runs, training runs and their logs."""
import math
import re
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, TRAIN, read_log, run_train, tiny_yaml, write_shard, write_yaml


def assert_no_output(tmp_path):
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), f"output was left behind: {list(runs.rglob('*'))}"


@pytest.mark.parametrize("text,needle", [
    ("training:\n  lr: [1, 2\n", "malformed YAML"),
    ("training:\n  lrate: 0.1\n", "training.lrate"),
    ("training:\n  steps: ten\n", "training.steps"),
    ("bogus_section:\n  x: 1\n", "unknown section 'bogus_section'"),
])
def test_bad_yaml_fails_with_named_error_and_no_output(tmp_path, train_bin, text, needle):
    y = write_yaml(tmp_path / "bad.yaml", f"run: {{out_dir: {tmp_path / 'runs'}}}\n" + text)
    p = run_train(["--yaml", y])
    assert p.returncode == 1, p.stderr
    assert needle in p.stderr
    assert_no_output(tmp_path)


def test_unknown_key_names_the_line(tmp_path, train_bin):
    y = write_yaml(tmp_path / "bad.yaml", "run:\n  name: x\ntraining:\n  steps: 3\n  micro_bach: 4\n")
    p = run_train(["--yaml", y])
    assert p.returncode == 1
    assert "training.micro_bach" in p.stderr and "line 5" in p.stderr


@pytest.mark.parametrize("override,needle", [
    ("training.seq_len=64", "max_seq_len"),          # tiny config has max_seq_len 32
    ("training.zero_stage=5", "training.zero_stage"),
    ("training.schedule=exponential", "training.schedule"),
    ("model.n_head=3", "divisible"),
    ("training.micro_batch=0", "training.micro_batch"),
    ("training.matmul_search_s=-1", "training.matmul_search_s"),
    ("training.matmul_search_s=61", "training.matmul_search_s"),
])
def test_impossible_configs_fail_before_any_output(tmp_path, train_bin, override, needle):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--set", override])
    assert p.returncode == 1, p.stdout + p.stderr
    assert needle in p.stderr
    assert_no_output(tmp_path)


@pytest.mark.parametrize("name,needle", [
    ('"."', "run.name: '.' is not a folder name under run.out_dir"),
    ("/abs/run", "run.name: '/abs/run' is not a folder name under run.out_dir"),
    ('"   "', "run.name: must not be only spaces"),
    ('"a\\nb"', "run.name: must not contain a line break"),
])
def test_run_name_must_name_one_folder(tmp_path, train_bin, name, needle):
    y = tiny_yaml(tmp_path, steps=1)
    y.write_text(y.read_text().replace("{name: t,", f"{{name: {name},"))
    p = run_train(["--yaml", y])
    assert p.returncode == 1 and needle in p.stderr, p.stderr
    assert_no_output(tmp_path)


def test_resume_takes_the_data_path_written_another_way(tmp_path, train_bin):
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "b1.bin", np.random.default_rng(0).integers(0, 64, 4096))
    y = tiny_yaml(tmp_path, steps=4, ckpt_every=2)
    y.write_text(y.read_text().replace("data: {synthetic: true, synthetic_vocab: 64, synthetic_branching: 4}",
                                       f"data: {{synthetic: false, train: '{data}//b1.bin'}}"))
    run_train(["--yaml", y, "--set", "training.steps=2"], check=True)
    # dir/b1.bin is dir//b1.bin: the same file, not a changed data.train
    p = run_train(["--yaml", y, "--resume", "--set", f"data.train={data}/./b1.bin"])
    assert p.returncode == 0 and "resumed from step 2" in p.stdout, p.stderr


def test_missing_data_is_a_named_error(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, extra="")
    p = run_train(["--yaml", y, "--set", "data.synthetic=false", "--set", f"data.train={tmp_path}/nope_*.bin"])
    assert p.returncode == 1
    assert "no data files match" in p.stderr


def test_dry_run_prints_config_and_memory_and_writes_nothing(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.zero_stage=1"])
    assert p.returncode == 0, p.stderr
    for word in ["training.zero_stage", "params", "grads", "master", "optim", "activations", "total"]:
        assert word in p.stdout
    assert_no_output(tmp_path)


def test_dry_run_of_gpt2_presets_predicts_memory(tmp_path, train_bin):
    y = write_yaml(tmp_path / "big.yaml", "model: {preset: d48}\ndata: {synthetic: true}\n"
                   "training: {device: cpu, micro_batch: 16, seq_len: 1024}\n")
    p = run_train(["--yaml", y, "--dry-run"])
    assert p.returncode == 0, p.stderr
    assert "48 layers x 25 heads x 1600 wide" in p.stdout


def test_help_lists_the_flags(train_bin):
    p = run_train(["--help"])
    assert p.returncode == 0
    for flag in ["--yaml", "--set", "--dry-run", "--list", "--index", "--resume"]:
        assert flag in p.stdout


def test_tinyshakespeare_training_lowers_loss_and_logs_everything(tmp_path, train_bin, shared_data):
    d = shared_data / "tinyshakespeare"
    y = write_yaml(tmp_path / "ts.yaml", f"""
run: {{name: ts, out_dir: {tmp_path / 'runs'}}}
model: {{preset: tiny, max_seq_len: 256}}
data: {{train: {d / 'tiny_shakespeare_train.bin'}, val: {d / 'tiny_shakespeare_val.bin'}}}
training: {{device: cpu, micro_batch: 4, seq_len: 64, steps: 200, lr: 3.0e-3, warmup_steps: 10, min_lr_frac: 0.1}}
eval: {{every: 50, batches: 4}}
log: {{every: 1, progress: false}}
""")
    p = run_train(["--yaml", y], timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    log = read_log(tmp_path / "runs/ts/log.h5")
    assert list(log["step"]) == list(range(1, 201))
    for k in ["loss", "lr", "grad_norm", "step_ms", "tokens_per_s"]:
        assert len(log[k]) == 200 and np.all(np.isfinite(log[k]))
    assert list(log["eval_step"]) == [50, 100, 150, 200]
    start, end = log["loss"][0], np.mean(log["loss"][-10:])
    assert start > 10.0                      # ln(50257) = 10.8 at initialisation
    assert end < start - 3.5, (start, end)   # well below the start
    assert log["val_loss"][-1] < log["val_loss"][0]
    a = log["attrs"]
    assert a["status"] == "ok" and a["n_params"] > 0 and "training:" in a["config_yaml"]
    assert log["mem_pred"]["total"] > 0 and log["mem_meas"]["peak"] > 0


def test_synthetic_training_approaches_the_known_floor(tmp_path, train_bin):
    # every token has 4 equally likely successors: no model can beat ln 4 = 1.386
    y = write_yaml(tmp_path / "s.yaml", f"""
run: {{name: s, out_dir: {tmp_path / 'runs'}}}
model: {{n_layer: 2, n_head: 2, n_embd: 64, vocab_size: 128, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 128, synthetic_branching: 4}}
training: {{device: cpu, micro_batch: 8, seq_len: 32, steps: 400, lr: 1.0e-2, warmup_steps: 10, weight_decay: 0.0, min_lr_frac: 0.1}}
eval: {{every: 0, batches: 8}}
log: {{every: 10, progress: false}}
""")
    p = run_train(["--yaml", y], timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    log = read_log(tmp_path / "runs/s/log.h5")
    floor = math.log(4)
    val = log["val_loss"][-1]
    assert val > floor - 0.02, f"val loss {val} is below the floor {floor}: the corpus or the loss is wrong"
    assert val < floor + 0.1, f"val loss {val} did not approach the floor {floor}"


def test_quickstart_config_is_valid(train_bin):
    p = run_train(["--yaml", ROOT / "experiments/quickstart.yaml", "--dry-run"])
    assert p.returncode == 0, p.stderr


def test_sigint_checkpoints_and_exits_75(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, name="sig", steps=100000)
    proc = subprocess.Popen([str(TRAIN), "--yaml", str(y)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "runs/sig/log.h5"
    deadline = time.time() + 60
    while not log.exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert (tmp_path / "runs/sig/checkpoints/latest").exists()
    assert read_log(log)["attrs"]["status"] == "checkpointed"


def test_export_and_init_from_round_trip(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, name="a", steps=5, ckpt_every=5)
    run_train(["--yaml", y], check=True)
    ck = tmp_path / "runs/a/checkpoints/step_00000005"
    run_train(["export", "--ckpt", ck, "--out", tmp_path / "m.bin"], check=True)
    hdr = np.fromfile(tmp_path / "m.bin", dtype=np.int32, count=256)
    assert list(hdr[:8]) == [20240326, 3, 32, 64, 2, 2, 32, 128]
    # a run started from the exported weights has the first run's final parameters: its first loss
    # equals a re-evaluation; export them again and compare bytes
    y2 = tiny_yaml(tmp_path, name="b", steps=1, ckpt_every=1, extra=f"")
    run_train(["--yaml", y2, "--set", f"model.init_from={tmp_path / 'm.bin'}", "--set", "training.lr=0"], check=True)
    run_train(["export", "--ckpt", tmp_path / "runs/b/checkpoints/step_00000001", "--out", tmp_path / "m2.bin"], check=True)
    assert (tmp_path / "m.bin").read_bytes() == (tmp_path / "m2.bin").read_bytes()


def test_sample_generates_tokens_from_a_checkpoint(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, name="a", steps=3, ckpt_every=3)
    run_train(["--yaml", y], check=True)
    ck = tmp_path / "runs/a/checkpoints/step_00000003"
    p = run_train(["sample", "--ckpt", ck, "--prompt-ids", "1,2,3", "--tokens", "10", "--temperature", "0"], check=True)
    prompt, generated = p.stdout.split(" | ")  # the prompt's ids, a marker, the generated ids
    ids = [int(x) for x in prompt.split() + generated.split()]
    assert prompt.split() == ["1", "2", "3"] and len(ids) == 13 and all(0 <= i < 64 for i in ids)
    p2 = run_train(["sample", "--ckpt", ck, "--prompt-ids", "1,2,3", "--tokens", "10", "--temperature", "0"], check=True)
    assert p2.stdout == p.stdout  # greedy decoding is deterministic


def test_sample_help_shows_the_defaults(train_bin):
    p = run_train(["sample", "--help"])
    assert p.returncode == 0, p.stderr
    for text in ("--tokens arg (=64)", "--temperature arg (=1)", "--seed arg (=1)", "--device arg (=cpu)",
                 "--force", 'the generated ids, on one line\n("50256 | 464 3290")'):
        assert text in p.stdout, (text, p.stdout)


def test_sample_script_turns_text_into_text(tmp_path, train_bin, shared_data):
    import sys
    y = write_yaml(tmp_path / "g.yaml", f"""
run: {{name: g, out_dir: {tmp_path / 'runs'}}}
model: {{preset: tiny, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 500}}
training: {{device: cpu, micro_batch: 2, seq_len: 32, steps: 2}}
eval: {{batches: 0}}
log: {{progress: false}}
checkpoint: {{every: 2}}
""")
    run_train(["--yaml", y], check=True)
    p = subprocess.run([sys.executable, ROOT / "scripts/sample.py", "--ckpt", tmp_path / "runs/g/checkpoints/step_00000002",
                        "--prompt", "First Citizen:", "--tokens", "8", "--temperature", "0",
                        "--vocab", shared_data / "gpt2/vocab.json", "--merges", shared_data / "gpt2/merges.txt"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("First Citizen:") and len(p.stdout) > len("First Citizen:")


def test_speed_and_profiling_switches_are_config_keys(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.deterministic=true", "--set", "log.op_profile=true",
                   "--set", "training.matmul_search_s=1.5"])
    assert p.returncode == 0, p.stderr
    assert re.search(r"training\.deterministic\s+true", p.stdout) and re.search(r"log\.op_profile\s+true", p.stdout)
    assert re.search(r"training\.matmul_search_s\s+1\.5", p.stdout)
    p = run_train(["--yaml", y, "--dry-run", "--set", "training.deterministic=sometimes"])
    assert p.returncode == 1 and "training.deterministic" in p.stderr


@pytest.mark.parametrize("name", ["zero", "zero_max", "zero_shared_gpu", "scaling", "accum_clip", "long_run",
                                  "structure"])
def test_experiment_configs_are_valid(name, train_bin, tmp_path, request):
    # the GPU experiments planned on the CPU, for the GPU they name: every point's config must parse and
    # validate, and the data files they name (data/tinyshakespeare/, here the shared copy) must be shards.
    # The synthetic ones (zero, zero_max, scaling) read no files: planned with no data/ at all, never skipped.
    reads_data = "data/tinyshakespeare" in (ROOT / f"experiments/{name}.yaml").read_text()
    if reads_data:
        (tmp_path / "data").mkdir()
        (tmp_path / "data/tinyshakespeare").symlink_to(request.getfixturevalue("shared_data") / "tinyshakespeare")
    p = run_train(["--yaml", ROOT / f"experiments/{name}.yaml", "--dry-run"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    if reads_data:
        assert "train data: 1 shard(s), 305261 tokens" in p.stdout


def test_op_profile_accounts_for_the_training_step(tmp_path, train_bin):
    """log.op_profile on the CPU: each op of a training step once per layer, evaluation left out, and the
    ops plus the idle time add up to the step's window."""
    y = tiny_yaml(tmp_path, steps=8, accum=2)
    p = run_train(["--yaml", y, "--set", "log.op_profile=true", "--set", "eval.every=3"])
    assert p.returncode == 0, p.stderr
    text = p.stdout[p.stdout.index("op profile over"):]
    head = re.match(r"op profile over (\d+) steps: ([\d.]+) ms per step", text)
    assert head and int(head.group(1)) == 7, text[:200]  # the warm-up step is left out
    window = float(head.group(2))
    rows = {}
    for m in re.finditer(r"^  (\S.*?)\s{2,}([\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)%$", text, re.M):
        rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    idle = float(re.search(r"\(idle between ops\)\s+(-?[\d.]+)", text).group(1))
    # 2 layers x 2 micro-steps; the lm head (vocabulary padded to 128) is one chunk per micro-step
    assert rows["matmul_fwd 32x96"][0] == 4.0 and rows["matmul_bwd 32x96"][0] == 4.0
    assert rows["matmul_fwd 32x128 +gelu"][0] == 4.0 and rows["attention_bwd"][0] == 4.0
    # per micro-step: the first ln1, then the residual add with the next LayerNorm after each branch
    assert rows["layernorm_fwd"][0] == 2.0 and rows["residual_layernorm_fwd"][0] == 8.0
    assert rows["layernorm_bwd"][0] == 10.0
    assert rows["classifier"][0] == 2.0 and rows["sum_squares"][0] == 1.0
    busy = sum(ms for _, ms in rows.values())
    assert abs(busy + idle - window) < 0.01 + 0.001 * window
    assert idle > -0.01 * window, "ops counted outside the step's window"


def test_config_reference_is_docs_config_md(tmp_path, train_bin):
    """docs/CONFIG.md is what --config-reference prints from the field table: it cannot drift."""
    p = run_train(["--config-reference"], check=True)
    assert p.stdout == (ROOT / "docs/CONFIG.md").read_text(), \
        "docs/CONFIG.md is stale: regenerate it with ./train --config-reference > docs/CONFIG.md"
    rows = [l for l in p.stdout.splitlines() if l.startswith("| `")]
    keys = set()
    section = None
    for line in p.stdout.splitlines():
        if line.startswith("## `"):
            section = line[4:-1]
        elif line.startswith("| `") and section != "sweep":
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 4 and cells[3], f"a field without documentation: {line}"
            keys.add(f"{section}.{cells[0].strip('`')}")
    assert len(rows) > 40
    # the documented keys are exactly the keys of the resolved config
    y = write_yaml(tmp_path / "ref.yaml", "model: {preset: tiny}\ndata: {synthetic: true}\ntraining: {device: cpu}\n")
    dry = run_train(["--yaml", y, "--dry-run"], check=True).stdout
    config_block = dry.split("+-- derived")[0]
    printed = {l.split()[1] for l in config_block.splitlines() if l.startswith("| ")}
    assert keys == printed


def test_memory_components_are_one_list(tmp_path, train_bin):
    """The dry-run, the run log and the Python reader name the same memory components in the same order."""
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    import h5log
    y = tiny_yaml(tmp_path, steps=1)
    dry = run_train(["--yaml", y, "--dry-run"], check=True).stdout
    block = dry.split("predicted memory per rank")[1].splitlines()[1:]
    printed = [l.split()[1] for l in block if l.startswith("| ") and not l.startswith("| (")]
    run_train(["--yaml", y], check=True)
    log = read_log(tmp_path / "runs" / "t" / "log.h5")
    lists = []
    for group in ("mem_pred", "mem_meas"):
        listed = log[group]["components"]
        listed = (listed.decode() if isinstance(listed, bytes) else listed).split()
        assert all(c in log[group] for c in listed + ["total"])
        lists.append(listed)
    assert lists[0] == lists[1] and printed == lists[0] + ["total"]
    assert "optim" in lists[0] and "adam_m" not in lists[0]
    # the Python reader takes the log's own list
    assert h5log.read_log(tmp_path / "runs" / "t" / "log.h5")["memory"]["components"] == lists[0]