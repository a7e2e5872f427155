"""The wheel's prebuilt C++ face (issue 43, item 4). Run by tools/torch-proof.sh
with the venv's python and the reservoir wheel installed.

Two modes:

  fallback     (default) which face face() takes, with torch's
               cpp_extension.load replaced by a stub that records the call:
               a prebuilt folder whose manifest matches the running torch
               loads without the stub; a manifest for another torch version,
               another face source, another Python, a manifest that is not
               JSON, a matching manifest over a library that does not load,
               RESERVOIR_FACE_PREBUILT=0 and a wheel without prebuilt faces
               all fall back to the build on first use (the stub), each with
               face_info()'s reason naming why. Needs no CUDA device.
  no-compiler  run in a fresh venv on a PATH with no compiler and no ninja
               (tools/torch-proof.sh builds it): enable(), a tensor on the
               fake device, cpp_extension never called. Prints
               "torch-proof face: prebuilt face loaded without a compiler (...)".

Prints "ok NAME" / "FAIL NAME detail" and closes with "prebuilt: N passed, M failed".
"""

import json
import os
import shutil
import sys
import tempfile

from fakecuda import Checks

COMPILERS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "ninja")


class LoadStub:
    """Stands for torch.utils.cpp_extension.load: records each call and
    returns a module-like object (nothing is compiled)."""

    def __init__(self):
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)

        class Built:
            __file__ = os.path.join(kwargs.get("build_directory", ""), "reservoir_torch_face.so")

        return Built()


def fallback(c):
    import torch
    from torch.utils import cpp_extension

    import reservoir.torch as rt
    from reservoir.torch import _face

    shipped = rt._PREBUILT_DIR
    key = _face.abi_key(torch)
    tag = _face.prebuilt_tag(key)
    real = os.path.join(shipped, tag)
    c.check("the wheel carries a face prebuilt for this torch", os.path.isfile(os.path.join(real, "manifest.json")),
            f"no {real}/manifest.json")

    stub = LoadStub()
    original = cpp_extension.load
    cpp_extension.load = stub
    work = tempfile.mkdtemp(prefix="reservoir-prebuilt-test-")
    saved_env = os.environ.pop("RESERVOIR_FACE_PREBUILT", None)
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(work, "ext")

    def face_with(folder_setup, env=None):
        """face() over a prebuilt folder made by folder_setup(dir): (origin, reason, stub calls)."""
        directory = os.path.join(work, f"case{len(os.listdir(work))}")
        os.makedirs(directory)
        folder_setup(directory)
        rt._face_module = None
        rt._face_info.clear()
        rt._PREBUILT_DIR = directory
        before = len(stub.calls)
        if env:
            os.environ.update(env)
        try:
            rt.face()
        finally:
            for k in env or {}:
                os.environ.pop(k, None)
        info = rt.face_info()
        return info.get("origin"), info.get("reason", ""), len(stub.calls) - before, info

    def copy_real(edit=None, library=None):
        def setup(directory):
            dest = os.path.join(directory, tag)
            shutil.copytree(real, dest)
            if edit is not None:
                with open(os.path.join(dest, "manifest.json")) as f:
                    m = json.load(f)
                edit(m)
                with open(os.path.join(dest, "manifest.json"), "w") as f:
                    json.dump(m, f)
            if library is not None:
                with open(os.path.join(dest, "reservoir_torch_face.so"), "wb") as f:
                    f.write(library)
        return setup

    try:
        if os.path.isdir(real):
            origin, reason, calls, info = face_with(copy_real())
            c.check("a matching manifest: the prebuilt face loads, nothing compiled",
                    origin == "prebuilt" and calls == 0 and info["path"].endswith("reservoir_torch_face.so")
                    and hasattr(rt.face(), "allocator"), f"{info} calls={calls}")

            origin, reason, calls, _ = face_with(copy_real(lambda m: m.update(torch="2.14.0+cu132")))
            c.check("a manifest for torch 2.14: falls back to the build on first use, the reason names both versions",
                    origin == "built" and calls == 1 and "'2.14.0+cu132'" in reason and repr(str(torch.__version__)) in reason,
                    f"{origin} calls={calls} {reason}")

            origin, reason, calls, _ = face_with(copy_real(lambda m: m.update(source_sha256="0" * 64)))
            c.check("a manifest for another face source: falls back, the reason names the source hash",
                    origin == "built" and calls == 1 and "source_sha256" in reason, f"{origin} calls={calls} {reason}")

            origin, reason, calls, _ = face_with(copy_real(lambda m: m.update(python="cpython-399")))
            c.check("a manifest for another Python: falls back", origin == "built" and calls == 1 and "cpython-399" in reason,
                    f"{origin} calls={calls} {reason}")

            origin, reason, calls, _ = face_with(copy_real(lambda m: m.update(cxx11_abi=not key["cxx11_abi"])))
            c.check("a manifest for the other C++ ABI: falls back", origin == "built" and calls == 1 and "cxx11_abi" in reason,
                    f"{origin} calls={calls} {reason}")

            origin, reason, calls, _ = face_with(copy_real(library=b"not a shared library\n"))
            c.check("a matching manifest over a library that does not load: falls back, the reason says so",
                    origin == "built" and calls == 1 and "did not load" in reason, f"{origin} calls={calls} {reason}")

            origin, reason, calls, _ = face_with(copy_real(), env={"RESERVOIR_FACE_PREBUILT": "0"})
            c.check("RESERVOIR_FACE_PREBUILT=0: the prebuilt face is not used",
                    origin == "built" and calls == 1 and "RESERVOIR_FACE_PREBUILT=0" in reason, f"{origin} calls={calls} {reason}")

        def bad_json(directory):
            os.makedirs(os.path.join(directory, tag))
            with open(os.path.join(directory, tag, "manifest.json"), "w") as f:
                f.write("{not json")
        origin, reason, calls, _ = face_with(bad_json)
        c.check("a manifest that is not JSON: falls back", origin == "built" and calls == 1 and "not JSON" in reason,
                f"{origin} calls={calls} {reason}")

        origin, reason, calls, _ = face_with(lambda d: os.rmdir(d))
        c.check("a wheel without prebuilt faces: falls back, the reason says the wheel carries none",
                origin == "built" and calls == 1 and "carries no prebuilt face" in reason, f"{origin} calls={calls} {reason}")
        last = stub.calls[-1] if stub.calls else {}
        c.check("the fallback builds as before (cpp_extension.load of the face, in the torch-version/source folder)",
                last.get("name") == "reservoir_torch_face" and last.get("build_directory", "").startswith(os.path.join(work, "ext"))
                and any("-Wl,-rpath," in f for f in last.get("extra_ldflags", [])), str(last))
    finally:
        cpp_extension.load = original
        rt._PREBUILT_DIR = shipped
        rt._face_module = None
        rt._face_info.clear()
        if saved_env is not None:
            os.environ["RESERVOIR_FACE_PREBUILT"] = saved_env
        shutil.rmtree(work, ignore_errors=True)


