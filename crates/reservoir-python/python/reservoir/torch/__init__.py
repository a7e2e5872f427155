"""PyTorch's CUDA allocations served by Reservoir's caching allocator.

Three lines::

    import torch, reservoir.torch
    reservoir.torch.enable("expandable_segments:True")   # before any CUDA work
    x = torch.empty(1 << 20, device="cuda")              # served by Reservoir

``enable()`` loads Reservoir's C++ face for torch (``csrc/reservoir_allocator.cpp``,
a ``c10::cuda::CUDACachingAllocator::CUDAAllocator``: the wheel's prebuilt one
when it was compiled against the running torch, else built once per torch
version with ``torch.utils.cpp_extension.load`` and cached; see :func:`face`)
and installs it:
torch's own ``torch.cuda.memory_stats()``, ``memory_snapshot()``,
``_record_memory_history``, ``empty_cache()``, ``set_per_process_memory_fraction``,
``MemPool``, ``record_stream`` and ``torch.OutOfMemoryError`` then all reach
Reservoir. The functions of the same names here answer from Reservoir too.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import OrderedDict
from typing import Any, Optional

import torch

from .. import _native
from .._native import ReservoirError
from .._outfile import write_file as _write_file
from . import _face

__all__ = [
    "LIBRARY",
    "SUPPORTED_RELEASES",
    "ReservoirError",
    "allocator",
    "check_invariants",
    "dump_snapshot",
    "empty_cache",
    "cuda_allocator",
    "effective_conf",
    "enable",
    "face",
    "face_info",
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
    "running_release",
    "set_per_process_memory_fraction",
    "snapshot",
]

#: The shared library torch loads (this package's native module, which
#: exports the C entry points ``reservoir_alloc`` and ``reservoir_free``).
LIBRARY: str = _native.__file__

_allocator: Optional[torch.cuda.memory.CUDAPluggableAllocator] = None
_enabled_conf: Optional[list] = None  # [conf] once enabled
_cdll: Optional[ctypes.CDLL] = None


def _pluggable() -> torch.cuda.memory.CUDAPluggableAllocator:
    """torch's ``CUDAPluggableAllocator`` over Reservoir's ``reservoir_alloc``
    / ``reservoir_free`` (one per process): the handle behind
    :func:`allocator`, for ``torch.cuda.MemPool`` only."""
    global _allocator
    if _allocator is None:
        _allocator = torch.cuda.memory.CUDAPluggableAllocator(
            LIBRARY, "reservoir_alloc", "reservoir_free"
        )
    return _allocator


def pluggable_allocator() -> torch.cuda.memory.CUDAPluggableAllocator:
    """Withdrawn: raises ``ReservoirError``; use :func:`enable`.

    It returned torch's ``CUDAPluggableAllocator`` over Reservoir for
    ``torch.cuda.memory.change_current_allocator``. On that route torch
    (2.15) does not raise when an allocation does not fit: it hands out a
    tensor whose ``data_ptr()`` is 0, and printing it kills the interpreter
    (SIGSEGV). :func:`enable` installs Reservoir's C++ face instead, which
    raises ``torch.OutOfMemoryError`` with PyTorch's text
    (:func:`cuda_allocator` is the same face, for code that calls
    ``change_current_allocator`` itself).
    """
    raise ReservoirError(
        "RESERVOIR_ERR_BACKEND_UNAVAILABLE: reservoir.torch.pluggable_allocator() is withdrawn: "
        "under torch.cuda.memory.change_current_allocator, torch's CUDAPluggableAllocator turns an "
        "out-of-memory into a tensor at address 0 (printing it crashes the interpreter). "
        "Use reservoir.torch.enable() (or change_current_allocator(reservoir.torch.cuda_allocator())), "
        "which raises torch.OutOfMemoryError"
    )


def allocator() -> "torch._C._cuda_CUDAAllocator":
    """torch's handle on Reservoir's allocator (one per process), as
    ``torch.cuda.MemPool`` takes it: without ``enable()``, torch's caching
    allocator then gets that pool's segments from Reservoir::

        pool = torch.cuda.MemPool(allocator=reservoir.torch.allocator())
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(n, device="cuda")

    On this route an allocation that does not fit raises
    ``torch.OutOfMemoryError``. It is for ``MemPool`` only: to make Reservoir
    torch's allocator, use :func:`enable`.
    """
    return _pluggable().allocator()


_face_module: Any = None


def _face_source() -> str:
    """The face's C++ source, copied into its build folder and compiled from
    there: ``$TORCH_EXTENSIONS_DIR`` (else ``~/.cache/reservoir/torch-ext``)
    ``/torch-VERSION/SOURCE_HASH/reservoir_allocator.cpp``. The folder is
    named by the torch version and the source's content, so every install of
    the same wheel (a venv, an unpacked wheel on PYTHONPATH) finds the face
    one of them compiled, and installs of different sources never rebuild
    each other's."""
    import hashlib
    import os

    src = os.path.join(os.path.dirname(__file__), "csrc", "reservoir_allocator.cpp")
    with open(src, "rb") as f:
        text = f.read()
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "reservoir", "torch-ext"
    )
    tag = torch.__version__.replace("+", "_").replace("/", "_")
    path = os.path.join(base, f"torch-{tag}", hashlib.sha256(text).hexdigest()[:16])
    os.makedirs(path, exist_ok=True)
    copy = os.path.join(path, "reservoir_allocator.cpp")
    if not os.path.exists(copy):
        # Written whole, then renamed: a process compiling the folder's copy
        # never sees half a file. The content is the folder's name, so an
        # existing copy is the same source (its time is left alone, and with
        # it ninja's record that the build is up to date).
        tmp = f"{copy}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(text)
        os.replace(tmp, copy)
    return copy


