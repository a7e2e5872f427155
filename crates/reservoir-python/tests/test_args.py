"""The Python API's argument handling (issue 44: G7, G8 and the property
test of item 4), as a user gets it.

* G7: a user's value is never read as an option of the command the API runs:
  a file named ``-a.pickle`` or ``--capacity=1`` replays, a missing one is
  a missing file, and ``policies="--capacity=1"`` is an unknown policy.
* G8: a lone surrogate in any string argument raises ``ReservoirError``
  naming the argument (no ``PanicException``); a surrogate-escaped file name
  (bytes that are not UTF-8, as Python decodes them) is a file name.
* Item 4: arbitrary strings (option-looking, lone surrogates, NUL bytes,
  1 MiB long) into every string argument of every function raise only
  ``ReservoirError``, ``ValueError``, ``TypeError`` or ``OSError``.

Run by tools/wheel-check.sh in a fresh venv with the wheel, pytest and
hypothesis installed: python -m pytest crates/reservoir-python/tests/test_args.py
The traces are ../shared/traces (RESERVOIR_SHARED_TRACES overrides).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import reservoir
from reservoir import ReservoirError, _native

ROOT = Path(__file__).resolve().parents[3]
TRACES = Path(os.environ.get("RESERVOIR_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
# A small real snapshot with a trace (62 ops): every replay of it is quick.
SMALL = TRACES / "cs336-silmont2000" / "b61be409_mem_snapshot.pickle"
WORKLOAD = "gpt-train:layers=1,steps=2"
# Values that a command-line parser reads as options.
OPTION_LIKE = ["--capacity=1", "-a", "--json", "--help", "-h", "--version", "--no-traces", "--"]
# A lone surrogate: valid in a Python str, no UTF-8 form.
LONE = "\ud800"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """An empty working directory: relative names are resolved there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def error_of(fn) -> str:
    """`fn()`'s ReservoirError message (anything else fails the test,
    a PanicException included: it is a BaseException)."""
    with pytest.raises(ReservoirError) as e:
        fn()
    return str(e.value)


def peaks(r: reservoir.Replay):
    return [(x.setting, x.ops, x.peak_reserved, x.peak_allocated, x.ooms) for x in r]


# --- G7: values are never options -----------------------------------------


@pytest.mark.parametrize("name", ["-a.pickle", "--capacity=1", "--json", "-h"])
def test_a_file_named_like_an_option_replays(in_tmp, name):
    shutil.copy(SMALL, in_tmp / name)
    r = reservoir.replay(name, policies=["pytorch", "expandable"])
    assert [x.file for x in r] == [name, name]
    assert peaks(r) == peaks(reservoir.replay(SMALL, policies=["pytorch", "expandable"]))
    # A folder named like an option is a folder.
    (in_tmp / "-a").mkdir()
    shutil.copy(SMALL, in_tmp / "-a" / "snap.pickle")
    c = reservoir.compare("-a", policies="pytorch")
    assert len(c.rows) == 1 and "snap.pickle" in c.rows[0].input


@pytest.mark.parametrize("name", ["--capacity=1", "-a.pickle", "--help", "--version", "--json", "-a"])
def test_a_missing_file_named_like_an_option_is_a_missing_file(in_tmp, name):
    # Before the fix, replay("--capacity=1") replayed the default workload on
    # a 1-byte device; replay("--help") raised clap's help text.
    msg = error_of(lambda: reservoir.replay(name))
    assert f"cannot load {name}: {name}: No such file" in msg, msg
    msg = error_of(lambda: reservoir.compare(name))
    assert msg.startswith(f"{name}: not a folder of traces"), msg


