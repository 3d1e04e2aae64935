"""ResultStore: append-only JSON lines, skip finished rows, survive and repair torn lines."""
import json
from pathlib import Path

import numpy as np

import pytest

from flowgp.bench.results import ResultStore, read_row_files, read_rows
from flowgp.bench.runner import parse_int_list, parse_name_list, run_jobs

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")

KEY = ("dataset", "split")


def test_append_and_skip(tmp_path):
    path = tmp_path / "r.jsonl"
    store = ResultStore(path, KEY)
    assert not store.is_done({"dataset": "a", "split": 0})
    store.append({"dataset": "a", "split": 0, "nll": 1.5})
    again = ResultStore(path, KEY)
    assert again.is_done({"dataset": "a", "split": 0, "other": 1})
    assert not again.is_done({"dataset": "a", "split": 1})
    assert again.rows == [{"dataset": "a", "split": 0, "nll": 1.5}]
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 1


def test_rows_written_before_a_key_field_existed_take_its_default(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultStore(path, KEY).append({"dataset": "a", "split": 0})
    store = ResultStore(path, KEY + ("order",), key_defaults={"order": "file"})
    assert store.is_done({"dataset": "a", "split": 0, "order": "file"})
    assert not store.is_done({"dataset": "a", "split": 0, "order": "authors"})
    store.append({"dataset": "a", "split": 0, "order": "authors"})
    assert store.is_done({"dataset": "a", "split": 0, "order": "authors"})
    # without the default the old row has no key and counts as not done
    assert not ResultStore(path, KEY + ("order",)).is_done({"dataset": "a", "split": 0, "order": "file"})
    with pytest.raises(ValueError, match="not key fields"):
        ResultStore(path, KEY, key_defaults={"order": "file"})


def test_a_key_field_at_its_default_leaves_the_checkpoint_name_unchanged(tmp_path):
    from flowgp.bench.runner import checkpoint_file

    job = {"dataset": "a", "split": 0}
    old = checkpoint_file(tmp_path, job, KEY)
    assert checkpoint_file(tmp_path, {**job, "order": "file"}, KEY + ("order",), {"order": "file"}) == old
    assert checkpoint_file(tmp_path, job, KEY + ("order",), {"order": "file"}) == old
    assert checkpoint_file(tmp_path, {**job, "order": "authors"}, KEY + ("order",), {"order": "file"}) != old


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultStore(path, KEY).append({"dataset": "a", "split": 0})
    with open(path, "a") as fh:
        fh.write('{"dataset": "a", "split": 1, "nl')  # killed mid-write
    with pytest.warns(RuntimeWarning, match="torn last line"):
        store = ResultStore(path, KEY)
    assert len(store) == 1 and not store.is_done({"dataset": "a", "split": 1})
    store.append({"dataset": "a", "split": 1})
    lines = path.read_text().splitlines()
    assert [json.loads(s)["split"] for s in lines] == [0, 1]


def test_complete_but_invalid_last_line_and_bad_middle_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"dataset": "a", "split": 0}\n\x00\x00\x00\n')
    with pytest.warns(RuntimeWarning):
        store = ResultStore(path, KEY)
    assert len(store) == 1
    path.write_text('{"dataset": "a", "split": 0}\nnot json\n{"dataset": "b", "split": 0}\n')
    with pytest.warns(RuntimeWarning, match="malformed line 2"):
        rows = read_rows(path)
    assert [r["dataset"] for r in rows] == ["a", "b"]