#: How :func:`face` got the face: see :func:`face_info`.
_face_info: dict = {}
#: Where :func:`face` looks for the wheel's prebuilt faces (tests point it elsewhere).
_PREBUILT_DIR: str = _face.PREBUILT


def face_info() -> dict:
    """How :func:`face` got Reservoir's C++ face in this process (empty
    before it did): ``origin`` (``"prebuilt"``: the wheel's face compiled
    against this torch, loaded without a compiler; ``"built"``: compiled
    with ``torch.utils.cpp_extension`` on first use, or found in that
    build's cache), ``path`` (the loaded library), ``torch`` (the running
    torch's version) and ``reason`` (why the prebuilt face was or was not
    used). The same text goes to the ``reservoir.torch`` logger at DEBUG
    level."""
    return dict(_face_info)


def face() -> Any:
    """The compiled C++ face.

    The wheel carries the face compiled against the torch of its release
    build (``reservoir/torch/prebuilt/torch-VERSION-PYTHON/``, with a
    ``manifest.json``); it is loaded, with no compiler, when the running
    torch's version string and git commit, its C++ ABI flag, the Python
    (``sys.implementation.cache_tag``), the platform and the SHA-256 of the
    installed face source all equal the manifest's. Otherwise (or when that
    library does not load, or ``RESERVOIR_FACE_PREBUILT=0``) it is compiled
    on first use, then cached per torch version and source (ninja is
    installed with pip when missing). :func:`face_info` says which and why.
    """
    global _face_module
    if _face_module is not None:
        return _face_module
    import logging
    import shutil

    log = logging.getLogger("reservoir.torch")
    running = str(torch.__version__)
    if os.environ.get("RESERVOIR_FACE_PREBUILT", "").strip() == "0":
        reason = "RESERVOIR_FACE_PREBUILT=0: the prebuilt face is not used"
    else:
        try:
            path, reason = _face.find_prebuilt(_face.abi_key(torch), _PREBUILT_DIR)
        except Exception as e:  # an unreadable source, a torch without the attributes
            path, reason = None, f"the prebuilt face could not be matched: {e!r}"
        if path is not None:
            try:
                module = _face.load_prebuilt(path)
            except Exception as e:
                reason = f"the prebuilt face {path} matches this torch but did not load: {e}"
                log.warning("reservoir.torch: %s; compiling the face instead", reason)
            else:
                _face_info.update(origin="prebuilt", path=path, torch=running, reason=reason)
                log.debug("reservoir.torch: prebuilt face %s loaded (%s)", path, reason)
                _face_module = module
                return _face_module
    log.debug("reservoir.torch: compiling the face on first use: %s", reason)

    if shutil.which("ninja") is None:
        found = _face.ninja_dir()
        if found is None:
            import subprocess

            subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "ninja"])
            found = _face.ninja_dir()
        if found is not None:
            os.environ["PATH"] = found + os.pathsep + os.environ.get("PATH", "")
    src = _face_source()
    try:
        module = _face.build(
            torch, src, os.path.dirname(src), verbose=bool(os.environ.get("RESERVOIR_FACE_VERBOSE"))
        )
    except RuntimeError as e:
        if "no CUDA headers found" in str(e):
            raise ReservoirError(f"RESERVOIR_ERR_BACKEND_UNAVAILABLE: {e}") from e
        raise
    _face_info.update(origin="built", path=getattr(module, "__file__", None), torch=running, reason=reason)
    _face_module = module
    return _face_module


def cuda_allocator() -> "torch.cuda.memory._CUDAAllocator":
    """Reservoir's ``CUDAAllocator`` (the C++ face), as
    ``torch.cuda.memory.change_current_allocator`` and ``torch.cuda.MemPool``
    take it."""
    return torch.cuda.memory._CUDAAllocator(face().allocator(LIBRARY))


