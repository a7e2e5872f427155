"""Writing a file the user named without losing or deleting what was there:
the rule of ``reservoir::outfile::write_file`` in Rust (docs/limits.md,
"Output files"), for the Python API's ``Replay.save_html`` and
``reservoir.torch.dump_snapshot``.

Symbolic links are followed (the link stays, its target is replaced). A
regular file, or nothing yet, is written to a temporary file in the same
folder, synced and renamed over the target only once whole: on failure only
the temporary file is removed, and the previous file is left as it was. A
replaced file keeps its permission bits; a new one gets ``0o666`` less the
umask. A device or FIFO (``/dev/stdout``) is written straight and never
removed; a folder is refused (``IsADirectoryError``).
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]


def write_file(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` by the rule above."""
    target = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{os.fspath(path)} is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # A device, FIFO or socket: write through, never replace.
        with open(target, "wb") as f:
            f.write(data)
        return
    folder = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix=".reservoir-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
