"""bench/gpu_bench.py without a GPU: its runs replaced by stand-ins that write the trainer's log.h5 and the
PyTorch script's JSON, so that the generated YAML, the rows, the ratios and the table can be checked."""
import importlib.util
import json
from pathlib import Path

import h5py
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TOKENS = 64 * 1024  # d12 at micro-batch 64
THIS_MS = {"bf16": 100.0, "fp8": 80.0}
TORCH_MS = {"none": 120.0, "tensorwise": 90.0, "rowwise": 96.0}


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_train(yaml_path, log, fail=()):
    cfg = yaml.safe_load(Path(yaml_path).read_text())
    name, t = cfg["run"]["name"], cfg["training"]
    if name in fail:
        Path(log).write_text("error: training.precision: not supported here\n")
        return 1
    Path(log).write_text("step 1/15\nop profile over 10 steps\n  matmul  1.0 ms\n" if cfg["log"]["op_profile"] else "")
    run_dir = Path(cfg["run"]["out_dir"]) / name
    run_dir.mkdir(parents=True)
    ms = THIS_MS[t["precision"]]
    with h5py.File(run_dir / "log.h5", "w") as f:
        f["train/step_ms"] = [500.0] * 5 + [ms] * (t["steps"] - 5)  # slow warm-up steps left out
        f["train/loss"] = [10.9] * t["steps"]
        f["train/fp8_saturated"] = [1 if t["precision"] == "fp8" else 0] * t["steps"]
        f.attrs.update(tokens_per_step=t["micro_batch"] * t["seq_len"], flops_per_token=1e9, message="")
        f.create_group("memory/measured").attrs["peak"] = 20 * 2**30
        f.create_group("memory/predicted").attrs["total"] = 21 * 2**30
    return 0


def fake_torch(cmd):
    out = Path(cmd[cmd.index("--json") + 1])
    recipe = cmd[cmd.index("--fp8") + 1] if "--fp8" in cmd else "none"
    ms = TORCH_MS[recipe]
    out.write_text(json.dumps({"median_step_ms": ms, "tokens_per_s": TOKENS / (ms / 1000), "mfu": 0.4,
                               "peak_mem_bytes": 25 * 2**30, "final_loss": 10.9, "fp8": recipe}))
    return 0


@pytest.fixture
def bench(monkeypatch):
    mod = load_bench()
    mod.commands, mod.fail = [], set()

    def run(cmd, log):
        cmd = list(map(str, cmd))
        mod.commands.append(cmd)
        return fake_train(cmd[2], log, mod.fail) if cmd[1] == "--yaml" else fake_torch(cmd)

    monkeypatch.setattr(mod, "run", run)
    return mod


