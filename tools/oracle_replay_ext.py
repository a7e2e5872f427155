#!/usr/bin/env python3
"""oracle_replay.py plus two things it cannot do: a memory fraction, and stream handle order.

usage: oracle_replay_ext.py TRACE OUT.json [--conf C] [--capacity BYTES] [--fraction F]
                            [any other oracle_replay.py option]

Runs the *unmodified* ../shared/oracle/oracle_replay.py (same process, same code path) with
three small hooks installed around it:

* --fraction F: torch.cuda.set_per_process_memory_fraction(F) right after torch.cuda.init(),
  i.e. before the first op of the trace (oracle_replay.py has no option or op for it);
* every torch.cuda.Stream the replay creates is remembered with its cuda_stream handle, and the
  output JSON gets "stream_handle_order": the trace's stream names sorted by handle value
  ("0" first: the default stream is the null handle). PyTorch orders free blocks and flushes by
  that pointer value, and the pool streams' handles are heap addresses whose order depends on
  the heap history of the process, so it is recorded per run instead of assumed;
* "fraction" is added to the output JSON (null when not set);
* "segment_addresses": the base address of every segment (plain allocation or VA reservation,
  in the oracle's segment numbering order), from the fake driver's log. oracle_replay.py keeps
  addresses out of its output; a replay that wants PyTorch's best-fit tie-breaking by address
  needs them (the fake's mmap addresses interleave with the process's other mappings).

Any python3 works: the script re-executes itself with the oracle venv's python and the fake
CUDA stack (../shared/oracle/oracle-python). RESERVOIR_ORACLE_DIR overrides the oracle folder.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE_DIR = os.environ.get("RESERVOIR_ORACLE_DIR",
                            os.path.normpath(os.path.join(HERE, "..", "..", "shared", "oracle")))


def split_args(argv):
    """Take --fraction out (the rest goes to oracle_replay.py); find --conf/--capacity/out."""
    rest, fraction = [], None
    it = iter(argv)
    for a in it:
        if a == "--fraction":
            fraction = float(next(it))
        elif a.startswith("--fraction="):
            fraction = float(a.split("=", 1)[1])
        else:
            rest.append(a)
    return fraction, rest


def option(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def main():
    fraction, rest = split_args(sys.argv[1:])
    if os.environ.get("PYTORCH_ORACLE_ACTIVE") != "1":
        env = dict(os.environ)
        env["PYTORCH_ORACLE_ACTIVE"] = "1"
        py = os.path.join(ORACLE_DIR, "oracle-python")
        if not os.path.exists(py):
            sys.exit(f"oracle_replay_ext: {py} not found (set RESERVOIR_ORACLE_DIR)")
        os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)

    sys.path.insert(0, ORACLE_DIR)
    import oracle_replay  # noqa: E402

    # What oracle_replay.main() does before "import torch", done before our own import.
    conf = option(rest, "--conf")
    if conf is not None:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    cap = option(rest, "--capacity")
    if cap is not None:
        os.environ["FAKECUDA_TOTAL_MEM"] = str(oracle_replay.parse_size(cap))
    positional = [a for i, a in enumerate(rest)
                  if not a.startswith("--") and (i == 0 or rest[i - 1] not in
                                                 ("--conf", "--capacity", "--snapshot", "--max-entries"))]
    if len(positional) < 2:
        sys.exit("usage: oracle_replay_ext.py TRACE OUT.json [--conf C] [--capacity B] [--fraction F] ...")
    out_path = positional[1]

    import torch  # noqa: E402

    created = []  # cuda_stream handles of the streams the replay created, in creation order
    real_stream = torch.cuda.Stream

    def stream_factory(*a, **k):
        s = real_stream(*a, **k)
        if "stream_id" not in k:  # torch.cuda also wraps existing streams (default_stream ...)
            created.append(s.cuda_stream)
        return s

    torch.cuda.Stream = stream_factory

    real_init = torch.cuda.init

    def init_with_fraction():
        real_init()
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, 0)

    torch.cuda.init = init_with_fraction

    real_exit = os._exit

    def exit_hook(code):
        if code == 0:
            try:
                annotate(out_path, rest, created, fraction, oracle_replay)
            except BaseException as e:  # noqa: BLE001 (report and fail, whatever it was)
                print(f"oracle_replay_ext: {e}", file=sys.stderr)
                code = 3
        sys.stdout.flush()
        sys.stderr.flush()
        real_exit(code)

    os._exit = exit_hook
    sys.argv = [os.path.join(ORACLE_DIR, "oracle_replay.py")] + rest
    oracle_replay.main()


def first_use_order(ops, oom_ops):
    """Stream names in the order oracle_replay.py first calls stream(name) for them.

    Mirrors its main loop: "r" of an id that is not live (its allocation hit OOM) returns
    before touching the stream; every other op with a stream name creates it.
    """
    order = []
    live = set()

    def use(n):
        if n is not None and n not in ("0", "default") and n not in order:
            order.append(n)

    for i, op in enumerate(ops):
        k = op[1]
        if k == "a":
            use(op[4])
            if i not in oom_ops:
                live.add(op[2])
        elif k == "f":
            live.discard(op[2])
        elif k in ("s", "h", "u", "k"):
            use(op[2])
        elif k == "y":
            use(op[2])
        elif k == "r":
            if op[2] in live:
                use(op[3])
        elif k == "w":
            use(op[2])
            use(op[3])
    return order


def segment_addresses(oracle_replay):
    """Base address of every successful plain allocation and VA reservation, in log order (the
    oracle's segment numbering), read back from the fake driver's device-call log."""
    import ctypes
    fake = ctypes.CDLL("libcudart.so.13", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    fake.fakecuda_log_count.restype = ctypes.c_size_t
    fake.fakecuda_log_get.argtypes = [ctypes.c_size_t, ctypes.POINTER(oracle_replay.LogEntry)]
    out, seen = [], set()
    e = oracle_replay.LogEntry()
    for j in range(fake.fakecuda_log_count()):
        fake.fakecuda_log_get(j, ctypes.byref(e))
        kind = oracle_replay.KIND.get(e.kind)
        if e.result == 0 and kind in ("alloc", "reserve") and e.id not in seen:
            seen.add(e.id)
            out.append(e.addr)
    return out


def annotate(out_path, rest, created, fraction, oracle_replay):
    trace = [a for a in rest if not a.startswith("--")][0]
    ops = oracle_replay.load_trace(trace)
    with open(out_path) as f:
        d = json.load(f)
    names = first_use_order(ops, {o["op"] for o in d["ooms"]})
    if len(names) != len(created):
        raise RuntimeError(f"{len(names)} stream names but {len(created)} streams created")
    handle = dict(zip(names, created))
    if len(set(created)) != len(created):
        raise RuntimeError("two stream names share one handle (more than 32 streams?)")
    d["stream_handle_order"] = ["0"] + sorted(names, key=lambda n: handle[n])
    d["fraction"] = fraction
    d["segment_addresses"] = segment_addresses(oracle_replay)
    with open(out_path, "w") as f:
        json.dump(d, f, indent=1)


if __name__ == "__main__":
    main()
