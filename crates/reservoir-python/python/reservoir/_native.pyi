"""Type stubs of the native module ``reservoir._native`` (Rust, pyo3)."""

from typing import Dict, List, Optional, Tuple, Union
import os

__version__: str

class ReservoirError(RuntimeError):
    """A Reservoir call failed: a bad input, argument or setting. The message
    is the one the ``reservoir`` command prints after ``error:``."""

def run(argv: List[Union[str, bytes, "os.PathLike[str]"]]) -> int:
    """Run the ``reservoir`` command line ``argv`` (program name first) on the
    process's standard output and error; return its exit status. Each
    element is encoded as ``os.fsencode`` does (surrogate-escaped bytes are
    those bytes); one that cannot be (a lone surrogate) raises
    :class:`ReservoirError` naming it."""

def run_captured(argv: List[Union[str, bytes, "os.PathLike[str]"]]) -> Tuple[bytes, Optional[str]]:
    """Run the ``reservoir`` command line ``argv`` with its standard output and
    ``--html`` page kept in memory: ``(stdout, html)``; raises
    :class:`ReservoirError` on failure. ``argv`` as for :func:`run`."""

# reservoir.torch's functions (src/torch.rs; called by reservoir/torch/__init__.py).
# A string that is not valid Unicode (a lone surrogate) raises ReservoirError
# naming the argument.
def configure(conf: Optional[str]) -> None: ...
def memory_stats(device: int) -> Dict[str, int]: ...
def snapshot_pickle(device: int) -> bytes: ...
def record_memory_history(device: int, enabled: Optional[str], context: Optional[str], max_entries: int, clear_history: bool) -> None: ...
def empty_cache(device: int) -> None: ...
def set_memory_fraction(device: int, fraction: float) -> None: ...
def memory_fraction(device: int) -> float: ...
def reset_peak_memory_stats(device: int) -> None: ...
def reset_accumulated_memory_stats(device: int) -> None: ...
def check_invariants(device: int) -> None: ...
