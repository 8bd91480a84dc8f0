"""Bad input is named before any work: exit status 1, a message naming the key or the file (and the line),
and no run directory, for what the config says and for what a run would read only later (validation
shards, the HellaSwag file, model.init_from). Then the commands that must work as written: `train sample`
and scripts/sample.py on models of any vocabulary, a preset given on the command line."""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, SHARED, run_train, tiny_yaml, write_shard, write_yaml

EXIT_BAD_INPUT = 1
V = 64  # the tiny model's vocabulary (conftest.TINY_SYNTH)


def assert_refused(p, *needles):
    """Exit 1 with every needle in the one error line."""
    assert p.returncode == EXIT_BAD_INPUT, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    assert errors, p.stderr
    for n in needles:
        assert n in errors[0], f"{n!r} not in: {errors[0]}"
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def assert_no_run_dir(tmp_path):
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.rglob("*")), f"left behind: {sorted(runs.rglob('*'))}"


def eval_file(path, examples):
    """An llm.c eval file (evalfile.hpp) of (context, endings, label) examples."""
    words = []
    for i, (ctx, endings, label) in enumerate(examples):
        w = [65535, 0, i, label, len(endings), len(ctx)] + ctx
        for e in endings:
            w += [len(e)] + e
        w[1] = 2 * len(w)
        words += w
    header = np.zeros(256, dtype="<i4")
    header[:4] = [20240522, 1, len(examples), 64]
    path.write_bytes(header.tobytes() + np.asarray(words, dtype="<u2").tobytes())
    return path


def good_train_shard(tmp_path):
    return write_shard(tmp_path / "train.bin", np.random.default_rng(0).integers(0, V, 4000))


def bad_val_shard(tmp_path, at=1500):
    tokens = np.random.default_rng(1).integers(0, V, 2000)
    tokens[at] = 60000
    return write_shard(tmp_path / "val.bin", tokens)


# ---- what a run reads later, checked at set-up -------------------------------------------------------

@pytest.mark.parametrize("dry", [False, True])
def test_a_bad_token_id_in_the_validation_shard_is_found_at_set_up(tmp_path, train_bin, dry):
    # eval.batches 1 reads only the first micro-batch: the first evaluation would not even see token 1500
    extra = (f"data: {{synthetic: false, train: '{good_train_shard(tmp_path)}', val: '{bad_val_shard(tmp_path)}'}}\n"
             "eval: {every: 2, batches: 1}\n")
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=4, extra=extra)] + (["--dry-run"] if dry else []))
    assert_refused(p, "data.val", "val.bin", "token 1500 is id 60000", f"vocabulary ({V})")
    assert_no_run_dir(tmp_path)
    assert "step" not in p.stdout  # no training step ran


def test_a_bad_validation_shard_ends_two_ranks_together(tmp_path, train_bin):
    extra = f"data: {{synthetic: false, train: '{good_train_shard(tmp_path)}', val: '{bad_val_shard(tmp_path)}'}}\n"
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=4, B=2, extra=extra)], ranks=2, timeout=120)
    assert_refused(p, "data.val", "token 1500 is id 60000")
    assert_no_run_dir(tmp_path)


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("kind,needles", [
    ("bad_token", ["eval.hellaswag", "hs.bin", "example 1 has token id 5000"]),
    ("no_examples", ["eval.hellaswag", "hs.bin", "holds 0 examples"]),
    ("folder", ["eval.hellaswag", "is a folder"]),
])
def test_a_bad_hellaswag_file_is_named_at_set_up(tmp_path, train_bin, dry, kind, needles):
    hs = tmp_path / "hs.bin"
    if kind == "bad_token":
        eval_file(hs, [([1, 2, 3], [[4], [5]], 0), ([1, 2], [[4], [5000]], 1)])
    elif kind == "no_examples":
        eval_file(hs, [])
    else:
        hs.mkdir()
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=2, extra=f"eval: {{hellaswag: '{hs}'}}\n")] +
                  (["--dry-run"] if dry else []))
    assert_refused(p, *needles)
    assert_no_run_dir(tmp_path)


