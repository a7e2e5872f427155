"""The ``reservoir`` command: ``reservoir ARGS`` (the console script) and
``python -m reservoir ARGS``.

It runs the Rust command's own code (``reservoir._native.run``): every
subcommand prints what ``cargo run -p reservoir-cli -- ARGS`` prints and exits
with the same status. Neither Rust nor torch is needed.
"""

from __future__ import annotations

import signal
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``reservoir`` with ``argv`` (default: ``sys.argv[1:]``) and return
    its exit status.

    Ctrl-C and a closed standard output behave as for the Rust binary: the
    default actions of SIGINT and SIGPIPE are restored for the run, so Ctrl-C
    stops it at once and ``reservoir ... | head`` ends quietly. Called with
    ``argv`` (in a process that goes on: a notebook, a test), it puts the
    caller's handlers back when it returns.
    """
    if argv is None:  # the process's entry point: the defaults stay to its end
        _default_signals()
        return _run(sys.argv[1:])
    saved = _default_signals()
    try:
        return _run(list(argv))
    finally:
        # Called in a process that goes on (a notebook, a test), main() puts
        # the caller's handlers back: a SIGPIPE left at its default kills
        # that process at its next write to a closed pipe.
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _default_signals() -> dict:
    """Restore the default actions of SIGINT and SIGPIPE and return the
    handlers they replaced (only in the main thread, where Python allows it;
    a handler not set from Python is left alone)."""
    import threading

    saved = {}
    if threading.current_thread() is not threading.main_thread():
        return saved
    for name in ("SIGINT", "SIGPIPE"):
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        previous = signal.getsignal(sig)
        if previous is None:
            continue
        signal.signal(sig, signal.SIG_DFL)
        saved[sig] = previous
    return saved


def _run(args: List[str]) -> int:
    """``main``'s body: the Rust command on ``args``, input URLs copied first."""
    from . import _native

    sys.stdout.flush()
    sys.stderr.flush()
    from . import _remote

    if not any(_remote.is_url(a.partition("=")[2] if a.startswith("--") else a) for a in args if isinstance(a, str)):
        return _native.run(["reservoir", *args])
    import tempfile

    with tempfile.TemporaryDirectory(prefix="reservoir-") as tmp:
        try:
            local = _localize(args, tmp)
        except _native.ReservoirError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return _native.run(["reservoir", *local])


#: The options whose value is a file the command writes, by subcommand: a
#: URL there is refused (outputs are local files).
_OUTPUTS = {
    "replay": {"--html"},
    "diff": {"--json", "--html"},
    "convert": {"--oracle-trace"},
    "workload": {"--out", "-o"},
}


def _localize(args: List[str], tmp: str) -> List[str]:
    """``args`` with each input URL (an argument, or the value of
    ``--traces``, ``--merge``, ``--steady-exceptions`` ...) replaced by a
    local copy streamed into ``tmp`` (``reservoir._remote``): ``--traces``
    names a folder, copied whole; any other input a file."""
    import os

    from . import _remote

    command = next((a for a in args if not a.startswith("-")), "")
    outputs = _OUTPUTS.get(command, set())
    out: List[str] = []
    prev = None  # the previous argument, when it was an option
    for n, a in enumerate(args):
        if not isinstance(a, str):
            out.append(a)
            prev = None
            continue
        inline = a.startswith("--") and "=" in a
        if inline:
            name, value = a.split("=", 1)
        elif a.startswith("-") and a != "-":
            out.append(a)
            prev = a
            continue
        else:
            name, value = prev, a
        prev = None
        if not _remote.is_url(value):
            out.append(a)
            continue
        # `reservoir predict URL@SIZE`: the URL is the part before the last
        # `@` when a whole number follows it.
        url, at, size = value.rpartition("@")
        if command == "predict" and name is None and at and size.isdigit():
            local = _remote.fetch(url, os.path.join(tmp, str(n)))
            out.append(f"{local}@{size}")
            continue
        if name in outputs:
            raise _native_error(f"{name} {value}: the command writes local files only, not a URL")
        fetch = _remote.fetch_tree if name == "--traces" else _remote.fetch
        local = fetch(value, os.path.join(tmp, str(n)))
        out.append(f"{name}={local}" if inline else local)
    return out


def _native_error(message: str) -> Exception:
    from ._native import ReservoirError

    return ReservoirError(message)


if __name__ == "__main__":
    sys.exit(main())
