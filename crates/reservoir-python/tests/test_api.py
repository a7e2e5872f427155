"""The reservoir wheel's Python API and command, as a user gets them.

Run by tools/wheel-check.sh in a fresh venv with the wheel installed (no
cargo, no torch):  python -m pytest crates/reservoir-python/tests/test_api.py
The traces are ../shared/traces (RESERVOIR_SHARED_TRACES overrides).
"""

from __future__ import annotations

import html as html_mod
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import reservoir
from reservoir import ReservoirError

ROOT = Path(__file__).resolve().parents[3]
TRACES = Path(os.environ.get("RESERVOIR_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
SNAP = TRACES / "cs336-bcrafton" / "06f51ae4_memory_snapshot.pickle"
SMALL_LOG = TRACES / "allocatorsim-alexnet" / "07702e3a_input_alexnet_train.log"
STATE_ONLY = TRACES / "stateonly-text-to-sql" / "27df9f5b_dump_snapshot.pickle"
WORKLOAD = "gpt-train:layers=1,steps=2"
# Measured wall-clock times: they differ from run to run.
TIMING_KEYS = {"allocator_ns_p50", "allocator_ns_p99", "allocator_ns_per_op", "allocator_time_ns"}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m reservoir ARGS` in a child process."""
    p = subprocess.run(
        [sys.executable, "-m", "reservoir", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert p.returncode == 0, p.stderr
    return p


def untimed(v):
    """`v` without the measured wall-clock times."""
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if k not in TIMING_KEYS}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v


def cli_error(*args: str) -> str:
    """The command's error message (after `error: `), checking it fails
    with status 1 and prints only that line."""
    p = cli(*args, check=False)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0][len("error: "):]


def api_error(capfd, fn) -> str:
    """`fn()`'s ReservoirError message, checking that nothing was printed."""
    capfd.readouterr()
    with pytest.raises(ReservoirError) as e:
        fn()
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    return str(e.value)


@pytest.fixture(scope="module")
def rep() -> reservoir.Replay:
    return reservoir.replay(SNAP, policies=["pytorch", "expandable"])


def test_version_is_the_commands():
    assert isinstance(reservoir.__version__, str) and reservoir.__version__
    assert cli("--version").stdout.strip() == f"reservoir {reservoir.__version__}"


def test_replay_reports_have_typed_attributes(rep):
    assert len(rep) == 2 and rep.settings == ["pytorch", "expandable"]
    py = rep["pytorch"]
    assert py is not None and py.setting == "pytorch" and rep[1].setting == "expandable"
    assert py.file == str(SNAP) and py.device == 0
    for name in ("peak_allocated", "peak_reserved", "peak_live", "capacity", "ops",
                 "driver_allocs", "driver_frees", "driver_time_ns", "ooms"):
        assert isinstance(getattr(py, name), int), name
    assert py.peak_reserved >= py.peak_allocated >= py.peak_live > 0
    assert py.fragmentation == pytest.approx(py.peak_reserved / py.peak_allocated)
    assert py.reserved_per_live == pytest.approx(py.peak_reserved / py.peak_live)
    assert py.ooms == 0 and py.oom is None and py.first_oom is None
    # PyTorch mode reproduces this recording exactly (its header says so).
    f = py.fidelity
    assert f is not None and f.exact and f.placements_matched == f.placements_total > 0
    assert f.recorded_peak_reserved == py.peak_reserved
    assert rep["expandable"].fidelity is None
    sites = py.peak_sites
    assert sites and all(isinstance(s.bytes, int) and isinstance(s.site, str) for s in sites)
    assert sites == sorted(sites, key=lambda s: -s.bytes) or len(sites) == 1
    assert py.torch_release == "2.12"
    assert py.memory_stats["reserved_bytes.all.peak"] == py.peak_reserved
    assert py.samples and py.min_capacity is None
    with pytest.raises(KeyError, match="expandable"):
        rep["nope"]


def test_replay_json_is_the_commands(rep):
    # The objects are built from the engine's --json: equal to the command's.
    ran = json.loads(cli("replay", SNAP, "-p", "pytorch", "-p", "expandable", "--json").stdout)
    assert untimed(json.loads(rep.to_json())) == untimed(ran)
    assert untimed(rep.to_dict()["reports"]) == untimed(ran)
    assert [json.loads(r.to_json()) for r in rep] == [r.to_dict() for r in rep]
    assert rep.to_dict()["reports"][0] == rep[0].to_dict()


def test_repr_html_is_the_commands_report(rep, tmp_path):
    html = rep._repr_html_()
    assert html == rep.html and html.lstrip().lower().startswith("<!doctype html")
    page = tmp_path / "r.html"
    cli("replay", SNAP, "-p", "pytorch", "-p", "expandable", "--html", page)
    # The same page but for the measured times.
    timing = re.compile(r"<tr><td>allocator time per call[^\n]*")
    assert timing.sub("", page.read_text()) == timing.sub("", html)
    for marker in ("<svg", "segment", "peak"):
        assert marker in html
    rep.save_html(tmp_path / "saved.html")
    assert (tmp_path / "saved.html").read_text() == html


def test_repr_html_shows_the_program_levers(rep):
    """Issue 41 item 2: the notebook report carries the summary's program
    levers (what was replayed, whether it fits), as the text and page do."""
    levers = rep[0].levers
    assert levers and levers == rep[0].summary["levers"]
    html = rep._repr_html_()
    assert '<ul class="levers">' in html
    for lv in levers:
        assert html_mod.escape(lv["replayed"], quote=False) in html
    # A single report shows its summary with the levers as a table.
    one = rep[0]._repr_html_()
    assert one.startswith('<div class="summary">') and '<table class="levers">' in one
    assert one.count("<tr><td><b>") == len(levers)


# A summary as `reservoir replay --json` writes it: an OOM, a settings fix,
# two program levers (one fits, one does not).
SUMMARY = {
    "setting": "pytorch",
    "oom_op": 1234,
    "shortfall": 3 << 30,
    "peak_reserved": 78 << 30,
    "happened": "OOM at op 1234: short by 3.00 GiB (1 OOMs in all)",
    "why": [{"cause": "capacity", "bytes": 3 << 30, "sentence": "the live bytes exceed the device"}],
    "roles": [{"role": "activations", "bytes": 40 << 30}, {"role": "optimizer_state", "bytes": 20 << 30}],
    "roles_at": "oom",
    "fix": "no setting avoids it",
    "levers": [
        {
            "lever": "micro_batch",
            "name": "smaller micro-batch",
            "replayed": "halved the micro-batch (factor 1/2) <& more>",
            "peak_reserved": 592 << 20,
            "peak_allocated": 535 << 20,
            "fits": True,
        },
        {
            "lever": "imbalance",
            "name": "balanced devices",
            "replayed": "device 1 peaks at 78.00 GiB reserved, device 0 at 8.00 GiB; ...",
            "peak_reserved": (81 << 30) + (1 << 29),
            "peak_allocated": 80 << 30,
            "fits": False,
        },
    ],
    "fits": None,
}


def test_the_summary_html_of_a_dict_lists_each_lever():
    """The notebook's summary, from the JSON alone (no page: a replay on an
    executor, or one report): each lever with what was replayed, its peak
    reserved and whether it fits."""
    d = {"setting": "pytorch", "file": "run/snap.pickle", "device": 1, "summary": SUMMARY}
    html = reservoir.Report(d)._repr_html_()
    assert html.startswith('<div class="summary"><h3>run/snap.pickle (device 1) Summary (pytorch)</h3>')
    assert "<dt>What happened</dt><dd>OOM at op 1234: short by 3.00 GiB (1 OOMs in all)</dd>" in html
    assert "<li><b>capacity</b> 3.00 GiB: the live bytes exceed the device</li>" in html
    assert "memory by role at the OOM: activations 40.00 GiB, optimizer state 20.00 GiB" in html
    assert "<dt>What to do</dt><dd>no setting avoids it<p>then the program levers" in html
    assert (
        "<tr><td><b>smaller micro-batch</b></td><td>halved the micro-batch (factor 1/2) "
        "&lt;&amp; more&gt;</td><td>592.00 MiB</td><td>fits</td></tr>"
    ) in html
    assert (
        "<tr><td><b>balanced devices</b></td><td>device 1 peaks at 78.00 GiB reserved, device 0 "
        "at 8.00 GiB; ...</td><td>81.50 GiB</td><td>no</td></tr>"
    ) in html
    assert "<dt>What fits</dt><dd>not measured (replay with min_capacity=True)</dd>" in html
    assert reservoir.Report(d).levers == SUMMARY["levers"]
    # Without a summary: the text repr.
    assert reservoir.Report({"setting": "pytorch"})._repr_html_() is None
    # A replay without a page: each input's summary once (its settings'
    # reports carry the same one), then the next input's.
    other = dict(SUMMARY, levers=[], happened="no OOM, peak reserved 1.00 GiB", oom_op=None)
    reports = [
        dict(d, setting="pytorch"),
        dict(d, setting="expandable"),
        {"setting": "pytorch", "file": None, "device": None, "summary": other},
    ]
    shown = reservoir.Replay(json.dumps(reports), None)._repr_html_()
    assert shown.count('<div class="summary">') == 2 and shown.count("balanced devices") == 1
    assert "<h3>workload Summary (pytorch)</h3>" in shown
    assert reservoir.Replay(json.dumps([{"setting": "pytorch"}]), None)._repr_html_() is None


def test_a_failed_save_html_keeps_the_previous_file(rep, tmp_path):
    """Issue 44, G1: save_html wrote with open(path, "w"), which truncated
    the previous file first; a failed write (here EFBIG under a file-size
    limit, which root gets too) left half a page. Now a temporary file is
    renamed into place: the previous file and a link to it survive, and no
    temporary file is left."""
    import resource

    page = tmp_path / "saved.html"
    page.write_text("the previous page")
    (tmp_path / "link").symlink_to("saved.html")
    assert len(rep.html.encode()) > 4096
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        for target in (page, tmp_path / "link"):
            with pytest.raises(OSError):
                rep.save_html(target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert page.read_text() == "the previous page"
    assert (tmp_path / "link").is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["link", "saved.html"]
    # Without the limit: replaced through the link, which stays a link.
    page.chmod(0o640)
    rep.save_html(tmp_path / "link")
    assert page.read_text() == rep.html
    assert (tmp_path / "link").is_symlink()
    assert page.stat().st_mode & 0o777 == 0o640
    # A device is written through, never replaced.
    rep.save_html("/dev/null")
    assert Path("/dev/null").is_char_device()
    with pytest.raises(IsADirectoryError):
        rep.save_html(tmp_path)


def test_replay_of_bytes_equals_replay_of_the_file(rep):
    by_bytes = reservoir.replay(SNAP.read_bytes(), policies=["pytorch", "expandable"])
    for a, b in zip(rep, by_bytes):
        da, db = untimed(a.to_dict()), untimed(b.to_dict())
        da.pop("file"), db.pop("file")
        assert da == db


def test_oom_is_explained():
    r = reservoir.replay(SNAP, policies="pytorch", capacity="3GiB", start="cold")
    py = r[0]
    assert py.capacity == 3 << 30 and py.ooms > 0
    oom = py.oom
    assert oom is not None and isinstance(oom.bytes, int) and oom.bytes > 0
    assert oom.rounded >= oom.bytes and isinstance(oom.site, str)
    assert oom.top_sites and isinstance(oom.diagnosis, dict) and oom.diagnosis
    assert py.first_oom is not None
    # Integer capacities are bytes.
    assert reservoir.replay(SNAP, policies="pytorch", capacity=3 << 30, start="cold")[0].ooms == py.ooms


def test_min_capacity_and_workload():
    r = reservoir.replay(workload=WORKLOAD, policies=["pytorch", "reservoir"], min_capacity=True)
    assert [x.setting for x in r] == ["pytorch", "reservoir"]
    for x in r:
        assert x.file is None and isinstance(x.min_capacity, int)
        assert x.peak_live <= x.min_capacity
    ran = json.loads(cli("replay", "--workload", WORKLOAD, "-p", "pytorch", "-p", "reservoir",
                         "--min-capacity", "--json").stdout)
    assert untimed(r.to_dict()["reports"]) == untimed(ran)


def test_settings_configs_and_release():
    r = reservoir.replay(SNAP, settings={"big": "max_split_size_mb:512"},
                         configs=["expandable_segments:True"], torch="2.13")
    assert r.settings == ["big", "expandable_segments:True"]
    assert all(x.torch_release == "2.13" for x in r)


def test_compare_folder_and_workloads(tmp_path):
    shutil.copy(SNAP, tmp_path / SNAP.name)
    shutil.copy(SMALL_LOG, tmp_path / SMALL_LOG.name)
    c = reservoir.compare(tmp_path, policies=["pytorch", "expandable"])
    rows = c.rows
    assert len(rows) == 2 and all(isinstance(r.ops, int) for r in rows)
    assert {p["policy"] for p in rows[0].policies} == {"pytorch", "expandable"}
    ran = cli("compare", "--traces", tmp_path, "-p", "pytorch", "-p", "expandable",
              "--no-workloads", "--json").stdout
    assert untimed(c.to_dict()) == untimed(json.loads(ran))
    assert json.loads(c.to_json()) == c.to_dict() and c.summary
    w = reservoir.compare(None, policies="pytorch", workloads=[WORKLOAD])
    assert [r.input for r in w.rows] == [f"workload {WORKLOAD}"] or len(w.rows) == 1


def test_to_pandas_or_a_clear_import_error(rep, monkeypatch):
    try:
        import pandas  # noqa: F401
    except ImportError:
        pandas = None
    if pandas is not None:
        df = rep.to_pandas()
        assert list(df["setting"]) == ["pytorch", "expandable"]
        assert int(df["peak_reserved"][0]) == rep[0].peak_reserved
    # Without pandas: an ImportError that says what to install.
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        rep.to_pandas()


# Bad input: one ReservoirError with the message the command prints, and
# nothing printed by the API.


def test_missing_file(capfd, tmp_path):
    missing = tmp_path / "no-such.pickle"
    msg = api_error(capfd, lambda: reservoir.replay(missing))
    assert msg == cli_error("replay", missing) and str(missing) in msg


def test_truncated_pickle(capfd, tmp_path):
    cut = tmp_path / "cut.pickle"
    data = SNAP.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    msg = api_error(capfd, lambda: reservoir.replay(cut))
    assert msg == cli_error("replay", cut) and "cut.pickle" in msg
    assert "pickle" in api_error(capfd, lambda: reservoir.replay(data[:1000]))


def test_state_only_snapshot(capfd):
    msg = api_error(capfd, lambda: reservoir.replay(STATE_ONLY))
    assert msg == cli_error("replay", STATE_ONLY) and "no trace entries" in msg


def test_bad_policy(capfd):
    msg = api_error(capfd, lambda: reservoir.replay(SNAP, policies=["pytorch", "fastest"]))
    assert msg == cli_error("replay", SNAP, "-p", "pytorch", "-p", "fastest")
    assert '"fastest"' in msg
    assert "max-split" in api_error(capfd, lambda: reservoir.replay(SNAP, policies="max-split-lots"))
    assert "fastest" in api_error(capfd, lambda: reservoir.compare(None, "fastest", workloads=[WORKLOAD]))


def test_bad_capacity(capfd):
    msg = api_error(capfd, lambda: reservoir.replay(SNAP, capacity="lots"))
    assert '"lots"' in msg
    # clap's message is the command's first line, after `error: `.
    p = cli("replay", SNAP, "--capacity", "lots", check=False)
    assert p.returncode == 2 and p.stderr.splitlines()[0] == f"error: {msg}"
    assert api_error(capfd, lambda: reservoir.replay(SNAP, capacity=0)) == cli_error(
        "replay", SNAP, "--capacity", "0")
    assert "-1" in api_error(capfd, lambda: reservoir.replay(SNAP, capacity=-1))
    assert "True" in api_error(capfd, lambda: reservoir.replay(SNAP, capacity=True))
    assert "17T" in api_error(capfd, lambda: reservoir.replay(SNAP, capacity="17T"))


def test_bad_arguments(capfd):
    assert "sideways" in api_error(capfd, lambda: reservoir.replay(SNAP, start="sideways"))
    assert "42" in api_error(capfd, lambda: reservoir.replay(42))  # type: ignore[arg-type]
    assert "2.99" in api_error(capfd, lambda: reservoir.replay(SNAP, torch="2.99"))
    assert "policies" in api_error(capfd, lambda: reservoir.replay(SNAP, policies=[1]))  # type: ignore[list-item]
    assert "nothing to compare" in api_error(capfd, lambda: reservoir.compare(None))
    missing = "/nonexistent/traces"
    assert api_error(capfd, lambda: reservoir.compare(missing)) == cli_error(
        "compare", "--traces", missing, "--no-workloads", "--json")


# The console script.


def test_console_script_is_python_m_reservoir():
    # The console script pip installed beside the interpreter.
    exe = Path(sys.executable).parent / "reservoir"
    assert exe.is_file() and os.access(exe, os.X_OK)
    a = subprocess.run([exe, "workloads"], capture_output=True, text=True, check=True)
    assert a.stdout == cli("workloads").stdout and "gpt-train" in a.stdout
    assert subprocess.run([exe, "replay", "--bogus"], capture_output=True).returncode == 2
    help_ = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert help_.returncode == 0 and "replay" in help_.stdout
    for sub in ("replay", "convert", "workload", "workloads", "compare", "diff"):
        assert sub in help_.stdout


def test_every_subcommand_runs(tmp_path):
    out = tmp_path / "t.txt"
    cli("convert", SNAP, "--oracle-trace", out)
    assert out.read_text().startswith("#")
    assert cli("workload", WORKLOAD).stdout.strip()
    d = json.loads(cli("diff", SNAP, SNAP, "--json", "-").stdout)
    assert isinstance(d, dict)
    assert "pytorch" in cli("compare", "--no-traces", "--workload", WORKLOAD, "-p", "pytorch").stdout


def test_broken_pipe_ends_quietly():
    p = subprocess.Popen([sys.executable, "-m", "reservoir", "replay", SNAP, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=120)
    assert p.returncode == -signal.SIGPIPE, (p.returncode, err)
    assert err == b""


def test_main_in_process_keeps_the_callers_signal_handlers():
    """main() called in a process that goes on (a notebook, pytest) puts the
    caller's SIGPIPE and SIGINT handlers back: left at SIGPIPE's default,
    this test process died at its next write to a closed pipe (CI, exit
    141, in a later test that killed a worker)."""
    import reservoir.__main__ as console

    before = {s: signal.getsignal(s) for s in (signal.SIGPIPE, signal.SIGINT)}
    assert before[signal.SIGPIPE] != signal.SIG_DFL  # Python ignores SIGPIPE
    assert console.main(["workloads"]) == 0
    assert console.main(["replay", "--bogus-option"]) != 0
    assert {s: signal.getsignal(s) for s in before} == before


def test_ctrl_c_stops_the_command():
    p = subprocess.Popen([sys.executable, "-m", "reservoir", "replay", "--workload",
                          "gpt-train:layers=48,steps=40", "--min-capacity"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.5)
    assert p.poll() is None, "the run ended before Ctrl-C"
    p.send_signal(signal.SIGINT)
    p.wait(timeout=120)
    # Killed by the signal (default handling, as the Rust command): a run
    # that went on to its end would exit 0. No wall-clock bound.
    assert p.returncode == -signal.SIGINT, p.returncode


def test_import_needs_no_torch_and_everything_public_is_documented():
    code = ("import sys, reservoir; "
            "assert 'torch' not in sys.modules and 'reservoir.torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    for name in reservoir.__all__:
        obj = getattr(reservoir, name)
        if name != "__version__":
            assert obj.__doc__ and obj.__doc__.strip(), name
    for cls in (reservoir.Replay, reservoir.Report, reservoir.Oom, reservoir.Fidelity, reservoir.Compare):
        for attr, v in vars(cls).items():
            if not attr.startswith("_"):
                assert getattr(v, "__doc__", None), f"{cls.__name__}.{attr}"
    pkg = Path(reservoir.__file__).parent
    assert (pkg / "py.typed").is_file() and (pkg / "_native.pyi").is_file()


def test_ctrl_c_interrupts_the_api():
    # The engine runs on a thread of its own; the caller waits and checks
    # for signals, so Ctrl-C raises KeyboardInterrupt at once instead of
    # after the run. No wall-clock bound (the machine may be loaded): the
    # same run, uninterrupted, is timed by the child itself, and the
    # interrupted one must end well before that run would have.
    code = ("import sys, time, reservoir\n"
            "t0 = time.monotonic()\n"
            "try:\n"
            "    reservoir.replay(workload='gpt-train:layers=48,steps=40', min_capacity=True)\n"
            "    print('finished', time.monotonic() - t0, flush=True)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', time.monotonic() - t0, flush=True)\n")
    whole = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    word, run_s = whole.stdout.split()
    assert word == "finished" and whole.returncode == 0, (whole.stdout, whole.stderr)
    sent_at = min(1.5, float(run_s) / 3)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(sent_at)
    assert p.poll() is None, "the run ended before Ctrl-C"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    word, at_s = out.split()
    assert word == "interrupted" and p.returncode == 0, (out, err)
    # Interrupted at sent_at (plus start-up); the whole run took run_s.
    assert float(at_s) < (sent_at + float(run_s)) / 2, (
        f"KeyboardInterrupt came only after the run: at {at_s} s of a {run_s} s run")


CS336 = TRACES / "cs336-kkaitlyn111"


def test_predict_is_the_commands():
    """reservoir.predict({path: size}, at=) is `reservoir predict FILE@SIZE
    ... --at SIZE --json` (issue 41 item 3): the real cs336 forward pass at
    context 512 predicted from 128 and 256, and the recorded size itself."""
    a = CS336 / "a97ea92b_memory_ctx128_forward_.pickle"
    b = CS336 / "019e70b3_memory_ctx256_forward_.pickle"
    got = reservoir.predict({a: 128, b: 256}, at=512)
    p = cli("predict", f"{a}@128", f"{b}@256", "--at", "512", "--json")
    assert untimed(got) == untimed(json.loads(p.stdout))
    assert got["at"] == 512
    assert got["predicted"]["peak_allocated"] > 0
    assert got["predicted"]["peak_reserved"] >= got["predicted"]["peak_allocated"]
    assert [r["size"] for r in got["recordings"]] == [128, 256]
    # A list of pairs, with a capacity: the largest size that fits.
    fit = reservoir.predict([(a, 128), (b, 256)], at=512, capacity="80GiB")
    assert fit["predicted"]["largest_fitting"]["kind"] == "size"
    assert fit["predicted"]["largest_fitting"]["size"] > 512


def test_predict_refuses_bad_input(capfd, tmp_path):
    a = CS336 / "a97ea92b_memory_ctx128_forward_.pickle"
    assert "recordings: none given" in api_error(capfd, lambda: reservoir.predict({}, at=512))
    assert "at=0" in api_error(capfd, lambda: reservoir.predict({a: 128}, at=0))
    assert "at=True" in api_error(capfd, lambda: reservoir.predict({a: 128}, at=True))
    assert "size -1" in api_error(capfd, lambda: reservoir.predict({a: -1}, at=512))
    assert "expected (source, size)" in api_error(capfd, lambda: reservoir.predict([a], at=512))
    missing = tmp_path / "none.pickle"
    assert "none.pickle" in api_error(capfd, lambda: reservoir.predict({missing: 128}, at=512))