def test_a_good_hellaswag_file_and_validation_shard_pass_the_checks(tmp_path, train_bin):
    hs = eval_file(tmp_path / "hs.bin", [([1, 2, 3], [[4], [5]], 0), ([1, 2], [[4], [63]], 1)])
    val = write_shard(tmp_path / "val.bin", np.random.default_rng(1).integers(0, V, 2000))
    extra = (f"data: {{synthetic: false, train: '{good_train_shard(tmp_path)}', val: '{val}'}}\n"
             f"eval: {{every: 2, batches: 1, hellaswag: '{hs}'}}\n")
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=2, extra=extra)])
    assert p.returncode == 0, p.stderr
    assert "hellaswag acc_norm" in p.stdout


# ---- the YAML itself -----------------------------------------------------------------------------------

BASE = "run: {{name: r, out_dir: {out}}}\nmodel: {{preset: tiny}}\ndata: {{synthetic: true}}\n"


@pytest.mark.parametrize("text,needles", [
    ("training:\n  [1, 2]: 3\n", ["section 'training' (line 5)", "a key must be a plain name, got a list"]),
    ("training:\n  {a: 1}: 3\n", ["section 'training' (line 5)", "got a mapping"]),
    ("training:\n  lr: 0.1\n  steps: 3\n  lr: 0.2\n", ["section 'training'", "'lr' is given twice (lines 5 and 7)"]),
    ("training: {lr: 0.1, lr: 0.2}\n", ["'lr' is given twice (line 4, columns 12 and 21)"]),
    ("training:\n  lr: 0.1\nlog:\n  every: 1\ntraining:\n  steps: 3\n", ["'training' is given twice (lines 4 and 8)"]),
    ("training:\n  warmup_step: 3\n", ["unknown key 'training.warmup_step' (line 5)",
                                       "did you mean 'training.warmup_steps'?", "Keys of 'training':"]),
    ("trainig:\n  lr: 0.1\n", ["unknown section 'trainig' (line 4)", "did you mean 'training'?"]),
    ("eval:\n  sample_prompt: ROMEO: hi\n", ["line 5", "a string value containing ': ' must be quoted",
                                             'sample_prompt: "ROMEO: hi"']),
    ("training:\n  seq_len: 1.5\n", ["training.seq_len (line 5): expected an integer, got '1.5'"]),
    ("training:\n  lr: fast\n", ["training.lr (line 5): expected a number, got 'fast'"]),
    ("training:\n  deterministic: maybe\n", ["expected a boolean (true/false), got 'maybe'"]),
    ("sweep:\n  grid:\n    training.lr: [1, 2]\n    training.lr: [3]\n", ["sweep.grid", "'training.lr' is given twice"]),
    ("sweep:\n  grid:\n    [a]: [1]\n", ["sweep.grid (line 6): a key must be a plain name"]),
    ("sweep:\n  grid:\n    training.warmup_step: [1]\n", ["did you mean 'training.warmup_steps'?"]),
    ("sweep:\n  gird:\n    training.lr: [1]\n", ["sweep: unknown key 'gird' (line 5); did you mean 'grid'?"]),
    ("sweep:\n  ranges:\n    training.lr: [1]\n", ["sweep: unknown key 'ranges' (line 5); expected grid or zip"]),
])
def test_yaml_mistakes_are_named_with_their_lines(tmp_path, train_bin, text, needles):
    y = write_yaml(tmp_path / "c.yaml", BASE.format(out=tmp_path / "runs") + text)
    p = run_train(["--yaml", y])
    assert_refused(p, *needles)
    assert_no_run_dir(tmp_path)


@pytest.mark.parametrize("override,needles", [
    ("training.warmup_step=3", ["unknown key 'training.warmup_step' (in an override)",
                                "did you mean 'training.warmup_steps'?"]),
    ("trainin.lr=3", ["did you mean 'training.lr'?"]),
    ("eval.sample_prompt=ROMEO: hi", ["eval.sample_prompt", "reads as a mapping",
                                      "--set 'eval.sample_prompt=\"ROMEO: hi\"'"]),
    ("training.steps=1.5", ["training.steps: expected an integer"]),
])
def test_override_mistakes_are_named(tmp_path, train_bin, override, needles):
    p = run_train(["--yaml", tiny_yaml(tmp_path), "--set", override, "--dry-run"])
    assert_refused(p, *needles)


