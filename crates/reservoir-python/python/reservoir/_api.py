"""The Python API: :func:`replay` and :func:`compare`.

Both run the ``reservoir`` command's own engine (``reservoir._native``) with
``--json`` and build the objects from that JSON, so what Python sees and what
``reservoir replay --json`` prints never drift: ``Report.to_dict()`` is one
element of the command's JSON array, key for key.

Arguments are values, never options: each reaches the command as one
``--flag=value`` argument and file names follow ``--`` (a file named
``-a.pickle`` replays; ``replay("--capacity=1")`` is a missing file). Paths
are file names as ``os.fsencode`` encodes them (surrogate-escaped bytes
included); a string that is not valid text (a lone surrogate) raises
:class:`ReservoirError` naming the argument.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _executor, _native, _remote, _summary
from ._native import ReservoirError
from ._outfile import write_file as _write_file

__all__ = [
    "Compare",
    "CompareRow",
    "Explanation",
    "Fidelity",
    "Oom",
    "Replay",
    "Report",
    "Site",
    "compare",
    "replay",
]

PathLike = Union[str, "os.PathLike[str]"]
Source = Union[PathLike, bytes, bytearray, memoryview, None]


def _pandas(what: str) -> Any:
    try:
        import pandas  # noqa: F401  (optional dependency)
    except ImportError as e:
        raise ImportError(
            f"{what}.to_pandas() needs pandas, which is not installed: pip install pandas"
        ) from e
    return pandas


class _JsonObject:
    """A report object over one JSON object of the engine."""

    __slots__ = ("_d",)

    def __init__(self, d: Dict[str, Any]) -> None:
        self._d = d

    def to_dict(self) -> Dict[str, Any]:
        """The engine's JSON object, as a dict (a copy)."""
        return json.loads(json.dumps(self._d))

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The engine's JSON object, as text."""
        return json.dumps(self._d, indent=indent)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._d == other._d  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]


class Site(_JsonObject):
    """Live bytes of one allocation site (a stack frame summary)."""

    __slots__ = ()

    @property
    def site(self) -> str:
        """The site (``file:line function`` of the allocation's frame)."""
        return str(self._d["site"])

    @property
    def bytes(self) -> int:
        """Live bytes allocated there."""
        return int(self._d["bytes"])

    @property
    def count(self) -> int:
        """Live allocations made there."""
        return int(self._d["count"])

    def __repr__(self) -> str:
        return f"Site({self.site!r}, bytes={self.bytes}, count={self.count})"


def _sites(v: Optional[List[Dict[str, Any]]]) -> List[Site]:
    return [Site(s) for s in v or []]


class Oom(_JsonObject):
    """A setting's first out-of-memory error, explained: the request, what
    was live (by site), why the free blocks could not serve it, and the
    diagnosis (the shortfall, its causes and the cheapest change that avoids
    it, proven by replay)."""

    __slots__ = ()

    @property
    def op(self) -> int:
        """The failed op's index."""
        return int(self._d["op"])

    @property
    def bytes(self) -> int:
        """Bytes requested."""
        return int(self._d["bytes"])

    @property
    def rounded(self) -> int:
        """The request rounded as the allocator rounds it."""
        return int(self._d["rounded"])

    @property
    def site(self) -> str:
        """The site of the failed allocation."""
        return str(self._d["site"])

    @property
    def reserved(self) -> int:
        """Reserved bytes after the failure."""
        return int(self._d["reserved"])

    @property
    def allocated(self) -> int:
        """Allocated bytes after the failure."""
        return int(self._d["allocated"])

    @property
    def top_sites(self) -> List[Site]:
        """The largest sites of the live allocations, by bytes."""
        return _sites(self._d.get("top_sites"))

    @property
    def unusable_free(self) -> List[Dict[str, Any]]:
        """The free blocks left, by the reason they could not serve it."""
        return list(self._d.get("unusable_free") or [])

    @property
    def avoided_by(self) -> Optional[str]:
        """The setting change (or ``reservoir`` policy) proven to avoid it."""
        return self._d.get("avoided_by")

    @property
    def diagnosis(self) -> Dict[str, Any]:
        """The diagnosis: shortfall, causes with their bytes, the fix."""
        return dict(self._d.get("diagnosis") or {})

    def __repr__(self) -> str:
        return f"Oom(op={self.op}, bytes={self.bytes}, site={self.site!r}, avoided_by={self.avoided_by!r})"


class Explanation(_JsonObject):
    """A setting's reserved peak and first OOM, explained."""

    __slots__ = ()

    @property
    def setting(self) -> str:
        """The setting's name."""
        return str(self._d["setting"])

    @property
    def peak(self) -> Optional[Dict[str, Any]]:
        """The reserved peak: ``op``, ``reserved``, ``allocated``, ``top_sites``."""
        return self._d.get("peak")

    @property
    def peak_sites(self) -> List[Site]:
        """Live bytes by site at the reserved peak, largest first."""
        return _sites((self._d.get("peak") or {}).get("top_sites"))

    @property
    def oom(self) -> Optional[Oom]:
        """The first OOM, explained (``None`` without one)."""
        o = self._d.get("oom")
        return None if o is None else Oom(o)

    def __repr__(self) -> str:
        return f"Explanation(setting={self.setting!r}, oom={self.oom!r})"


