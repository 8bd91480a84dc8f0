"""The model's structural choices against GPT-2's, end to end on the CPU: model.norm rmsnorm (in place of
LayerNorm), model.bias false (no bias vectors) and model.tied_head false (the head's own matrix). Each trains (in fp32 and FP8), its
checkpoints resume bit for bit and carry the choice (a resume under another structure is named, exit 1,
nothing changed), its parameter table lacks exactly the tensors it drops, and the GPT-2 file formats refuse
it by name. A new structural choice gets these checks by a line in VARIANTS."""
import numpy as np
import pytest

import json
import sys
from pathlib import Path

from conftest import read_log, run_train, tiny_yaml
from test_resume_states import ok, refused, run, snapshot
from test_zero import checkpoint_state, latest_checkpoint, run_ok

# name: (overrides, what the refusals name, parameters of the tiny model (2 layers of width 32, vocabulary
# 64) it drops)
C, L, V = 32, 2, 64
VARIANTS = {
    "rmsnorm": (["model.norm=rmsnorm"], "model.norm rmsnorm", (2 * L + 1) * C),  # ln1b, ln2b, lnfb
    "nobias": (["model.bias=false"], "model.bias false", L * 9 * C + (2 * L + 1) * C),  # qkv 3C, attproj C, fc 4C, fcproj C
    "rmsnorm-nobias": (["model.norm=rmsnorm", "model.bias=false"], "model.norm rmsnorm", L * 9 * C + (2 * L + 1) * C),
    "untied": (["model.tied_head=false"], "model.tied_head false", -V * C),  # the head's own matrix
    "relu2": (["model.activation=relu2"], "model.activation relu2", 0),  # the same parameters
    "nope": (["model.pos_embedding=false"], "model.pos_embedding none", 32 * C),  # wpe: max_seq_len x C
    "rope": (["model.pos_embedding=rope"], "model.pos_embedding rope", 32 * C),  # wpe's place: rotations, no tensor
}


