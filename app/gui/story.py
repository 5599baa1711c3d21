"""One story on every screen: each task's answer, and the mix's, read once from the AppState's
verdict, so that the Start page, the Results banner and its plot, the Sweep tab's decisions and
Export never tell the same sweep three ways.

An answer has a state (``State``): *decided* (sure: turn it on, or leave it off because it is
slower), *provisional* (an answer from runs on a busy machine, to confirm when it is quiet),
*withheld* (the machine was too busy to say anything) or *undecided* (within noise, too few runs,
or output that repeats itself). Each state has its word and its colour; only a decided answer
may be green, only a decided one may say "decided", and a withheld one never says "faster".

    for a in answers(v):   # each task first, then the mix (when there are several tasks)
        a.name, a.line, a.color, a.state, a.command.export

A sweep of placements over RPC workers has one more line, the sweep's (``where_story``): the
placement that pays, whose setting the window then judges, so the banner's rows and Export follow it;
the banner and Export show it alike (``where_line``), marked provisional or withheld as the rows are.
"""

from __future__ import annotations

import dataclasses
import enum
import html
from typing import TYPE_CHECKING, Iterable, Sequence

from app.core.analysis.decide import NO_GAIN
from app.core.common.errors import UserError
from app.core.common.text import printable

from .words import BUSY, OFF, ON, UNSURE, mix_name, task_name, verdict_line

if TYPE_CHECKING:  # numpy-backed: loaded with the first results
    from app.core.analysis.recommend import Pick
    from app.core.records.cost import CostRecord
    from app.core.records.schema import RunRecord
    from app.core.verdict import Command, Verdict


class State(enum.Enum):
    """Where one answer stands; its value is the word the window shows for it."""

    DECIDED = "decided"
    PROVISIONAL = "provisional"
    WITHHELD = "withheld"
    UNDECIDED = "undecided"

    @property
    def sure(self) -> bool:
        return self is State.DECIDED


GREY = "#757575"  # a withheld answer: no colour that reads as a result


@dataclasses.dataclass(frozen=True)
class Answer:
    """One scope's answer: a task's, or the mix's (``scope`` "")."""

    scope: str
    name: str  # "Code", "Your mix (code 50 %, stories 50 %)"
    pick: Pick
    state: State
    line: str  # "Code: turn MTP on, K=2 -> 1.34x faster (1.20-1.49, sure)"
    color: str
    command: Command  # its llama-server command (``command.export`` None: none can be shown)

    @property
    def has_command(self) -> bool:
        return self.command.export is not None


def state_of(v: Verdict, pick: Pick, scope: str) -> State:
    """The state of ``pick`` (a task's, or the mix's for ``scope`` "") in the verdict ``v``."""
    if v.withheld:
        return State.WITHHELD
    if v.is_provisional(scope):  # answered from runs measured while the machine was busy
        return State.PROVISIONAL
    r = pick.ratio
    if pick.arm is not None:  # sure: on pairs of its own (Pick.sure)
        return State.DECIDED if pick.sure and not v.repeats(scope) else State.UNDECIDED
    if r is None or r.estimate is None:  # nothing measured could be turned on: leave it off
        return State.DECIDED
    # leave it off, decided: slower, or no gain worth having (app.core.analysis.decide's words)
    return State.DECIDED if r.verdict == "slower" or pick.outcome == NO_GAIN else State.UNDECIDED


def answer(v: Verdict, scope: str) -> Answer:
    """The answer for a task, or for the mix (``scope`` "")."""
    pick = next(p for p in v.per_task if p.scope == scope) if scope else v.pick
    name = task_name(scope) if scope else mix_name(v.mix)
    state = state_of(v, pick, scope)
    line, color = verdict_line(pick, name, v.withheld, v.repeats(scope), v.is_provisional(scope))
    if state is State.WITHHELD:
        color = GREY
    elif not state.sure and color in (ON, OFF):  # only a decided answer is green (or red)
        color = UNSURE
    return Answer(scope, name, pick, state, line, color, v.command(scope))


def answers(v: Verdict) -> list[Answer]:
    """Each task's answer, then the mix's when the sweep has several tasks (with one task, its
    answer is the mix's too)."""
    out = [answer(v, p.scope) for p in v.per_task]
    return out + [answer(v, "")] if len(out) > 1 else out


def task_states(v: Verdict) -> dict[str, State]:
    """Each task's state, by task name."""
    return {p.scope: state_of(v, p, p.scope) for p in v.per_task}


def answer_html(v: Verdict) -> str:
    """Each task's answer in bold, then the mix's (app.gui.story: the words and colours of every
    other tab), and why when the last line leaves it off."""
    parts = [f'<span style="color:{a.color}; font-weight:{"bold" if a.scope else "normal"}">'
             f'{html.escape(printable(a.line, one_line=True))}</span>' for a in answers(v)]
    last = v.pick if len(v.per_task) > 1 else v.per_task[0]
    why = "" if last.arm is not None or v.withheld else f"<br>Why: {html.escape(printable(last.reason))}"
    return "<br>".join(parts) + why


def where_story(records: Sequence[RunRecord], mix: str | None = None,
                cost_records: Iterable[CostRecord] = ()) -> tuple[int, str]:
    """For a sweep of placements of the draft over RPC workers (bench --placements): the setting
    to judge first, the placement that pays (the joint verdict of the core's one entry,
    verdict.judge, priced by ``cost_records`` as the window's verdict is, so that the Results rows
    and Export answer with its flags), and its sentence ("over this link keep the MTP block on
    this machine: K=2 1.30x ..."); (0, "") for any other sweep."""
    ok = [r for r in records if r.status == "ok"]
    if len({r.server_args for r in ok}) < 2:  # one setting of the server's flags: no placements
        return 0, ""
    from app.core.verdict.judge import judge  # numpy: with the first results

    # a bad task mix: equal weights, as the verdict then is
    jv = judge(ok, cost_records=cost_records, mix=mix, setting=0, lenient_mix=True).joint
    if jv is None or not jv.placements:
        return 0, ""
    return jv.values.index(jv.best), jv.sentence


def where_line(where: str, v: Verdict | None, setting: str = "") -> str:
    """The line on where drafting runs (where_story's sentence) as the Results banner and Export
    show it, marked as the answers under it are: withheld or provisional when their runs were
    disturbed, so that a plain placement never stands above rows that say "for now" ("" for a
    sweep without placements). ``setting``: the placement whose command Export shows (the
    setting the window judges, which the user may change on Results)."""
    if not where:
        return ""
    mark = ("" if v is None else " (withheld: the machine was busy)" if v.withheld
            else f" ({BUSY})" if v.provisional else "")
    return f"Where drafting runs: {where}{mark}" + (f"\nThe command below is for: {setting}" if setting else "")
