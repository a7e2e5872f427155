"""Snapshots where they live (issue 43, item 2): inputs named by a URL that
fsspec opens, in the Python API and the console script, streamed with the
input size limit of local files.

Run by tools/wheel-check.sh in its fresh venv (fsspec installed there):
  python -m pytest crates/reservoir-python/tests/test_remote.py
Uses fsspec's in-process ``memory://`` file system and local ``file://`` URLs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import reservoir
import reservoir.__main__ as console
from reservoir import ReservoirError

fsspec = pytest.importorskip("fsspec")

ROOT = Path(__file__).resolve().parents[3]
TRACES = Path(os.environ.get("RESERVOIR_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
SNAP = TRACES / "cs336-bcrafton" / "06f51ae4_memory_snapshot.pickle"
SMALL_LOG = TRACES / "allocatorsim-alexnet" / "07702e3a_input_alexnet_train.log"
TIMING_KEYS = {"allocator_ns_p50", "allocator_ns_p99", "allocator_ns_per_op", "allocator_time_ns"}


def untimed(v, drop=("file",)):
    """`v` without measured times and the keys in ``drop`` (file names)."""
    if isinstance(v, dict):
        return {k: untimed(x, drop) for k, x in v.items() if k not in TIMING_KEYS and k not in drop}
    if isinstance(v, list):
        return [untimed(x, drop) for x in v]
    return v


@pytest.fixture()
def mem():
    """A fresh memory:// tree: runs/a/snap.pickle and runs/b/alexnet.log."""
    fs = fsspec.filesystem("memory")
    fs.rm("/runs", recursive=True) if fs.exists("/runs") else None
    fs.pipe("/runs/a/snap.pickle", SNAP.read_bytes())
    fs.pipe("/runs/b/alexnet.log", SMALL_LOG.read_bytes())
    yield fs
    fs.rm("/runs", recursive=True)


def test_replay_memory_url_equals_the_local_file(mem):
    url = "memory://runs/a/snap.pickle"
    remote = reservoir.replay(url, policies=["pytorch", "expandable"])
    local = reservoir.replay(SNAP, policies=["pytorch", "expandable"])
    assert remote["pytorch"].file == url
    assert untimed(remote.to_dict()) == untimed(local.to_dict())
    assert "reservoir-" not in json.dumps(remote.to_dict()), "the temporary copy's name leaked"


def test_replay_file_url_equals_the_local_file():
    url = SNAP.as_uri()
    remote = reservoir.replay(url, policies="pytorch")
    local = reservoir.replay(SNAP, policies="pytorch")
    assert remote["pytorch"].file == url
    assert untimed(remote.to_dict()) == untimed(local.to_dict())


def test_compare_memory_folder_equals_the_local_folder(mem, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "snap.pickle").write_bytes(SNAP.read_bytes())
    (tmp_path / "b" / "alexnet.log").write_bytes(SMALL_LOG.read_bytes())
    remote = reservoir.compare("memory://runs", policies=["pytorch", "expandable"])
    local = reservoir.compare(tmp_path, policies=["pytorch", "expandable"])
    assert [r.input for r in remote.rows] == ["a/snap.pickle#0", "b/alexnet.log#0"]
    assert untimed(remote.to_dict(), ()) == untimed(local.to_dict(), ())


def test_the_size_limit_of_local_files(mem, monkeypatch, capfd):
    monkeypatch.setenv("RESERVOIR_MAX_INPUT_BYTES", "1000")
    with pytest.raises(ReservoirError) as e:
        reservoir.replay("memory://runs/a/snap.pickle", policies="pytorch")
    size = len(SNAP.read_bytes())
    assert str(e.value).startswith(
        f"memory://runs/a/snap.pickle: {size} bytes (") and "more than the input size limit of 1000 bytes" in str(e.value)
    assert "RESERVOIR_MAX_INPUT_BYTES=BYTES" in str(e.value)
    # The local file says the same (the Rust reader's message).
    with pytest.raises(ReservoirError) as local:
        reservoir.replay(SNAP, policies="pytorch")
    assert f"{size} bytes (" in str(local.value) and "more than the input size limit of 1000 bytes" in str(local.value)
    # A folder: each file has the limit.
    with pytest.raises(ReservoirError) as folder:
        reservoir.compare("memory://runs", policies="pytorch")
    assert "more than the input size limit of 1000 bytes" in str(folder.value)
    monkeypatch.setenv("RESERVOIR_MAX_INPUT_BYTES", "lots")
    with pytest.raises(ReservoirError) as bad:
        reservoir.replay("memory://runs/a/snap.pickle")
    assert "RESERVOIR_MAX_INPUT_BYTES='lots': expected a number of bytes" in str(bad.value)


