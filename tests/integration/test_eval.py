"""Evaluation during training on CPU: HellaSwag scoring against a NumPy GPT-2 on a fixture, split
across ranks; a model trained on a text beating chance on choices made from it; samples in the log and
on the terminal; eval.batches: all."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import ROOT, SHARED, as_killed, read_log, run_train, tiny_yaml, write_yaml

VOCAB_DIR = SHARED / "gpt2"
ENV = {"OMP_NUM_THREADS": "1"}


def need_vocab():
    if not (VOCAB_DIR / "vocab.json").is_file():
        pytest.skip(f"SKIP: GPT-2 vocabulary not found in {VOCAB_DIR}")


def prepare_hellaswag(jsonl, out):
    p = subprocess.run([sys.executable, ROOT / "scripts/prepare_hellaswag.py", jsonl, "--out", out,
                        "--vocab", VOCAB_DIR / "vocab.json", "--merges", VOCAB_DIR / "merges.txt"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return out


def read_eval_file(path):
    """[(context, [endings], label)] token lists of an eval file (the format documented in FORMATS.md)."""
    raw = Path(path).read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:2]) == [20240522, 1]
    w = np.frombuffer(raw[1024:], dtype="<u2").tolist()
    out, at = [], 0
    for _ in range(header[2]):
        assert w[at] == 65535
        label, n = w[at + 3], w[at + 4]
        at += 5
        ctx = w[at + 1: at + 1 + w[at]]
        at += 1 + len(ctx)
        endings = []
        for _ in range(n):
            endings.append(w[at + 1: at + 1 + w[at]])
            at += 1 + w[at]
        out.append((ctx, endings, label))
    assert at == len(w)
    return out


# --- a NumPy GPT-2 (float64) over an llm.c model file: the reference for the trainer's scoring -------

def read_model(path):
    h = np.fromfile(path, dtype=np.int32, count=256)
    assert h[0] == 20240326 and h[1] == 3, h[:2]
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    flat = np.fromfile(path, dtype=np.float32, offset=1024).astype(np.float64)
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)),
              ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
              ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    m, at = {"V": V, "L": L, "NH": NH}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        m[name] = flat[at: at + n].reshape(shape)
        at += n
    assert at == len(flat)
    return m


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def token_losses(m, tokens):
    """Loss of predicting tokens[i + 1] at each position i."""
    t = np.asarray(tokens[:-1])
    T, C, NH = len(t), m["wte"].shape[1], m["NH"]
    x = m["wte"][t] + m["wpe"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(m["L"]):
        q, k, v = np.split(layernorm(x, m["ln1w"][l], m["ln1b"][l]) @ m["qkvw"][l].T + m["qkvb"][l], 3, axis=-1)
        heads = []
        for h in np.split(np.arange(C), NH):
            a = q[:, h] @ k[:, h].T / np.sqrt(len(h)) + mask
            a = np.exp(a - a.max(-1, keepdims=True))
            heads.append(a / a.sum(-1, keepdims=True) @ v[:, h])
        x = x + np.concatenate(heads, -1) @ m["attprojw"][l].T + m["attprojb"][l]
        hdn = gelu(layernorm(x, m["ln2w"][l], m["ln2b"][l]) @ m["fcw"][l].T + m["fcb"][l])
        x = x + hdn @ m["fcprojw"][l].T + m["fcprojb"][l]
    logits = layernorm(x, m["lnfw"], m["lnfb"]) @ m["wte"][: m["V"]].T
    mx = logits.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
    return lse - logits[np.arange(T), np.asarray(tokens[1:])]


def reference_scores(m, examples, T):
    """acc, acc_norm and each example's smallest gap between the two best endings (sum, mean)."""
    right = right_norm = 0
    gaps = []
    for ctx, endings, label in examples:
        sums, means = [], []
        for e in endings:
            row = list(ctx) + list(e)
            drop = max(0, len(row) - (T + 1))  # the trainer keeps a row's last T + 1 tokens
            row = row[drop:]
            loss = token_losses(m, row)[max(0, len(ctx) - 1 - drop):]
            sums.append(loss.sum())
            means.append(loss.mean())
        right += int(np.argmin(sums) == label)
        right_norm += int(np.argmin(means) == label)
        gaps.append(min(np.diff(np.sort(sums))[0], np.diff(np.sort(means))[0]))
    return right / len(examples), right_norm / len(examples), min(gaps)


