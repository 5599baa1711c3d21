"""The watch itself: attach to a running llama-server, read its counters every few seconds,
and at the end summarise the window: counts, predictions, the recommendation, the watch record.
The CLI and the window drive the same ``Watcher``: ``attach``, then ``poll`` on their own clock,
then ``summary``."""

from __future__ import annotations

import dataclasses
import logging
import shlex
import time
from pathlib import Path, PurePath
from typing import Any, Iterator

from app.core.analysis import breakeven
from app.core.common.cancel import CancelToken
from app.core.common.errors import Cancelled, UserError
from app.core.common.paths import results_dir
from app.core.common.redact import redact
from app.core.records.check import MAX_TEXT
from app.core.common.text import shown, slug
from app.core.records.cost import CostRecord
from app.core.records.reader import load_cost_records
from app.core.records.schema import SCHEMA_VERSION, host_info, new_id, utc_now
from app.core.records.watch import RECORD_TYPE, WatchPrediction, WatchRecord
from app.core.records.watch import mode_of as mode_of  # the front ends take it from here
from app.core.records.writer import append_line
from app.core.watch import predict as P
from app.core.watch.client import Client, is_local
from app.core.watch.costs import ServerInfo, find_costs
from app.core.watch.metrics import MAX_POSITIONS, Reading, parse
from app.core.watch.window import Counts, Tracker


log = logging.getLogger("mtp_tuner")

SLOTS_EVERY = 0.5  # seconds between /slots reads (the requests seen) within an interval
SLOTS_BUDGET = 2.0  # the longest one /slots read may take (it answers in milliseconds)
END_GRACE = 1.0  # the last reading, taken at the window's end, may take this long


class MetricsOff(UserError):
    """The server does not serve /metrics (started without --metrics)."""


def with_metrics(command: str | None) -> str | None:
    """The user's llama-server command with --metrics added (None when none was given)."""
    if not command or not command.strip():
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    if "--metrics" in words:
        return command.strip()
    return command.strip() + " --metrics"


def metrics_off_message(url: str, command: str | None = None) -> str:
    fixed = with_metrics(command)
    how = f": {fixed}" if fixed else " (e.g. llama-server -m MODEL.gguf ... --metrics)"
    return (f"{url} does not serve /metrics, which watch counts with: restart the server with --metrics"
            f"{how}")


@dataclasses.dataclass(frozen=True)
class Update:
    counts: Counts
    server_k: int | None
    spec_types: str | None
    note: str | None  # a restart, a server that does not answer


@dataclasses.dataclass(frozen=True)
class Summary:
    counts: Counts
    server: ServerInfo
    server_k: int | None
    spec_types: str | None
    predictions: list[P.Prediction]
    recommendation: P.Recommendation
    costs_line: str | None  # which probe priced it, or why none could
    record: WatchRecord
    notes: list[str]
    warning: str | None = None  # why the window has no interpretation (its counts stand, and are saved)

    def to_json(self) -> dict[str, Any]:
        """The issue's shape, and ``requests_at_least`` (true: ``requests`` is a lower bound)."""
        c = self.counts
        return {"accepted_per_pos": list(c.accepted_per_pos), "draft_steps": c.draft_steps,
                "draft_tokens": c.draft_tokens, "accepted": c.accepted, "requests": c.requests,
                "requests_at_least": True,  # seen finishing in /slots: /metrics has no request counter
                "predicted": [{"k": p.k, "speedup": round(p.speedup, 4), "lo": round(p.lo, 4), "hi": round(p.hi, 4),
                               "extrapolated": p.extrapolated} for p in self.predictions],
                "recommendation": {"k": self.recommendation.k, "reason": self.recommendation.reason}}


def _outside(value: Any, limit: int = 32_767) -> str | None:
    """A string a server reported (/props, /slots), or None when it is not one (a number, a list,
    empty, longer than ``limit``: no path is longer, even on Windows). A lone surrogate, which no
    file or terminal can take, becomes U+FFFD."""
    if not isinstance(value, str) or not value or len(value) > limit:
        return None
    if any("\ud800" <= c <= "\udfff" for c in value):
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