def no_compiler(c):
    found = {name: shutil.which(name) for name in COMPILERS}
    c.check("no compiler and no ninja on PATH", not any(found.values()), str({k: v for k, v in found.items() if v}))

    import torch
    from torch.utils import cpp_extension

    called = []

    def refuse(*args, **kwargs):
        called.append(kwargs.get("name"))
        raise RuntimeError("torch-proof: cpp_extension was called (no compiler here)")

    cpp_extension.load = refuse
    cpp_extension.load_inline = refuse

    import reservoir.torch as rt

    rt.enable()
    # (The fake device runs no kernels: the tensor's contents are not checked.)
    x = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    info = rt.face_info()
    backend = torch.cuda.get_allocator_backend()
    allocated = rt.memory_allocated()
    c.check("enable() took the prebuilt face", info.get("origin") == "prebuilt", str(info))
    c.check("cpp_extension was never called", not called, str(called))
    c.check("a tensor on the fake device, served by Reservoir",
            backend == "reservoir" and allocated >= 4 << 20 and x.device.type == "cuda"
            and torch.cuda.memory_stats()["allocated_bytes.all.current"] == allocated,
            f"backend={backend} allocated={allocated}")
    if c.failed == 0:
        print(f"torch-proof face: prebuilt face loaded without a compiler (torch {torch.__version__}, "
              f"{sys.implementation.cache_tag}, {info['path']})")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "fallback"
    c = Checks()
    if mode == "fallback":
        fallback(c)
    elif mode == "no-compiler":
        no_compiler(c)
    else:
        raise SystemExit(f"unknown mode {mode!r} (fallback, no-compiler)")
    print(f"prebuilt: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