def test_a_quoted_string_with_a_colon_is_accepted(tmp_path, train_bin):
    p = run_train(["--yaml", tiny_yaml(tmp_path, extra='eval: {sample_prompt: "ROMEO: hi"}\n'), "--set",
                   'eval.sample_temperature=0.5', "--dry-run"])
    assert p.returncode == 0, p.stderr
    assert '"ROMEO: hi"' in p.stdout
    p = run_train(["--yaml", tiny_yaml(tmp_path), "--set", 'eval.sample_prompt="ROMEO: hi"', "--dry-run"])
    assert p.returncode == 0 and '"ROMEO: hi"' in p.stdout, p.stderr


def test_yaml_given_a_folder_names_the_path(tmp_path, train_bin):
    (tmp_path / "conf").mkdir()
    p = run_train(["--yaml", tmp_path / "conf"])
    assert_refused(p, str(tmp_path / "conf"), "is a folder, not a file")
    assert "n_layer" not in p.stderr


@pytest.mark.parametrize("key", ["run.name", "run.out_dir"])
def test_a_sweep_cannot_vary_the_folder_its_points_run_in(tmp_path, train_bin, key):
    p = run_train(["--yaml", tiny_yaml(tmp_path, extra=f"sweep:\n  grid:\n    {key}: [a, b]\n"), "--dry-run"])
    assert_refused(p, f"sweep.grid.{key} (line", f"cannot vary {key}")
    p = run_train(["--yaml", tiny_yaml(tmp_path, extra=f"sweep:\n  zip:\n    {key}: [a, b]\n"
                                                        "    training.lr: [0.1, 0.2]\n")])
    assert_refused(p, f"sweep.zip.{key}")
    assert_no_run_dir(tmp_path)


def test_eval_every_without_anything_to_evaluate_is_refused(tmp_path, train_bin):
    train = good_train_shard(tmp_path)
    y = tiny_yaml(tmp_path, extra=f"data: {{synthetic: false, train: '{train}'}}\neval: {{every: 5}}\n")
    p = run_train(["--yaml", y])
    assert_refused(p, "eval.every: 5", "nothing to evaluate", "data.val is empty")
    assert_no_run_dir(tmp_path)
    # something to evaluate: a sample, or validation shards; or no periodic evaluation at all
    for extra in ["eval.sample_tokens=2", f"data.val={train}", "eval.every=0"]:
        p = run_train(["--yaml", y, "--dry-run", extra])
        assert p.returncode == 0, f"{extra}: {p.stderr}"


# ---- a preset given on the command line ------------------------------------------------------------------

def test_a_preset_on_the_command_line_replaces_the_files_dims(tmp_path, train_bin):
    y = tiny_yaml(tmp_path)  # n_layer 2, n_head 2, n_embd 32
    p = run_train(["--yaml", y, "model.preset=d48", "training.device=cuda", "--dry-run"])
    assert p.returncode == 0, p.stderr
    assert "model.preset d48 from the command line replaces the file's n_layer 2, n_head 2, n_embd 32" in p.stdout
    assert "48 layers x 25 heads x 1600 wide" in p.stdout
    # a preset and dims from the same source stay an error, whichever comes first
    for args in (["model.preset=d12", "model.n_layer=3"], ["model.n_layer=3", "model.preset=d12"]):
        assert_refused(run_train(["--yaml", y, *args, "--dry-run"]), "model.preset", "not both")
    text = y.read_text().replace("model: {", "model: {preset: tiny, ")
    assert_refused(run_train(["--yaml", write_yaml(tmp_path / "both.yaml", text), "--dry-run"]), "not both")


def test_a_sweep_over_presets_replaces_the_files_dims(tmp_path, train_bin):
    y = tiny_yaml(tmp_path, extra="sweep:\n  grid:\n    model.preset: [tiny, d12]\n")
    p = run_train(["--yaml", y, "--dry-run", "--index", "1"])
    assert p.returncode == 0, p.stderr
    assert "model.preset d12 from sweep point 1 replaces the file's n_layer 2" in p.stdout
    assert "12 layers x 12 heads x 768 wide" in p.stdout


# ---- train sample and scripts/sample.py ------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A run of the 64-token model with a checkpoint, exported as an llm.c file and a Hugging Face folder."""
    tmp = tmp_path_factory.mktemp("inputs")
    run_train(["--yaml", tiny_yaml(tmp, name="s", steps=2, ckpt_every=2)], check=True)
    run_train(["export", "--ckpt", tmp / "runs/s", "--out", tmp / "m.bin"], check=True)
    run_train(["export", "--ckpt", tmp / "runs/s", "--format", "hf", "--out", tmp / "hf"], check=True)
    return tmp


