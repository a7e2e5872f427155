#!/usr/bin/env python3
"""Prebuild Reservoir's C++ face for the wheel (issue 43, item 4).

Run with the python whose torch the face is compiled against (tools/torch-proof.sh
runs it with its venv, the oracle's torch 2.15, before `maturin build`):

    python tools/build-face.py [--build-dir DIR]

Compiles crates/reservoir-python/python/reservoir/torch/csrc/reservoir_allocator.cpp
with reservoir/torch/_face.py's build() (torch.utils.cpp_extension.load, the
flags enable() uses on first use, less the rpath to this machine's torch) in
DIR (default target/face-build/TAG), and puts the library and its manifest in
the package, where maturin takes them into the wheel:

    reservoir/torch/prebuilt/torch-2.15.0_cu132-cpython-311/reservoir_torch_face.so
    reservoir/torch/prebuilt/torch-2.15.0_cu132-cpython-311/manifest.json

(.gitignore'd: never committed). Prebuilt folders of another face source are
removed; those of other torch versions with this source stay (side by side).
Prints "build-face: TAG ..." and exits 0, or names what failed.
"""

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "crates", "reservoir-python", "python", "reservoir", "torch")


def load_face_module():
    """reservoir/torch/_face.py alone (reservoir._native need not exist yet).
    No bytecode is written: a __pycache__ in the package would go into the
    wheel (maturin takes every file of the package folder)."""
    sys.dont_write_bytecode = True
    spec = importlib.util.spec_from_file_location("reservoir_face_build", os.path.join(PACKAGE, "_face.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiler_version():
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
        return out.splitlines()[0] if out else cxx
    except OSError:
        return cxx


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", help="the build folder (default target/face-build/TAG)")
    args = ap.parse_args()

    import torch

    face = load_face_module()
    if shutil.which("ninja") is None:
        # The ninja wheel's (tools/torch-proof.sh installs it) when no ninja is on PATH.
        found = face.ninja_dir()
        if found is None:
            raise SystemExit("build-face: no ninja (pip install ninja)")
        os.environ["PATH"] = found + os.pathsep + os.environ.get("PATH", "")
    key = face.abi_key(torch)
    tag = face.prebuilt_tag(key)
    prebuilt = face.PREBUILT
    os.makedirs(prebuilt, exist_ok=True)
    for entry in sorted(os.listdir(prebuilt)):
        folder = os.path.join(prebuilt, entry)
        if not os.path.isdir(folder) or entry == tag:
            continue
        try:
            stale = face.read_manifest(folder).get("source_sha256") != key["source_sha256"]
        except ValueError:
            stale = True
        if stale:
            print(f"build-face: removing {entry} (another face source)")
            shutil.rmtree(folder)

    build_dir = os.path.abspath(args.build_dir or os.path.join(ROOT, "target", "face-build", tag))
    os.makedirs(build_dir, exist_ok=True)
    started = time.time()
    module = face.build(torch, face.SOURCE, build_dir, rpath=False,
                        verbose=bool(os.environ.get("RESERVOIR_FACE_VERBOSE")))
    built = module.__file__
    # The library imported: check it is the face (its entry points).
    for name in ("allocator", "install"):
        if not hasattr(module, name):
            raise SystemExit(f"build-face: {built} has no {name}(): not Reservoir's face")

    dest = os.path.join(prebuilt, tag)
    tmp = f"{dest}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    library = face.NAME + ".so"
    shutil.copyfile(built, os.path.join(tmp, library))
    manifest = dict(key)
    manifest.update(
        format=face.MANIFEST_FORMAT,
        library=library,
        built_with={"compiler": compiler_version(), "machine": platform.machine(),
                    "cflags": ["-O2"], "ldflags": ["-lc10_cuda"], "rpath": False},
    )
    with open(os.path.join(tmp, face.MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    size = os.path.getsize(os.path.join(dest, library))
    print(f"build-face: {tag}: {os.path.relpath(dest, ROOT)}/{library} ({size} bytes, "
          f"torch {key['torch']}, source {key['source_sha256'][:16]}, {time.time() - started:.1f} s)")


if __name__ == "__main__":
    sys.exit(main())
