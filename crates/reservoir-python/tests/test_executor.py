"""reservoir.compare / reservoir.replay on a concurrent.futures.Executor.

Run by tools/wheel-check.sh in a fresh venv with the wheel installed (no
dask, no tqdm: a ProcessPoolExecutor, executors made here, a fake tqdm):
    python -m pytest crates/reservoir-python/tests/test_executor.py
tools/cluster-proof.sh runs the same API on a Dask LocalCluster.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import signal
import sys
import types
from pathlib import Path

import pytest

import reservoir
from reservoir import ReservoirError, _api, _executor

ROOT = Path(__file__).resolve().parents[3]
TRACES = Path(os.environ.get("RESERVOIR_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
SMALL = TRACES / "cs336-silmont2000"
LOG = TRACES / "allocatorsim-alexnet" / "07702e3a_input_alexnet_train.log"
SNAP = TRACES / "cs336-silmont2000" / "b61be409_mem_snapshot.pickle"
TIMING_KEYS = {"allocator_ns_p50", "allocator_ns_p99", "allocator_ns_per_op", "allocator_time_ns"}
POLICIES = ["pytorch", "expandable"]


def untimed(v):
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if k not in TIMING_KEYS}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v


def pool(n: int = 2) -> cf.ProcessPoolExecutor:
    return cf.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("forkserver"))


class Inline:
    """An executor that runs each task at submit, here; ``fail(args,
    attempt)`` says whether attempt 1 or 2 of a task raises (the attempt is
    the task's last argument: a retry is another task, as Dask, which names
    a task by its arguments, needs)."""

    def __init__(self, fail=lambda args, attempt: False, refuse_after: int | None = None):
        self.fail = fail
        self.keys: set = set()
        self.submitted = 0
        self.refuse_after = refuse_after

    def submit(self, fn, *args):
        self.submitted += 1
        if self.refuse_after is not None and self.submitted > self.refuse_after:
            raise RuntimeError("cannot schedule new futures after shutdown")
        f: cf.Future = cf.Future()
        if repr(args) in self.keys:
            # As Dask does: the same function and arguments are the same
            # task, and its future is the failed one.
            f.set_exception(OSError("the same task as before: its result is its failure"))
            return f
        self.keys.add(repr(args))
        attempt = args[-1]
        if self.fail(args, attempt):
            f.set_exception(OSError(f"worker lost (attempt {attempt})"))
        else:
            try:
                f.set_result(fn(*args))
            except Exception as e:
                f.set_exception(e)
        return f


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder of inputs that exercises the command's listing: nested
    folders, names that sort differently by bytes and by path components,
    a `.md` file (left out), a symbolic link to a folder (skipped), a file
    no format reads (skipped), and real traces (linked, not copied)."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "a").mkdir()
    (d / "a" / "b").mkdir()
    (d / "a-c").mkdir()
    os.symlink(LOG, d / "a" / "b" / "x.log")
    os.symlink(LOG, d / "a-c" / "y.log")
    os.symlink(SNAP, d / "a" / "snap.pickle")
    (d / "a" / "README.md").write_text("# notes\n")
    (d / "junk.bin").write_bytes(b"\x00\x01not a trace")
    os.symlink(d / "a-c", d / "linked")
    (d / "z").mkdir()
    os.symlink(SMALL / "769df2d4_memory_forward_fp32_128.pickle", d / "z" / "r.pickle")
    return d


def test_units_are_the_commands_inputs_in_its_order(folder):
    names = _api._compare_units(folder, False)
    assert names == ["a/b/x.log", "a/snap.pickle", "a-c/y.log", "junk.bin", "z/r.pickle"]
    # Shard k of N is input k: its row (file#device) or its skipped entry.
    for k, name in enumerate(names, 1):
        part = json.loads(_api._compare_task([b"--json", _api._opt("--traces", os.fsencode(folder)),
                                              b"--no-workloads"], f"{k}/{len(names)}"))
        got = [r["input"].rsplit("#", 1)[0] for r in part["rows"]]
        got += [s["file"] for s in part["skipped"] if s["file"] != "linked"]
        assert got and set(got) == {name}, (k, name, part["rows"], part["skipped"])
    assert _api._compare_units(None, ["gpt-train:layers=1"]) == ["workload gpt-train:layers=1"]
    assert "workload gpt-train" in _api._compare_units(None, True)


def test_compare_on_a_process_pool_equals_the_one_process_run(folder):
    whole = reservoir.compare(folder, POLICIES, workloads=["gpt-train:layers=1,steps=2"])
    with pool() as ex:
        got = reservoir.compare(folder, POLICIES, workloads=["gpt-train:layers=1,steps=2"], executor=ex)
    assert untimed(got.to_dict()) == untimed(whole.to_dict())
    assert got.failed == []
    assert {s["file"] for s in got.skipped} == {"junk.bin", "linked"}
    assert len(got.rows) == len(whole.rows) >= 5


def test_compare_retries_a_failed_task_once(folder):
    whole = reservoir.compare(folder, POLICIES)
    before = _executor.stats["retried"]
    ex = Inline(fail=lambda args, attempt: attempt == 1)
    got = reservoir.compare(folder, POLICIES, executor=ex)
    assert untimed(got.to_dict()) == untimed(whole.to_dict())
    assert got.failed == []
    assert _executor.stats["retried"] - before == 5
    assert ex.submitted == 10


def test_compare_reports_an_input_that_fails_twice_and_loses_nothing_else(folder):
    whole = reservoir.compare(folder, POLICIES)
    ex = Inline(fail=lambda args, attempt: args[1] == "2/5")
    got = reservoir.compare(folder, POLICIES, executor=ex)
    assert [f["input"] for f in got.failed] == ["a/snap.pickle"]
    assert "failed twice on the executor: OSError: worker lost (attempt 2)" in got.failed[0]["reason"]
    assert {"file": "a/snap.pickle", "reason": got.failed[0]["reason"]} in got.skipped
    assert [r.input for r in got.rows] == [r.input for r in whole.rows if not r.input.startswith("a/snap.pickle#")]
    kept = {r["input"]: r for r in untimed(whole.to_dict())["rows"]}
    for r in untimed(got.to_dict())["rows"]:
        assert r == kept[r["input"]]


def test_every_input_failing_is_an_error_naming_the_first(folder):
    with pytest.raises(ReservoirError, match=r"every input failed twice on the executor \(5\); the first, a/b/x.log: OSError"):
        reservoir.compare(folder, POLICIES, executor=Inline(fail=lambda args, attempt: True))


def test_a_broken_executor_retries_here(folder):
    """An executor that refuses new work (a ProcessPoolExecutor whose worker
    was killed): the failed tasks run once more in this process."""
    whole = reservoir.compare(folder, POLICIES)
    ex = Inline(fail=lambda args, attempt: args[1] in ("1/5", "4/5"), refuse_after=5)
    got = reservoir.compare(folder, POLICIES, executor=ex)
    assert untimed(got.to_dict()) == untimed(whole.to_dict())
    assert got.failed == []


class KillFirst:
    """A ProcessPoolExecutor whose first task kills its worker (SIGKILL):
    the pool breaks, every pending task fails."""

    def __init__(self):
        self.ex = pool(2)
        self.first = True

    def submit(self, fn, *args):
        if self.first:
            self.first = False
            return self.ex.submit(signal.raise_signal, signal.SIGKILL)
        return self.ex.submit(fn, *args)


def test_a_worker_killed_mid_run_loses_nothing(folder):
    whole = reservoir.compare(folder, POLICIES)
    ex = KillFirst()
    try:
        got = reservoir.compare(folder, POLICIES, executor=ex)
    finally:
        ex.ex.shutdown(wait=True, cancel_futures=True)
    assert untimed(got.to_dict()) == untimed(whole.to_dict())
    assert got.failed == []


def test_replay_of_many_inputs_on_an_executor_equals_the_one_process_run():
    sources = [str(LOG), str(SNAP)]
    kw = dict(policies=POLICIES, min_capacity=True, workload="gpt-train:layers=1,steps=2")
    whole = reservoir.replay(sources, **kw)
    assert whole.html
    with pool() as ex:
        got = reservoir.replay(sources, **kw, executor=ex)
    assert untimed(json.loads(got.to_json())) == untimed(json.loads(whole.to_json()))
    assert [r.file for r in got] == [str(LOG)] * 2 + [str(SNAP)] * 2 + [None] * 2
    assert got.failed == [] and got.html == ""
    # No page: the notebook shows each input's summary, its levers in it.
    shown = got._repr_html_()
    assert shown is not None and shown.count('<div class="summary">') == 3, shown
    assert '<table class="levers">' in shown
    # The one-input form is unchanged.
    one = reservoir.replay(str(LOG), policies=POLICIES, min_capacity=True)
    assert untimed(json.loads(one.to_json())) == untimed(json.loads(got.to_json()))[:2]


def test_replay_reports_a_failed_input_and_keeps_the_others(tmp_path):
    bad = tmp_path / "unreadable.pickle"
    bad.write_bytes(b"not a pickle")
    got = reservoir.replay([str(LOG), str(bad)], policies=POLICIES, executor=Inline())
    assert [r.file for r in got] == [str(LOG)] * 2
    assert [f["input"] for f in got.failed] == [str(bad)]
    assert "unreadable.pickle" in got.failed[0]["reason"]
    with pytest.raises(ReservoirError):
        reservoir.replay([str(LOG), str(bad)], policies=POLICIES)


def test_bad_executor_arguments_are_refused(folder):
    with pytest.raises(ReservoirError, match=r"executor=42: expected a concurrent.futures.Executor"):
        reservoir.compare(folder, executor=42)
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as ex:
        with pytest.raises(ReservoirError, match=r"forks its workers.*forkserver"):
            reservoir.compare(folder, executor=ex)
    with pytest.raises(ReservoirError, match=r"source\[1\]: a snapshot's bytes; with an executor give its path"):
        reservoir.replay([str(LOG), b"abc"], executor=Inline())
    with pytest.raises(ReservoirError, match=r"not a URL"):
        reservoir.compare("memory://runs/", executor=Inline())
    with pytest.raises(ReservoirError, match=r"source=\[\]: no input"):
        reservoir.replay([])


def test_progress_is_a_tqdm_bar_when_tqdm_is_importable(folder, monkeypatch):
    bars = []

    class Bar:
        def __init__(self, total, desc, unit):
            self.total, self.desc, self.n, self.closed = total, desc, 0, False
            bars.append(self)

        def update(self, k):
            self.n += k

        def close(self):
            self.closed = True

    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = Bar
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    reservoir.compare(folder, POLICIES, executor=Inline())
    assert [(b.total, b.desc, b.n, b.closed) for b in bars] == [(5, "reservoir compare", 5, True)]
    reservoir.compare(folder, POLICIES, executor=Inline(), progress=False)
    assert len(bars) == 1
    # No tqdm: no bar, no error.
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    reservoir.compare(folder, POLICIES, executor=Inline())


def test_the_longest_inputs_are_submitted_first(folder):
    """Workloads, then files by size, largest first (the engine's own
    longest-first order): a long input does not start last."""
    shards = []

    class Recording(Inline):
        def submit(self, fn, *args):
            shards.append(args[1])
            return super().submit(fn, *args)

    reservoir.compare(folder, POLICIES, workloads=["gpt-train:layers=1,steps=2"], executor=Recording())
    names = _api._compare_units(folder, ["gpt-train:layers=1,steps=2"])
    order = [names[int(s.split("/")[0]) - 1] for s in shards]
    sizes = [os.stat(folder / n).st_size for n in order[1:]]
    assert order[0] == "workload gpt-train:layers=1,steps=2"
    assert sizes == sorted(sizes, reverse=True) and len(order) == len(names) == 6