class Watcher:
    """``cancel`` ends a read in flight (it raises Cancelled inside, which ``watch`` ends the window
    on); ``deadline`` (time.monotonic()) is the time no read runs past, set by ``watch``."""

    def __init__(self, client: Client, command: str | None = None, cancel: CancelToken | None = None):
        self.client = client
        self.command = command  # the user's llama-server command, to show it with --metrics
        self.cancel = cancel or CancelToken()
        self.deadline: float | None = None
        self.tracker = Tracker()
        self.server: ServerInfo | None = None
        self.spec_types: str | None = None
        self.notes: list[str] = []
        self._found: dict[tuple[Any, ...], tuple[CostRecord | None, str]] = {}  # find_costs per server and --costs
        self._t_attach: float | None = None

    # -- reading ---------------------------------------------------------------------------

    def _until(self, budget: float | None = None) -> float | None:
        """The deadline of one read: the watch's, or ``budget`` seconds from now if sooner."""
        if budget is None:
            return self.deadline
        soon = time.monotonic() + budget
        return soon if self.deadline is None else min(self.deadline, soon)

    def _reading(self) -> Reading:
        page = self.client.get("/metrics", self._until(), self.cancel)
        if page.status != 200:
            raise MetricsOff(metrics_off_message(self.client.url, self.command))
        r = parse(page.body, page.t, page.headers.get("process-start-time-unix"))
        if not r.has_spec:
            raise MetricsOff(f"{self.client.url}: /metrics has no speculative counters "
                             "(llamacpp:spec_decode_num_drafts_total): a llama.cpp too old to count drafts")
        if r.ignored:
            note = (f"/metrics names draft position {', '.join(r.ignored)}: past {MAX_POSITIONS}, which no "
                    "llama-server drafts; left out")
            if note not in self.notes:
                self.notes.append(note)
        return r

    def _props(self) -> None:
        props = self.client.get_json("/props", self._until(), self.cancel)
        props = props if isinstance(props, dict) else {}
        mp, build = props.get("model_path"), props.get("build_info")
        if isinstance(mp, str) and "\x00" in mp:
            raise UserError(f"{self.client.url}: /props names a model path holding a NUL character, which no "
                            "file path holds: not a llama-server's answer")
        # a path longer than a record's text may be (records.check.MAX_TEXT) is no path: not kept, so
        # the window's record stays readable
        self.server = ServerInfo(self.client.url, _outside(mp, MAX_TEXT), _outside(build, 200),
                                 is_local(self.client.url))

    def _slots(self, until: float | None = None) -> None:
        """Read /slots (what mode the server runs; the requests seen); never raises but Cancelled.
        The read ends by ``until`` when given, and within SLOTS_BUDGET seconds."""
        end = self._until(SLOTS_BUDGET)
        if until is not None and end is not None:
            end = min(end, until)
        try:
            slots = self.client.get_json("/slots", end, self.cancel)
        except UserError:
            return
        if isinstance(slots, list):
            for s in slots:
                if not isinstance(s, dict):
                    continue
                params = s.get("params")
                t = _outside(params.get("speculative.types"), 200) if isinstance(params, dict) else None
                if t is not None:
                    self.spec_types = t
                elif self.spec_types is None and isinstance(s.get("speculative"), bool):
                    # before its first task a slot says only whether it drafts
                    self.spec_types = "speculative" if s["speculative"] else "none"
            self.tracker.feed_slots(slots)

    def attach(self) -> Update:
        """The first reading. Raises UserError when the server does not answer, is still
        loading, or has no /metrics (MetricsOff); Cancelled when cancelled."""
        self._t_attach = time.monotonic()
        health = self.client.get("/health", self._until(), self.cancel)
        if health.status == 503:
            raise UserError(f"{self.client.url}: the server is still loading its model; try again in a moment")
        self.tracker.feed(self._reading())
        self._props()
        self._slots()
        return self._update(None)

    def poll(self) -> Update:
        """One more reading. A server that does not answer (restarting) is a note, not an error;
        a restart or a reset starts a new window. Raises Cancelled when cancelled."""
        try:
            r = self._reading()
        except MetricsOff as e:
            return self._update(f"{e} (a restart without --metrics?)")
        except UserError as e:
            return self._update(f"the server does not answer (restarting?); still watching: {e}")
        new = self.tracker.feed(r)
        note = None
        if new:
            note = f"{self.tracker.notes[-1]}: a new window starts here"
            self.notes.append(note)
            try:
                self._props()  # it may serve another model now
            except UserError:
                pass
        self._slots()
        return self._update(note)

    def _update(self, note: str | None) -> Update:
        c = self.tracker.counts()
        assert c is not None
        return Update(c, self.tracker.server_k, self.spec_types, note)

    def watch(self, duration: float, interval: float, cancel: CancelToken | None = None,
              slots_every: float = SLOTS_EVERY) -> Iterator[Update]:
        """Updates every ``interval`` seconds for ``duration`` seconds from the attach (attach
        first, unless done already); stops early when cancelled, without raising. No read runs
        past the end by more than END_GRACE seconds, however slowly the server answers. Between
        readings ``/slots`` is read every ``slots_every`` seconds, so short requests are seen too."""
        if cancel is not None:
            self.cancel = cancel
        cancel = self.cancel
        attached = self.tracker.last is not None and self._t_attach is not None
        t_end = (self._t_attach if attached and self._t_attach is not None else time.monotonic()) + duration
        self.deadline = t_end + END_GRACE
        if not attached:
            yield self.attach()  # Cancelled here: nothing was read, the caller hears of it
        try:
            while True:
                t_next = min(time.monotonic() + interval, t_end)
                while (left := t_next - time.monotonic()) > 0:
                    if cancel.wait(min(slots_every, left)):
                        return  # the last reading stands
                    if t_next - time.monotonic() > 0.05:
                        self._slots(until=t_next)
                u = self.poll()
                yield u
                if t_next >= t_end or cancel.cancelled:
                    return
        except Cancelled:
            return  # stopped inside a read: the last reading stands

    # -- the end -----------------------------------------------------------------------------

    def summary(self, costs: str | None = None, cost_files: list[Path] | None = None,
                min_steps: int = P.MIN_STEPS) -> Summary:
        """The window so far: its counts and its record, whatever happens to their interpretation
        (a results file, a cost record or a model path that will not go becomes the summary's
        ``warning``, and the record is saved without a prediction)."""
        counts = self.tracker.counts()
        if counts is None or self.server is None:
            raise UserError("nothing was read from the server")
        k = self.tracker.server_k
        here = host_info()  # as the probe keeps it
        warning = None
        try:
            preds, reco, costs_line, rec = self._interpret(counts, k, here, costs, cost_files, min_steps)
        except Exception as e:  # noqa: BLE001 - nothing in interpreting may lose the window
            if not isinstance(e, UserError):  # the window's log keeps the details (info: not on a CLI's stderr)
                log.info("watch: the window could not be interpreted", exc_info=True)
            warning = f"no prediction for this window: {shown(redact(e) or type(e).__name__, 300)}"
            preds, reco, costs_line, rec = [], P.Recommendation(None, warning), None, None
        record = WatchRecord(
            schema_version=SCHEMA_VERSION, record_type=RECORD_TYPE, run_id=new_id(), timestamp_utc=utc_now(),
            url=self.client.url, model_path=self.server.model_path or "", llama_build=self.server.build,
            spec_types=self.spec_types, server_k=k, seconds=round(counts.seconds, 3), restarts=counts.restarts,
            requests=counts.requests, generated=counts.generated, draft_steps=counts.draft_steps,
            draft_tokens=counts.draft_tokens, accepted=counts.accepted, accepted_per_pos=counts.accepted_per_pos,
            decode_tok_s=counts.decode_tok_s, cost_run_id=rec.run_id if rec is not None and preds else None,
            predicted=tuple(WatchPrediction(p.k, p.speedup, p.lo, p.hi, p.extrapolated) for p in preds),
            recommendation_k=reco.k, reason=reco.reason, host=here)
        notes = list(self.notes)
        if counts.inexact:
            notes.append(f"counters printed inexactly by the server (past a million): {', '.join(counts.inexact)}")
        return Summary(counts, self.server, k, self.spec_types, preds, reco, costs_line, record, notes, warning)

    def _interpret(self, counts: Counts, k: int | None, here: dict[str, Any], costs: str | None,
                   cost_files: list[Path] | None, min_steps: int
                   ) -> tuple[list[P.Prediction], P.Recommendation, str | None, CostRecord | None]:
        """The predictions and the recommendation of a window, priced by a matching cost record."""
        assert self.server is not None
        drafting = self.spec_types is None or any(t != "none" for t in self.spec_types.split(","))
        if not k or counts.draft_steps == 0:
            why = ("the server does not draft (it runs without --spec-type draft-mtp): there is no acceptance "
                   "to measure; start it with --spec-type draft-mtp to see what MTP would do for this work"
                   if not drafting else "no draft was verified in the window: no speculative traffic to judge "
                   "(watch while the server is in use)")
            return [], P.Recommendation(None, why), None, None
        if counts.draft_steps < min_steps:
            return [], P.Recommendation(None, f"only {counts.draft_steps} verification steps in the window "
                                              f"({P.duration(counts.seconds)}): too few to predict (at least "
                                              f"{min_steps}); watch longer or while the server is busier"), None, None
        key = (self.server, costs, tuple(cost_files) if cost_files is not None else None)
        if key not in self._found:  # read the results files once per server (it may restart as another)
            self._found[key] = find_costs(self.server, here, cost_files, costs)
        rec, costs_line = self._found[key]
        if rec is None:
            return [], P.Recommendation(None, f"no prediction: {costs_line}"), costs_line, None
        preds = P.predict(counts, k, breakeven.Costs.from_probe(rec))
        return preds, P.recommend(preds, counts, k), costs_line, rec