class Fidelity(_JsonObject):
    """How exactly PyTorch mode reproduced the recording."""

    __slots__ = ()

    @property
    def segment_events_matched(self) -> int:
        """Recorded segment events (cudaMalloc / cudaFree) reproduced in order."""
        return int(self._d["segment_events_matched"])

    @property
    def segment_events_total(self) -> int:
        """Recorded segment events."""
        return int(self._d["segment_events_total"])

    @property
    def segment_events_exact(self) -> bool:
        """Whether the segment events were reproduced exactly."""
        return bool(self._d["segment_events_exact"])

    @property
    def placements_matched(self) -> int:
        """Blocks placed at their recorded address."""
        return int(self._d["placements_matched"])

    @property
    def placements_total(self) -> int:
        """Blocks placed."""
        return int(self._d["placements_total"])

    @property
    def recorded_peak_reserved(self) -> int:
        """The recording's reserved peak, bytes."""
        return int(self._d["recorded_peak_reserved"])

    @property
    def recorded_ooms(self) -> int:
        """The recording's OOMs."""
        return int(self._d["recorded_ooms"])

    @property
    def exact(self) -> bool:
        """Segment events exact and every block at its recorded address."""
        return self.segment_events_exact and self.placements_matched == self.placements_total

    def __repr__(self) -> str:
        return (
            f"Fidelity(segment_events={self.segment_events_matched}/{self.segment_events_total}, "
            f"placements={self.placements_matched}/{self.placements_total}, exact={self.exact})"
        )


class Report(_JsonObject):
    """One input (a recorded device trace or a workload) replayed with one
    setting: one element of ``reservoir replay --json``."""

    __slots__ = ()

    @property
    def setting(self) -> str:
        """The setting's name (``pytorch``, ``expandable``, ...)."""
        return str(self._d["setting"])

    @property
    def config(self) -> str:
        """Its allocator configuration (``PYTORCH_CUDA_ALLOC_CONF`` syntax)."""
        return str(self._d.get("config", ""))

    @property
    def file(self) -> Optional[str]:
        """The recorded file (``None`` for a workload)."""
        return self._d.get("file")

    @property
    def device(self) -> Optional[int]:
        """The recorded device (``None`` for a workload)."""
        return self._d.get("device")

    @property
    def capacity(self) -> int:
        """The simulated device's capacity, bytes."""
        return int(self._d["capacity"])

    @property
    def ops(self) -> int:
        """Ops replayed (allocations and frees)."""
        return int(self._d["ops"])

    @property
    def peak_allocated(self) -> int:
        """Peak allocated bytes (rounded blocks handed out)."""
        return int(self._d["peak_allocated"])

    @property
    def peak_reserved(self) -> int:
        """Peak reserved bytes (device memory held by the allocator)."""
        return int(self._d["peak_reserved"])

    @property
    def peak_live(self) -> int:
        """Peak of the bytes the program asked for."""
        return int(self._d["peak_live"])

    @property
    def fragmentation(self) -> float:
        """Peak reserved / peak allocated (1.0 is no waste)."""
        return float(self._d["fragmentation"])

    @property
    def reserved_per_live(self) -> Optional[float]:
        """Peak reserved / peak live bytes (``None`` when nothing was live)."""
        return self.peak_reserved / self.peak_live if self.peak_live else None

    @property
    def driver_allocs(self) -> int:
        """Device allocations (``cudaMalloc``) made."""
        return int(self._d["driver_allocs"])

    @property
    def driver_frees(self) -> int:
        """Device frees (``cudaFree``) made."""
        return int(self._d["driver_frees"])

    @property
    def driver_time_ns(self) -> int:
        """Simulated driver time, nanoseconds."""
        return int(self._d["driver_time_ns"])

    @property
    def ooms(self) -> int:
        """Out-of-memory errors."""
        return int(self._d["ooms"])

    @property
    def first_oom(self) -> Optional[Dict[str, Any]]:
        """The first OOM as the replay saw it (``None`` without one); see
        :attr:`oom` for its explanation."""
        return self._d.get("first_oom")

    @property
    def explanation(self) -> Optional[Explanation]:
        """The reserved peak and first OOM, explained."""
        e = self._d.get("explain")
        return None if e is None else Explanation(e)

    @property
    def oom(self) -> Optional[Oom]:
        """The first OOM, explained (``None`` without one)."""
        e = self.explanation
        return None if e is None else e.oom

    @property
    def peak_sites(self) -> List[Site]:
        """Live bytes by site at the reserved peak, largest first."""
        e = self.explanation
        return [] if e is None else e.peak_sites

    @property
    def fidelity(self) -> Optional[Fidelity]:
        """How exactly PyTorch mode reproduced the recording (``None`` when
        not measured: other settings, a cold start, a workload)."""
        f = self._d.get("fidelity")
        return None if f is None else Fidelity(f)

    @property
    def min_capacity(self) -> Optional[int]:
        """The smallest device (to 2 MiB) that runs without OOM
        (``min_capacity=True`` only; ``None`` when not measured or nothing
        up to 16 TiB fits)."""
        return self._d.get("min_capacity")

    @property
    def torch_release(self) -> Optional[str]:
        """The PyTorch release PyTorch mode reproduced (recorded inputs)."""
        return self._d.get("torch_release")

    @property
    def memory_stats(self) -> Dict[str, int]:
        """``torch.cuda.memory_stats()`` at the end of the replay."""
        return dict(self._d.get("memory_stats") or {})

    @property
    def samples(self) -> List[Dict[str, int]]:
        """The timeline: ``{"op", "allocated", "reserved"}`` samples."""
        return list(self._d.get("samples") or [])

    @property
    def lints(self) -> List[Dict[str, Any]]:
        """What the allocator did that wasted memory or time (see the text report)."""
        return list(self._d.get("lints") or [])

    @property
    def summary(self) -> Optional[Dict[str, Any]]:
        """What the report says first, for the input's first setting:
        ``happened``, ``why``, ``fix``, ``fits`` (and ``oom_op``,
        ``shortfall``, ``peak_reserved``); docs/replay.md, ``summary``."""
        s = self._d.get("summary")
        return dict(s) if s is not None else None

    @property
    def levers(self) -> List[Dict[str, Any]]:
        """The program levers of the summary (``lever``, ``replayed``,
        ``peak_reserved``, ``peak_allocated``, ``fits``); docs/replay.md,
        "Program levers"."""
        return list((self._d.get("summary") or {}).get("levers") or [])

    def _repr_html_(self) -> Optional[str]:
        # The summary (with the program levers); None (the text repr)
        # without one.
        s = self._d.get("summary")
        if not s:
            return None
        where = self.file if self.file is not None else "workload"
        title = f"{where} (device {self.device})" if self.file is not None else where
        return _summary.summary_html(s, title)

    def row(self) -> Dict[str, Any]:
        """The scalar numbers of the report, for a table."""
        return {
            "file": self.file,
            "device": self.device,
            "setting": self.setting,
            "capacity": self.capacity,
            "ops": self.ops,
            "peak_live": self.peak_live,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "fragmentation": self.fragmentation,
            "driver_allocs": self.driver_allocs,
            "driver_frees": self.driver_frees,
            "driver_time_ns": self.driver_time_ns,
            "ooms": self.ooms,
            "min_capacity": self.min_capacity,
        }

    def __repr__(self) -> str:
        where = self.file if self.file is not None else "workload"
        return (
            f"Report({where!r}, setting={self.setting!r}, peak_reserved={self.peak_reserved}, "
            f"peak_allocated={self.peak_allocated}, ooms={self.ooms})"
        )


