"""Reservoir: a caching device-memory allocator, PyTorch's exactly and better.

This distribution holds

* the ``reservoir`` command (the console script, and ``python -m reservoir``):
  the same subcommands and output as the Rust command;
* a Python API over the same engine: :func:`replay` (a memory snapshot or a
  built-in workload, replayed under each policy: peaks, driver calls, OOMs
  and their explanation, fidelity, per-site live bytes; ``_repr_html_`` shows
  the HTML report in Jupyter, its summary first with the program levers (a
  replay on an executor, which writes no page, and a single report show
  the summary alone)) and :func:`compare` (a folder of snapshots);
  both take ``executor=``, a cluster engine's ``concurrent.futures``
  executor (Dask, Ray, MPI), and run one input per task there;
* :mod:`reservoir.torch`, which serves PyTorch's CUDA allocations from
  Reservoir (import it explicitly; torch is imported only then).

Every failure raises :class:`ReservoirError` with the message the command
prints after ``error:``.
"""

from __future__ import annotations

from ._native import ReservoirError, __version__
from ._api import (
    Compare,
    CompareRow,
    Explanation,
    Fidelity,
    Oom,
    Replay,
    Report,
    Site,
    compare,
    predict,
    replay,
)

__all__ = [
    "Compare",
    "CompareRow",
    "Explanation",
    "Fidelity",
    "Oom",
    "Replay",
    "Report",
    "ReservoirError",
    "Site",
    "__version__",
    "compare",
    "predict",
    "replay",
]