def check_costs(costs: str | None) -> None:
    """Refuse, before a watch begins, a ``--costs`` file that is not there, cannot be read or holds
    no cost-probe record (a typo found after an hour's window would cost the hour)."""
    if not costs:
        return
    p = Path(costs).expanduser()
    try:
        if not p.is_file():
            raise UserError(f"{shown(p)}: results file not found (--costs)")
        found = load_cost_records(p)
    except UserError as e:
        raise UserError(shown(redact(e), 400)) from None
    except Exception as e:  # noqa: BLE001 - a hostile file: one line, never a traceback
        raise UserError(f"{shown(p)}: not a results file with a cost probe ({type(e).__name__}) (--costs)") from None
    if not found:
        raise UserError(f"{shown(p)}: no cost-probe record in this results file (--costs); make one with "
                        "`mtp-tuner probe --engine server --out RESULTS.jsonl`")


def default_record_path(server: ServerInfo) -> Path:
    """watch-MODEL.jsonl in the results folder, MODEL the served model's file name as a safe piece
    of a file name (the server says it: no escape, line break or path reaches the name)."""
    stem = slug(PurePath(server.model_path.replace("\\", "/")).stem, empty="server") if server.model_path \
        else "server"
    return results_dir() / f"watch-{stem}.jsonl"


