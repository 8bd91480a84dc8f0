"""Hugging Face interop: `./train export --format hf` writes a GPT-2 folder (config.json, model.safetensors)
with GPT-2's tensor names and shapes and the llm.c export's values, and for a model on GPT-2's BPE the
tokenizer files and generation_config.json (none for another vocabulary); `model.init_from` reads one
back bit for bit; its logits and greedy continuation equal this trainer's (NumPy everywhere, transformers
where torch and transformers are installed); sample and export find a run's checkpoint from the run."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run_train, tiny_yaml

sys.path.insert(0, str(ROOT / "scripts"))
import check_hf_export  # noqa: E402

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="SKIP: pip install safetensors")

L, C, V, VP, T = 2, 32, 64, 128, 32  # the tiny model of conftest.TINY_SYNTH


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run with a checkpoint at step 5, exported as llm.c (m.bin) and as HF (hf/)."""
    tmp = tmp_path_factory.mktemp("hf")
    run_train(["--yaml", tiny_yaml(tmp, name="a", steps=5, ckpt_every=5)], check=True)
    run = tmp / "runs/a"
    run_train(["export", "--ckpt", run / "checkpoints/step_00000005", "--out", tmp / "m.bin"], check=True)
    run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp / "hf"], check=True)
    return tmp, run