def test_sample_without_prompt_ids_starts_at_the_vocabularys_last_id(small_run, train_bin):
    p = run_train(["sample", "--ckpt", small_run / "runs/s", "--tokens", "3", "--temperature", "0"])
    assert p.returncode == 0, p.stderr
    ids = [int(x) for x in p.stdout.replace("|", " ").split()]  # the prompt | what was generated
    assert len(ids) == 4 and ids[0] == V - 1 and all(0 <= i < V for i in ids)


@pytest.mark.parametrize("args,needles", [
    (["--tokens", "-5"], ["--tokens: -5 is negative"]),
    (["--tokens", "-5", "--prompt-ids", "1"], ["--tokens: -5 is negative"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--prompt-ids", "1,64"], ["--prompt-ids: '64' is not a token id of this model (0 to 63)"]),
    (["--prompt-ids", "1,2x"], ["--prompt-ids: '2x' is not a token id"]),
])
def test_sample_refuses_bad_flags_by_name(small_run, train_bin, args, needles):
    assert_refused(run_train(["sample", "--ckpt", small_run / "runs/s", *args]), *needles)


def sample_py(args, env=None):
    e = dict(os.environ, XDG_CACHE_HOME=env or os.environ.get("XDG_CACHE_HOME", ""))
    return subprocess.run([sys.executable, str(ROOT / "scripts/sample.py"), *map(str, args)],
                          capture_output=True, text=True, env=e, timeout=300)


def test_sample_py_on_a_model_of_another_vocabulary(small_run, train_bin, tmp_path):
    ckpt = small_run / "runs/s"
    p = sample_py(["--ckpt", ckpt, "--tokens", "3", "--temperature", "0"], env=tmp_path / "cache")
    assert p.returncode == 0, p.stderr
    assert [int(x) for x in p.stdout.split()][0] == V - 1
    assert "vocabulary is 64 ids, not GPT-2's" in p.stderr
    p = sample_py(["--ckpt", ckpt, "--prompt", "ROMEO:"], env=tmp_path / "cache")
    assert p.returncode == 1 and "vocabulary of 64 token ids" in p.stderr and "--prompt-ids" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "download" not in p.stderr
    p = sample_py(["--ckpt", ckpt, "--prompt-ids", "5,6", "--tokens", "2"])
    assert p.returncode == 0 and p.stdout.split()[:2] == ["5", "6"], p.stderr


@pytest.fixture(scope="module")
def gpt2_vocab_run(tmp_path_factory):
    """A tiny model over GPT-2's 50257 ids, its data folder (a shard, no vocabulary), checkpointed."""
    tmp = tmp_path_factory.mktemp("gpt2vocab")
    (tmp / "data").mkdir()
    train = write_shard(tmp / "data/train.bin", np.random.default_rng(2).integers(0, 50257, 4000))
    text = tiny_yaml(tmp, name="g", steps=1, ckpt_every=1).read_text().replace("vocab_size: 64", "vocab_size: 50257")
    text = text.replace("data: {synthetic: true, synthetic_vocab: 64, synthetic_branching: 4}",
                        f"data: {{train: '{train}'}}")
    run_train(["--yaml", write_yaml(tmp / "g.yaml", text)], check=True)
    return tmp


def test_sample_py_finds_the_vocabulary_without_a_download(gpt2_vocab_run, shared_data, tmp_path):
    ckpt, data = gpt2_vocab_run / "runs/g", gpt2_vocab_run / "data"
    empty = tmp_path / "cache"
    for f in ("vocab.json", "merges.txt"):  # a leftover of an earlier test run
        (data / f).unlink(missing_ok=True)
    # nowhere to look: says where it looked, downloads nothing
    p = sample_py(["--ckpt", ckpt, "--prompt", "ROMEO:", "--tokens", "2"], env=empty)
    assert p.returncode == 1, p.stderr
    for needle in ["no GPT-2 vocabulary", "eval.vocab (not set)", str(data), str(empty / "gpt2-bpe"),
                   "--vocab FOLDER", "--download"]:
        assert needle in p.stderr, (needle, p.stderr)
    assert "Traceback" not in p.stderr and not empty.exists()
    # the vocabulary beside the run's shards (where prepare_data.py keeps it)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(shared_data / "gpt2" / f, data / f)
    p = sample_py(["--ckpt", ckpt, "--prompt", "ROMEO:", "--tokens", "3", "--temperature", "0"], env=empty)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ROMEO:"), p.stdout
    # --vocab as a folder; and the ids of the prompt are GPT-2's ("ROMEO" "15173"...)
    p = sample_py(["--ckpt", ckpt, "--vocab", shared_data / "gpt2", "--prompt", "First Citizen:", "--tokens", "0"],
                  env=empty)
    assert p.returncode == 0 and p.stdout.strip() == "First Citizen:", (p.stdout, p.stderr)


def test_sample_py_reads_the_runs_eval_vocab_file_with_eval_merges(gpt2_vocab_run, shared_data, tmp_path):
    """A run whose eval.vocab names vocab.json itself beside eval.merges: sample.py reads those two files."""
    for f in ("vocab.json", "merges.txt"):  # none beside the shards: only the run's keys can serve
        (gpt2_vocab_run / "data" / f).unlink(missing_ok=True)
    (tmp_path / "tok").mkdir()
    vocab, merges = tmp_path / "tok/gpt2-vocab.json", tmp_path / "tok/gpt2-merges.txt"
    shutil.copy(shared_data / "gpt2/vocab.json", vocab)
    shutil.copy(shared_data / "gpt2/merges.txt", merges)
    text = (gpt2_vocab_run / "g.yaml").read_text()
    assert "name: g," in text and "eval: {every: 0, batches: 2}" in text
    text = text.replace("name: g,", "name: em,").replace(
        "eval: {every: 0, batches: 2}", f"eval: {{every: 0, batches: 2, vocab: '{vocab}', merges: '{merges}'}}")
    run_train(["--yaml", write_yaml(tmp_path / "em.yaml", text)], check=True)
    p = sample_py(["--ckpt", gpt2_vocab_run / "runs/em", "--prompt", "First Citizen:", "--tokens", "0"],
                  env=tmp_path / "cache")
    assert p.returncode == 0 and p.stdout.strip() == "First Citizen:", (p.stdout, p.stderr)


# ---- model.init_from ----------------------------------------------------------------------------------------

def init_from_yaml(tmp_path, source):
    return tiny_yaml(tmp_path, steps=2, extra=f"model: {{init_from: '{source}'}}\n")


def edited_hf(small_run, tmp_path, edit):
    d = tmp_path / "hf"
    shutil.copytree(small_run / "hf", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(edit(cfg)))
    return d


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("edit,needles", [
    (lambda c: {**c, "n_layer": "2"}, ["config.json' n_layer must be an integer, got \"2\""]),
    (lambda c: {**c, "model_type": 5}, ["config.json' has model_type 5, expected \"gpt2\""]),
    (lambda c: [c], ["config.json' must hold a JSON object (GPT-2's config), not array"]),
    (lambda c: {k: v for k, v in c.items() if k != "n_head"}, ["config.json' has no n_head"]),
    (lambda c: {**c, "n_embd": 48}, ["config.json' n_embd is 48 but the config says 32"]),
])
def test_a_mistyped_config_json_is_named_by_file_and_field(small_run, train_bin, tmp_path, dry, edit, needles):
    d = edited_hf(small_run, tmp_path, edit)
    p = run_train(["--yaml", init_from_yaml(tmp_path, d)] + (["--dry-run"] if dry else []))
    assert_refused(p, "model.init_from", str(d), *needles)
    assert "json.exception" not in p.stderr
    assert_no_run_dir(tmp_path)


def test_a_nan_weight_in_safetensors_names_the_tensor(small_run, train_bin, tmp_path):
    d = edited_hf(small_run, tmp_path, lambda c: c)
    st = d / "model.safetensors"
    raw = bytearray(st.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    begin = json.loads(raw[8:8 + n])["transformer.h.1.mlp.c_fc.weight"]["data_offsets"][0]
    raw[8 + n + begin + 4 * 10:8 + n + begin + 4 * 11] = struct.pack("<f", float("nan"))
    st.write_bytes(bytes(raw))
    p = run_train(["--yaml", init_from_yaml(tmp_path, d)])
    assert_refused(p, "model.init_from", "model.safetensors", "tensor 'transformer.h.1.mlp.c_fc.weight' holds NaN "
                   "at element 10 of 4096")
    assert "diverged" not in p.stderr
    assert_no_run_dir(tmp_path)


def test_an_infinite_weight_in_an_llmc_file_names_the_tensor(small_run, train_bin, tmp_path):
    m = tmp_path / "m.bin"
    raw = bytearray((small_run / "m.bin").read_bytes())
    wpe = 1024 + 4 * 128 * 32  # after the header and wte (padded vocabulary 128 x 32)
    raw[wpe + 4 * 5:wpe + 4 * 6] = struct.pack("<f", float("inf"))
    m.write_bytes(bytes(raw))
    p = run_train(["--yaml", init_from_yaml(tmp_path, m), "--dry-run"])
    assert_refused(p, "model file", "m.bin", "tensor wpe holds an infinity at element 5 of 1024")
    p = run_train(["--yaml", init_from_yaml(tmp_path, m)])
    assert_refused(p, "tensor wpe holds an infinity")
    assert_no_run_dir(tmp_path)
    # the file as exported starts a run
    p = run_train(["--yaml", init_from_yaml(tmp_path, small_run / "m.bin")])
    assert p.returncode == 0, p.stderr


# ---- inputs that are not regular files ---------------------------------------------------------------------

@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("what", ["data.train", "eval.hellaswag", "init_from", "init_from_hf", "eval.vocab"])
def test_a_fifo_or_device_input_is_refused_at_once(tmp_path, train_bin, what, dry):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    if what == "data.train":
        extra, needles = f"data: {{synthetic: false, train: '{fifo}'}}\n", [str(fifo), "a FIFO (named pipe)"]
    elif what == "eval.hellaswag":
        extra, needles = "eval: {hellaswag: /dev/urandom}\n", ["eval.hellaswag", "'/dev/urandom' is a character device"]
    elif what == "init_from":
        extra, needles = f"model: {{init_from: '{fifo}'}}\n", ["model.init_from", "a FIFO"]
    elif what == "init_from_hf":  # a Hugging Face folder whose weights are a FIFO
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "config.json").write_text(json.dumps(
            {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64, "n_positions": 32}))
        os.mkfifo(tmp_path / "hf" / "model.safetensors")
        extra, needles = f"model: {{init_from: '{tmp_path}/hf'}}\n", ["model.safetensors' is a FIFO"]
    else:
        (tmp_path / "vocab").mkdir()
        os.mkfifo(tmp_path / "vocab" / "vocab.json")
        extra, needles = f"eval: {{vocab: '{tmp_path}/vocab'}}\n", ["eval.vocab", "vocab.json' is a FIFO"]
    p = run_train(["--yaml", tiny_yaml(tmp_path, extra=extra)] + (["--dry-run"] if dry else []), timeout=60)
    assert_refused(p, *needles)
    assert_no_run_dir(tmp_path)


def test_a_fifo_as_the_yaml_is_refused(tmp_path, train_bin):
    os.mkfifo(tmp_path / "conf.yaml")
    assert_refused(run_train(["--yaml", tmp_path / "conf.yaml"], timeout=60), "--yaml", "a FIFO")


# ---- keys that act only at precision fp8 -------------------------------------------------------------------

@pytest.mark.parametrize("key", ["training.fp8_gelu_epilogue=true", "training.fp8_fast_accum=all",
                                 "training.fp8_margin=2", "training.fp8_amax_history=8",
                                 "training.fp8_grad_format=e4m3"])
def test_an_fp8_key_at_another_precision_is_refused(tmp_path, train_bin, key):
    p = run_train(["--yaml", tiny_yaml(tmp_path), key, "--dry-run"])
    assert_refused(p, f"{key.split('=')[0]}: needs training.precision: fp8 (it is bf16)")
    # at its default it says nothing, and at fp8 it is taken
    default = run_train(["--yaml", tiny_yaml(tmp_path), "training.fp8_margin=0", "--dry-run"])
    assert default.returncode == 0, default.stderr
    fp8 = run_train(["--yaml", tiny_yaml(tmp_path), key, "training.precision=fp8", "--dry-run"])
    assert fp8.returncode == 0, fp8.stderr