def _to_pandas(rows: List[Dict[str, Any]], what: str) -> Any:
    return _pandas(what).DataFrame(rows)


class Replay:
    """What :func:`replay` returns: one :class:`Report` per input and
    setting, in the command's order, and the HTML report.

    Index it by position or by setting name (the first report of that
    setting); iterate over the reports.
    """

    __slots__ = ("_json", "_reports", "_html", "_failed")

    def __init__(
        self, json_text: str, html: Optional[str], failed: Optional[List[Dict[str, str]]] = None
    ) -> None:
        self._json = json_text
        self._reports = [Report(d) for d in json.loads(json_text)]
        self._html = html
        self._failed = list(failed or [])

    @property
    def failed(self) -> List[Dict[str, str]]:
        """The inputs whose task failed twice on the executor (``{"input",
        "reason"}``, in input order; their reports are missing); empty
        without an executor."""
        return [dict(f) for f in self._failed]

    @property
    def reports(self) -> List[Report]:
        """The reports, one per input and setting."""
        return list(self._reports)

    @property
    def settings(self) -> List[str]:
        """The settings replayed, in order, each once."""
        return list(dict.fromkeys(r.setting for r in self._reports))

    @property
    def html(self) -> str:
        """The self-contained HTML report (what ``replay --html`` writes);
        empty for a replay on an executor."""
        return self._html or ""

    def __len__(self) -> int:
        return len(self._reports)

    def __iter__(self) -> Iterator[Report]:
        return iter(self._reports)

    def __getitem__(self, key: Union[int, str]) -> Report:
        if isinstance(key, str):
            for r in self._reports:
                if r.setting == key:
                    return r
            raise KeyError(f"no report of setting {key!r}; settings: {', '.join(self.settings)}")
        return self._reports[key]

    def to_dict(self) -> Dict[str, Any]:
        """``{"reports": [...]}``: each report's JSON object."""
        return {"reports": [r.to_dict() for r in self._reports]}

    def to_json(self) -> str:
        """The JSON array ``reservoir replay --json`` prints, byte for byte."""
        return self._json

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``, one row per report (:meth:`Report.row`);
        needs pandas."""
        return _to_pandas([r.row() for r in self._reports], "Replay")

    def save_html(self, path: PathLike) -> None:
        """Write the HTML report to ``path``: a temporary file renamed into
        place, so a failed write keeps the previous file (a device such as
        ``/dev/stdout`` is written straight; docs/limits.md, "Output files")."""
        _write_file(path, self.html.encode("utf-8"))

    def _repr_html_(self) -> Optional[str]:
        # The page; without one (a replay on an executor) the summary of
        # each input, the program levers in it; None (the text repr)
        # without either.
        return self._html or _summary.reports_html(r._d for r in self._reports)

    def __repr__(self) -> str:
        return f"Replay({len(self._reports)} reports: {', '.join(self.settings)})"


class CompareRow(_JsonObject):
    """One input of :func:`compare`, under each compared policy."""

    __slots__ = ()

    @property
    def input(self) -> str:
        """The input's name (``file#device`` or ``workload NAME``)."""
        return str(self._d["input"])

    @property
    def ops(self) -> int:
        """Ops replayed."""
        return int(self._d["ops"])

    @property
    def policies(self) -> List[Dict[str, Any]]:
        """Each policy's numbers: ``policy``, ``peak_reserved``, ``ooms``, ..."""
        return list(self._d.get("policies") or [])

    def __repr__(self) -> str:
        return f"CompareRow({self.input!r}, {len(self.policies)} policies)"