def save(record: WatchRecord, path: str | Path) -> None:
    """Append the watch record to a results file (a UserError naming the file when it cannot)."""
    append_line(path, record.to_json())


@dataclasses.dataclass(frozen=True)
class Live:
    """What the window shows after each reading: the window so far, summarised (predictions
    included where a cost record matches); ``final`` once the watch ended, with where its record
    went (or why it could not be saved)."""

    summary: Summary
    note: str | None
    final: bool = False
    saved_to: Path | None = None
    save_error: str | None = None


def run_watch(client: Client, duration: float, interval: float, *, costs: str | None = None,
              out: str | Path | None = None, command: str | None = None,
              cancel: CancelToken | None = None) -> Iterator[Live]:
    """The whole watch for a front end: attach, a Live after every reading, and a final one
    once the duration is over or the watch is cancelled (the record appended to ``out``, else
    to watch-MODEL.jsonl in the results folder). ``costs`` is checked before the watch begins;
    nothing in interpreting the window keeps its record from being saved (Summary.warning)."""
    check_costs(costs)
    w = Watcher(client, command, cancel)
    for u in w.watch(duration, interval):
        yield Live(w.summary(costs=costs), u.note)
    s = w.summary(costs=costs)
    path = Path(out) if out else default_record_path(s.server)
    try:
        save(s.record, path)
    except UserError as e:
        yield Live(s, None, True, None, shown(redact(e), 400))
        return
    yield Live(s, None, True, path)