def llmc_tensors(path):
    """The llm.c fp32 file's tensors by name, in its order and shapes."""
    data = np.fromfile(path, dtype=np.float32, offset=1024)
    shapes = [("wte", (VP, C)), ("wpe", (T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)),
              ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
              ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    out, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out[name] = data[off:off + n].reshape(shape)
        off += n
    assert off == len(data)
    return out


def test_hf_export_has_gpt2_names_shapes_and_the_llmc_values(trained):
    tmp, _ = trained
    cfg = json.loads((tmp / "hf/config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]) == (L, 2, C, V, T)
    assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"] is True
    hf = safetensors_numpy.load_file(str(tmp / "hf/model.safetensors"))
    ref = llmc_tensors(tmp / "m.bin")
    expected = {"transformer.wte.weight": ref["wte"][:V],  # the vocabulary unpadded
                "transformer.wpe.weight": ref["wpe"],
                "transformer.ln_f.weight": ref["lnfw"], "transformer.ln_f.bias": ref["lnfb"]}
    for i in range(L):
        h = f"transformer.h.{i}."
        expected.update({
            h + "ln_1.weight": ref["ln1w"][i], h + "ln_1.bias": ref["ln1b"][i],
            h + "attn.c_attn.weight": ref["qkvw"][i].T, h + "attn.c_attn.bias": ref["qkvb"][i],  # Conv1D: (in, out)
            h + "attn.c_proj.weight": ref["attprojw"][i].T, h + "attn.c_proj.bias": ref["attprojb"][i],
            h + "ln_2.weight": ref["ln2w"][i], h + "ln_2.bias": ref["ln2b"][i],
            h + "mlp.c_fc.weight": ref["fcw"][i].T, h + "mlp.c_fc.bias": ref["fcb"][i],
            h + "mlp.c_proj.weight": ref["fcprojw"][i].T, h + "mlp.c_proj.bias": ref["fcprojb"][i]})
    assert set(hf) == set(expected)  # lm_head is tied to wte and not stored
    for name, want in expected.items():
        assert hf[name].dtype == np.float32 and hf[name].shape == want.shape, name
        assert np.array_equal(hf[name], want), name
    assert np.count_nonzero(ref["wte"][V:]) == 0  # nothing is lost by dropping the padding rows


def test_hf_export_then_init_from_round_trips_bit_exactly(trained, tmp_path):
    tmp, _ = trained
    # a run from the HF folder at lr 0 keeps the weights: its checkpoint exports to the same bytes
    y = tiny_yaml(tmp_path, name="b", steps=1, ckpt_every=1)
    run_train(["--yaml", y, "--set", f"model.init_from={tmp / 'hf'}", "--set", "training.lr=0"], check=True)
    run_train(["export", "--ckpt", tmp_path / "runs/b", "--out", tmp_path / "m2.bin"], check=True)
    assert (tmp / "m.bin").read_bytes() == (tmp_path / "m2.bin").read_bytes()
    run_train(["export", "--ckpt", tmp_path / "runs/b", "--format", "hf", "--out", tmp_path / "hf2"], check=True)
    assert (tmp / "hf/model.safetensors").read_bytes() == (tmp_path / "hf2/model.safetensors").read_bytes()
    # and a fine-tune from it trains exactly as one from the llm.c file does
    losses = []
    for i, src in enumerate((tmp / "hf", tmp / "m.bin")):
        y = tiny_yaml(tmp_path, name=f"ft{i}", steps=3)
        p = run_train(["--yaml", y, "--set", f"model.init_from={src}"], check=True)
        losses.append([l.split("| loss ")[1].split()[0] for l in p.stdout.splitlines() if "| loss " in l])
    assert losses[0] == losses[1] and len(losses[0]) == 3


def test_bf16_export_and_init_from(trained, tmp_path):
    tmp, run = trained
    run_train(["export", "--ckpt", run, "--format", "hf", "--dtype", "bf16", "--out", tmp_path / "hf"], check=True)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "hf/model.safetensors"), framework="numpy") as f:
        header = f.metadata()
    assert header == {"format": "pt"}
    raw = (tmp_path / "hf/model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + n])
    assert {v["dtype"] for k, v in meta.items() if k != "__metadata__"} == {"BF16"}
    cfg = json.loads((tmp_path / "hf/config.json").read_text())
    # `dtype` for transformers 4.56 and later, `torch_dtype` for earlier versions
    assert cfg["dtype"] == cfg["torch_dtype"] == "bfloat16"
    y = tiny_yaml(tmp_path, name="c", steps=1)
    run_train(["--yaml", y, "--set", f"model.init_from={tmp_path / 'hf'}"], check=True)


def test_init_from_a_folder_of_another_model_is_a_named_error(trained, tmp_path):
    tmp, _ = trained
    y = tiny_yaml(tmp_path, name="d", steps=1)
    p = run_train(["--yaml", y, "--set", f"model.init_from={tmp / 'hf'}", "--set", "model.n_layer=3"])
    assert p.returncode == 1 and "n_layer is 2 but the config says 3" in p.stderr
    (tmp_path / "empty").mkdir()
    p = run_train(["--yaml", y, "--set", f"model.init_from={tmp_path / 'empty'}"])
    assert p.returncode == 1 and "without config.json" in p.stderr


def edited_copy(trained, tmp_path, edit):
    """A copy of the exported folder with its config.json edited by edit(dict)."""
    tmp, _ = trained
    hf = tmp_path / "hf_edited"
    shutil.copytree(tmp / "hf", hf)
    cfg = json.loads((hf / "config.json").read_text())
    edit(cfg)
    (hf / "config.json").write_text(json.dumps(cfg))
    return hf


@pytest.mark.parametrize("key,value,needle", [
    ("activation_function", "gelu", 'activation_function is "gelu", but this trainer computes GELU\'s tanh'),
    ("activation_function", "relu", 'activation_function is "relu"'),
    ("layer_norm_epsilon", 1e-6, "layer_norm_epsilon is 1e-06, but this trainer's LayerNorm adds 1e-5"),
    ("n_inner", 64, "n_inner is 64, but this trainer's MLP has 4 n_embd = 128 units"),
    ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx is true"),
])  # (tie_word_embeddings false is an untied head: tests/integration/test_structure.py)
def test_init_from_refuses_a_model_the_trainer_cannot_represent(trained, tmp_path, key, value, needle):
    hf = edited_copy(trained, tmp_path, lambda c: c.update({key: value}))
    y = tiny_yaml(tmp_path, name="r", steps=1, ckpt_every=1)
    p = run_train(["--yaml", y, "--set", f"model.init_from={hf}"])
    assert p.returncode == 1 and needle in p.stderr and f"'{hf}/config.json'" in p.stderr, p.stderr
    assert "cannot represent" in p.stderr and not (tmp_path / "runs/r/checkpoints").exists()


def test_init_from_reads_transformers_defaults_and_other_names_of_the_same_model(trained, tmp_path):
    def edit(c):
        for k in ("layer_norm_epsilon", "tie_word_embeddings", "n_inner"):
            del c[k]  # GPT2Config's defaults are this trainer's
        c["activation_function"] = "gelu_pytorch_tanh"
    hf = edited_copy(trained, tmp_path, edit)
    p = run_train(["--yaml", tiny_yaml(tmp_path, name="ok", steps=1), "--set", f"model.init_from={hf}"])
    assert p.returncode == 0, p.stderr


def test_init_from_refuses_a_key_given_twice(trained, tmp_path):
    hf = edited_copy(trained, tmp_path, lambda c: None)
    y = tiny_yaml(tmp_path, name="r", steps=1)
    # config.json: n_layer twice
    text = (hf / "config.json").read_text()
    (hf / "config.json").write_text(text.replace('"n_layer": 2', '"n_layer": 2, "n_layer": 3'))
    p = run_train(["--yaml", y, "--set", f"model.init_from={hf}"])
    assert p.returncode == 1 and "key 'n_layer' is given twice" in p.stderr and "config.json" in p.stderr, p.stderr
    (hf / "config.json").write_text(text)
    # model.safetensors: wte twice, the first entry pointing at zeros appended to the data (every reader keeps
    # one of the two: which one was meant is unknown)
    raw = (hf / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    name = "transformer.wte.weight"
    size = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
    extra = dict(header[name], data_offsets=[len(data), len(data) + size])
    text = "{" + json.dumps(name) + ": " + json.dumps(extra) + ", " + json.dumps(header)[1:]
    text += " " * (-len(text) % 8)
    (hf / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text.encode() + data + bytes(size))
    p = run_train(["--yaml", y, "--set", f"model.init_from={hf}"])
    assert p.returncode == 1 and f"key '{name}' is given twice" in p.stderr, p.stderr
    assert "model.safetensors" in p.stderr and not (tmp_path / "runs/r/log.h5").exists()


def test_hf_logits_match_the_trainers_forward_numpy_reference(trained):
    # GPT-2's forward written from Hugging Face's layout (Conv1D (in, out), tied head), in float64
    _, run = trained
    diff, tol, used = check_hf_export.compare(run, reference="numpy")
    assert used == "numpy" and diff <= tol, (diff, tol)


def test_hf_greedy_generation_matches_the_numpy_reference(trained):
    _, run = trained
    r = check_hf_export.compare(run, reference="numpy", new_tokens=16)
    assert r["diff"] <= r["tol"], r
    assert len(r["ours"]) == 16 and check_hf_export.generation_ok(r), r


def test_hf_export_loads_in_transformers(trained):
    """On a machine with torch and transformers (the GPU machine): every logit of the prompt and the
    greedy continuation of GPT2LMHeadModel.from_pretrained(folder).generate against `./train sample`."""
    if not check_hf_export.have_transformers():
        pytest.skip("SKIP: torch or transformers is not installed; GPT2LMHeadModel.from_pretrained and generate "
                    "not tried (scripts/check_hf_export.py --reference transformers runs them where they are)")
    _, run = trained
    r = check_hf_export.compare(run, reference="transformers", new_tokens=16)
    assert r["reference"] == "transformers" and r["diff"] <= r["tol"], r
    assert len(r["ours"]) == 16 and check_hf_export.generation_ok(r), r


# ---- the tokenizer files ----------------------------------------------------------------------------

GPT2_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")


def gpt2_size_run(tmp, name, vocab=None, merges=None):
    """A tiny model on GPT-2's vocabulary size (synthetic tokens); eval.vocab = vocab (and eval.merges =
    merges) when given."""
    y = tiny_yaml(tmp, name=name, steps=2, ckpt_every=2)
    text = y.read_text().replace("vocab_size: 64", "vocab_size: 50257").replace("synthetic_vocab: 64",
                                                                                "synthetic_vocab: 50257")
    if vocab:
        keys = f"vocab: {vocab}" + (f", merges: {merges}" if merges else "")
        text = text.replace("eval: {every: 0, batches: 2}", f"eval: {{every: 0, batches: 2, {keys}}}")
    assert text.count("50257") == 2 and (not vocab or str(vocab) in text)
    y.write_text(text)
    run_train(["--yaml", y], check=True)
    return tmp / "runs" / name


@pytest.fixture(scope="module")
def gpt2_vocab_run(tmp_path_factory, shared_data):
    """(folder, a run whose eval.vocab is GPT-2's files, GPT-2's files)."""
    tmp = tmp_path_factory.mktemp("hf_vocab")
    return tmp, gpt2_size_run(tmp, "v", shared_data / "gpt2"), shared_data / "gpt2"


def test_gpt2_vocabulary_export_has_the_tokenizer(gpt2_vocab_run):
    tmp, run, gpt2 = gpt2_vocab_run
    p = run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp / "hf"], check=True)
    assert f"tokenizer: GPT-2's BPE from {gpt2}" in p.stdout
    out = tmp / "hf"
    for name in GPT2_TOKENIZER_FILES + ("generation_config.json", "config.json", "model.safetensors"):
        assert (out / name).is_file(), name
    for name in ("vocab.json", "merges.txt"):
        assert (out / name).read_bytes() == (gpt2 / name).read_bytes(), name
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "GPT2Tokenizer" and tc["model_max_length"] == T
    assert tc["eos_token"] == tc["bos_token"] == "<|endoftext|>" and tc["add_prefix_space"] is False
    assert json.loads((out / "special_tokens_map.json").read_text())["eos_token"] == "<|endoftext|>"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == gen["bos_token_id"] == 50256
    # the files make GPT-2's tokenizer: the tokenizers package (what transformers' fast tokenizer runs on)
    tokenizers = pytest.importorskip("tokenizers", reason="SKIP: pip install tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(out / "vocab.json"), str(out / "merges.txt")))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    assert tok.get_vocab_size() == 50257 and tok.token_to_id("<|endoftext|>") == 50256
    assert tok.encode("First Citizen:").ids == [5962, 22307, 25]
    assert tok.decode(tok.encode("Thou art, sirrah!").ids) == "Thou art, sirrah!"


def test_gpt2_vocabulary_export_loads_in_autotokenizer(gpt2_vocab_run):
    transformers = pytest.importorskip("transformers", reason="SKIP: transformers is not installed "
                                                              "(optional: pip install transformers)")
    tmp, run, _ = gpt2_vocab_run
    run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp / "hf_auto"], check=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp / "hf_auto"))
    assert len(tok) == 50257 and tok.eos_token_id == tok.bos_token_id == 50256
    assert tok("First Citizen:").input_ids == [5962, 22307, 25]
    assert transformers.GenerationConfig.from_pretrained(str(tmp / "hf_auto")).eos_token_id == 50256