class Compare:
    """What :func:`compare` returns: one :class:`CompareRow` per input, the
    per-policy summary and the skipped files (``reservoir compare --json``)."""

    __slots__ = ("_json", "_d", "_failed")

    def __init__(self, json_text: str, failed: Optional[List[Dict[str, str]]] = None) -> None:
        self._json = json_text
        self._d = json.loads(json_text)
        self._failed = list(failed or [])

    @property
    def failed(self) -> List[Dict[str, str]]:
        """The inputs whose task failed twice on the executor (``{"input",
        "reason"}``, in input order; also in :attr:`skipped`, with the
        reason); empty without an executor."""
        return [dict(f) for f in self._failed]

    @property
    def rows(self) -> List[CompareRow]:
        """One row per input."""
        return [CompareRow(r) for r in self._d.get("rows") or []]

    @property
    def summary(self) -> List[Dict[str, Any]]:
        """Each policy over every input."""
        return list(self._d.get("summary") or [])

    @property
    def skipped(self) -> List[Dict[str, str]]:
        """Files left out, with the reason."""
        return list(self._d.get("skipped") or [])

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object ``reservoir compare --json`` prints, as a dict."""
        return json.loads(self._json)

    def to_json(self) -> str:
        """The JSON ``reservoir compare --json`` prints, byte for byte."""
        return self._json

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``, one row per input and policy; needs pandas."""
        rows = []
        for r in self._d.get("rows") or []:
            for p in r.get("policies") or []:
                row = {"input": r.get("input"), "ops": r.get("ops")}
                row.update({k: v for k, v in p.items() if not isinstance(v, (dict, list))})
                rows.append(row)
        return _to_pandas(rows, "Compare")

    def __repr__(self) -> str:
        return f"Compare({len(self._d.get('rows') or [])} inputs)"


def _text(name: str, v: Any) -> str:
    """``v``, the value of argument ``name``, as text the command takes: a
    ``str`` that is valid Unicode (no lone surrogate, which has no UTF-8
    form); raises ``ReservoirError`` naming the argument otherwise."""
    if not isinstance(v, str):
        raise ReservoirError(f"{name}={v!r}: expected a string")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ReservoirError(
            f"{name}={v!r}: not valid text ({e.reason} at position {e.start})"
        ) from None
    return v


def _path(name: str, v: Any) -> bytes:
    """``v``, the path argument ``name``, as the bytes of its file name
    (``os.fsencode``: a ``str`` with surrogate-escaped bytes names the file
    those bytes name, as ``open`` does); raises ``ReservoirError`` naming
    the argument when it is not a path or names no possible file."""
    if not isinstance(v, (str, bytes, os.PathLike)):
        raise ReservoirError(f"{name}={v!r}: expected a path")
    try:
        return os.fsencode(v)
    except (UnicodeEncodeError, TypeError) as e:
        raise ReservoirError(f"{name}={v!r}: not a file name ({e})") from None