def test_fp8_variants_torch_recipes_and_ratios(bench, tmp_path):
    bench.main(["--out", str(tmp_path), "--configs", "d12:64", "--variants", "0,0fp8,0fp8prof",
                "--torch-fp8", "tensorwise,rowwise", "--train", "/bin/false"])
    for variant, precision, profile in [("0", "bf16", False), ("0fp8", "fp8", False), ("0fp8prof", "fp8", True)]:
        t = yaml.safe_load((tmp_path / f"d12_b64_r{variant}.yaml").read_text())
        assert (t["training"]["precision"], t["log"]["op_profile"], t["training"]["recompute"]) == \
            (precision, profile, 0), variant
    torch_cmds = [c for c in bench.commands if c[1].endswith("pytorch_gpt2.py")]
    assert [c[c.index("--fp8") + 1] if "--fp8" in c else None for c in torch_cmds] == [None, "tensorwise", "rowwise"]
    rows = json.loads((tmp_path / "results.json").read_text())
    by = {r["impl"]: r for r in rows}
    assert list(by) == ["this", "this fp8", "this fp8 (op profile)", "pytorch", "pytorch fp8 tensorwise",
                        "pytorch fp8 rowwise"]
    assert all(r["status"] == "ok" for r in rows)
    assert by["this"]["median_step_ms"] == 100.0 and by["this fp8"]["median_step_ms"] == 80.0
    assert by["this"]["vs_this_bf16"] == pytest.approx(1.0)
    assert "fp8_saturated" not in by["this"] and by["this fp8"]["fp8_saturated"] == 15
    assert by["this fp8"]["vs_this_bf16"] == pytest.approx(100 / 80)
    assert by["this fp8"]["vs_pytorch"] == pytest.approx(120 / 80)
    assert by["pytorch"]["vs_this_bf16"] == pytest.approx(100 / 120)
    assert by["pytorch fp8 tensorwise"]["vs_this_bf16"] == pytest.approx(100 / 90)
    assert by["pytorch fp8 tensorwise"]["vs_pytorch"] == pytest.approx(120 / 90)
    assert by["pytorch fp8 rowwise"]["vs_this_bf16"] == pytest.approx(100 / 96)
    assert "vs_this_bf16" not in by["this fp8 (op profile)"] and "vs_pytorch" not in by["this fp8 (op profile)"]
    assert "op profile over 10 steps" in (tmp_path / "op_profile_d12_b64_fp8.txt").read_text()
    assert not (tmp_path / "op_profile_d12_b64.txt").exists()
    table = (tmp_path / "results.md").read_text().splitlines()
    assert "x this bf16 tok/s" in table[0] and len(table) == 2 + len(rows)
    assert "| this fp8 | d12 | 64 | 0 | 80.0 | 819,200 |" in table[3]
    assert table[3].split(" | ")[-2:] == ["1.250", "ok |"]


def test_failed_runs_and_missing_reference(bench, tmp_path):
    """A trainer run that fails is a row with its exit status; without variant 0 (this bf16) or the
    PyTorch baseline, the ratios against them are left out."""
    bench.fail.add("d12_b64_r0fp8")
    bench.main(["--out", str(tmp_path), "--configs", "d12:64", "--variants", "0fp8,1", "--no-torch",
                "--torch-fp8", "rowwise", "--train", "/bin/false"])
    assert not [c for c in bench.commands if c[1].endswith("pytorch_gpt2.py")]  # --no-torch: none at all
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["impl"], r["recompute"], r["status"]) for r in rows] == [("this fp8", 0, "exit 1"), ("this", 1, "ok")]
    assert all("vs_this_bf16" not in r and "vs_pytorch" not in r for r in rows)
    assert "median_step_ms" not in rows[0]


def test_bad_torch_fp8_recipe(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path), "--torch-fp8", "tensorwise,blockwise"])
    assert e.value.code == 2 and "blockwise" in capsys.readouterr().err
    assert not bench.commands