def test_no_tokenizer_is_claimed_without_gpt2s_files(gpt2_vocab_run, trained, tmp_path):
    tmp, run, gpt2 = gpt2_vocab_run
    # another vocabulary (64 tokens): no tokenizer and no generation config, and the export says why
    _, tiny = trained
    p = run_train(["export", "--ckpt", tiny, "--format", "hf", "--out", tmp_path / "small"], check=True)
    assert "no tokenizer files: the model's 64-token vocabulary is not GPT-2's BPE" in p.stdout
    assert sorted(f.name for f in (tmp_path / "small").iterdir()) == ["config.json", "model.safetensors"]
    # --vocab cannot make one: exit 1 and nothing written
    p = run_train(["export", "--ckpt", tiny, "--format", "hf", "--out", tmp_path / "small2", "--vocab", gpt2])
    assert p.returncode == 1 and "--vocab: the model's 64-token vocabulary is not GPT-2's BPE" in p.stderr
    assert not (tmp_path / "small2").exists()
    # GPT-2's size, but a --vocab folder without the files: exit 1 naming the file, nothing written
    (tmp_path / "empty").mkdir()
    p = run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp_path / "x", "--vocab", tmp_path / "empty"])
    assert p.returncode == 1 and f"{tmp_path / 'empty'}/vocab.json" in p.stderr
    assert not (tmp_path / "x").exists()
    # a vocab.json of another size
    (tmp_path / "other").mkdir()
    (tmp_path / "other/vocab.json").write_text(json.dumps({"a": 0, "b": 1}))
    (tmp_path / "other/merges.txt").write_text("a b\n")
    p = run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp_path / "x", "--vocab", tmp_path / "other"])
    assert p.returncode == 1 and "holds 2 tokens, not GPT-2's 50257" in p.stderr
    # no eval.vocab: the export stands, without tokenizer files, and says what to pass; --vocab adds them
    bare = gpt2_size_run(tmp_path, "bare")
    p = run_train(["export", "--ckpt", bare, "--format", "hf", "--out", tmp_path / "hf_bare"], check=True)
    assert "no tokenizer files: pass --vocab DIR" in p.stdout
    names = sorted(f.name for f in (tmp_path / "hf_bare").iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors"]
    run_train(["export", "--ckpt", bare, "--format", "hf", "--out", tmp_path / "hf_given", "--vocab", gpt2],
              check=True)
    assert all((tmp_path / "hf_given" / name).is_file() for name in GPT2_TOKENIZER_FILES)
    # an eval.vocab that is gone by the time of the export: named, no tokenizer files
    shutil.copytree(gpt2, tmp_path / "gpt2_copy")
    gone = gpt2_size_run(tmp_path, "gone", tmp_path / "gpt2_copy")
    shutil.rmtree(tmp_path / "gpt2_copy")
    p = run_train(["export", "--ckpt", gone, "--format", "hf", "--out", tmp_path / "hf_gone"], check=True)
    assert f"no tokenizer files: the run's eval.vocab '{tmp_path / 'gpt2_copy'}' cannot be used" in p.stdout
    assert not (tmp_path / "hf_gone/vocab.json").exists()


def test_export_takes_the_vocabulary_as_a_folder_or_its_two_files(gpt2_vocab_run, tmp_path):
    """--vocab DIR, or --vocab FILE --merges FILE (as the scripts take it), and the run's eval.vocab and
    eval.merges the same way: the same tokenizer files."""
    tmp, run, gpt2 = gpt2_vocab_run
    run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp_path / "dir", "--vocab", gpt2], check=True)
    # the two files under other names, in a folder that is not a vocabulary folder
    (tmp_path / "tok").mkdir()
    vocab, merges = tmp_path / "tok/gpt2-vocab.json", tmp_path / "tok/gpt2-merges.txt"
    shutil.copyfile(gpt2 / "vocab.json", vocab)
    shutil.copyfile(gpt2 / "merges.txt", merges)
    p = run_train(["export", "--ckpt", run, "--format", "hf", "--out", tmp_path / "files", "--vocab", vocab,
                   "--merges", merges], check=True)
    assert f"tokenizer: GPT-2's BPE from {vocab} and {merges}" in p.stdout
    from_run = gpt2_size_run(tmp_path, "files_run", vocab, merges)
    p = run_train(["export", "--ckpt", from_run, "--format", "hf", "--out", tmp_path / "run"], check=True)
    assert f"tokenizer: GPT-2's BPE from {vocab} and {merges}" in p.stdout
    for out in ("files", "run"):
        for name in GPT2_TOKENIZER_FILES:
            assert (tmp_path / out / name).read_bytes() == (tmp_path / "dir" / name).read_bytes(), (out, name)