@pytest.mark.parametrize("value", OPTION_LIKE)
def test_every_string_argument_takes_option_like_values_as_values(in_tmp, value):
    """Each string argument of replay() and compare(), given an
    option-looking value, fails on that value (its message quotes it): the
    value reached the option it was given for, and nothing ran."""
    cases = {
        "replay policies": lambda: reservoir.replay(SMALL, policies=value),
        "replay workload": lambda: reservoir.replay(workload=value),
        "replay configs": lambda: reservoir.replay(SMALL, configs=["", value]),
        "replay settings value": lambda: reservoir.replay(SMALL, settings={"s": value}),
        "replay capacity": lambda: reservoir.replay(SMALL, capacity=value),
        "replay device_total": lambda: reservoir.replay(SMALL, device_total=value),
        "replay start": lambda: reservoir.replay(SMALL, start=value),
        "replay torch": lambda: reservoir.replay(SMALL, torch=value),
        "replay device": lambda: reservoir.replay(SMALL, device=value),  # type: ignore[arg-type]
        "compare policies": lambda: reservoir.compare(None, policies=value, workloads=[WORKLOAD]),
        "compare workloads": lambda: reservoir.compare(None, workloads=[value]),
        "compare capacity": lambda: reservoir.compare(None, workloads=[WORKLOAD], capacity=value),
    }
    for what, fn in cases.items():
        msg = error_of(fn)
        # clap quotes the value '...', Reservoir "..."; the value is there,
        # not "a value is required" nor "unexpected argument".
        assert "a value is required" not in msg and "unexpected argument" not in msg, (what, msg)
        assert value in msg, (what, msg)
    # A setting's name is any text without "=": an option-like one names
    # the setting.
    if "=" in value:
        assert "contains '='" in error_of(lambda: reservoir.replay(SMALL, settings={value: ""}))
    else:
        assert reservoir.replay(SMALL, settings={value: ""}).settings == [value]


# --- G8: lone surrogates and surrogate-escaped file names -----------------


def test_a_lone_surrogate_in_every_string_argument_names_it(in_tmp):
    cases = {
        "source": lambda: reservoir.replay(LONE),
        "policies": lambda: reservoir.replay(SMALL, policies=["pytorch", LONE]),
        "workload": lambda: reservoir.replay(workload=LONE),
        "configs": lambda: reservoir.replay(SMALL, configs=LONE),
        "settings": lambda: reservoir.replay(SMALL, settings={LONE: ""}),
        "settings['s']": lambda: reservoir.replay(SMALL, settings={"s": LONE}),
        "capacity": lambda: reservoir.replay(SMALL, capacity="1" + LONE),
        "device_total": lambda: reservoir.replay(SMALL, device_total=LONE),
        "start": lambda: reservoir.replay(SMALL, start=LONE),
        "torch": lambda: reservoir.replay(SMALL, torch=LONE),
        "device": lambda: reservoir.replay(SMALL, device=LONE),  # type: ignore[arg-type]
        "folder": lambda: reservoir.compare(LONE),
        "compare policies": lambda: reservoir.compare(None, policies=LONE, workloads=[WORKLOAD]),
        "workloads": lambda: reservoir.compare(None, workloads=[WORKLOAD, LONE]),
        "compare capacity": lambda: reservoir.compare(None, workloads=[WORKLOAD], capacity=LONE),
        # The native functions (the console script's and reservoir.torch's).
        "argv[2]": lambda: _native.run_captured(["reservoir", "replay", LONE]),
        "argv[1]": lambda: _native.run(["reservoir", LONE]),
        "conf": lambda: _native.configure(LONE),
        "enabled": lambda: _native.record_memory_history(0, LONE, None, 1, False),
        "context": lambda: _native.record_memory_history(0, "all", LONE, 1, False),
    }
    for name, fn in cases.items():
        msg = error_of(fn)
        arg = name.split(" ")[-1]
        assert msg.startswith(f"{arg}=") or f" {arg}=" in msg, (name, msg)
        assert "\\ud800" in msg, (name, msg)