def test_no_torch_bf16_keeps_the_recipes(bench, tmp_path):
    """--no-torch-bf16 (its row measured in another call): only the torchao recipes run on the PyTorch
    side, each still held against this trainer's bf16, and no ratio against a PyTorch bf16 row appears."""
    bench.main(["--out", str(tmp_path), "--configs", "d12:64", "--variants", "0,0fp8", "--no-torch-bf16",
                "--torch-fp8", "tensorwise", "--train", "/bin/false"])
    torch_cmds = [c for c in bench.commands if c[1].endswith("pytorch_gpt2.py")]
    assert [c[c.index("--fp8") + 1] if "--fp8" in c else None for c in torch_cmds] == ["tensorwise"]
    by = {r["impl"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert list(by) == ["this", "this fp8", "pytorch fp8 tensorwise"]
    assert by["pytorch fp8 tensorwise"]["vs_this_bf16"] == pytest.approx(100 / 90)
    assert all("vs_pytorch" not in r for r in by.values())


def test_fp8_classifier_variants(bench, tmp_path, capsys):
    """"cls" after "fp8" turns training.fp8_classifier on (its own row and op profile); an fp8 variant
    without it writes the key off (the default is on), bf16 leaves it out, and "cls" without fp8 is
    refused before anything runs."""
    bench.main(["--out", str(tmp_path), "--configs", "d12:64", "--variants", "0,0fp8,0fp8cls,0fp8clsprof",
                "--no-torch", "--train", "/bin/false"])
    for variant, precision, cls in [("0", "bf16", False), ("0fp8", "fp8", False), ("0fp8cls", "fp8", True),
                                    ("0fp8clsprof", "fp8", True)]:
        t = yaml.safe_load((tmp_path / f"d12_b64_r{variant}.yaml").read_text())["training"]
        # written for every fp8 variant, so that a row means the same whatever the build's default
        assert (t["precision"], t.get("fp8_classifier")) == (precision, cls if precision == "fp8" else None), variant
    by = {r["impl"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert list(by) == ["this", "this fp8", "this fp8 +classifier", "this fp8 +classifier (op profile)"]
    assert by["this fp8 +classifier"]["vs_this_bf16"] == pytest.approx(100 / 80)
    assert (tmp_path / "op_profile_d12_b64_fp8cls.txt").exists()
    assert not (tmp_path / "op_profile_d12_b64_fp8.txt").exists()
    assert_refused(bench, tmp_path, capsys, "0cls")


def assert_refused(bench, tmp_path, capsys, variant):
    """--variants VARIANT is an argparse error (exit 2) naming it, and nothing runs."""
    n = len(bench.commands)
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path), "--variants", variant, "--no-torch"])
    assert e.value.code == 2 and f"'{variant}'" in capsys.readouterr().err and len(bench.commands) == n


def test_gelu_variants(bench, tmp_path, capsys):
    """"epi" after fp8 (or fp8cls) writes training.fp8_gelu_epilogue: true, "cast" false, each with its own row
    and op profile; other variants leave the key out (the trainer's default, the cast); "epi" or "cast"
    without fp8, or both, are refused."""
    bench.main(["--out", str(tmp_path), "--configs", "d12:64", "--variants",
                "0fp8cls,0fp8clsepi,0fp8castprof,0fp8epiprof", "--no-torch", "--train", "/bin/false"])
    for variant, key in [("0fp8cls", None), ("0fp8clsepi", True), ("0fp8castprof", False), ("0fp8epiprof", True)]:
        t = yaml.safe_load((tmp_path / f"d12_b64_r{variant}.yaml").read_text())["training"]
        assert t["precision"] == "fp8" and t.get("fp8_gelu_epilogue") is key, variant
    by = {r["impl"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert list(by) == ["this fp8 +classifier", "this fp8 +classifier GELU epilogue",
                        "this fp8 GELU cast (op profile)", "this fp8 GELU epilogue (op profile)"]
    assert (tmp_path / "op_profile_d12_b64_fp8cast.txt").exists()
    assert (tmp_path / "op_profile_d12_b64_fp8epi.txt").exists()
    for bad in ("0cast", "0epi", "0fp8castepi"):
        assert_refused(bench, tmp_path, capsys, bad)


def test_fast_accumulation_variants(bench, tmp_path, capsys):
    """"fwdacc" / "allacc" after fp8 write training.fp8_fast_accum forward / all, each with its own row;
    other fp8 variants leave the key out (the trainer's default, dinp); "acc" without fp8, both, or an
    unknown "...acc" are refused."""
    bench.main(["--out", str(tmp_path), "--configs", "d12:64", "--variants",
                "0fp8cls,0fp8clsfwdacc,0fp8allacc,0fp8fwdaccprof", "--no-torch", "--train", "/bin/false"])
    for variant, key in [("0fp8cls", None), ("0fp8clsfwdacc", "forward"), ("0fp8allacc", "all"),
                         ("0fp8fwdaccprof", "forward")]:
        t = yaml.safe_load((tmp_path / f"d12_b64_r{variant}.yaml").read_text())["training"]
        assert t["precision"] == "fp8" and t.get("fp8_fast_accum") == key, variant
    by = {r["impl"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert list(by) == ["this fp8 +classifier", "this fp8 +classifier fast accumulation forward",
                        "this fp8 fast accumulation all", "this fp8 fast accumulation forward (op profile)"]
    assert (tmp_path / "op_profile_d12_b64_fp8fwdacc.txt").exists()
    for bad in ("0fwdacc", "0fp8fwdaccallacc", "0fp8dinpacc"):
        assert_refused(bench, tmp_path, capsys, bad)