#: The torch releases whose allocator Reservoir's PyTorch mode reproduces
#: (``policy:pytorch-2.11`` ... ``policy:pytorch-2.15``).
SUPPORTED_RELEASES = ("2.11", "2.12", "2.13", "2.14", "2.15")


def running_release(version: Optional[str] = None) -> Optional[str]:
    """The release (``"2.13"``) of torch ``version`` (default: the running
    torch's ``torch.__version__``) if Reservoir reproduces it, else ``None``."""
    m = re.match(r"(\d+)\.(\d+)", version if version is not None else str(torch.__version__))
    release = f"{m.group(1)}.{m.group(2)}" if m else None
    return release if release in SUPPORTED_RELEASES else None


def effective_conf(conf: Optional[str], version: Optional[str] = None) -> str:
    """The settings string :func:`enable` applies for ``conf`` (``None``: the
    ``RESERVOIR_ALLOC_CONF`` environment variable, else PyTorch's defaults).

    Without a ``policy`` key, Reservoir runs the allocator of the torch it
    serves: ``policy:pytorch-X.Y`` for torch ``X.Y`` (2.11-2.15), so its
    statistics keys, OOM text and placements near an OOM are that release's.
    A ``policy`` the string names wins (the last entry of a key wins)."""
    text = conf if conf is not None else os.environ.get("RESERVOIR_ALLOC_CONF", "")
    keys = [item.split(":", 1)[0].strip() for item in text.split(",") if item.strip()]
    release = running_release(version)
    if "policy" in keys or release is None:
        return text
    return f"policy:pytorch-{release}" + (f",{text}" if text.strip() else "")


def enable(conf: Optional[str] = None) -> None:
    """Make Reservoir torch's CUDA allocator, configured by ``conf``.

    ``conf`` uses ``PYTORCH_CUDA_ALLOC_CONF`` syntax plus Reservoir's policies
    (``None``: defaults, or the ``RESERVOIR_ALLOC_CONF`` environment
    variable). Without a ``policy`` key it runs the allocator of the running
    torch's release (:func:`effective_conf`). Call it before CUDA is first used: afterwards torch's
    allocator is in use and this raises ``ReservoirError``, changing nothing.
    Enabling again with the same ``conf`` does nothing.

    torch's allocator interface is served by Reservoir's C++ face (see
    :func:`face`): ``Tensor.record_stream`` and C++ ``recordStream`` reach
    Reservoir, an allocation that does not fit raises
    ``torch.OutOfMemoryError`` with PyTorch's exact text, and what Reservoir
    cannot honour raises ``RuntimeError("reservoir: <method> is not supported: ...")``.
    """
    global _enabled_conf
    if _enabled_conf is not None:
        if _enabled_conf[0] != conf:
            raise ReservoirError(
                f"RESERVOIR_ERR_INVALID_STATE: Reservoir is already enabled with "
                f"conf={_enabled_conf[0]!r}; it cannot switch to conf={conf!r}"
            )
        return
    if torch.cuda.is_initialized():
        # Checked before building anything: torch's allocator is in use.
        raise ReservoirError(
            "RESERVOIR_ERR_INVALID_STATE: reservoir.torch.enable() must run before "
            "CUDA is first used (torch's own allocator is already initialized). "
            "Call it at the start of the program."
        )
    _native.configure(effective_conf(conf))
    try:
        alloc = cuda_allocator()
    except RuntimeError as e:
        raise ReservoirError(
            f"RESERVOIR_ERR_BACKEND_UNAVAILABLE: Reservoir's torch face could not be built or loaded: {e}"
        ) from e
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise ReservoirError(
            "RESERVOIR_ERR_INVALID_STATE: reservoir.torch.enable() must run before "
            "CUDA is first used (torch's own allocator is already initialized: "
            f"{e}). Call it at the start of the program."
        ) from e
    # torch.accelerator.* and torch.cuda.memory._set_allocator_settings reach
    # Reservoir too (the face's install()).
    face().install()
    _enabled_conf = [conf]


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
    # A temporary file renamed into place: a failed write keeps the previous
    # snapshot and never removes a device or FIFO (docs/limits.md).
    _write_file(path, data)


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
    """Release Reservoir's cached segments (what ``torch.cuda.empty_cache()``
    does once enabled)."""
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

    Once enabled, ``Tensor.record_stream`` and C++ ``recordStream`` reach
    Reservoir through the face; this is the same for a tensor given by
    name. When the tensor's memory is freed it is not reused before the
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

    After ``enable()`` a refused allocation raises ``torch.OutOfMemoryError``
    itself, as it does through :func:`allocator` (a ``MemPool`` without
    ``enable()``); this names why Reservoir refused it.
    """
    return _lib().reservoir_last_error().decode(errors="replace")


def check_invariants(device: Any = None) -> None:
    """Check every invariant of Reservoir's allocator; raises on the first
    violated one."""
    _native.check_invariants(_device(device))