def test_the_console_script_refuses_a_lone_surrogate_without_a_panic():
    p = subprocess.run(
        [sys.executable, "-c", "import sys, reservoir.__main__ as m; sys.exit(m.main(['replay', '\\ud800']))"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 1, p.stderr
    assert "ReservoirError: argv[2]='\\ud800'" in p.stderr, p.stderr
    assert "panic" not in p.stderr.lower(), p.stderr


def test_a_surrogate_escaped_file_name_is_a_file_name(tmp_path):
    # b"\xff" is no UTF-8: Python names the file "\udcff-snap.pickle".
    folder = os.path.join(os.fsencode(tmp_path), b"\xfe-traces")
    os.mkdir(folder)
    raw = os.path.join(folder, b"\xff-snap.pickle")
    shutil.copyfile(SMALL, raw)
    name = os.fsdecode(raw)
    assert "\udcff" in name
    r = reservoir.replay(name, policies="pytorch")
    assert peaks(r) == peaks(reservoir.replay(SMALL, policies="pytorch"))
    assert len(reservoir.compare(os.fsdecode(folder), policies="pytorch").rows) == 1
    assert len(reservoir.compare(folder, policies="pytorch").rows) == 1  # a bytes path
    # The command line too (the console script gets such names from sys.argv).
    out, _ = _native.run_captured(["reservoir", "replay", name, "-p", "pytorch", "--json"])
    assert [x["peak_reserved"] for x in json.loads(out)] == [x.peak_reserved for x in r]


# --- Item 4: arbitrary strings into every function --------------------------


SPECIALS = OPTION_LIKE + [
    "-", "-a.pickle", "=", "a=b", "--setting=a=b", "--policy", "-p", "--capacity", "1",
    LONE, "\udfff", "\udcff", "a\ud800b", "\udbff\udc00", "\x00", "a\x00b", "\n", " ", "",
    "é", "\U0001f600", "\u200f", "x" * 5000, "-" * 4096, "y" * (1 << 20), LONE * 1000,
]
# Every code point, lone surrogates and NUL included.
CHARS = st.characters(codec=None, exclude_categories=())
ARBITRARY = st.lists(
    st.one_of(st.sampled_from(SPECIALS), st.text(CHARS, max_size=12)), min_size=1, max_size=4
).map("".join)

# (what, call(s), is s a path): every string argument of the API and of the
# native functions behind it; the other arguments are valid.
TARGETS = [
    ("replay source", lambda s: reservoir.replay(s), True),
    ("replay policies", lambda s: reservoir.replay(SMALL, policies=[s]), False),
    ("replay workload", lambda s: reservoir.replay(workload=s), False),
    ("replay configs", lambda s: reservoir.replay(SMALL, configs=s), False),
    ("replay settings name", lambda s: reservoir.replay(SMALL, settings={s: "max_split_size_mb:200"}), False),
    ("replay settings conf", lambda s: reservoir.replay(SMALL, settings={"s": s}), False),
    ("replay capacity", lambda s: reservoir.replay(SMALL, capacity=s), False),
    ("replay device_total", lambda s: reservoir.replay(SMALL, device_total=s), False),
    ("replay start", lambda s: reservoir.replay(SMALL, start=s), False),
    ("replay torch", lambda s: reservoir.replay(SMALL, torch=s), False),
    ("replay device", lambda s: reservoir.replay(SMALL, device=s), False),  # type: ignore[arg-type]
    ("compare folder", lambda s: reservoir.compare(s, policies="pytorch"), True),
    ("compare policies", lambda s: reservoir.compare(None, policies=s, workloads=[WORKLOAD]), False),
    ("compare workloads", lambda s: reservoir.compare(None, workloads=[s]), False),
    ("compare capacity", lambda s: reservoir.compare(None, workloads=[WORKLOAD], capacity=s), False),
    ("native run_captured", lambda s: _native.run_captured(["reservoir", "replay", "--", s]), True),
    ("native configure", lambda s: _native.configure(s), False),
    ("native record_memory_history enabled", lambda s: _native.record_memory_history(0, s, None, 1, False), False),
    ("native record_memory_history context", lambda s: _native.record_memory_history(0, "all", s, 1, False), False),
]
EXPECTED = (ReservoirError, ValueError, TypeError, OSError)


@pytest.mark.parametrize("what,call,is_path", TARGETS, ids=[t[0] for t in TARGETS])
def test_arbitrary_strings_raise_only_expected_errors(tmp_path_factory, what, call, is_path):
    work = tmp_path_factory.mktemp("cwd")
    old = os.getcwd()
    os.chdir(work)
    try:

        @settings(
            max_examples=60,
            deadline=None,
            derandomize=True,  # the same cases on every run (CI)
            database=None,  # no .hypothesis folder in the working tree
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(s=st.one_of(st.sampled_from(SPECIALS), ARBITRARY))
        def check(s: str) -> None:
            if is_path:
                # Only names of nothing: "." or "/" would replay a folder.
                assume(not os.path.lexists(s))
            try:
                call(s)
            except EXPECTED:
                pass
            # Anything else (a PanicException is a BaseException) fails.

        check()
    finally:
        os.chdir(old)