@pytest.mark.parametrize("precision", ["fp32", "fp8"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_trains_and_differs_from_gpt2(tmp_path, variant, precision):
    sets = [f"training.precision={precision}"]
    gpt2, _ = run_ok(tmp_path, 1, "gpt2", steps=30, sets=sets)
    other, run_dir = run_ok(tmp_path, 1, "other", steps=30, sets=sets + VARIANTS[variant][0])
    loss = np.asarray(other["loss"])
    ref = np.asarray(gpt2["loss"])
    # it learns (the synthetic corpus from ln(64) ~ 4.2), as far as GPT-2's structure does in as many steps
    assert np.all(np.isfinite(loss)) and loss[-5:].mean() < loss[:3].mean() - 0.25, loss
    assert loss[-5:].mean() < 1.05 * ref[-5:].mean(), (loss, ref)  # at least as far (an untied head goes further)
    assert not np.array_equal(loss, ref)  # another model: not GPT-2 under another name
    # the predicted memory is what was allocated (fewer tensors, fewer gradients)
    for k in ("params", "activations"):
        assert other["mem_pred"][k] == other["mem_meas"][k], (k, other["mem_pred"], other["mem_meas"])
    assert (other["mem_meas"]["params"] < gpt2["mem_meas"]["params"]) == (VARIANTS[variant][2] > 0)
    state, _, _ = checkpoint_state(latest_checkpoint(run_dir))
    assert state, "no parameters in the checkpoint"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_resumes_bit_for_bit(tmp_path, variant):
    # a constant learning rate: the first half run alone (4 steps) follows the whole run's schedule
    sets = VARIANTS[variant][0] + ["training.schedule=constant"]
    whole, _ = run_ok(tmp_path, 1, "whole", steps=8, sets=sets)
    y = tiny_yaml(tmp_path, name="parts", steps=8, ckpt_every=4)
    args = [a for kv in sets for a in ("--set", kv)]
    ok(run(["--yaml", y, *args, "--set", "training.steps=4"]))
    ok(run(["--yaml", y, *args, "--resume"]))
    parts = read_log(tmp_path / "runs/parts/log.h5")
    assert list(parts["loss"]) == list(whole["loss"])


@pytest.mark.parametrize("key,was,now", [("model.norm", "layernorm", "rmsnorm"), ("model.bias", "true", "false"),
                                         ("model.tied_head", "true", "false"),
                                         ("model.activation", "gelu", "relu2"),
                                         ("model.pos_embedding", "learned", "none"),
                                         ("model.pos_embedding", "learned", "rope")])
def test_a_resume_under_another_structure_is_named(tmp_path, key, was, now):
    y = tiny_yaml(tmp_path, steps=6, ckpt_every=3)
    ok(run(["--yaml", y, "--set", "training.steps=3"]))
    before = snapshot(tmp_path / "runs/t")
    refused(run(["--yaml", y, "--resume", "--set", f"{key}={now}"]), "holds another model",
            f"{key} was {was} and is {now} now")
    assert snapshot(tmp_path / "runs/t") == before


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpt2_files_refuse_a_variant(tmp_path, variant):
    sets, named, _ = VARIANTS[variant]
    _, run_dir = run_ok(tmp_path, 1, "r", steps=2, sets=sets)
    # a Hugging Face folder holds an untied head (below); llm.c files hold GPT-2 exactly
    for fmt in ("llmc",) if variant == "untied" else ("llmc", "hf"):
        out = tmp_path / f"out_{fmt}"
        p = run_train(["export", "--ckpt", str(run_dir), "--out", str(out), "--format", fmt])
        assert p.returncode == 1 and named in p.stderr, p.stderr
        assert not out.exists()
    y = tiny_yaml(tmp_path, name="i", extra=f"model: {{init_from: '{tmp_path}/model.bin'}}")
    p = run_train(["--yaml", str(y)] + [a for kv in sets for a in ("--set", kv)])
    assert p.returncode == 1 and "model.init_from" in p.stderr and named in p.stderr, p.stderr


def test_an_untied_head_goes_through_a_hugging_face_folder(tmp_path):
    """Exported with tie_word_embeddings false and its own lm_head.weight, whose logits a float64 NumPy GPT-2
    over the folder reproduces; back through model.init_from bit for bit; refused by name where the folder
    and the config disagree about the tying."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import check_hf_export
    from safetensors.numpy import load_file
    sets = ["model.tied_head=false"]
    _, run_dir = run_ok(tmp_path, 1, "u", steps=5, sets=sets)
    diff, tol, used = check_hf_export.compare(run_dir, reference="numpy")
    assert used == "numpy" and diff <= tol, (diff, tol)
    hf = tmp_path / "hf"
    run_train(["export", "--ckpt", run_dir, "--format", "hf", "--out", hf], check=True)
    assert json.loads((hf / "config.json").read_text())["tie_word_embeddings"] is False
    t = load_file(str(hf / "model.safetensors"))
    assert t["lm_head.weight"].shape == (V, C) and not np.array_equal(t["lm_head.weight"], t["transformer.wte.weight"])
    # a run from the folder at lr 0 keeps the weights: its checkpoint exports to the same bytes
    y = tiny_yaml(tmp_path, name="b", steps=1, ckpt_every=1)
    run_train(["--yaml", y, "--set", sets[0], "--set", f"model.init_from={hf}", "--set", "training.lr=0"], check=True)
    run_train(["export", "--ckpt", tmp_path / "runs/b", "--format", "hf", "--out", tmp_path / "hf2"], check=True)
    assert (hf / "model.safetensors").read_bytes() == (tmp_path / "hf2/model.safetensors").read_bytes()
    # the tying must agree: a tied model from this folder, an untied one from a tied folder
    _, tied_run = run_ok(tmp_path, 1, "t", steps=1)
    run_train(["export", "--ckpt", tied_run, "--format", "hf", "--out", tmp_path / "tied"], check=True)
    for extra, src, needle in (([], hf, "tie_word_embeddings is false"),
                               (sets, tmp_path / "tied", "no lm_head.weight of its own")):
        p = run_train(["--yaml", tiny_yaml(tmp_path, name="x"), "--set", f"model.init_from={src}"] +
                      [a for kv in extra for a in ("--set", kv)])
        assert p.returncode == 1 and needle in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("key,value,named", [("model.norm", "batchnorm", "layernorm"),
                                             ("model.activation", "swish", "relu2"),
                                             ("model.pos_embedding", "alibi", "rope")])
def test_an_unknown_structure_is_refused(tmp_path, key, value, named):
    p = run_train(["--yaml", str(tiny_yaml(tmp_path)), "--set", f"{key}={value}"])
    assert p.returncode == 1 and key in p.stderr and named in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()


def numpy_logits(ckpt, tokens, n_head, pos_embedding):
    """An independent float64 forward of a checkpoint's model (LayerNorm, GELU's tanh form, tied head) over
    one row of tokens, its parameters read by name from the rank file; rope as GPT-NeoX and LLaMA's
    rotate_half: element i of each query and key head with element i + HS/2, by t * 10000^(-2i / HS)."""
    import h5py
    with h5py.File(next(Path(ckpt).glob("rank_*.h5")), "r") as f:
        m = {}
        for g in sorted(k for k in f if isinstance(f[k], h5py.Group) and "tensors" in f[k].attrs):
            flat = np.asarray(f[g]["param"], dtype=np.float64)
            for item in f[g].attrs["tensors"].split(";"):
                name, off, n = item.split()
                m.setdefault(name, []).append(flat[int(off): int(off) + int(n)])
    m = {k: v if len(v) > 1 else v[0] for k, v in m.items()}
    C, V = len(m["lnfw"]), 64
    ln = lambda x, w, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    gelu = lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    T, HS = len(tokens), C // n_head
    wte = m["wte"].reshape(-1, C)
    x = wte[tokens] + (m["wpe"].reshape(-1, C)[:T] if pos_embedding == "learned" else 0)
    ang = np.arange(T)[:, None] * 10000.0 ** (-2 * np.arange(HS // 2) / HS)[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
    rotate_half = lambda u: np.concatenate([-u[:, HS // 2:], u[:, :HS // 2]], 1)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(len(m["qkvw"])):
        qkv = ln(x, m["ln1w"][l], m["ln1b"][l]) @ m["qkvw"][l].reshape(3 * C, C).T + m["qkvb"][l]
        q, k, v = np.split(qkv, 3, axis=-1)
        heads = []
        for h in range(n_head):
            s = slice(h * HS, (h + 1) * HS)
            qh, kh = q[:, s], k[:, s]
            if pos_embedding == "rope":
                qh, kh = qh * cos + rotate_half(qh) * sin, kh * cos + rotate_half(kh) * sin
            a = qh @ kh.T / np.sqrt(HS) + mask
            a = np.exp(a - a.max(-1, keepdims=True))
            heads.append(a / a.sum(-1, keepdims=True) @ v[:, s])
        x = x + np.concatenate(heads, -1) @ m["attprojw"][l].reshape(C, C).T + m["attprojb"][l]
        hdn = gelu(ln(x, m["ln2w"][l], m["ln2b"][l]) @ m["fcw"][l].reshape(4 * C, C).T + m["fcb"][l])
        x = x + hdn @ m["fcprojw"][l].reshape(C, 4 * C).T + m["fcprojb"][l]
    return ln(x, m["lnfw"], m["lnfb"]) @ wte[:V].T


@pytest.mark.parametrize("pos_embedding", ["learned", "none", "rope"])
def test_the_positions_are_what_an_independent_forward_computes(tmp_path, pos_embedding):
    """The trained model's logits (`sample --logits`, fp32 on the CPU) against numpy_logits: the same
    convention for RoPE's pairs and frequencies as GPT-NeoX and LLaMA, and NoPE with nothing added."""
    import h5py
    _, run_dir = run_ok(tmp_path, 1, "p", steps=6, sets=[f"model.pos_embedding={pos_embedding}"])

    def logits(tokens, name):
        out = tmp_path / f"{name}.h5"
        run_train(["sample", "--ckpt", run_dir, "--prompt-ids", ",".join(map(str, tokens)), "--tokens", "0",
                   "--logits", out], check=True)
        with h5py.File(out, "r") as f:
            return np.asarray(f["logits"], dtype=np.float64)

    tokens = [5, 17, 3, 3, 60, 9, 41, 22, 8, 8, 13, 1]
    mine, ref = logits(tokens, "row"), numpy_logits(latest_checkpoint(run_dir), tokens, 2, pos_embedding)
    assert mine.shape == ref.shape, (mine.shape, ref.shape)
    assert np.max(np.abs(mine - ref)) < 1e-4 * max(1.0, np.max(np.abs(ref))), np.max(np.abs(mine - ref))
    # one token repeated: attention averages equal values whatever its weights, so only a position added to
    # the residual stream (learned) tells the places apart; rope moves the weights alone, as none does nothing
    same = logits([7] * 8, "same")
    spread = np.max(np.abs(same - same[0]))
    assert (spread > 1e-3) if pos_embedding == "learned" else (spread < 1e-5), spread


def test_rope_needs_an_even_head_size(tmp_path):
    p = run_train(["--yaml", str(tiny_yaml(tmp_path, extra="model: {n_embd: 30, pos_embedding: rope}"))])
    assert p.returncode == 1 and "model.pos_embedding" in p.stderr and "(15) must be even" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()


def test_the_fp8_gelu_epilogue_needs_gelu(tmp_path):
    y = str(tiny_yaml(tmp_path))
    sets = ["training.precision=fp8", "training.fp8_gelu_epilogue=true"]
    ok_ = run_train(["--yaml", y, "--dry-run"] + [a for kv in sets for a in ("--set", kv)])
    assert ok_.returncode == 0, ok_.stderr
    p = run_train(["--yaml", y] + [a for kv in sets + ["model.activation=relu2"] for a in ("--set", kv)])
    assert p.returncode == 1 and "training.fp8_gelu_epilogue" in p.stderr and "model.activation" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists()


def test_the_plan_names_the_structure_and_counts_its_parameters(tmp_path):
    y = str(tiny_yaml(tmp_path))
    count = lambda p: int(p.stdout.split("| parameters")[1].split()[0])
    gpt2 = run_train(["--yaml", y, "--dry-run"])
    assert gpt2.returncode == 0 and "), layernorm\n" in gpt2.stdout, gpt2.stdout[:800]
    names = {"rmsnorm": "rmsnorm", "nobias": "layernorm, no biases", "rmsnorm-nobias": "rmsnorm, no biases",
             "untied": "layernorm, untied head", "relu2": "layernorm, relu2", "nope": "layernorm, positions none",
             "rope": "layernorm, positions rope"}
    for variant, (sets, _, dropped) in VARIANTS.items():
        p = run_train(["--yaml", y, "--dry-run"] + [a for kv in sets for a in ("--set", kv)])
        assert p.returncode == 0, p.stderr
        assert f"wide, vocab" in p.stdout and f"), {names[variant]}\n" in p.stdout, p.stdout[:800]
        assert count(gpt2) - count(p) == dropped, (variant, count(gpt2), count(p))


def has_gpu():
    import shutil
    import subprocess
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(not has_gpu(), reason="SKIP: no CUDA device on this machine (GPU tests run on the GPU machine)")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_trains_on_the_gpu_as_on_the_cpu(tmp_path, variant):
    """The CUDA kernels' variant (the norms without their bias, the products without theirs, FP8 included)
    follows the CPU reference's loss curve, and allocates what its plan predicted."""
    curves = {}
    for dev, prec in [("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16"), ("cpu", "fp8"), ("cuda", "fp8")]:
        log, _ = run_ok(tmp_path, 1, f"{dev}{prec}", steps=30,
                        sets=VARIANTS[variant][0] + [f"training.device={dev}", f"training.precision={prec}"])
        curves[dev + prec] = np.asarray(log["loss"])
        assert np.all(np.isfinite(curves[dev + prec])), (dev, prec, curves[dev + prec])
        assert log["mem_pred"]["params"] == log["mem_meas"]["params"], (dev, prec, log["mem_pred"], log["mem_meas"])
    assert np.max(np.abs(curves["cudafp32"] - curves["cpufp32"])) < 0.05, (curves["cudafp32"], curves["cpufp32"])
    assert np.max(np.abs(curves["cudabf16"] - curves["cpufp32"])) < 0.15, (curves["cudabf16"], curves["cpufp32"])
    assert np.max(np.abs(curves["cudafp8"] - curves["cpufp8"])) < 0.15, (curves["cudafp8"], curves["cpufp8"])
