"""Metric sinks: every metric the run log holds goes to log.csv's train.csv and eval.csv with the same
values (log.csv: true), a resume keeps the rows up to its step, and the terminal shows the same rows."""
import csv

import h5py
import numpy as np

from conftest import run_train, tiny_yaml


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def test_csv_sink_holds_what_the_log_holds(tmp_path):
    y = tiny_yaml(tmp_path, name="c", steps=6, extra="eval: {every: 3, batches: 2, sample_tokens: 4}\n"
                                                     "log: {every: 1, progress: false, csv: true}\n")
    p = run_train(["--yaml", y], check=True)
    d = tmp_path / "runs" / "c"
    head, rows = read_csv(d / "train.csv")
    ehead, erows = read_csv(d / "eval.csv")
    with h5py.File(d / "log.h5", "r") as f:
        assert set(head) == set(f["train"].keys()), (head, list(f["train"].keys()))
        assert len(rows) == 6 and [int(r[0]) for r in rows] == list(f["train/step"][:])
        for i, name in enumerate(head):
            logged = f["train"][name][:]
            if f["train"][name].dtype.kind == "i":
                assert [int(r[i]) for r in rows] == list(logged), name
            else:
                got = np.array([float(r[i]) if r[i] else np.nan for r in rows])
                np.testing.assert_array_equal(got, logged, err_msg=name)  # shortest round-trip text
        assert f["train/peak_memory"][:].min() > 0 and f["train/peak_memory"].attrs["units"] == "bytes"
        assert ehead == ["step", "val_loss", "hellaswag_acc", "hellaswag_acc_norm", "sample"]
        assert [int(r[0]) for r in erows] == list(f["eval/step"][:]) == [3, 6]
        np.testing.assert_array_equal([float(r[1]) for r in erows], f["eval/val_loss"][:])
        assert all(r[2] == "" for r in erows)  # not measured: empty, as NaN in the log
        text = bytes(f["samples"][:]).decode()
        ends = [0] + list(f["eval/sample_end"][:])
        assert [r[4] for r in erows] == [text[a:b] for a, b in zip(ends, ends[1:])]
        assert all(len(r[4].split()) >= 4 for r in erows)  # the samples' token ids
    # the terminal printed the same logged rows
    assert sum(1 for l in p.stdout.splitlines() if l.startswith("step ") and "| loss " in l) == 6


def test_csv_resume_keeps_the_rows_up_to_the_checkpoint(tmp_path):
    extra = "log: {every: 1, progress: false, csv: true}\n"
    y = tiny_yaml(tmp_path, name="r", steps=8, ckpt_every=4, extra=extra)
    run_train(["--yaml", y, "--set", "training.steps=6"], check=True)  # checkpoints at 4 and at the end, 6
    d = tmp_path / "runs" / "r"
    import shutil
    shutil.rmtree(d / "checkpoints" / "step_00000006")
    (d / "checkpoints" / "latest").write_text("step_00000004\n")
    with h5py.File(d / "log.h5", "a") as f:  # as a run killed after step 6
        f.attrs["status"] = "running"
    p = run_train(["--yaml", y, "--resume"])
    assert p.returncode == 0, p.stderr
    head, rows = read_csv(d / "train.csv")
    assert [int(r[0]) for r in rows] == list(range(1, 9))
    with h5py.File(d / "log.h5", "r") as f:
        np.testing.assert_array_equal([float(r[head.index("loss")]) for r in rows], f["train/loss"][:])


def test_csv_off_by_default(tmp_path):
    y = tiny_yaml(tmp_path, name="n", steps=2)
    run_train(["--yaml", y], check=True)
    assert not (tmp_path / "runs" / "n" / "train.csv").exists()
