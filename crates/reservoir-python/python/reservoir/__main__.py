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
    default actions of SIGINT and SIGPIPE are restored first, so Ctrl-C stops
    the run at once and ``reservoir ... | head`` ends quietly.
    """
    from . import _native

    args = sys.argv[1:] if argv is None else list(argv)
    for name in ("SIGINT", "SIGPIPE"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    return _native.run(["reservoir", *args])


if __name__ == "__main__":
    sys.exit(main())