FIXTURE = [
    ("A man is sitting on a roof. He", ["starts pulling up roofing on a roof.", "is using wrap to wrap a pair of skis.",
                                         "is ripping level tiles off.", "is holding a rubik's cube."], 0),
    ("The chef slices the onions and", ["cries.", "drives a truck across the bridge at noon.",
                                        "adds them to the hot pan with butter.", "sings."], 2),
    ("She opened the old book carefully", ["and dust rose from its pages.", "then ate it.",
                                           "because the moon is made of glass and light.", "quickly."], 0),
    ("Two kids run to the playground", ["and climb the slide.", "with a refrigerator.",
                                        "as the economy grows.", "then the swing set, laughing all the way."], 3),
    ("How to tie a tie. Drape the tie around your neck", ["with the wide end longer than the narrow one.",
                                                         "and eat soup.", "so the cat sleeps.", "forever."], 1),
    ("The dog barks at the mailman, who", ["waves back and walks on.", "is a teapot.",
                                           "swims to the far island every Tuesday morning.", "explodes."], 0),
    # a context longer than the model's window: its first tokens are dropped
    (" ".join(["It was a long and winding story about a village by the sea."] * 4) + " In the end the",
     ["villagers rebuilt the harbour.", "sky.", "number seven tastes blue.", "fish went to the market to sell people."], 0),
]


def write_fixture(path):
    with open(path, "w", encoding="utf-8") as f:
        for ctx, endings, label in FIXTURE:
            f.write(json.dumps({"ctx": ctx, "endings": endings, "label": label, "split": "val"}) + "\n")
    return path


def hellaswag_yaml(tmp_path, name, hs, B=3, steps=3, stage=0):
    return write_yaml(tmp_path / f"{name}.yaml", f"""
run: {{name: {name}, out_dir: {tmp_path / 'runs'}, seed: 5}}
model: {{preset: tiny, max_seq_len: 64}}
data: {{synthetic: true, synthetic_vocab: 500}}
training: {{device: cpu, micro_batch: {B}, seq_len: 32, steps: {steps}, lr: 1.0e-3, zero_stage: {stage}}}
eval: {{every: 0, batches: 1, hellaswag: {hs}, sample_tokens: 5, sample_prompt: "464", sample_temperature: 0}}
log: {{progress: false}}
checkpoint: {{every: {steps}}}
""")


def test_hellaswag_scores_match_a_numpy_gpt2(tmp_path, train_bin):
    need_vocab()
    hs = prepare_hellaswag(write_fixture(tmp_path / "hs.jsonl"), tmp_path / "hs.bin")
    examples = read_eval_file(hs)
    assert len(examples) == len(FIXTURE) and len(examples[-1][0]) + 5 > 33  # one row outgrows seq_len + 1
    # the same training on 1 rank x 6 rows and 2 ranks x 3 (at ZeRO-3, where every forward pass is
    # collective): rows of an example straddle micro-batches, and the ranks score different examples
    run_train(["--yaml", hellaswag_yaml(tmp_path, "one", hs, B=6)], env=ENV, check=True)
    run_train(["--yaml", hellaswag_yaml(tmp_path, "two", hs, B=3, stage=3)], ranks=2, env=ENV, check=True)
    run_train(["export", "--ckpt", tmp_path / "runs/one/checkpoints/step_00000003", "--out", tmp_path / "m.bin"],
              check=True)
    acc, acc_norm, gap = reference_scores(read_model(tmp_path / "m.bin"), examples, T=32)
    assert gap > 1e-4, f"the fixture has near-ties ({gap}) that float32 could break either way"
    for name in ("one", "two"):
        with h5py.File(tmp_path / f"runs/{name}/log.h5", "r") as f:
            assert list(f["eval/step"][:]) == [3]
            assert f["eval/hellaswag_acc"][-1] == pytest.approx(acc, abs=1e-12), name
            assert f["eval/hellaswag_acc_norm"][-1] == pytest.approx(acc_norm, abs=1e-12), name
            assert np.isfinite(f["eval/val_loss"][-1])
            samples = bytes(f["samples"][:]).decode()
            assert samples.startswith("464 ") and len(samples.split()) == 6
            if name == "one":
                first = samples
            assert samples == first  # the greedy sample too


