"""One field list for the per-cell table (one row per task and arm), rendered everywhere from it:
the CLI's text table, CSV, JSON, Markdown, the window's Results table, and ``compare``; and the
same for the verdict's other tables: the model check, the held-out widths and the output
equivalence (``MODEL_CHECK_FIELDS``, ``HELD_OUT_FIELDS``, ``EQUIVALENCE_FIELDS``).

A field has a ``key`` (its CSV column and JSON key), a ``header`` (its column in a table), a
``value`` (the plain value from a cell, for CSV and JSON) and a ``text`` (the value as a table
shows it), a ``width`` and an ``align`` for the fixed-width text table. A field with no header
is data only (CSV and JSON); one with no key is text only. A field with a ``unit`` and no
``text`` shows its value through that unit's one formatter (app.core.common.units.UNITS:
"ratio" 1.34x, "signed_percent" +5 %, "fixed2" 0.80, "size" 1.20 GiB).

    headers, rows = table(analysis.cells)   # the window's table: headers + one row of strings per cell
    print(text_table(analysis.cells))        # the CLI's
    cells_csv(analysis.cells), cell_rows(analysis.cells), markdown_table(analysis.cells)

A sweep's cells as JSON, the same shape in ``bench --json``, ``recommend --json`` and the
window's JSON export (the field list's keys, and ``setting`` when the sweep has several):

    sweep_cells(records)                    # one analysis per setting, the cells of all of them
    json_cells(analysis.cells, setting)     # one setting's cells, from an analysis made already
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any, Callable, Iterable, Sequence

from app.core.analysis.analysis import Analysis, CellStats, analyze
from app.core.analysis.compare import Comparison, detect_text
from app.core.analysis.disturbed import disturbance
from app.core.analysis.settings import setting_label, split_by_setting
from app.core.common.units import UNITS, ratio
from app.core.records.schema import RunRecord


@dataclasses.dataclass(frozen=True)
class Field:
    key: str | None  # CSV column / JSON key; None: shown in tables only
    header: str | None  # table column; None: data only
    value: Callable[[Any], Any] = lambda c: None
    text: Callable[[Any], str] | None = None  # the table's text (default: str of the value, "" for None)
    width: int = 0
    align: str = "<"  # "<" or ">"
    unit: str | None = None  # a key of UNITS: the value shown through that unit's formatter

    def shown(self, cell: Any) -> str:
        if self.text is not None:
            return self.text(cell)
        v = self.value(cell)
        if v is None:
            return ""
        return UNITS[self.unit](v) if self.unit else str(v)


def _num(spec: str, suffix: str = "", blank: str = "") -> Callable[[float | None], str]:
    def f(v: float | None) -> str:
        return blank if v is None else format(v, spec) + suffix
    return f


def _speedup_ci(c: CellStats) -> str:
    r = c.ratio
    if r is None:
        return ""
    if r.lo is None:
        return ratio(r.estimate) if r.estimate else "-"
    return f"{ratio(r.estimate)} [{r.lo:.2f}, {r.hi:.2f}]"


def _p_min(c: CellStats) -> float | None:
    return c.arm.p_min if c.arm.k is not None else None


def _r(attr: str) -> Callable[[CellStats], float | None]:
    return lambda c: getattr(c.ratio, attr) if c.ratio else None


_pct = _num(".0f", "%")

CELL_FIELDS: tuple[Field, ...] = (
    Field("task", "task", lambda c: c.task, width=15),
    Field("arm", "arm", lambda c: c.arm.label, width=10),
    Field("k", None, lambda c: c.arm.k),
    Field("p_min", None, _p_min),
    Field("mode", None, lambda c: c.arm.mode),  # llama.cpp's --spec-type ("none": the baseline)
    Field("drafter", None, lambda c: c.arm.drafter),
    Field("draft_sampling", None, lambda c: c.arm.draft_sampling),  # greedy / probabilistic (None: no drafts)
    Field("runs", "runs", lambda c: c.tok_s.n, width=4, align=">"),
    Field("tok_s_median", "tok/s", lambda c: c.tok_s.median,
          lambda c: f"{c.tok_s.median:.1f}" if c.tok_s.median else "-", 8, ">"),
    Field("tok_s_p10", None, lambda c: c.tok_s.p10),
    Field("tok_s_p90", None, lambda c: c.tok_s.p90),
    Field("speedup", "speedup [95% CI]", _r("estimate"), _speedup_ci, 22, ">"),
    Field("speedup_lo", None, _r("lo")),
    Field("speedup_hi", None, _r("hi")),
    Field("verdict", "verdict", lambda c: c.verdict, width=13),
    Field("acceptance", "accept", lambda c: c.acceptance,
          lambda c: _pct(None if c.acceptance is None else 100 * c.acceptance), 7, ">"),
    Field("alpha", "alpha", lambda c: c.alpha, lambda c: _num(".2f")(c.alpha), 6, ">"),
    Field("mean_accepted_len", "len", lambda c: c.mean_accepted_len,
          lambda c: _num(".2f")(c.mean_accepted_len), 5, ">"),
    Field("failed", None, lambda c: c.n_failed),
    Field("not_engaged", None, lambda c: c.not_engaged),  # speculative runs that drafted nothing
)

CELL_COLUMNS = tuple(f.key for f in CELL_FIELDS if f.key)


def _ratio(c: CellStats | None) -> float | None:
    return c.ratio.estimate if c and c.ratio else None


def _verdicts(c: Comparison) -> str:
    """"within noise -> faster  (changed)" only when the difference is significant; a crossing
    that is not is marked as noise."""
    if not c.verdict_changed:
        mark = ""
    elif c.changed or c.change is None:  # no statistics (no records given): the crossing as it is
        mark = "  (changed)"
    else:
        mark = "  (noise, not a change)"
    return " " + (c.a.verdict if c.a else "-") + " -> " + (c.b.verdict if c.b else "-") + mark


def _chg(attr: str) -> Callable[[Comparison], Any]:
    return lambda c: getattr(c.change, attr) if c.change else None


def _change_text(c: Comparison) -> str:
    """B/A with its 95 % interval: of the speedups (a speculative arm) or of tok/s (the baseline)."""
    d = c.change
    if d is None or d.estimate is None:
        return "-"
    if d.lo is None:
        return f"{d.estimate:.2f} [too few runs]"
    return f"{d.estimate:.2f} [{d.lo:.2f}, {d.hi:.2f}]"


def _detect_text(c: Comparison) -> str:
    return detect_text(c.change.detectable if c.change else None).replace(" ", "")


_dash1, _dashx = _num(".1f", blank="-"), _num(".2f", "x", "-")

COMPARE_FIELDS: tuple[Field, ...] = (
    Field("task", "task", lambda c: c.task, width=16),
    Field("arm", "arm", lambda c: c.arm.label, width=12),
    Field("tok_s_a", "tok/s A", lambda c: c.a.tok_s.median if c.a else None,
          lambda c: _dash1(c.a.tok_s.median if c.a else None), 8, ">"),
    Field("tok_s_b", "tok/s B", lambda c: c.b.tok_s.median if c.b else None,
          lambda c: _dash1(c.b.tok_s.median if c.b else None), 8, ">"),
    Field("b_over_a", None, lambda c: c.tok_s_change),  # medians' ratio; the statistics are "change"
    Field("speedup_a", "spd A", lambda c: _ratio(c.a), lambda c: _dashx(_ratio(c.a)), 6, ">"),
    Field("speedup_b", "spd B", lambda c: _ratio(c.b), lambda c: _dashx(_ratio(c.b)), 6, ">"),
    # B/A of the speedups (speculative arms) or of the baseline's tok/s, 95 % Welch interval
    Field("change_of", None, _chg("what")),
    Field("change", "B/A [95% CI]", _chg("estimate"), _change_text, 19, ">"),
    Field("change_lo", None, _chg("lo")),
    Field("change_hi", None, _chg("hi")),
    Field("detectable", "detect", _chg("detectable"), _detect_text, 6, ">"),
    Field("status", "status", lambda c: c.status, width=17),
    Field("changed", None, lambda c: c.changed),
    Field("verdict_a", None, lambda c: c.a.verdict if c.a else None),
    Field("verdict_b", None, lambda c: c.b.verdict if c.b else None),
    Field("verdict_changed", " verdict", lambda c: c.verdict_changed, _verdicts),
)


def _attr(name: str) -> Callable[[Any], Any]:
    return lambda x: getattr(x, name)


# the break-even model against the measurements (app.core.verdict's ModelValidation.checks)
MODEL_CHECK_FIELDS: tuple[Field, ...] = (
    Field("task", "task", _attr("task"), width=15),
    Field("k", "K", _attr("k"), lambda c: f"K={c.k}", 3),
    Field("p_min", None, _attr("p_min")),
    Field("alpha", "alpha", _attr("alpha"), width=5, align=">", unit="fixed2"),
    Field("predicted", "predicted", _attr("predicted"), width=9, align=">", unit="ratio"),
    Field("measured", "measured", _attr("measured"), width=8, align=">", unit="ratio"),
    Field("error", "error", _attr("error"), width=6, align=">", unit="signed_percent"),
)

# each measured K predicted from the task's other K by acceptance per draft position (ModelValidation.held_out)
HELD_OUT_FIELDS: tuple[Field, ...] = (
    Field("task", "task", _attr("task"), width=15),
    Field("k", None, _attr("k")),
    Field("p_min", None, _attr("p_min")),
    Field("fit_ks", None, lambda h: list(h.fit_ks)),
    Field(None, "K from", text=lambda h: f"K={h.k} from K={','.join(map(str, h.fit_ks))}", width=14),
    Field("predicted", "predicted", _attr("predicted"), width=9, align=">", unit="ratio"),
    Field("measured", "measured", _attr("measured"), width=8, align=">", unit="ratio"),
    Field("error", "error", _attr("error"), width=6, align=">", unit="signed_percent"),
    Field("extrapolated", "", _attr("extrapolated"),
          lambda h: "extrapolated past the measured positions" if h.extrapolated else ""),
)

# greedy runs against the baseline's tokens (Analysis.equivalence); the rep counted from 1 as shown
EQUIVALENCE_FIELDS: tuple[Field, ...] = (
    Field("task", "task", _attr("task")),
    Field("prompt_id", "prompt", _attr("prompt_id")),
    Field("arm", "arm", lambda e: e.arm.label),
    Field("rep", "rep", _attr("rep"), lambda e: str(e.rep + 1), align=">"),
    Field("equal", "same tokens as baseline", _attr("equal"), lambda e: "yes" if e.equal else "NO"),
    Field("first_divergence", "first difference", _attr("first_divergence"),
          lambda e: "" if e.first_divergence is None else f"token {e.first_divergence}"),
    Field("margin", "top-2 margin there", _attr("margin"), lambda e: "" if e.margin is None else f"{e.margin:.3f}",
          align=">"),
)


def _shown(fields: Sequence[Field]) -> list[Field]:
    return [f for f in fields if f.header is not None]


def _headers(cols: Sequence[Field]) -> list[str]:
    """The headers of fields that _shown kept (each has one)."""
    return [f.header for f in cols if f.header is not None]


def table(items: Iterable[Any], fields: Sequence[Field] = CELL_FIELDS) -> tuple[list[str], list[list[str]]]:
    """(headers, one row of shown strings per item): what a table widget needs."""
    cols = _shown(fields)
    return _headers(cols), [[f.shown(c) for f in cols] for c in items]


def text_table(items: Iterable[Any], fields: Sequence[Field] = CELL_FIELDS, rule: bool = True) -> str:
    """The fixed-width table (with a rule under its header unless ``rule`` is False); a column
    wider than its field's width (an arm label like "draft-simple K=3 p=0.5") widens to fit."""
    cols = _shown(fields)
    rows = [[f.shown(c) for f in cols] for c in items]
    widths = [max([f.width, *(len(r[i]) for r in rows)]) for i, f in enumerate(cols)]

    def line(vals: Sequence[str]) -> str:
        return " ".join(format(v, f"{f.align}{w}") for f, w, v in zip(cols, widths, vals))

    head = line(_headers(cols))
    return "\n".join([head] + (["-" * len(head)] if rule else []) + [line(r) for r in rows])


