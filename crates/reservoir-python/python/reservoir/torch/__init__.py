"""PyTorch's CUDA allocations served by Reservoir's caching allocator.

Three lines::

    import torch, reservoir.torch
    reservoir.torch.enable("expandable_segments:True")   # before any CUDA work
    x = torch.empty(1 << 20, device="cuda")              # served by Reservoir

torch loads this package's native library as a ``CUDAPluggableAllocator``
(``reservoir_alloc`` / ``reservoir_free``). torch's own statistics, snapshot,
history, ``empty_cache`` and memory fraction are not available for a
pluggable allocator ("CUDAPluggableAllocator does not yet support ..."):
the functions of the same names here answer them from Reservoir, with
torch's key names and snapshot format.
"""

from __future__ import annotations

import ctypes
import sys
from collections import OrderedDict
from typing import Any, Optional

import torch

from .. import _native
from .._native import ReservoirError

__all__ = [
    "LIBRARY",
    "ReservoirError",
    "allocator",
    "check_invariants",
    "dump_snapshot",
    "empty_cache",
    "enable",
    "get_per_process_memory_fraction",
    "is_enabled",
    "last_error",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "pluggable_allocator",
    "record_memory_history",
    "record_stream",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "snapshot",
]

#: The shared library torch loads (this package's native module, which
#: exports the C entry points ``reservoir_alloc`` and ``reservoir_free``).
LIBRARY: str = _native.__file__

_allocator: Optional[torch.cuda.memory.CUDAPluggableAllocator] = None
_enabled_conf: Optional[list] = None  # [conf] once enabled
_cdll: Optional[ctypes.CDLL] = None


def pluggable_allocator() -> torch.cuda.memory.CUDAPluggableAllocator:
    """The ``CUDAPluggableAllocator`` over Reservoir (one per process), the
    object ``torch.cuda.memory.change_current_allocator`` takes."""
    global _allocator
    if _allocator is None:
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(
            LIBRARY, "reservoir_alloc", "reservoir_free"
        )
    return _allocator


def allocator() -> "torch._C._cuda_CUDAAllocator":
    """torch's handle on Reservoir's allocator (one per process), as
    ``torch.cuda.MemPool`` takes it: without ``enable()``, torch's caching
    allocator then gets that pool's segments from Reservoir::

        pool = torch.cuda.MemPool(allocator=reservoir.torch.allocator())
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(n, device="cuda")
    """
    return pluggable_allocator().allocator()


def enable(conf: Optional[str] = None) -> None:
    """Make Reservoir torch's CUDA allocator, configured by ``conf``.

    ``conf`` uses ``PYTORCH_CUDA_ALLOC_CONF`` syntax plus Reservoir's policies
    (``None``: defaults, or the ``RESERVOIR_ALLOC_CONF`` environment
    variable). Call it before CUDA is first used: afterwards torch's
    allocator is in use and this raises ``ReservoirError``, changing nothing.
    Enabling again with the same ``conf`` does nothing.

    ``Tensor.record_stream`` is extended to reach Reservoir too (torch gives
    a pluggable allocator no record-stream hook from Python); C++ callers of
    ``recordStream`` do not reach it.
    """
    global _enabled_conf
    if _enabled_conf is not None:
        if _enabled_conf[0] != conf:
            raise ReservoirError(
                f"RESERVOIR_ERR_INVALID_STATE: Reservoir is already enabled with "
                f"conf={_enabled_conf[0]!r}; it cannot switch to conf={conf!r}"
            )
        return
    if conf is not None:
        _native.configure(conf)
    try:
        torch.cuda.memory.change_current_allocator(pluggable_allocator())
    except RuntimeError as e:
        raise ReservoirError(
            "RESERVOIR_ERR_INVALID_STATE: reservoir.torch.enable() must run before "
            "CUDA is first used (torch's own allocator is already initialized: "
            f"{e}). Call it at the start of the program."
        ) from e
    _enabled_conf = [conf]
    _forward_record_stream()


_torch_record_stream = torch.Tensor.record_stream


def _forward_record_stream() -> None:
    def record_stream(self: torch.Tensor, stream: torch.cuda.Stream) -> None:
        _torch_record_stream(self, stream)
        if self.is_cuda and self.untyped_storage().data_ptr() != 0:
            # A tensor whose memory Reservoir did not hand out (from_blob,
            # another pool's allocator) is not Reservoir's to track.
            _record_stream(self, stream, ignore_foreign=True)

    record_stream.__doc__ = _torch_record_stream.__doc__
    torch.Tensor.record_stream = record_stream


def is_enabled() -> bool:
    """Whether ``enable()`` switched torch to Reservoir in this process."""
    return _enabled_conf is not None


def _device(device: Any) -> int:
    if device is None:
        return torch.cuda.current_device()
    return torch.cuda._utils._get_device_index(device, optional=True)