def test_log_from_before_the_new_series_resumes(tmp_path, train_bin):
    """A log without the HellaSwag and sample series (as written before they existed) gets them on
    resume, NaN (and empty) for its earlier rows."""
    y = tiny_yaml(tmp_path, name="old", steps=4, ckpt_every=2)
    sets = ["--set", "eval.every=2", "--set", "eval.sample_tokens=3", "--set", "eval.sample_prompt=1"]
    run_train(["--yaml", y, *sets], env=ENV, check=True)
    log = tmp_path / "runs/old/log.h5"
    with h5py.File(log, "a") as f:
        for k in ("eval/hellaswag_acc", "eval/hellaswag_acc_norm", "eval/sample_end", "samples"):
            del f[k]
    import shutil
    shutil.rmtree(tmp_path / "runs/old/checkpoints/step_00000004")
    (tmp_path / "runs/old/checkpoints/latest").write_text("step_00000002\n")
    as_killed(tmp_path / "runs/old")  # a completed run would be left as it is
    run_train(["--yaml", y, "--resume", *sets], env=ENV, check=True)
    with h5py.File(log, "r") as f:
        assert list(f["eval/step"][:]) == [2, 4]
        assert np.isnan(f["eval/hellaswag_acc"][:]).all() and len(f["eval/hellaswag_acc_norm"]) == 2
        ends = list(f["eval/sample_end"][:])
        text = bytes(f["samples"][:]).decode()
    assert ends == [0, len(text.encode())] and text.startswith("1 ") and len(text.split()) == 4


def test_bad_hellaswag_file_is_named(tmp_path, train_bin):
    bad = tmp_path / "hs.bin"
    bad.write_bytes(np.zeros(300, dtype="<i4").tobytes())
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=1), "--set", f"eval.hellaswag={bad}"], env=ENV)
    assert p.returncode == 1 and "eval.hellaswag" in p.stderr and "hs.bin" in p.stderr and "magic" in p.stderr


# --- a model trained on a text beats chance on choices made from that text; samples of it -----------

ANIMALS = ["fox", "owl", "cat", "bear", "wolf", "hare", "deer", "crow"]
PLACES = ["river", "hill", "barn", "forest", "lake", "field", "bridge", "garden"]
DEEDS = ["sleeps by the", "sings near the", "hides under the", "dances on the", "waits beside the", "runs to the",
         "looks at the", "swims past the"]


def story_sentences():
    """The training text's sentences, in a fixed word order a model that read the text knows."""
    return [f"The {a} {DEEDS[i]} {PLACES[i]} at dawn." for i, a in enumerate(ANIMALS)]