def format_analysis(a: Analysis) -> str:
    """The analysis as the CLI prints it: the per-cell table, then each warning with its fix."""
    lines = [text_table(a.cells)]
    if a.findings:
        lines.append("")
        lines += [f"warning: {f.message} -> {f.fix}" for f in a.findings]
    return "\n".join(lines)


def markdown_table(items: Iterable[Any], fields: Sequence[Field] = CELL_FIELDS) -> str:
    cols = _shown(fields)

    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    rows = ["| " + " | ".join(h.strip() for h in _headers(cols)) + " |",
            "|" + "|".join("---:" if f.align == ">" else "---" for f in cols) + "|"]
    rows += ["| " + " | ".join(esc(f.shown(c)) for f in cols) + " |" for c in items]
    return "\n".join(rows)


def cell_rows(items: Iterable[Any], fields: Sequence[Field] = CELL_FIELDS) -> list[dict[str, Any]]:
    """One dict per item (JSON): the fields' keys and plain values."""
    keyed = [(f.key, f.value) for f in fields if f.key]
    return [{key: value(c) for key, value in keyed} for c in items]


def cells_csv(items: Iterable[Any], fields: Sequence[Field] = CELL_FIELDS) -> str:
    keyed = [f.key for f in fields if f.key]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keyed, lineterminator="\n")
    w.writeheader()
    for row in cell_rows(items, fields):
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def json_cells(cells: Iterable[CellStats], setting: str = "") -> list[dict[str, Any]]:
    """One setting's cells as JSON: the field list's keys and values, and the setting's label
    (``setting``) when the sweep has several settings ("" leaves the key out)."""
    rows = cell_rows(cells)
    return [{**r, "setting": setting} for r in rows] if setting else rows


