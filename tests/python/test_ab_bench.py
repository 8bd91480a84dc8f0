"""bench/ab_bench.py without a GPU: the two builds' runs replaced by stand-ins that write the trainer's log.h5
(the old build 2% slower), so that the A B B A order, the ratio, a second call into the same folder and a bad
variant can be checked."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gpu_bench import REPO, THIS_MS, fake_train  # noqa: E402


@pytest.fixture
def ab(monkeypatch):
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("ab_bench", REPO / "bench" / "ab_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls = []

    def run(cmd, log):
        cmd = list(map(str, cmd))
        calls.append(Path(cmd[0]).parent.name)
        slow = 1.02 if cmd[0].endswith("old/train") else 1.0
        monkeypatch.setitem(THIS_MS, "bf16", 100.0 * slow)
        monkeypatch.setitem(THIS_MS, "fp8", 80.0 * slow)
        return fake_train(cmd[2], log)

    monkeypatch.setattr(sys.modules["gpu_bench"], "run", run)
    mod.calls = calls
    return mod


def test_abba_order_ratio_and_a_second_call(ab, tmp_path):
    args = ["--ref", "/x/old/train", "--new", "/x/new/train", "--out", str(tmp_path), "--configs", "d12:64",
            "--variants", "0,0fp8"]
    for _ in range(2):  # the second call finds the first's runs in the same folder
        ab.calls.clear()
        assert ab.main(args) == 0
        assert ab.calls == ["old", "new", "new", "old"] * 2  # A B B A per variant
        rows = json.loads((tmp_path / "ab.json").read_text())
        assert [r["variant"] for r in rows] == ["0", "0fp8"]
        for r in rows:
            assert r["ref"]["status"] == ["ok", "ok"] and r["new"]["status"] == ["ok", "ok"]
            assert r["new_over_ref_tokens_per_s"] == pytest.approx(1.02)
    assert sorted(p.parent.name for p in tmp_path.glob("*/d12_b64_r0.yaml")) == ["new1", "new2", "ref0", "ref3"]
    assert "| d12 | 64 | 0fp8 |" in (tmp_path / "ab.md").read_text()


def test_a_bad_variant_is_refused_before_any_run(ab, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ab.main(["--ref", "/x/old/train", "--out", str(tmp_path), "--variants", "0,fast"])
    assert e.value.code == 2 and "'fast'" in capsys.readouterr().err and ab.calls == []