@pytest.mark.parametrize("flags,first_line", [
    (["--merges", "{merges}"], "error: --merges: '{merges}' needs --vocab to name GPT-2's vocab.json beside it"),
    (["--vocab", "{gpt2}", "--merges", "{merges}"],
     "error: --merges: with it --vocab names vocab.json itself, but '{gpt2}' is a folder"),
    (["--vocab", "{vocab}"], "error: --vocab: '{vocab}' is a file, not a folder: give GPT-2's merges.txt with --merges"),
    (["--vocab", "{vocab}", "--merges", "{gpt2}"], "error: --merges: '{gpt2}' is a folder, not GPT-2's merges.txt"),
    (["--vocab", "{vocab}", "--merges", "{gpt2}/none.txt"], "error: --vocab: '{vocab}' and --merges '{gpt2}/none.txt' "
                                                             "cannot be the tokenizer: cannot read '{gpt2}/none.txt'"),
    (["--format", "llmc", "--merges", "{merges}"], "error: --merges: only --format hf writes a tokenizer"),
])
def test_export_refuses_vocabulary_flags_against_the_rule(gpt2_vocab_run, tmp_path, flags, first_line):
    _, run, gpt2 = gpt2_vocab_run
    names = {"gpt2": gpt2, "vocab": gpt2 / "vocab.json", "merges": gpt2 / "merges.txt"}
    args = [f.format(**names) for f in flags]
    if "--format" not in args:
        args += ["--format", "hf"]
    p = run_train(["export", "--ckpt", run, "--out", tmp_path / "x"] + args)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.splitlines()[0].startswith(first_line.format(**names)), p.stderr
    assert not (tmp_path / "x").exists()