def memory_stats(device: Any = None) -> "OrderedDict[str, int]":
    """``torch.cuda.memory_stats()`` from Reservoir: the same flat keys
    (``allocated_bytes.all.current``, ``num_alloc_retries``, ...), sorted."""
    return OrderedDict(sorted(_native.memory_stats(_device(device)).items()))


def memory_allocated(device: Any = None) -> int:
    """Bytes in live blocks (``allocated_bytes.all.current``)."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    """Peak of ``memory_allocated``."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    """Bytes in segments Reservoir holds (``reserved_bytes.all.current``)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    """Peak of ``memory_reserved``."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    """Reset the peaks (``torch.cuda.reset_peak_memory_stats``)."""
    _native.reset_peak_memory_stats(_device(device))


def snapshot(device: Any = None) -> dict:
    """``torch.cuda.memory._snapshot()``: ``segments``, ``device_traces``,
    ``allocator_settings``, decoded from the pickle Reservoir writes."""
    import pickle

    return pickle.loads(_native.snapshot_pickle(_device(device)))


def memory_snapshot(device: Any = None) -> list:
    """``torch.cuda.memory_snapshot()``: the segments of ``snapshot()``."""
    return snapshot(device)["segments"]


def dump_snapshot(path: str = "dump_snapshot.pickle", device: Any = None) -> None:
    """``torch.cuda.memory._dump_snapshot(path)``: the pickle opens in
    ``torch.cuda._memory_viz`` and pytorch.org/memory_viz."""
    data = _native.snapshot_pickle(_device(device))
    with open(path, "wb") as f:
        f.write(data)


def record_memory_history(
    enabled: Optional[str] = "all",
    context: Optional[str] = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """``torch.cuda.memory._record_memory_history`` on Reservoir.

    Stacks are the native frames of the allocating thread whatever
    ``stacks`` says (Reservoir does not walk the Python stack from inside
    the allocator).
    """
    if stacks not in ("python", "cpp", "all"):
        raise ReservoirError(
            f"RESERVOIR_ERR_INVALID_ARGUMENT: stacks={stacks!r} is not 'python', 'cpp' or 'all'"
        )
    _native.record_memory_history(
        _device(device), enabled, context, max_entries, clear_history
    )


def empty_cache(device: Any = None) -> None:
    """Release Reservoir's cached segments (``torch.cuda.empty_cache()``
    does nothing for a pluggable allocator)."""
    _native.empty_cache(_device(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap Reservoir at ``fraction`` of the device's memory
    (``torch.cuda.set_per_process_memory_fraction``)."""
    _native.set_memory_fraction(_device(device), float(fraction))


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by ``set_per_process_memory_fraction`` (1.0 by default)."""
    return _native.memory_fraction(_device(device))


def _lib() -> ctypes.CDLL:
    global _cdll
    if _cdll is None:
        lib = ctypes.CDLL(LIBRARY)
        lib.reservoir_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.reservoir_torch_record_stream.restype = ctypes.c_int
        lib.reservoir_last_error.argtypes = []
        lib.reservoir_last_error.restype = ctypes.c_char_p
        lib.reservoir_status_name.argtypes = [ctypes.c_int]
        lib.reservoir_status_name.restype = ctypes.c_char_p
        _cdll = lib
    return _cdll


def record_stream(tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """``tensor.record_stream(stream)`` for Reservoir.

    torch's Python API cannot give a pluggable allocator a record-stream
    hook; ``enable()`` extends ``Tensor.record_stream`` to call this. When the tensor's memory is freed it is not reused before the
    work enqueued on ``stream`` so far has completed.
    """
    _record_stream(tensor, stream, ignore_foreign=False)


_ERR_INVALID_POINTER = 5


def _record_stream(tensor: torch.Tensor, stream: torch.cuda.Stream, ignore_foreign: bool) -> None:
    lib = _lib()
    ptr = tensor.untyped_storage().data_ptr()
    status = lib.reservoir_torch_record_stream(ptr, stream.cuda_stream)
    if status != 0 and not (ignore_foreign and status == _ERR_INVALID_POINTER):
        msg = lib.reservoir_last_error().decode(errors="replace")
        # Named like every other error ("RESERVOIR_ERR_INVALID_POINTER: ...").
        name = lib.reservoir_status_name(status).decode(errors="replace")
        raise ReservoirError(f"{name}: {msg}")


def last_error() -> str:
    """This thread's last Reservoir error message ("" after a success).

    torch 2.15's pluggable wrapper does not raise when the allocator
    returns null: an allocation Reservoir refuses (out of memory) gives a
    tensor whose ``data_ptr()`` is 0. This names why.
    """
    return _lib().reservoir_last_error().decode(errors="replace")


def check_invariants(device: Any = None) -> None:
    """Check every invariant of Reservoir's allocator; raises on the first
    violated one."""
    _native.check_invariants(_device(device))
