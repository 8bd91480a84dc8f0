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
            elif name == "lr":  # the optimizer's float32, as its float32 text ("0.0003", not "0.000300000014")
                assert [np.float32(r[i]) for r in rows] == [np.float32(x) for x in logged], name
                assert all(len(r[i]) <= len(str(np.float32(x))) for r, x in zip(rows, logged)), [r[i] for r in rows]
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


def killed_csv_run(tmp_path, name, csv=True):
    """A run of 6 steps with checkpoints at 4 and 6, then made to look killed after step 6 with only the
    checkpoint of step 4 (a resume continues from it)."""
    import shutil
    extra = "log: {every: 1, progress: false, csv: %s}\n" % ("true" if csv else "false")
    y = tiny_yaml(tmp_path, name=name, steps=8, ckpt_every=4, extra=extra)
    run_train(["--yaml", y, "--set", "training.steps=6"], check=True)
    d = tmp_path / "runs" / name
    shutil.rmtree(d / "checkpoints" / "step_00000006")
    (d / "checkpoints" / "latest").write_text("step_00000004\n")
    with h5py.File(d / "log.h5", "a") as f:
        f.attrs["status"] = "running"
    return y, d


def test_csv_malformed_row_is_named_and_the_log_left_as_it_was(tmp_path):
    y, d = killed_csv_run(tmp_path, "m")
    lines = (d / "train.csv").read_text().splitlines(keepends=True)
    lines[3] = "x3" + lines[3][1:]  # the step of the third row
    (d / "train.csv").write_text("".join(lines))
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    p = run_train(["--yaml", y, "--resume"])
    assert p.returncode == 1, p.stderr
    assert f"'{d}/train.csv' line 4: the step 'x3' is not a whole number" in p.stderr, p.stderr
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before  # log.h5's status too: a refusal touches nothing


def test_csv_that_cannot_be_replaced_leaves_the_log_as_it_was(tmp_path):
    y, d = killed_csv_run(tmp_path, "w")
    (d / "eval.csv").unlink()
    (d / "eval.csv").mkdir()
    log = (d / "log.h5").read_bytes()
    p = run_train(["--yaml", y, "--resume"])
    assert p.returncode == 1 and f"'{d}/eval.csv' is not a regular file" in p.stderr, p.stderr
    assert (d / "log.h5").read_bytes() == log


def test_csv_unterminated_last_line_is_dropped(tmp_path):
    import shutil
    y = tiny_yaml(tmp_path, name="u", steps=12, ckpt_every=4, extra="log: {every: 1, progress: false, csv: true}\n")
    run_train(["--yaml", y], check=True)
    d = tmp_path / "runs" / "u"
    shutil.rmtree(d / "checkpoints" / "step_00000012")
    with h5py.File(d / "log.h5", "a") as f:
        f.attrs["status"] = "running"
    rows = (d / "train.csv").read_text().splitlines(keepends=True)
    (d / "train.csv").write_text("".join(rows[:11]) + rows[11][:1])  # steps 1-10 whole, step 11 cut to "1"
    assert run_train(["--yaml", y, "--resume"]).returncode == 0
    head, got = read_csv(d / "train.csv")
    assert [int(r[0]) for r in got] == list(range(1, 13))
    assert all(len(r) == len(head) and r[1] for r in got)


def test_csv_turned_on_at_resume_is_filled_from_the_log(tmp_path):
    y, d = killed_csv_run(tmp_path, "o", csv=False)
    assert not (d / "train.csv").exists()
    p = run_train(["--yaml", y, "--resume", "log.csv=true"])
    assert p.returncode == 0, p.stderr
    assert "train.csv and eval.csv filled from log.h5 up to step 4" in p.stdout
    head, rows = read_csv(d / "train.csv")
    ehead, erows = read_csv(d / "eval.csv")
    with h5py.File(d / "log.h5", "r") as f:
        assert [int(r[0]) for r in rows] == list(f["train/step"][:]) == list(range(1, 9))
        np.testing.assert_array_equal([float(r[head.index("loss")]) for r in rows], f["train/loss"][:])
        assert [int(r[0]) for r in erows] == list(f["eval/step"][:])


def test_csv_of_a_start_over_is_kept_beside_the_kept_log(tmp_path):
    extra = "log: {every: 1, progress: false, csv: true}\n"
    y = tiny_yaml(tmp_path, name="s", steps=3, extra=extra)  # no checkpoints: a resume starts over
    run_train(["--yaml", y], check=True)
    d = tmp_path / "runs" / "s"
    with h5py.File(d / "log.h5", "a") as f:
        f.attrs["status"] = "running"
    old = (d / "train.csv").read_bytes()
    p = run_train(["--yaml", y, "--resume"])
    assert p.returncode == 0, p.stderr
    assert (d / "log.1.h5").exists() and (d / "train.1.csv").read_bytes() == old and (d / "eval.1.csv").exists()
    assert len(read_csv(d / "train.csv")[1]) == 3


def test_overwrite_removes_the_replaced_runs_csv(tmp_path):
    y = tiny_yaml(tmp_path, name="v", steps=3, extra="log: {every: 1, progress: false, csv: true}\n")
    run_train(["--yaml", y], check=True)
    d = tmp_path / "runs" / "v"
    run_train(["--yaml", y, "run.overwrite=true", "log.csv=false"], check=True)
    assert (d / "log.h5").exists() and not (d / "train.csv").exists() and not (d / "eval.csv").exists()
