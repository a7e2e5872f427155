"""Building, prebuilding and finding Reservoir's C++ face for torch.

This module imports nothing of Reservoir (not ``reservoir._native``):
``tools/build-face.py`` loads this file alone to compile the face before the
wheel exists, with exactly the flags :func:`build` gives ``enable()``'s build
on first use.

A prebuilt face lives in the wheel at
``reservoir/torch/prebuilt/<tag>/reservoir_torch_face.so`` with a
``manifest.json`` beside it (``<tag>``: ``torch-2.15.0_cu132-cpython-311``, so
faces for several torch versions and Pythons can sit side by side).
:func:`find_prebuilt` takes one only when every field of :func:`abi_key` in
its manifest equals the running process's: the torch version string, torch's
git commit, torch's C++ ABI flag (``_GLIBCXX_USE_CXX11_ABI``), the Python
(``sys.implementation.cache_tag``), the platform, and the SHA-256 of the face
source installed next to this file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from typing import Any, Optional, Tuple

#: The extension module's name (its ``PyInit_`` symbol).
NAME = "reservoir_torch_face"
#: The face's C++ source, as installed with the package.
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "reservoir_allocator.cpp")
#: Where the wheel's prebuilt faces are.
PREBUILT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prebuilt")
#: The manifest's file name and the version of its format.
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def source_sha256(path: str = SOURCE) -> str:
    """The SHA-256 (hex) of the face source at ``path``."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def abi_key(torch: Any, source: str = SOURCE) -> dict:
    """What a compiled face depends on, for the running process: a prebuilt
    face is used only when its manifest has every one of these values."""
    return {
        "torch": str(torch.__version__),
        "torch_git": str(getattr(torch.version, "git_version", "")),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": sys.implementation.cache_tag,
        "platform": sysconfig.get_platform(),
        "source_sha256": source_sha256(source),
    }


def prebuilt_tag(key: dict) -> str:
    """The folder name of a prebuilt face: ``torch-2.15.0_cu132-cpython-311``."""
    version = key["torch"].replace("+", "_").replace("/", "_")
    return f"torch-{version}-{key['python']}"


def cuda_include_dirs(torch: Any) -> list:
    """CUDA headers for the face: ``$CUDA_HOME/include``, the oracle's
    ``cuda-headers``, or the ``nvidia`` wheels' ``include``."""
    import glob

    dirs = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(os.path.join(os.environ[var], "include"))
    # The torch oracle's headers (../shared/oracle: a torch without a toolkit).
    oracle = os.environ.get("PYTORCH_ORACLE_HOME") or os.path.expanduser("~/.cache/pytorch-oracle")
    dirs.append(os.path.join(oracle, "cuda-headers"))
    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    dirs += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "include")))
    dirs.append("/usr/local/cuda/include")
    complete = [
        d
        for d in dirs
        if all(os.path.exists(os.path.join(d, h)) for h in ("cuda_runtime_api.h", "crt/host_config.h"))
    ]
    return complete[:1]


def build(torch: Any, src: str, build_directory: str, rpath: bool = True, verbose: bool = False) -> Any:
    """Compile the face from ``src`` in ``build_directory`` with
    ``torch.utils.cpp_extension.load`` and import it. ``rpath``: record
    torch's ``lib`` folder in the library (the build on first use does; a
    prebuilt face does not carry the build machine's path, and finds torch's
    libraries already loaded by ``import torch``)."""
    from torch.utils import cpp_extension

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    includes = cuda_include_dirs(torch)
    if not includes:
        raise RuntimeError(
            "no CUDA headers found to build Reservoir's torch face "
            "(set CUDA_HOME, or install the nvidia-cuda-runtime wheel)"
        )
    ldflags = [f"-L{torch_lib}", "-lc10_cuda"]
    if rpath:
        ldflags.append(f"-Wl,-rpath,{torch_lib}")
    return cpp_extension.load(
        name=NAME,
        sources=[src],
        extra_include_paths=includes,
        extra_cflags=["-O2"],
        extra_ldflags=ldflags,
        build_directory=build_directory,
        with_cuda=False,
        verbose=verbose,
    )


def ninja_dir() -> Optional[str]:
    """A folder holding the ``ninja`` executable of the ``ninja`` wheel, or
    ``None`` (not installed). ``ninja.BIN_DIR`` is empty when the wheel sits
    in another environment's site-packages (a venv that sees it through a
    ``.pth`` file): then the ``bin`` folder of that environment."""
    try:
        import ninja
    except ImportError:
        return None
    candidates = [getattr(ninja, "BIN_DIR", "")]
    # site-packages/ninja/__init__.py -> PREFIX/lib/pythonX.Y/site-packages -> PREFIX/bin
    package = os.path.dirname(os.path.realpath(ninja.__file__))
    candidates.append(os.path.join(package, "..", "..", "..", "..", "bin"))
    candidates.append(os.path.join(package, "data", "bin"))
    for folder in candidates:
        if folder and os.path.isfile(os.path.join(folder, "ninja")) and os.access(os.path.join(folder, "ninja"), os.X_OK):
            return os.path.normpath(folder)
    return None


def read_manifest(folder: str) -> dict:
    """The manifest of the prebuilt face in ``folder`` (``ValueError`` when
    it is missing, not JSON, or not a manifest of this format)."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except OSError as e:
        raise ValueError(f"no readable {MANIFEST} ({e.strerror or e})") from e
    except ValueError as e:
        raise ValueError(f"{MANIFEST} is not JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{MANIFEST} is not a manifest of format {MANIFEST_FORMAT}")
    return manifest


def find_prebuilt(key: dict, directory: str = PREBUILT) -> Tuple[Optional[str], str]:
    """``(path, why)``: the prebuilt face in ``directory`` whose manifest
    matches ``key`` (:func:`abi_key`), or ``None`` and why none does (each
    candidate's first mismatch)."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        return None, "this reservoir carries no prebuilt face (the wheel was built without torch)"
    reasons = []
    for entry in entries:
        folder = os.path.join(directory, entry)
        if not os.path.isdir(folder):
            continue
        try:
            manifest = read_manifest(folder)
        except ValueError as e:
            reasons.append(f"{entry}: {e}")
            continue
        mismatch = [
            f"{field} {key[field]!r} (prebuilt for {manifest.get(field)!r})"
            for field in key
            if manifest.get(field) != key[field]
        ]
        if mismatch:
            reasons.append(f"{entry}: " + ", ".join(mismatch))
            continue
        library = os.path.join(folder, str(manifest.get("library", NAME + ".so")))
        if os.path.basename(library) != NAME + ".so" or not os.path.isfile(library):
            reasons.append(f"{entry}: the manifest matches but {library} is missing")
            continue
        return library, f"{entry}: the manifest matches"
    if not reasons:
        return None, f"no prebuilt face in {directory}"
    return None, "no prebuilt face matches this torch: " + "; ".join(reasons)


def load_prebuilt(path: str) -> Any:
    """Import the compiled face at ``path`` (torch imported already)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(NAME, path)
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {path} as an extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
