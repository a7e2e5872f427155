"""The GPU check's environment as JSON (tools/gpu-check.sh's first stage):
torch's version, CUDA, the device, the driver, the fake flag.

  python env_info.py OUT.json MODE
"""

import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv):
    out, mode = argv
    import torch

    e = {"mode": mode, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
         "python": platform.python_version(), "machine": platform.machine()}
    e["cuda_available"] = torch.cuda.is_available()
    if e["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        e["device"] = p.name
        e["device_total_bytes"] = p.total_memory
        e["capability"] = f"{p.major}.{p.minor}"
        free, total = torch.cuda.mem_get_info(0)
        e["mem_get_info"] = [free, total]
    e["fake_device"] = common.is_fake_device()
    e["reservoir_conf"] = common.reservoir_conf(torch.__version__)
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        e["nvidia_smi"] = r.stdout.strip() or r.stderr.strip()
        e["driver"] = r.stdout.split(",")[1].strip() if r.returncode == 0 and "," in r.stdout else None
    except (OSError, subprocess.SubprocessError) as x:
        e["nvidia_smi"] = f"not available: {x}"
        e["driver"] = "fake (../shared/oracle)" if e["fake_device"] else None
    common.write_json(out, e)
    print(f"torch {e['torch']} (CUDA {e['torch_cuda']}), Python {e['python']}, device "
          f"{e.get('device')}, driver {e['driver']}, fake device: {e['fake_device']}; "
          f"Reservoir's mode for this torch: {e['reservoir_conf']}")
    return 0 if e["cuda_available"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