def sweep_cells(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """A sweep's cells as JSON: one analysis per setting (sampler, thinking, depth; runs pair only
    within one), each cell with its setting's label when the sweep has several."""
    out: list[dict[str, Any]] = []
    for runs in list(split_by_setting(records).values()) or [list(records)]:
        out += json_cells(analyze(runs).cells, setting_label(runs, records))
    return out


def sweep_text(records: Sequence[RunRecord]) -> str:
    """A sweep's per-cell table and findings, from one analysis per setting (a section per setting
    when it has several)."""
    parts = []
    for runs in list(split_by_setting(records).values()) or [list(records)]:
        a = analyze(runs)
        label = setting_label(runs, records)
        if a.cells:
            parts.append((f"== {label} ==\n" if label else "") + format_analysis(a))
    return "\n\n".join(parts) if parts else no_cells_text(records)


def no_cells_text(records: Sequence[RunRecord]) -> str:
    """Why a sweep has no cell to show: no run finished, or how many did and why none counts
    (disturbed by other programs, or paired with such runs), never "no finished runs" when runs finished."""
    ok = [r for r in records if r.status == "ok"]
    if not ok:
        return "no finished runs"
    d = disturbance(ok)
    if d is not None:
        return (f"{len(ok)} runs finished, and none counts: {d.sentence()}; disturbed runs, and the runs paired "
                "with them, are left out of the numbers; close the busy programs and run again")
    return f"{len(ok)} runs finished, and none counts toward a cell"