def test_whole_file_torn(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"dataset"')
    with pytest.warns(RuntimeWarning):
        store = ResultStore(path, KEY)
    assert len(store) == 0 and path.read_text() == ""


def test_key_errors(tmp_path):
    with pytest.raises(ValueError, match="non-empty sequence"):
        ResultStore(tmp_path / "r.jsonl", "dataset")
    store = ResultStore(tmp_path / "r.jsonl", KEY)
    with pytest.raises(ValueError, match="missing key fields \\['split'\\]"):
        store.append({"dataset": "a"})


def _square(job):
    if job["split"] == 3:
        raise RuntimeError("boom")
    return {**job, "value": job["split"] ** 2}


def test_run_jobs_skips_done_and_records_failures(tmp_path, capsys):
    store = ResultStore(tmp_path / "r.jsonl", KEY)
    store.append({"dataset": "a", "split": 0, "value": -1})
    jobs = [{"dataset": "a", "split": i} for i in range(5)]
    failures = run_jobs(jobs, _square, store, 1, verbose=False)
    assert failures == 1
    rows = {r["split"]: r["value"] for r in ResultStore(tmp_path / "r.jsonl", KEY).rows}
    assert rows == {0: -1, 1: 1, 2: 4, 4: 16}  # row 0 kept, not recomputed; failed row 3 not written
    err = read_rows(tmp_path / "r.errors.jsonl")
    assert err[0]["split"] == 3 and "boom" in err[0]["error"]


def test_parse_lists():
    assert parse_int_list("0-3,7,2") == [0, 1, 2, 3, 7]
    with pytest.raises(ValueError, match="inclusive ranges"):
        parse_int_list("3-1")
    with pytest.raises(ValueError, match="bad split list"):
        parse_int_list("a", "split")
    with pytest.raises(ValueError, match="unknown model"):
        parse_name_list("svgp,foo", known=("svgp",), what="model")


def _checkpoint_of(job):
    return {"dataset": job["dataset"], "split": job["split"], "checkpoint": job.get("checkpoint")}


@pytest.mark.parametrize("flag", [False, True, None])
def test_run_suite_gives_each_job_a_checkpoint_file_named_by_its_key(tmp_path, flag):
    """With `--no-checkpoints` off, every job gets runs/bench/<name of OUT>/<key>.pt under the current directory
    (the key's odd characters replaced), not a file in the results folder; with it on, or for a subcommand without
    the flag (None), no job gets one."""
    import argparse

    from flowgp.bench.runner import run_suite

    out = tmp_path / "results" / "grid"
    args = argparse.Namespace(out=str(out), jobs=1, quiet=True, wait=False)
    if flag is not None:
        args.no_checkpoints = flag
    jobs = [{"dataset": "csv:/a b/c.csv:y", "split": 0}, {"dataset": "toy", "split": 1}]
    assert run_suite(args, jobs, _checkpoint_of, KEY, "r", report_hint=False) == 0
    got = {r["split"]: r["checkpoint"] for r in ResultStore(out / "r.jsonl", KEY).rows}
    if flag is False:
        state = Path("runs") / "bench" / "grid"
        assert got == {0: str(state / "csv_a_b_c.csv_y_0.pt"), 1: str(state / "toy_1.pt")}
    else:
        assert got == {0: None, 1: None}


def test_state_dir_names_the_folder_of_fits_in_progress(tmp_path):
    """`--state-dir` replaces the default runs/bench/<name of OUT>; an OUT without a folder name needs it."""
    import argparse

    from flowgp.bench.runner import add_checkpoint_argument, run_suite, state_folder

    parser = argparse.ArgumentParser()
    add_checkpoint_argument(parser)
    args = parser.parse_args(["--state-dir", str(tmp_path / "s")])
    args.out, args.jobs, args.quiet, args.wait = str(tmp_path / "o"), 1, True, False
    assert state_folder(args) == tmp_path / "s"
    assert run_suite(args, [{"dataset": "toy", "split": 3}], _checkpoint_of, KEY, "r", report_hint=False) == 0
    assert ResultStore(tmp_path / "o" / "r.jsonl", KEY).rows[0]["checkpoint"] == str(tmp_path / "s" / "toy_3.pt")
    assert state_folder(argparse.Namespace(out=str(tmp_path / "x" / "y"), state_dir=None)) == Path("runs/bench/y")
    with pytest.raises(ValueError, match="--state-dir"):
        state_folder(argparse.Namespace(out="/", state_dir=None))


def test_fit_and_score_keeps_a_checkpoint_when_the_fit_itself_fails(tmp_path):
    """Only a state that cannot be continued (an error naming the file) is discarded and refitted; the fit's own
    failure is raised and its checkpoint kept for a rerun."""
    from types import SimpleNamespace

    from flowgp.bench.runner import fit_and_score

    saved = tmp_path / "checkpoints" / "job.pt"
    saved.parent.mkdir()

    class Failing:
        calls = 0

        def __init__(self, checkpoint=None, message="boom"):
            self.checkpoint, self.message = checkpoint, message

        def fit(self, x, y):
            Failing.calls += 1
            if self.message == "stale" and Failing.calls == 1:
                raise ValueError(f"the checkpoint {self.checkpoint} was written with budget=3")
            if self.message == "boom":
                raise RuntimeError("Cholesky failed")

        def predict_proba(self, x):
            return np.full((len(x), 2), 0.5)

    split = SimpleNamespace(x_train=np.zeros((4, 1)), y_train=np.zeros(4), x_test=np.zeros((2, 1)),
                            y_test=np.zeros(2, dtype=int))
    saved.write_bytes(b"state")
    with pytest.raises(RuntimeError, match="Cholesky"):
        fit_and_score(Failing(), split, "classification", checkpoint=str(saved))
    assert saved.exists()
    Failing.calls = 0
    row = fit_and_score(Failing(message="stale"), split, "classification", checkpoint=str(saved))
    assert Failing.calls == 2 and not saved.exists() and row["accuracy"] == 1.0


def test_read_row_files_reads_files_in_order_and_names_a_missing_one(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"n": 1}) + "\n" + json.dumps({"n": 2}) + "\n")
    b.write_text(json.dumps({"n": 3}) + "\n{torn")  # a file still being written ends in a torn line
    assert [r["n"] for r in read_row_files([a, b])] == [1, 2, 3]
    assert read_row_files([]) == []
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_row_files([a, tmp_path / "missing.jsonl"])