def _strs(name: str, v: Union[str, Sequence[str], None]) -> List[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [_text(name, v)]
    out = list(v)
    for x in out:
        if not isinstance(x, str):
            raise ReservoirError(f"{name}: expected a string or a list of strings, got {x!r}")
        _text(name, x)
    return out


def _size(name: str, v: Union[int, str, None]) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ReservoirError(
            f"{name}={v!r}: expected bytes (an int) or a size such as '80GiB'"
        )
    if isinstance(v, int) and v < 0:
        raise ReservoirError(f"{name}={v}: a capacity is a positive number of bytes")
    return _text(name, str(v))


def _opt(flag: str, value: Union[str, bytes]) -> bytes:
    """``--flag=value``, one argument: the command takes everything after
    the first ``=`` as the value, even a value that looks like an option."""
    v = value if isinstance(value, bytes) else value.encode("utf-8")
    return flag.encode("ascii") + b"=" + v


def _run(command: str, options: List[bytes], positionals: List[bytes]) -> "tuple[str, Optional[str]]":
    """Run ``reservoir COMMAND OPTIONS -- POSITIONALS`` in memory.

    User values never reach the command's parser as options: each option is
    one ``--flag=value`` argument (:func:`_opt`), and the positionals (file
    names) come after ``--``, so a file named ``-a.pickle`` or
    ``--capacity=1`` is a file name."""
    argv: List[Union[str, bytes]] = ["reservoir", command, *options]
    if positionals:
        argv += ["--", *positionals]
    out, html = _native.run_captured(argv)
    return out.decode("utf-8"), html


def replay(
    source: Union[Source, Sequence[Source]] = None,
    policies: Union[str, Sequence[str], None] = None,
    capacity: Union[int, str, None] = None,
    start: Optional[str] = None,
    min_capacity: bool = False,
    *,
    workload: Optional[str] = None,
    settings: Optional[Dict[str, str]] = None,
    configs: Union[str, Sequence[str], None] = None,
    device: Optional[int] = None,
    device_total: Union[int, str, None] = None,
    torch: Optional[str] = None,
    executor: Any = None,
    progress: bool = True,
) -> Replay:
    """Replay a memory snapshot (or a built-in workload) under each policy.

    ``reservoir.replay(src, ...)`` is ``reservoir replay SRC --json --html``:

    * ``source``: a snapshot's path (``torch.cuda.memory._dump_snapshot``
      pickles, ``_memory_viz`` JSON, allocatorSim logs), a URL ``fsspec``
      opens (``s3://``, ``gs://``, ``memory://``, ``file://``...: streamed
      into a temporary file under the input size limit; the reports name the
      URL) or its bytes; a list of them (``reservoir replay A B ...``: the
      reports in input order); ``None`` replays ``workload`` (default
      ``gpt-train``);
    * ``policies``: policy names (``pytorch``, ``expandable``, ``reservoir``,
      ``max-split-N``, ``roundup-N``, ``gc-T``, ``large-segment-N``,
      ``mps-heap``, ``pytorch-2.11`` ... ``pytorch-2.15``); default: all;
    * ``capacity``: the simulated device, bytes or a size like ``"24GiB"``;
      default: the capacity that reproduces the recording's OOMs, else 80 GiB;
    * ``start``: ``"recorded"`` (exact replay, the default) or ``"cold"``;
    * ``min_capacity``: also find each policy's smallest device without OOM;
    * ``settings`` (``{name: PYTORCH_CUDA_ALLOC_CONF}``), ``configs``,
      ``device``, ``device_total``, ``torch`` (a release, e.g. ``"2.13"``):
      as the command's options;
    * ``executor``: a ``concurrent.futures.Executor`` (Dask's
      ``Client.get_executor()``, ``ProcessPoolExecutor``, mpi4py's
      ``MPIPoolExecutor``, Ray's adapter): each input (path or URL: the
      workers read it; not bytes) and the workload is one task; the reports
      are those of the one-process run, in input order (measured times
      aside), without the HTML page. A task that fails is tried once more,
      then named in :attr:`Replay.failed` (see ``reservoir._executor``);
    * ``progress``: with an executor, a tqdm bar when tqdm is importable.

    Raises :class:`reservoir.ReservoirError` with the command's message.
    """
    many = isinstance(source, (list, tuple))
    sources: List[Source] = list(source) if many else ([] if source is None else [source])  # type: ignore[arg-type]
    if many and not sources:
        raise ReservoirError("source=[]: no input (give paths, or None to replay the workload)")
    for k, s in enumerate(sources):
        name = f"source[{k}]" if many else "source"
        if _remote.is_url(s):
            _text(name, s)
        elif isinstance(s, (bytes, bytearray, memoryview)):
            if executor is not None:
                raise ReservoirError(
                    f"{name}: a snapshot's bytes; with an executor give its path or URL "
                    "(a task carries paths, which the workers read, not bytes)"
                )
        elif isinstance(s, (str, os.PathLike)):
            _path(name, s)
        else:
            raise ReservoirError(f"{name}={s!r}: expected a path, the snapshot's bytes or None")
    opts: List[bytes] = []
    for p in _strs("policies", policies):
        opts.append(_opt("--policy", p))
    for name, conf in (settings or {}).items():
        _text("settings", name)
        if "=" in name:
            raise ReservoirError(f"settings: the name {name!r} contains '=' (NAME=CONF)")
        opts.append(_opt("--setting", f"{name}={_text(f'settings[{name!r}]', conf)}"))
    for c in _strs("configs", configs):
        opts.append(_opt("--config", c))
    cap = _size("capacity", capacity)
    if cap is not None:
        opts.append(_opt("--capacity", cap))
    total = _size("device_total", device_total)
    if total is not None:
        opts.append(_opt("--device-total", total))
    if start is not None:
        opts.append(_opt("--start", _text("start", str(start))))
    if device is not None:
        opts.append(_opt("--device", _text("device", str(device))))
    if torch is not None:
        opts.append(_opt("--torch", _text("torch", str(torch))))
    if min_capacity:
        opts.append(b"--min-capacity")
    wopts = [] if workload is None else [_opt("--workload", _text("workload", workload))]
    if executor is None:
        text, html = _replay_run(sources, wopts + opts, True)
        return Replay(text, html)
    _executor.check_executor(executor)
    tasks: List[Tuple[Any, ...]] = [([s], opts) for s in sources]
    names = [s if _remote.is_url(s) else os.fsdecode(s) for s in sources]  # type: ignore[arg-type]
    if workload is not None or not sources:
        tasks.append(([], wopts + opts))
        names.append(f"workload {workload or 'gpt-train'}")
    texts: List[Optional[str]] = [None] * len(tasks)

    def keep(i: int, text: str) -> None:
        texts[i] = text

    failed = _executor.run(executor, _replay_task, tasks, keep, progress=progress, desc="reservoir replay")
    err = _executor.all_failed("replay", names, failed)
    if err is not None:
        raise err
    return Replay(_join_arrays([t for t in texts if t is not None]), None, _executor.failures(names, failed))


def _replay_task(sources: List[Source], opts: List[bytes], attempt: int = 1) -> str:
    """One task of :func:`replay` on an executor: the engine's JSON
    (``attempt``: 1, or 2 for the retry)."""
    return _replay_run(sources, opts, False)[0]


def _join_arrays(texts: List[str]) -> str:
    """The JSON arrays ``texts`` (as ``reservoir replay --json`` prints them)
    as one, as the command prints it for all their inputs at once."""
    items = []
    for t in texts:
        body = t.strip()
        if not (body.startswith("[") and body.endswith("]")):
            raise ReservoirError(f"a task returned no JSON array: {body[:80]!r}")
        body = body[1:-1].strip("\n")
        if body.strip():
            items.append(body)
    return "[\n" + ",\n".join(items) + "\n]\n" if items else "[]\n"


def _replay_run(sources: List[Source], opts: List[bytes], want_html: bool) -> "tuple[str, Optional[str]]":
    """``reservoir replay OPTS --json [--html] -- SOURCES`` in memory: bytes
    written to, and URLs streamed into, a temporary folder (the reports then
    name the URL)."""
    with tempfile.TemporaryDirectory(prefix="reservoir-") as tmp:
        files: List[bytes] = []
        renames = []
        for k, s in enumerate(sources):
            if isinstance(s, (bytes, bytearray, memoryview)):
                path = os.path.join(tmp, "snapshot.pickle" if k == 0 else f"snapshot-{k}.pickle")
                with open(path, "wb") as f:
                    f.write(bytes(s))
                files.append(os.fsencode(path))
            else:
                path, renamed = _local("source", s, tmp, k)
                files.append(path)
                renames += renamed
        opts = [*opts, b"--json"]
        if want_html:
            opts.append(_opt("--html", os.fsencode(os.path.join(tmp, "report.html"))))
        text, html = _run("replay", opts, files)
        for local, url in renames:
            text, html = _renamed(text, html, local, url)  # type: ignore[arg-type]
    return text, html


def _local(name: str, s: Any, tmp: str, k: int) -> "tuple[bytes, List[Tuple[str, str]]]":
    """The file the command reads for input ``k``, argument ``name``: a URL
    streamed into ``tmp`` (with ``[(local, url)]``, the copy to rename in
    the output), else the path's own bytes (and ``[]``)."""
    if _remote.is_url(s):
        local = _remote.fetch(_text(name, s), os.path.join(tmp, "input" if k == 0 else f"input-{k}"))
        return os.fsencode(local), [(local, s)]
    return _path(name, s), []


def _renamed(text: str, html: Optional[str], local: str, url: str) -> "tuple[str, Optional[str]]":
    """The command's JSON and HTML with the temporary copy's path ``local``
    (a file or a folder) replaced by the ``url`` it was read from."""
    import html as _html

    text = text.replace(json.dumps(local)[1:-1], json.dumps(url)[1:-1])
    if html is not None:
        html = html.replace(json.dumps(local)[1:-1], json.dumps(url)[1:-1])
        html = html.replace(_html.escape(local), _html.escape(url))
    return text, html


def predict(
    recordings: Union[Dict[Any, int], Sequence[Tuple[Any, int]]],
    at: int,
    capacity: Union[int, str, None] = None,
    *,
    device: Optional[int] = None,
    torch: Optional[str] = None,
) -> Dict[str, Any]:
    """Predict the peak memory of another batch or context size from the
    program's own snapshots (``reservoir predict FILE@SIZE ... --at SIZE
    --json``).

    * ``recordings``: ``{source: size}`` or ``[(source, size), ...]``: each
      snapshot (a path, or a URL ``fsspec`` opens: streamed into a temporary
      file under the input size limit) with the batch or context size it ran
      at. One recording: activations and temporaries scale linearly with the
      size; several: each allocation gets its own law (constant, linear,
      quadratic), fitted across them (docs/replay.md, "Another batch or
      context size");
    * ``at``: the size to predict;
    * ``capacity``: the device (bytes or ``"80GiB"``): also find the largest
      size that fits it, per setting;
    * ``device``, ``torch``: as the command's options.

    Returns the command's JSON: ``predicted`` (``peak_allocated``,
    ``peak_reserved``, ``ooms``, ``fits``, ``largest_fitting``: PyTorch
    mode), ``settings`` (one per setting), ``recordings``, ``base``,
    ``sized_by``, ``at``, ``capacity``. A prediction is one fit over its
    recordings, replayed on every core; it takes no executor. Raises
    :class:`reservoir.ReservoirError` with the command's message.
    """
    pairs = list(recordings.items()) if isinstance(recordings, dict) else list(recordings)
    if not pairs:
        raise ReservoirError("recordings: none given (give {path: size}, at least one)")
    if isinstance(at, bool) or not isinstance(at, int) or at <= 0:
        raise ReservoirError(f"at={at!r}: expected a batch or context size, a whole number above 0")
    opts: List[bytes] = [_opt("--at", str(at))]
    cap = _size("capacity", capacity)
    if cap is not None:
        opts.append(_opt("--capacity", cap))
    if device is not None:
        opts.append(_opt("--device", _text("device", str(device))))
    if torch is not None:
        opts.append(_opt("--torch", _text("torch", str(torch))))
    opts.append(b"--json")
    with tempfile.TemporaryDirectory(prefix="reservoir-") as tmp:
        files: List[bytes] = []
        renames = []
        for k, pair in enumerate(pairs):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ReservoirError(f"recordings[{k}]={pair!r}: expected (source, size)")
            src, size = pair
            name = f"recordings[{k}]"
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ReservoirError(f"{name}: size {size!r}: expected a whole number above 0")
            path, renamed = _local(name, src, tmp, k)
            renames += renamed
            files.append(path + b"@" + str(size).encode("ascii"))
        text, _ = _run("predict", opts, files)
        for local, url in renames:
            text, _ = _renamed(text, None, local, url)
    return json.loads(text)


def compare(
    folder: Optional[PathLike] = None,
    policies: Union[str, Sequence[str], None] = None,
    *,
    workloads: Union[bool, str, Sequence[str]] = False,
    capacity: Union[int, str, None] = None,
    executor: Any = None,
    progress: bool = True,
) -> Compare:
    """Compare policies on every snapshot of ``folder`` (recursively, from a
    cold start): ``reservoir compare --traces FOLDER --json``. ``folder``
    may be a URL ``fsspec`` opens (``s3://bucket/run/``, ``memory://...``):
    its files are streamed into a temporary folder, each under the input
    size limit, and compared there (the rows name them relative to it, as
    for a local folder).

    ``policies`` defaults to pytorch, expandable and reservoir; ``workloads``
    adds the built-in workloads (``True``: every preset, or names);
    ``folder=None`` compares the workloads alone; ``capacity``: bytes, a size
    or ``"bound"``. Raises :class:`reservoir.ReservoirError`.

    ``executor``: a ``concurrent.futures.Executor`` (Dask's
    ``Client.get_executor()``, ``ProcessPoolExecutor``, mpi4py's
    ``MPIPoolExecutor``, Ray's adapter): each input (a file of ``folder``,
    a workload) is one task, ``reservoir compare --shard K/N`` with N the
    number of inputs, which reads the file where the worker runs (a local
    ``folder`` path the workers see, e.g. on a shared file system; not a
    URL); the results are merged as they come by ``reservoir compare
    --merge``: the JSON is the one-process run's, measured times aside. A
    task that fails is tried once more, then named in :attr:`Compare.failed`
    and :attr:`Compare.skipped`. ``progress``: a tqdm bar when tqdm is
    importable (with an executor).
    """
    opts: List[bytes] = [b"--json"]
    url = folder if _remote.is_url(folder) else None
    if folder is None:
        opts.append(b"--no-traces")
    elif url is None:
        opts.append(_opt("--traces", _path("folder", folder)))
    for p in _strs("policies", policies):
        opts.append(_opt("--policy", p))
    if workloads is False:
        opts.append(b"--no-workloads")
    elif workloads is not True:
        for w in _strs("workloads", workloads):  # type: ignore[arg-type]
            opts.append(_opt("--workload", w))
    if capacity is not None:
        cap = "bound" if capacity == "bound" else _size("capacity", capacity)
        opts.append(_opt("--capacity", str(cap)))
    if folder is None and workloads is False:
        raise ReservoirError("compare: nothing to compare (no folder and workloads=False)")
    if executor is not None:
        _executor.check_executor(executor)
        if url is not None:
            raise ReservoirError(
                f"folder={url!r}: with an executor, give a folder the workers read "
                "(a path on a shared file system), not a URL"
            )
        names = _compare_units(folder, workloads)
        if names:
            return _compare_on(executor, folder, opts, names, progress)
    if url is None:
        text, _ = _run("compare", opts, [])
        return Compare(text)
    with tempfile.TemporaryDirectory(prefix="reservoir-") as tmp:
        local = _remote.fetch_tree(_text("folder", url), os.path.join(tmp, "input"))
        text, _ = _run("compare", [_opt("--traces", os.fsencode(local)), *opts], [])
        text, _ = _renamed(text, None, local, url.rstrip("/"))
    return Compare(text)


def _compare_task(opts: List[bytes], shard: str, attempt: int = 1) -> str:
    """One task of :func:`compare` on an executor: ``reservoir compare OPTS
    --shard K/N`` (one input), the engine's JSON (``attempt``: 1, or 2 for
    the retry)."""
    return _run("compare", [*opts, _opt("--shard", shard)], [])[0]


def _compare_on(
    executor: Any, folder: Optional[PathLike], opts: List[bytes], names: List[str], progress: bool
) -> Compare:
    """:func:`compare` on ``executor``: part ``K`` of ``len(names)`` per
    task, each part's JSON written to a temporary file as it comes, the
    parts merged by ``reservoir compare --merge`` (which checks that every
    part is there once). A part whose task failed twice is a part with no
    row and the input in its skipped files."""
    n = len(names)
    tasks = [(opts, f"{k + 1}/{n}") for k in range(n)]
    with tempfile.TemporaryDirectory(prefix="reservoir-compare-") as tmp:
        part = lambda i: os.path.join(tmp, f"part-{i + 1}.json")  # noqa: E731

        def keep(i: int, text: str) -> None:
            with open(part(i), "w", encoding="utf-8") as f:
                f.write(text)

        failed = _executor.run(
            executor, _compare_task, tasks, keep, progress=progress, desc="reservoir compare",
            order=_longest_first(folder, names),
        )
        err = _executor.all_failed("compare", names, failed)
        if err is not None:
            raise err
        report = _executor.failures(names, failed)
        for i, f in zip(sorted(failed), report):
            with open(part(i), "w", encoding="utf-8") as out:
                json.dump(
                    {
                        "rows": [],
                        "skipped": [{"file": f["input"], "reason": f["reason"]}],
                        "shard": {"index": i + 1, "count": n},
                    },
                    out,
                )
        merge = [_opt("--merge", os.fsencode(part(i))) for i in range(n)]
        text, _ = _run("compare", [b"--json", *merge], [])
    return Compare(text, report)


def _longest_first(folder: Optional[PathLike], names: List[str]) -> List[int]:
    """The order to submit :func:`compare`'s inputs in: the workloads (the
    large presets are the longest inputs), then the files by size, largest
    first (a file that cannot be read last: its task fails fast)."""

    def size(i: int) -> int:
        if names[i].startswith("workload ") or folder is None:
            return 1 << 62
        try:
            return os.stat(os.path.join(os.fsencode(folder), os.fsencode(names[i]))).st_size
        except OSError:
            return -1

    return sorted(range(len(names)), key=lambda i: -size(i))


def _compare_units(folder: Optional[PathLike], workloads: Union[bool, str, Sequence[str]]) -> List[str]:
    """The names of what ``reservoir compare`` compares, in its order: each
    file under ``folder`` as the command lists it (recursively, ``.md``
    files and symbolic links to folders left out, sorted by path
    components), then each workload. Its length makes the ``--shard K/N``
    of one input per task (a different count would still cover every input
    once: the parts of any split do; only the failure names rely on it)."""
    names: List[str] = []
    if folder is not None:
        root = os.fsencode(folder)
        found: List[Tuple[bytes, ...]] = []
        stack: List[Tuple[bytes, ...]] = [()]
        while stack:
            rel = stack.pop()
            d = os.path.join(root, *rel) if rel else root
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError as e:
                raise ReservoirError(f"cannot read {os.fsdecode(d)}: {e.strerror or e}") from None
            for e in entries:
                r = rel + (e.name,)
                if e.is_dir(follow_symlinks=False):
                    stack.append(r)
                elif e.is_symlink() and os.path.isdir(e.path):
                    continue
                elif not (e.name.endswith(b".md") and len(e.name) > 3):
                    found.append(r)
        found.sort()
        names += [os.fsdecode(b"/".join(r)) for r in found]
    if workloads is True:
        names += [f"workload {w}" for w in _presets()]
    elif workloads is not False:
        names += [f"workload {w}" for w in _strs("workloads", workloads)]  # type: ignore[arg-type]
    return names


def _presets() -> List[str]:
    """The built-in workloads' preset names (``reservoir workloads``)."""
    out, _ = _native.run_captured(["reservoir", "workloads"])
    names = []
    for line in out.decode("utf-8").splitlines()[1:]:
        if not line.strip():
            if names:
                break
            continue
        if line.startswith("  ") and not line.startswith("   "):
            names.append(line.split()[0])
    return names