def test_the_limit_holds_while_streaming_when_the_size_is_unknown(mem, monkeypatch):
    """A file system that reports no size: the copy stops past the limit."""
    from fsspec.implementations.memory import MemoryFileSystem

    info = MemoryFileSystem.info

    def no_size(self, path, **kw):
        d = dict(info(self, path, **kw))
        d.pop("size", None)
        return d

    monkeypatch.setattr(MemoryFileSystem, "info", no_size)
    monkeypatch.setattr(reservoir._remote, "CHUNK_BYTES", 256)
    monkeypatch.setenv("RESERVOIR_MAX_INPUT_BYTES", "1000")
    with pytest.raises(ReservoirError) as e:
        reservoir.replay("memory://runs/a/snap.pickle", policies="pytorch")
    assert "1024 bytes (1.0 KiB), more than the input size limit of 1000 bytes" in str(e.value)


def test_bad_urls_name_themselves(mem):
    with pytest.raises(ReservoirError, match=r"^memory://runs/none\.pickle: No such file or directory$"):
        reservoir.replay("memory://runs/none.pickle")
    with pytest.raises(ReservoirError, match=r"^memory://runs/a: not a regular file \(a folder\)$"):
        reservoir.replay("memory://runs/a")
    with pytest.raises(ReservoirError, match=r"^memory://runs/a/snap\.pickle: not a folder$"):
        reservoir.compare("memory://runs/a/snap.pickle")
    with pytest.raises(ReservoirError, match=r"^nosuchproto://x: fsspec cannot open it"):
        reservoir.replay("nosuchproto://x")


def test_without_fsspec_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(ReservoirError) as e:
        reservoir.replay("s3://bucket/snap.pickle")
    assert str(e.value).startswith("s3://bucket/snap.pickle: reading a URL needs fsspec")
    assert "reservoir-allocator[fsspec]" in str(e.value)


def test_console_script_memory_urls(mem, capfd):
    """The console script's main() (in this process: memory:// is per process)."""
    capfd.readouterr()
    assert console.main(["replay", "memory://runs/a/snap.pickle", "-p", "pytorch", "--json"]) == 0
    remote = json.loads(capfd.readouterr().out)
    assert console.main(["replay", str(SNAP), "-p", "pytorch", "--json"]) == 0
    local = json.loads(capfd.readouterr().out)
    assert untimed(remote) == untimed(local)
    assert console.main(["compare", "--traces=memory://runs", "--no-workloads", "-p", "pytorch", "--json"]) == 0
    rows = json.loads(capfd.readouterr().out)["rows"]
    assert [r["input"] for r in rows] == ["a/snap.pickle#0", "b/alexnet.log#0"]
    assert console.main(["compare", "--traces", "memory://runs", "--no-workloads", "-p", "pytorch", "--json"]) == 0
    assert [r["input"] for r in json.loads(capfd.readouterr().out)["rows"]] == ["a/snap.pickle#0", "b/alexnet.log#0"]
    # An output is a local file: a URL there is refused, nothing is written.
    assert console.main(["replay", "memory://runs/a/snap.pickle", "--html", "memory://out.html"]) == 1
    out, err = capfd.readouterr()
    assert out == "" and err == "error: --html memory://out.html: the command writes local files only, not a URL\n"
    assert console.main(["replay", "memory://runs/none.pickle"]) == 1
    assert capfd.readouterr().err == "error: memory://runs/none.pickle: No such file or directory\n"


def test_predict_reads_urls(mem, capfd):
    """reservoir.predict and `reservoir predict URL@SIZE` read snapshots by
    URL, and say the same as for the local files (the reports name the URL
    in the API)."""
    cs = TRACES / "cs336-kkaitlyn111"
    a, b = cs / "a97ea92b_memory_ctx128_forward_.pickle", cs / "019e70b3_memory_ctx256_forward_.pickle"
    mem.pipe("/runs/c/ctx128.pickle", a.read_bytes())
    mem.pipe("/runs/c/ctx256.pickle", b.read_bytes())
    urls = {"memory://runs/c/ctx128.pickle": 128, "memory://runs/c/ctx256.pickle": 256}
    remote = reservoir.predict(urls, at=512)
    local = reservoir.predict({a: 128, b: 256}, at=512)
    assert [r["file"] for r in remote["recordings"]] == list(urls)
    assert untimed(remote, ("file", "base")) == untimed(local, ("file", "base"))
    capfd.readouterr()
    args = ["predict", "memory://runs/c/ctx128.pickle@128", "memory://runs/c/ctx256.pickle@256", "--at", "512", "--json"]
    assert console.main(args) == 0
    out = json.loads(capfd.readouterr().out)
    assert out["predicted"] == local["predicted"]


def test_console_script_file_url():
    """`reservoir replay file://...` as a user runs it (a child process)."""
    run = [sys.executable, "-m", "reservoir", "replay", "-p", "pytorch", "--json"]
    remote = subprocess.run(run + [SNAP.as_uri()], capture_output=True, text=True, timeout=300)
    local = subprocess.run(run + [str(SNAP)], capture_output=True, text=True, timeout=300)
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr
    assert untimed(json.loads(remote.stdout)) == untimed(json.loads(local.stdout))
