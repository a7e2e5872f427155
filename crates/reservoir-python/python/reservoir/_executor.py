"""Many inputs on a cluster engine: any :class:`concurrent.futures.Executor`.

:func:`reservoir.compare` and :func:`reservoir.replay` take ``executor=``
(Dask's ``Client.get_executor()``, Ray's executor adapter, mpi4py's
``MPIPoolExecutor``, ``ProcessPoolExecutor``, ...) and submit one input per
task. A task carries paths and settings, never a snapshot's bytes, and
returns the JSON the engine writes; the caller merges the results as they
come (``compare``: with ``reservoir compare --merge``, the code that joins
the parts of a ``--shard K/N`` split, so the output equals the one-process
run's field for field, measured times aside).

A task that fails (its worker killed, its file unreadable, the engine's
error) is submitted once more (the executor picks the worker: Dask and Ray
reschedule elsewhere), or, when the executor refuses new work (a
``ProcessPoolExecutor`` whose worker was killed is broken for good), run
once more in this process. A second failure is reported for that input
(``failed``); nothing else is lost.

Progress: a ``tqdm`` bar (``tqdm.auto``: a terminal or a notebook) when tqdm
is importable and ``progress`` is true; else none.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._native import ReservoirError

#: A task: the arguments of the task function.
Task = Tuple[Any, ...]

#: Counts over this process's runs: ``retried`` (tasks submitted again).
stats: Dict[str, int] = {"retried": 0}


def is_executor(v: Any) -> bool:
    """Whether ``v`` looks like a ``concurrent.futures.Executor`` (has
    ``submit``): Dask's and Ray's adapters are not subclasses of it."""
    return isinstance(v, cf.Executor) or callable(getattr(v, "submit", None))


def check_executor(v: Any) -> None:
    """Raise :class:`ReservoirError` when ``v`` is no executor, or a
    ``ProcessPoolExecutor`` that forks: a forked child keeps none of the
    engine's worker threads started in this process (any earlier replay or
    compare), so its first replay would wait for them forever."""
    if not is_executor(v):
        raise ReservoirError(
            f"executor={v!r}: expected a concurrent.futures.Executor (something with submit(fn, *args)), "
            "e.g. dask.distributed.Client(...).get_executor() or ProcessPoolExecutor()"
        )
    if isinstance(v, cf.ProcessPoolExecutor):
        ctx = getattr(v, "_mp_context", None)
        method = ctx.get_start_method() if ctx is not None else None
        if method == "fork":
            raise ReservoirError(
                "executor: a ProcessPoolExecutor that forks its workers (the engine's threads do not "
                "survive fork: a worker would hang); make it with "
                "mp_context=multiprocessing.get_context('forkserver') (or 'spawn')"
            )


def _bar(total: int, desc: str, progress: bool) -> Any:
    """A tqdm bar of ``total`` steps, or ``None`` (no tqdm, or not wanted)."""
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm  # optional dependency
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="input")


def _reason(e: BaseException) -> str:
    """What a failed task's exception says."""
    if isinstance(e, ReservoirError):
        return str(e)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _done_future(fn: Callable[..., Any], args: Task) -> "cf.Future[Any]":
    """``fn(*args)`` run here, as a finished future."""
    f: "cf.Future[Any]" = cf.Future()
    try:
        f.set_result(fn(*args))
    except Exception as e:  # reported per input by the caller
        f.set_exception(e)
    return f


def _submit(executor: Any, fn: Callable[..., Any], args: Task, local_ok: bool) -> "cf.Future[Any]":
    """``executor.submit(fn, *args)``; when the executor refuses (broken,
    shut down) and ``local_ok``, ``fn(*args)`` run here instead."""
    try:
        return executor.submit(fn, *args)
    except Exception:
        if not local_ok:
            raise
        return _done_future(fn, args)


def run(
    executor: Any,
    fn: Callable[..., Any],
    tasks: Sequence[Task],
    on_result: Callable[[int, Any], None],
    *,
    progress: bool = True,
    desc: str = "reservoir",
    order: Optional[Sequence[int]] = None,
) -> Dict[int, str]:
    """Run ``fn(*tasks[i], attempt)`` for each ``i`` on ``executor``; hand each result
    to ``on_result(i, result)`` as it comes (in completion order, kept no
    longer than that call), submitted in ``order`` (default: task order;
    the longest first keeps a long task from starting last). A task that
    fails is submitted once more (or, when the executor refuses new work,
    run once more here). Returns the tasks that failed twice: ``{i:
    reason}``."""
    bar = _bar(len(tasks), desc, progress)
    failed: Dict[int, str] = {}
    index: Dict["cf.Future[Any]", int] = {}
    retries: Dict["cf.Future[Any]", int] = {}
    try:
        # The attempt is the task's last argument: a retry is a new task
        # (Dask names a task by its function and arguments, and would hand
        # back the failed one).
        for i in range(len(tasks)) if order is None else order:
            index[_submit(executor, fn, (*tasks[i], 1), local_ok=False)] = i

        def settle(f: "cf.Future[Any]", i: int, again: bool) -> None:
            try:
                value = f.result()
            except (Exception, cf.CancelledError) as e:
                if again:
                    stats["retried"] += 1
                    retries[_submit(executor, fn, (*tasks[i], 2), local_ok=True)] = i
                    return
                failed[i] = _reason(e)
            else:
                on_result(i, value)
                del value
            if bar is not None:
                bar.update(1)

        # as_completed drops each future it yields; so does the pop.
        for f in cf.as_completed(list(index)):
            settle(f, index.pop(f), True)
        for f in cf.as_completed(list(retries)):
            settle(f, retries.pop(f), False)
    except BaseException:
        for f in list(index) + list(retries):
            f.cancel()
        raise
    finally:
        if bar is not None:
            bar.close()
    return failed


def failures(names: List[str], failed: Dict[int, str]) -> List[Dict[str, str]]:
    """``failed`` as ``[{"input": NAME, "reason": WHY}]``, in input order."""
    return [
        {"input": names[i], "reason": f"failed twice on the executor: {why}"}
        for i, why in sorted(failed.items())
    ]


def all_failed(what: str, names: List[str], failed: Dict[int, str]) -> Optional[ReservoirError]:
    """The error when every input failed (nothing to merge), else ``None``."""
    if not names or len(failed) < len(names):
        return None
    first = min(failed)
    return ReservoirError(
        f"{what}: every input failed twice on the executor ({len(names)}); "
        f"the first, {names[first]}: {failed[first]}"
    )
