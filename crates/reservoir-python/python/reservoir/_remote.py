"""Snapshots where they live: inputs named by a URL that ``fsspec`` opens
(``s3://``, ``gs://``, ``hdfs://``, ``memory://``, ``file://``, ...).

A URL input is streamed, 64 KiB at a time, into a file of a temporary
folder, and that file is replayed: never more than the input size limit
(``RESERVOIR_MAX_INPUT_BYTES``, default 8 GiB, as for local files: refused
from the size the file system reports before reading, and again while
reading should it grow), never whole in memory. ``fsspec`` (and the package
of the protocol: ``s3fs``, ``gcsfs``, ...) is an optional dependency:
``pip install 'reservoir-allocator[fsspec]'``.
"""

from __future__ import annotations

import os
import re
from typing import Any, List, Tuple

from ._native import ReservoirError

#: ``PROTOCOL://...`` (two or more characters: ``C://`` stays a Windows path).
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+://")
#: Bytes copied at a time.
CHUNK_BYTES = 64 << 10
#: The default input size limit (``reservoir_replay::input::DEFAULT_MAX_INPUT_BYTES``).
DEFAULT_MAX_INPUT_BYTES = 8 << 30
MAX_INPUT_BYTES_ENV = "RESERVOIR_MAX_INPUT_BYTES"


def is_url(v: Any) -> bool:
    """Whether ``v`` is a ``str`` naming a URL (``PROTOCOL://...``)."""
    return isinstance(v, str) and _URL.match(v) is not None


def max_input_bytes() -> int:
    """The input size limit: ``RESERVOIR_MAX_INPUT_BYTES`` when set, else 8 GiB."""
    text = os.environ.get(MAX_INPUT_BYTES_ENV)
    if text is None:
        return DEFAULT_MAX_INPUT_BYTES
    try:
        return int(text.strip().replace("_", ""))
    except ValueError:
        raise ReservoirError(
            f"{MAX_INPUT_BYTES_ENV}={text!r}: expected a number of bytes, e.g. 17179869184"
        ) from None


def _size(n: int) -> str:
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _too_large(url: str, size: int, limit: int) -> ReservoirError:
    return ReservoirError(
        f"{url}: {size} bytes ({_size(size)}), more than the input size limit of {limit} bytes "
        f"({_size(limit)}); raise it with {MAX_INPUT_BYTES_ENV}=BYTES (see docs/limits.md)"
    )


def _fs(url: str) -> Tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise ReservoirError(
            f"{url}: reading a URL needs fsspec (pip install 'reservoir-allocator[fsspec]', "
            "and the package of the protocol, e.g. s3fs or gcsfs)"
        ) from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise ReservoirError(f"{url}: fsspec cannot open it ({e})") from None


def _local_name(url: str) -> str:
    """A relative file name for ``url``'s copy that reads like the URL:
    ``memory://runs/a.pickle`` -> ``memory/runs/a.pickle``."""
    proto, _, rest = url.partition("://")
    parts = [p for p in rest.split("/") if p not in ("", ".", "..")]
    return os.path.join(re.sub(r"[^A-Za-z0-9+.\-]", "_", proto), *parts) if parts else proto


def _copy(fs: Any, path: str, url: str, dest: str, limit: int) -> None:
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise ReservoirError(f"{url}: No such file or directory") from None
    except OSError as e:
        raise ReservoirError(f"{url}: {e}") from None
    if info.get("type") == "directory":
        raise ReservoirError(f"{url}: not a regular file (a folder)")
    size = info.get("size")
    if isinstance(size, int) and size > limit:
        raise _too_large(url, size, limit)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    total = 0
    try:
        with fs.open(path, "rb") as src, open(dest, "wb") as out:
            while True:
                chunk = src.read(CHUNK_BYTES)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    raise _too_large(url, total, limit)
                out.write(chunk)
    except ReservoirError:
        raise
    except OSError as e:
        raise ReservoirError(f"{url}: {e}") from None


def fetch(url: str, tmp: str) -> str:
    """Stream the file at ``url`` into the folder ``tmp``; its local path."""
    fs, path = _fs(url)
    dest = os.path.join(tmp, _local_name(url))
    _copy(fs, path, url, dest, max_input_bytes())
    return dest


def fetch_tree(url: str, tmp: str) -> str:
    """Stream every file under the folder ``url`` (recursively) into the
    folder ``tmp``, keeping the layout; the local folder. Each file has the
    input size limit."""
    fs, path = _fs(url)
    limit = max_input_bytes()
    try:
        if not fs.isdir(path):
            raise ReservoirError(f"{url}: not a folder")
        files: List[str] = sorted(fs.find(path, withdirs=False))
    except OSError as e:
        raise ReservoirError(f"{url}: {e}") from None
    root = os.path.join(tmp, _local_name(url))
    os.makedirs(root, exist_ok=True)
    base = path.rstrip("/")
    for f in files:
        rel = f[len(base):].lstrip("/") if f.startswith(base) else os.path.basename(f)
        parts = [p for p in rel.split("/") if p not in ("", ".", "..")]
        if not parts:
            continue
        _copy(fs, f, url.rstrip("/") + "/" + "/".join(parts), os.path.join(root, *parts), limit)
    return root