def test_export_over_an_earlier_export_leaves_none_of_its_files(gpt2_vocab_run, trained, tmp_path):
    _, run, _ = gpt2_vocab_run
    _, tiny = trained
    out = tmp_path / "hf"
    run_train(["export", "--ckpt", run, "--format", "hf", "--out", out], check=True)
    assert (out / "generation_config.json").is_file() and (out / "vocab.json").is_file()
    (out / "README.md").write_text("mine")  # not the export's: stays
    # a model of another vocabulary over it: no generation config or tokenizer of GPT-2's is left behind
    run_train(["export", "--ckpt", tiny, "--format", "hf", "--out", out, "--force"], check=True)
    assert sorted(f.name for f in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["vocab_size"] == V


@pytest.mark.parametrize("where", ["run", "checkpoints", "latest", "step"])
def test_sample_and_export_find_the_checkpoint(trained, tmp_path, where):
    _, run = trained
    path = {"run": run, "checkpoints": run / "checkpoints", "latest": run / "checkpoints/latest",
            "step": run / "checkpoints/step_00000005"}[where]
    p = run_train(["sample", "--ckpt", path, "--prompt-ids", "1,2", "--tokens", "4", "--temperature", "0"], check=True)
    assert len(p.stdout.split()) == 7  # 2 ids of the prompt, "|", 4 generated
    p = run_train(["export", "--ckpt", path, "--out", tmp_path / "m.bin"], check=True)
    assert "step_00000005" in p.stdout


def test_a_folder_without_checkpoints_is_a_named_error(tmp_path, train_bin):
    p = run_train(["export", "--ckpt", tmp_path, "--out", tmp_path / "m.bin"])
    assert p.returncode == 1 and "holds no complete checkpoint" in p.stderr and str(tmp_path) in p.stderr


def test_check_hf_export_script(trained):
    _, run = trained
    p = subprocess.run([sys.executable, ROOT / "scripts/check_hf_export.py", run, "--reference", "numpy"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("ok: largest logit difference"), p.stdout + p.stderr