def test_trained_model_beats_chance_and_samples_text(tmp_path, train_bin):
    need_vocab()
    rng = np.random.default_rng(0)
    sentences = story_sentences()
    text = "\n\n".join(" ".join(rng.permutation(sentences)) for _ in range(300))
    (tmp_path / "story.txt").write_text(text, encoding="utf-8")
    p = subprocess.run([sys.executable, ROOT / "scripts/prepare_data.py", tmp_path / "story.txt", "--out-dir",
                        tmp_path / "data", "--prefix", "story", "--val-tokens", "4096", "--workers", "1",
                        "--no-progress", "--vocab", VOCAB_DIR / "vocab.json", "--merges", VOCAB_DIR / "merges.txt"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # each sentence's context, its true ending and three with the same words in another order
    with open(tmp_path / "story.jsonl", "w", encoding="utf-8") as f:
        for i, a in enumerate(ANIMALS):
            words = [PLACES[i], "at", "dawn."]
            wrong = [[words[1], words[0], words[2]], [words[2], words[1], words[0]], [words[0], words[2], words[1]]]
            endings = [" ".join(w) for w in wrong]
            label = int(rng.integers(0, 4))
            endings.insert(label, " ".join(words))
            f.write(json.dumps({"ctx": f"The {a} {DEEDS[i]}", "endings": endings, "label": label}) + "\n")
    hs = prepare_hellaswag(tmp_path / "story.jsonl", tmp_path / "story.bin")
    y = write_yaml(tmp_path / "story.yaml", f"""
run: {{name: story, out_dir: {tmp_path / 'runs'}, seed: 3}}
model: {{preset: tiny, max_seq_len: 64}}
data: {{train: {tmp_path / 'data/story_train.bin'}, val: {tmp_path / 'data/story_val.bin'}}}
training: {{device: cpu, micro_batch: 4, seq_len: 32, steps: 80, lr: 4.0e-3, warmup_steps: 5, weight_decay: 0.0}}
eval: {{every: 40, batches: 2, hellaswag: {hs}, sample_tokens: 12, sample_prompt: "The fox", sample_temperature: 0,
        vocab: {VOCAB_DIR}}}
log: {{every: 20, progress: false}}
""")
    p = run_train(["--yaml", y], env={"OMP_NUM_THREADS": "2"}, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    with h5py.File(tmp_path / "runs/story/log.h5", "r") as f:
        steps = list(f["eval/step"][:])
        acc, acc_norm = f["eval/hellaswag_acc"][:], f["eval/hellaswag_acc_norm"][:]
        ends = f["eval/sample_end"][:]
        samples = bytes(f["samples"][:]).decode("utf-8")
    assert steps == [40, 80]
    assert acc_norm[-1] >= 0.75 and acc[-1] >= 0.75, (acc, acc_norm)  # chance: 0.25 on 8 examples
    texts = [samples[a:b] for a, b in zip([0] + list(ends[:-1]), ends)]
    assert all(t.startswith("The fox") and len(t) > len("The fox") for t in texts), texts
    assert f"sample: {texts[-1]}" in p.stdout
    assert "hellaswag acc_norm" in p.stdout
    # the Python reader and the plots see the same
    sys.path.insert(0, str(ROOT / "scripts"))
    import h5log
    log = h5log.read_log(tmp_path / "runs/story")
    assert log["attrs"]["status"] == "ok" and len(log["eval"]["val_loss"]) == 2
    assert log["samples"] == texts and list(log["eval"]["hellaswag_acc_norm"]) == list(acc_norm)
    p = subprocess.run([sys.executable, ROOT / "scripts/plot_runs.py", tmp_path / "runs/story", "-o",
                        tmp_path / "story.png"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    import matplotlib.image
    assert matplotlib.image.imread(tmp_path / "story.png").shape[1] == 1400  # loss and accuracy panels


def test_sample_token_ids_are_the_models_greedy_continuation(tmp_path, train_bin):
    """Without a vocabulary the sample is token ids: the greedy ones equal `train sample`'s from the
    checkpoint of the same step, and a text prompt is refused, naming eval.vocab."""
    y = tiny_yaml(tmp_path, name="s", steps=4, ckpt_every=4)
    sets = ["--set", "eval.sample_tokens=6", "--set", "eval.sample_prompt=5,6,7", "--set", "eval.sample_temperature=0"]
    run_train(["--yaml", y, *sets], env=ENV, check=True)
    with h5py.File(tmp_path / "runs/s/log.h5", "r") as f:
        sample = bytes(f["samples"][:]).decode()
    p = run_train(["sample", "--ckpt", tmp_path / "runs/s/checkpoints/step_00000004", "--prompt-ids", "5,6,7",
                   "--tokens", "6", "--temperature", "0"], check=True)
    assert sample == p.stdout.strip().replace(" | ", " ")  # the prompt, then what was generated
    assert len(sample.split()) == 9
    p = run_train(["--yaml", y, "--set", "run.name=s2", "--set", "eval.sample_tokens=4",
                   "--set", "eval.sample_prompt=Hello there"], env=ENV)
    assert p.returncode == 1 and "eval.sample_prompt" in p.stderr and "eval.vocab" in p.stderr


def gpt2_sample_run(tmp_path, name, vocab_keys):
    """A tiny model on GPT-2's vocabulary size that samples greedily from a text prompt at its one evaluation;
    the decoded sample."""
    y = tiny_yaml(tmp_path, name=name, steps=2, extra=f"""
model: {{vocab_size: 50257}}
data: {{synthetic_vocab: 50257}}
eval: {{every: 2, sample_tokens: 4, sample_prompt: "The fox", sample_temperature: 0, {vocab_keys}}}
""")
    run_train(["--yaml", y], env=ENV, check=True)
    with h5py.File(tmp_path / f"runs/{name}/log.h5", "r") as f:
        return bytes(f["samples"][:]).decode("utf-8")


def test_eval_vocab_is_a_folder_or_vocab_json_with_eval_merges(tmp_path, train_bin):
    """eval.vocab FILE with eval.merges FILE (files of any name) encodes the prompt and decodes the sample
    as the folder does."""
    need_vocab()
    (tmp_path / "tok").mkdir()
    vocab, merges = tmp_path / "tok/gpt2-vocab.json", tmp_path / "tok/gpt2-merges.txt"
    shutil.copyfile(VOCAB_DIR / "vocab.json", vocab)
    shutil.copyfile(VOCAB_DIR / "merges.txt", merges)
    by_folder = gpt2_sample_run(tmp_path, "dir", f"vocab: {VOCAB_DIR}")
    by_files = gpt2_sample_run(tmp_path, "files", f"vocab: {vocab}, merges: {merges}")
    assert by_folder.startswith("The fox") and len(by_folder) > len("The fox"), by_folder
    assert by_files == by_folder


@pytest.mark.parametrize("keys,first_line", [
    ("merges: {merges}", "eval.merges: '{merges}' needs eval.vocab to name GPT-2's vocab.json beside it"),
    ("vocab: {vocab}", "eval.vocab: '{vocab}' is a file, not a folder: give GPT-2's merges.txt with eval.merges"),
    ("vocab: {dir}, merges: {merges}", "eval.merges: with it eval.vocab names vocab.json itself, but '{dir}' is a folder"),
])
def test_eval_vocab_and_merges_against_the_rule_are_refused(tmp_path, train_bin, keys, first_line):
    need_vocab()
    names = {"dir": VOCAB_DIR, "vocab": VOCAB_DIR / "vocab.json", "merges": VOCAB_DIR / "merges.txt"}
    y = tiny_yaml(tmp_path, name="r", steps=2, extra=f"eval: {{{keys.format(**names)}}}\n")
    for dry in [[], ["--dry-run"]]:
        p = run_train(["--yaml", y] + dry, env=ENV)
        assert p.returncode == 1, p.stdout + p.stderr
        assert first_line.format(**names) in p.stderr.splitlines()[0], p.stderr
        assert not (tmp_path / "runs/r").exists()


def test_eval_batches_all_covers_the_whole_val_set(tmp_path, train_bin, shared_data):
    # the first 3000 tokens of tinyshakespeare's val shard as a val shard of its own
    tokens = np.fromfile(shared_data / "tinyshakespeare/tiny_shakespeare_val.bin", dtype="<u2", offset=1024)[:3000]
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(tokens)]
    val = tmp_path / "val.bin"
    val.write_bytes(header.tobytes() + tokens.tobytes())
    batches = (len(tokens) - 1) // 32 // 4  # whole global micro-batches of 4 sequences of 32 tokens

    def val_loss(name, value, ranks=1, B=4):
        y = write_yaml(tmp_path / f"{name}.yaml", f"""
run: {{name: {name}, out_dir: {tmp_path / 'runs'}}}
model: {{preset: tiny, max_seq_len: 64}}
data: {{train: {val}, val: {val}}}
training: {{device: cpu, micro_batch: {B}, seq_len: 32, steps: 1, lr: 0}}
eval: {{batches: {value}}}
log: {{progress: false}}
""")
        run_train(["--yaml", y], ranks=ranks, env=ENV, check=True, timeout=600)
        return read_log(tmp_path / f"runs/{name}/log.h5")["val_loss"][-1]

    every = val_loss("all", "all")
    assert every == pytest.approx(val_loss("count", batches), abs=1e-9)
    assert every != pytest.approx(val_loss("fewer", batches - 1), abs=1e-7)
    assert every == pytest.approx(val_loss("two", "all", ranks=2, B=2), abs=1e-5)
    p = run_train(["--yaml", tiny_yaml(tmp_path, steps=1), "--set", "eval.batches=all"])
    assert p.returncode == 1 and "eval.batches" in p.stderr
