"""Shared pieces of tools/gpu/*.py (the real-GPU check, tools/gpu-check.sh)."""

import json
import os

#: torch releases Reservoir's PyTorch mode reproduces (`policy:pytorch-X.Y`).
SUPPORTED_RELEASES = ("2.11", "2.12", "2.13", "2.14", "2.15")

#: What is known to differ in torch 2.11's allocator from 2.15's (issue 33's
#: oracle runs, ../shared/oracle/README.md), named in the summary when the
#: GPU machine runs 2.11.
TORCH_2_11_DIFFERENCES = [
    "stats key set: torch 2.11 has no `num_oom_rejections` (added in 2.12)",
    "block placement: which free block a request gets differs on 11 of 42 adversarial traces",
    "OOM message text differs from 2.15's (2.11 to 2.14 share an older text)",
    "segment events, driver calls and statistics near OOMs (free-and-retry, when segments are "
    "made and released) differ on 15 of 42 adversarial traces",
    "the allocator changed observably between 2.12 and 2.13 and between 2.14 and 2.15: "
    "Reservoir runs in the mode of the torch it runs in (`policy:pytorch-2.11` here)",
]


def release_of(version):
    """'2.11.0+cu130' -> '2.11'."""
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


def reservoir_conf(torch_version):
    """Reservoir's configuration for PyTorch mode of the running torch: its
    release's mode where supported, else the newest (`pytorch`)."""
    rel = release_of(torch_version)
    return f"policy:pytorch-{rel}" if rel in SUPPORTED_RELEASES else "policy:pytorch"


def is_fake_device():
    """True on the fake CUDA driver of ../shared/oracle (the dry run)."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
        return lib.fakecuda_is_fake() >= 2
    except (OSError, AttributeError):
        return False


def enable_reservoir(torch):
    """Install Reservoir as torch's CUDA allocator (before CUDA is used), in
    PyTorch mode of the running torch. Works with the C++ face (a torch
    `CUDAAllocator`) and with the older `CUDAPluggableAllocator` route.
    Returns (conf, allocator description)."""
    import reservoir.torch as rt

    conf = os.environ.get("GPU_CHECK_RESERVOIR_CONF") or reservoir_conf(torch.__version__)
    try:
        rt.enable(conf)
    except Exception as e:  # an older build may not know the versioned policy
        if "policy" not in str(e):
            raise
        conf = ""
        rt.enable(conf)
    return conf, describe_allocator(torch)


def describe_allocator(torch):
    try:
        a = torch.cuda.memory._get_current_allocator()
        name = getattr(a, "name", None)
        return f"{type(a).__name__}{' ' + name() if callable(name) else ''}"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"


def memory_stats(torch, reservoir_enabled):
    """torch.cuda.memory_stats(), or Reservoir's answer under torch's key
    names where torch's own call is not served (the pluggable route).
    Returns (stats dict, source)."""
    try:
        s = dict(torch.cuda.memory_stats())
        if s or not reservoir_enabled:
            return s, "torch.cuda.memory_stats"
    except Exception as e:  # noqa: BLE001
        if not reservoir_enabled:
            raise
        err = str(e).splitlines()[0]
    else:
        err = "empty"
    import reservoir.torch as rt

    return dict(rt.memory_stats()), f"reservoir.torch.memory_stats (torch's: {err})"


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)
