"""The summary of a replay as HTML, from its JSON (``summary``), for a
notebook: what happened, why, what to do (the cheapest proven fix, then the
program levers, each with what was replayed, its peak reserved and whether
it fits), what fits. The command's page (``replay --html``) carries the same
summary; this one serves where there is no page (a replay on an executor)
and a single :class:`~reservoir.Report`.
"""

from __future__ import annotations

import html
import json
from typing import Any, Dict, Iterable, List, Optional


def format_size(n: int) -> str:
    """Bytes as the command prints them (PyTorch's ``format_size``):
    ``1024 bytes``, ``1.50 MiB``, GiB the largest unit."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1 << 20:
        return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


def levers_html(levers: Iterable[Dict[str, Any]]) -> str:
    """The program levers as a table: lever, what was replayed, peak
    reserved, fits ("" without levers)."""
    rows = [
        "<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            html.escape(str(lv.get("name") or lv.get("lever", ""))),
            html.escape(str(lv.get("replayed", ""))),
            html.escape(format_size(int(lv.get("peak_reserved") or 0))),
            "fits" if lv.get("fits") else "no",
        )
        for lv in levers
    ]
    if not rows:
        return ""
    return (
        '<table class="levers"><tr><th>lever</th><th>what was replayed</th>'
        "<th>peak reserved</th><th>fits</th></tr>" + "".join(rows) + "</table>"
    )


def summary_html(summary: Dict[str, Any], title: Optional[str] = None) -> str:
    """One input's ``summary`` object as a ``<div class="summary">``."""
    e = html.escape
    setting = str(summary.get("setting") or "")
    head = e(title) + " " if title else ""
    out = [f'<div class="summary"><h3>{head}Summary ({e(setting)})</h3><dl>']
    out.append(f"<dt>What happened</dt><dd>{e(str(summary.get('happened') or ''))}</dd>")
    why = [
        f"<li><b>{e(str(c.get('cause', '')))}</b> {e(format_size(int(c.get('bytes') or 0)))}: "
        f"{e(str(c.get('sentence', '')))}</li>"
        for c in summary.get("why") or []
    ]
    roles = summary.get("roles") or []
    if roles:
        at = "the OOM" if summary.get("roles_at") == "oom" else "the peak"
        parts = ", ".join(
            f"{str(r.get('role', '')).replace('_', ' ')} {format_size(int(r.get('bytes') or 0))}"
            for r in roles
        )
        why.append(f'<li class="roles">{e(f"memory by role at {at}: {parts}")}</li>')
    if why:
        out.append("<dt>Why</dt><dd><ul>" + "".join(why) + "</ul></dd>")
    fix = summary.get("fix")
    levers: List[Dict[str, Any]] = list(summary.get("levers") or [])
    if fix or levers:
        out.append("<dt>What to do</dt><dd>")
        if fix:
            out.append(e(str(fix)))
        if levers:
            head = (
                "then the program levers, each proven by replaying the changed trace"
                if summary.get("oom_op") is not None
                else "to cut the peak, the program levers, each proven by replaying the changed trace"
            )
            out.append(f"<p>{e(head)}:</p>" + levers_html(levers))
        out.append("</dd>")
    fits = summary.get("fits") or "not measured (replay with min_capacity=True)"
    out.append(f"<dt>What fits</dt><dd>{e(str(fits))}</dd></dl></div>")
    return "".join(out)


def reports_html(reports: Iterable[Dict[str, Any]]) -> Optional[str]:
    """The summary of each input among ``reports`` (JSON objects, several
    settings of one input in a row carry the same summary: shown once);
    ``None`` when none has a summary."""
    out: List[str] = []
    last = None
    for r in reports:
        s = r.get("summary")
        if not s:
            continue
        where = r.get("file")
        title = f"{where} (device {r.get('device')})" if where is not None else "workload"
        key = (where, r.get("device"), json_key(s))
        if key == last:
            continue
        last = key
        out.append(summary_html(s, title))
    return "".join(out) or None


def json_key(v: Any) -> str:
    """A value's JSON text, to tell equal summaries apart."""
    return json.dumps(v, sort_keys=True)
