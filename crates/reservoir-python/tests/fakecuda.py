"""The fake CUDA driver of ../shared/oracle as the in-torch tests see it, and
their pass/fail counter. Imported by test_in_torch.py, test_native_api.py and
test_face.py (run as scripts: this folder is first on sys.path)."""

import ctypes
import os


class LogEntry(ctypes.Structure):  # struct fakecuda_log_entry (../shared/oracle/src/fakecuda.h)
    _fields_ = [("tag", ctypes.c_longlong), ("kind", ctypes.c_int), ("result", ctypes.c_int),
                ("api", ctypes.c_char_p), ("size", ctypes.c_ulonglong), ("addr", ctypes.c_ulonglong),
                ("id", ctypes.c_ulonglong), ("base", ctypes.c_ulonglong), ("offset", ctypes.c_ulonglong),
                ("handle", ctypes.c_ulonglong), ("stream", ctypes.c_ulonglong)]


# Log entry kinds: a device allocation, a free, a cuMemCreate, a cuMemRelease.
EV_ALLOC, EV_FREE, EV_CREATE, EV_RELEASE = 1, 2, 5, 6


def fake_driver(optional=False):
    """The fake driver torch loaded (libcudart.so.13), with the argument types
    of its log and sanitizer entry points. When torch runs on another (a real
    GPU): None if ``optional``, else the program exits saying so."""
    try:
        fake = ctypes.CDLL("libcudart.so.13", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        is_fake = fake.fakecuda_is_fake() >= 2
    except (OSError, AttributeError):
        is_fake = False
    if not is_fake:
        if optional:
            return None
        raise SystemExit("not running on the fake CUDA stack (source ../shared/oracle/env.sh)")
    fake.fakecuda_log_count.restype = ctypes.c_size_t
    fake.fakecuda_log_get.argtypes = [ctypes.c_size_t, ctypes.POINTER(LogEntry)]
    fake.fakecuda_log_set_tag.argtypes = [ctypes.c_longlong]
    fake.fakecuda_sanitizer_violations.restype = ctypes.c_ulonglong
    fake.fakecuda_sanitizer_last.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    fake.fakecuda_stream_enqueue.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fake


class Checks:
    """Counts checks and prints "ok   NAME" / "FAIL NAME detail"."""

    def __init__(self):
        self.passed = self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name} {detail}")


def diff_stats(a, b):
    """The keys whose values differ between two memory_stats() dicts:
    key -> (a's value, b's value), "missing" where one lacks the key."""
    keys = sorted(set(a) | set(b))
    return {k: (a.get(k, "missing"), b.get(k, "missing")) for k in keys if a.get(k) != b.get(k)}
