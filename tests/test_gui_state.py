"""The window's seams: each tab is a QWidget built with an AppState and the services it uses, and
tabs talk only through the state. An AST check fails if a tab module imports another tab module or
reaches into another tab; each tab is then built alone (no MainWindow) and driven through the
AppState's signals. The job registry runs every worker and cancels them all."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6")


from app.core.engines.base import EngineKind  # noqa: E402
from conftest import ROOT, make_tab  # noqa: E402

TABS_DIR = ROOT / "app" / "gui" / "tabs"
# a tab is a module of tabs/ or a package of its parts (tabs/sweep/, tabs/results/)
TAB_MODULES = sorted(p for p in TABS_DIR.rglob("*.py") if p.name != "__init__.py" or p.parent != TABS_DIR)
# what a tab may touch on itself and on the state; every other object's attributes are its own business,
# but no tab may name another tab (its module, class, or the window that holds them all)
TAB_CLASSES = {"StartTab", "MachineTab", "ModelTab", "PromptsTab", "SweepTab", "ResultsTab", "ExportTab", "WatchTab",
               "MainWindow"}
TAB_CLASS_OF = {"start": "StartTab", "machine": "MachineTab", "model": "ModelTab", "prompts": "PromptsTab", "sweep": "SweepTab",
                "results": "ResultsTab", "export": "ExportTab", "watch": "WatchTab"}
TAB_ATTRS = {"start_tab", "machine_tab", "model_tab", "prompts_tab", "sweep_tab", "results_tab", "export_tab", "watch_tab",
             "tabs", "window"}


def tab_of(path: Path, tabs_dir: Path = TABS_DIR) -> str:
    """The tab a file belongs to: its module's name, or its package's (a part of a tab folder)."""
    return path.stem if path.parent == tabs_dir else path.parent.name


def tab_violations(path: Path, tabs_dir: Path = TABS_DIR) -> list[str]:
    """Ways the tab file at ``path`` reaches past the AppState into another tab (the parts of a tab
    folder may import each other)."""
    tree = ast.parse(path.read_text(), str(path))
    own = tab_of(path, tabs_dir)
    tabs_level = 1 if path.parent == tabs_dir else 2  # the relative level at which a name is a tab
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = ("." * node.level) + (node.module or "")
            names = [a.name for a in node.names]
            if node.level == tabs_level and node.module is None:  # from . import sweep
                out += [f"imports tab module {n}" for n in names if n != own]
            elif node.level == tabs_level or mod.startswith("app.gui.tabs."):  # from .sweep import SweepTab
                parts = (node.module or "").split(".")
                head = parts[3] if mod.startswith("app.gui.tabs.") else parts[0]
                if head != own:
                    out.append(f"imports tab module {head}")
            elif mod.endswith("main_window"):
                out.append("imports the main window")
            out += [f"imports {n}" for n in names if n in TAB_CLASSES - {_class_of(tree), TAB_CLASS_OF.get(own)}]
        elif isinstance(node, ast.Import):
            out += [f"imports {a.name}" for a in node.names if a.name.startswith("app.gui.tabs.")
                    and a.name.split(".")[3] != own]
        elif isinstance(node, ast.Attribute) and node.attr in TAB_ATTRS:
            out.append(f"touches .{node.attr} (another tab, or the window's tabs)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"}:
            out.append(f"{node.func.id}() guard (a tab reads only its own attributes and the state's)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in {"parent", "parentWidget", "window", "topLevelWidget", "findChild", "findChildren"}:
            out.append(f"calls .{node.func.attr}() (reaching the window or another tab)")
    return out


def _class_of(tree) -> str | None:
    return next((n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name in TAB_CLASSES), None)


def test_there_is_one_tab_module_or_folder_per_tab():
    assert {tab_of(p) for p in TAB_MODULES} == {"start", "machine", "model", "prompts", "sweep", "results", "export",
                                                "watch"}
    assert {p.parent.name for p in TAB_MODULES if p.parent != TABS_DIR} == {"start", "sweep", "results", "machine"}


@pytest.mark.parametrize("path", TAB_MODULES, ids=lambda p: str(p.relative_to(TABS_DIR)))
def test_a_tab_reads_only_its_own_widgets_and_the_state(path):
    assert tab_violations(path) == []


def test_the_tab_check_bites(tmp_path):
    """A tab that reaches into another one is caught, whichever way it does it (from a tab module
    or from a part of a tab folder)."""
    tabs = tmp_path / "tabs"
    (tabs / "results").mkdir(parents=True)
    src = (TABS_DIR / "results" / "tab.py").read_text()
    for p, bad in ((tabs / "results" / "tab.py", "from ..sweep.tab import SweepTab\n"),
                   (tabs / "results" / "tab.py", "from .. import sweep\n"),
                   (tabs / "results" / "tab.py", "from ..export import ExportTab\n"),
                   (tabs / "export.py", "from .sweep import SweepTab\n"),
                   (tabs / "export.py", "from . import sweep\n"),
                   (tabs / "results" / "tab.py", "import app.gui.tabs.sweep.tab\n"),
                   (tabs / "results" / "tab.py", "from app.gui.tabs.sweep.plots import LivePlots\n"),
                   (tabs / "results" / "tab.py", "def f(self):\n    self.window().sweep_tab.k_edit.setText('1')\n"),
                   (tabs / "results" / "tab.py", "def f(self):\n    getattr(self, 'k_edit', None)\n")):
        p.write_text(src + "\n" + bad)
        assert tab_violations(p, tabs), bad
        p.unlink()
    (tabs / "results" / "tab.py").write_text(src + "\nfrom .card import CardDialog\n")
    assert tab_violations(tabs / "results" / "tab.py", tabs) == []  # its own parts: fine


# -- each tab alone, with an AppState and its services-----------------------------------------------


@pytest.fixture
def demo_records(state, qtbot):
    """A finished demo sweep's records and file, made by the Sweep tab alone."""
    from app.gui.tabs.sweep import SweepTab

    sweep = make_tab(SweepTab, state)
    qtbot.addWidget(sweep)
    state.sweep_tab_for_test = sweep
    state.use_demo_model()
    sweep.form.k_edit.setText("1,2")
    sweep.form.npredict.setValue(16)
    sweep.form.reps.setValue(1)
    with qtbot.waitSignal(state.sweep_finished, timeout=120000):
        sweep.start_btn.click()
    assert not state.errors
    return list(state.records), state.results_path


def test_sweep_tab_alone_publishes_the_sweep_and_one_verdict(state, qtbot, demo_records):
    records, path = demo_records
    assert {r.task for r in records} == {"code", "story", "tongue-twister"} and path.is_file()
    v = state.verdict
    assert v is not None and v.records == tuple(records) and v.export is not None  # built once, in the state
    seen = []
    state.verdict_changed.connect(seen.append)
    state.set_task_mix("code=1")
    assert seen == [state.verdict] and state.verdict.mix == {"code": 1.0}
    state.set_task_mix("nonsense")
    assert "nonsense" in state.mix_error and state.verdict is not None  # the table still shows


def test_results_and_export_tabs_alone_render_the_states_verdict(state, qtbot, demo_records, tmp_path):
    from app.gui.tabs.export import ExportTab
    from app.gui.tabs.results import ResultsTab

    records, path = demo_records
    results, export = make_tab(ResultsTab, state), make_tab(ExportTab, state)
    for t in (results, export):
        qtbot.addWidget(t)
    state.set_results(records, path)  # what opening a sweep or finishing one does
    v = state.verdict
    assert results.table.rowCount() == len(v.analysis.cells) == 9
    assert export.command.toPlainText() == v.export.command and v.pick.reason in export.verdict_label.text()
    export.shell_box.setCurrentText("powershell")  # the shell is part of the verdict's export
    assert state.verdict.export.shell == "powershell" and export.command.toPlainText().startswith("& ")
    out = results.export_data("json", str(tmp_path / "v.json"))
    assert json.loads(open(out).read())["command"] == state.verdict.export.command


def test_run_again_is_a_request_the_sweep_tab_answers(state, qtbot, demo_records):
    """Results asks through the state (sweep_requested with the plan); the Sweep tab shows the plan
    in its own widgets and runs it; Results compares the two when it finishes."""
    from app.gui.tabs.results import ResultsTab

    records, path = demo_records
    sweep = state.sweep_tab_for_test  # the fixture's Sweep tab; Results knows nothing of it
    sweep.form.k_edit.setText("3")  # the form changed since: Run again still repeats the shown sweep
    results = make_tab(ResultsTab, state)
    qtbot.addWidget(results)
    requested = []
    state.sweep_requested.connect(requested.append)
    with qtbot.waitSignal(state.sweep_finished, timeout=120000):
        results.run_again()
    assert len(requested) == 1 and requested[0].reps == 1
    assert state.results_path != path and len(state.records) == len(records)
    assert results.compare_label.text().startswith(f"A: {path}\nB: {state.results_path}")
    assert sweep.form.k_edit.text() == "1,2"  # the Sweep tab shows the plan it ran in its own widgets


def test_sweep_tab_shows_a_requested_plan_in_its_form(state, qtbot, monkeypatch):
    from app.core.measure.plan import Plan, make_arms
    from app.core.records.prompt import Prompt
    from app.gui.tabs.sweep import SweepTab

    sweep = make_tab(SweepTab, state)
    qtbot.addWidget(sweep)
    started = []
    monkeypatch.setattr(sweep, "start_sweep", started.append)
    plan = Plan(model="/m.gguf", arms=make_arms([2, 3], [0.5]), prompts=(Prompt("c1", "code", "x"),),
                n_predict=48, reps=4, warmup=1, engine="server")
    state.sweep_requested.emit(plan)
    assert started == [plan] and state.model == "/m.gguf"
    assert (sweep.form.k_edit.text(), sweep.form.pmin_edit.text(), sweep.form.npredict.value(), sweep.form.reps.value()) == \
        ("2,3", "0.5", 48, 4)
    assert sweep.form.engine_box.currentText() == "llama-server" and \
        [t for t, cb in sweep.form.task_boxes.items() if cb.isChecked()] == ["code"]


def test_engine_settings_come_from_the_sweep_tab_and_persist(state, qtbot, tmp_path, make_model):
    from app.gui.services import make_services
    from app.gui.state import AppState
    from app.gui.tabs.sweep import SweepTab

    sweep = make_tab(SweepTab, state)
    qtbot.addWidget(sweep)
    assert state.engine_settings("inprocess").ctx_size == 4096 and state.engine_settings("server").n_gpu_layers is None
    sweep.form.ctx_size.setValue(0)  # the model's own
    sweep.form.gpu_layers.setCurrentText("all")
    sweep.form.threads.setValue(3)
    state.set_server_bin("/opt/llama-server")
    s = state.engine_settings(EngineKind.SERVER)
    assert (s.kind, s.ctx_size, s.n_gpu_layers, s.threads, s.server_bin) == \
        (EngineKind.SERVER, 0, "all", 3, "/opt/llama-server")
    assert state.engine_settings("inprocess").server_bin is None
    for tip in (sweep.form.ctx_size.toolTip(), sweep.form.gpu_layers.toolTip()):
        assert "llama.cpp" in tip
    assert "-c" in sweep.form.ctx_size.toolTip() and "-ngl" in sweep.form.gpu_layers.toolTip()
    again_state = AppState(state.settings)  # a new window reads them back
    again = make_tab(SweepTab, again_state, make_services(again_state))
    qtbot.addWidget(again)
    assert (again.form.ctx_size.value(), again.form.gpu_layers.currentText()) == (0, "all")
    sweep.form.gpu_layers.setCurrentText("lots")
    state.set_model(str(make_model(0.0)))
    sweep.start_sweep()
    assert state.errors and "GPU layers" in state.errors[-1] and "lots" in state.errors[-1]


def test_machine_tab_alone_shows_the_probe_verdict_from_the_state(state, qtbot):
    from app.core.verdict import probe_sentence
    from app.gui.tabs.machine import MachineTab
    from tests.helpers import fake_costs

    machine = make_tab(MachineTab, state)
    qtbot.addWidget(machine)
    rec = fake_costs({1: 10.0, 2: 11.0, 3: 12.0}, 0.5)
    state.add_probe(rec)
    assert machine.probe_verdict.text() == probe_sentence(rec) and "MTP can pay" in machine.probe_verdict.text()
    assert list(machine.probe_curve.getData()[0]) == sorted(rec.ratio)


def test_model_and_prompts_tabs_alone_talk_through_the_state(state, qtbot):
    from app.gui.tabs.model import ModelTab
    from app.gui.tabs.prompts import PromptsTab

    model, prompts = make_tab(ModelTab, state), make_tab(PromptsTab, state)
    for t in (model, prompts):
        qtbot.addWidget(t)
    infos = []
    state.model_info_changed.connect(infos.append)
    state.use_demo_model()
    assert model.model_edit.text() == state.model and infos and infos[-1] is not None
    prompts.new_prompt()
    prompts.prompt_id.setText("mine")
    prompts.prompt_task.setCurrentText("sql")
    prompts.prompt_text.setPlainText("SELECT 1")
    with qtbot.waitSignal(state.prompts_changed):
        prompts.save_prompt()
    assert "sql" in state.prompt_tasks() and state.user_prompt_file()


def test_export_tab_saves_the_script_byte_for_byte_and_names_the_problem(state, qtbot, demo_records, tmp_path):
    """Save as script writes render_script's bytes unchanged; with no command it says why."""
    from app.core.engines.render import render_script
    from app.gui.tabs.export import ExportTab

    export = make_tab(ExportTab, state)
    qtbot.addWidget(export)
    export.shell_box.setCurrentText("cmd")
    exp = state.verdict.export
    saved = export.save_script(str(tmp_path / "run.cmd"))
    assert open(saved, "rb").read() == render_script(list(exp.argv), "cmd")
    state.set_results([], None)
    assert export.save_script(str(tmp_path / "again.cmd")) is None and state.errors[-1].startswith("no recommendation")
    assert not (tmp_path / "again.cmd").exists()


def test_closing_cancels_every_job_of_the_registry(state, qtbot):
    import threading

    gate = threading.Event()

    def factory(cancel):
        while not cancel.cancelled:
            gate.wait(0.01)
        yield "stopped"

    registry = state.services.jobs
    seen = []
    jobs = [registry.run(factory, finished=lambda: seen.append("done")) for _ in range(2)]
    assert len(registry.running()) == 2 and set(registry) == set(jobs)
    registry.cancel_all(10000)
    assert not any(j.is_running() for j in jobs)
    qtbot.waitUntil(lambda: len(registry) == 0, timeout=5000)  # each leaves the registry when it finishes
    assert seen == ["done", "done"]  # each finished handler once


def test_the_registry_runs_one_job_per_key_and_wires_its_handlers(state, qtbot):
    registry = state.services.jobs
    got = []

    def factory(cancel):
        yield 1
        yield 2

    def broken(cancel):
        raise ValueError("no")
        yield

    job = registry.run(factory, key="k", event=(got.append, lambda ev: got.append(-ev)),
                       finished=lambda: got.append(registry.get("k")))
    assert registry.get("k") is job
    with pytest.raises(RuntimeError):
        registry.run(factory, key="k")
    qtbot.waitUntil(lambda: registry.get("k") is None and None in got, timeout=10000)
    assert got == [1, -1, 2, -2, None]  # handlers in order; the job already gone when finished fires
    failures = []
    registry.run(broken, failed=failures.append, finished=lambda: failures.append("done"))
    qtbot.waitUntil(lambda: "done" in failures, timeout=10000)
    assert failures == ["ValueError: no", "done"]


def test_a_runtime_install_asks_the_engines_once(state, monkeypatch):
    """An installed runtime emits the runtimes' changed and the state's server_changed (the install's
    event handler, driven here with a Runtime event); the engines, asked before, are asked again
    once, not twice. Each signal alone still asks them."""
    from app.core.machine.runtime_store import Runtime

    svc = state.services
    svc.engines.rows = []  # the engines were asked before
    calls = []
    wired = {}
    monkeypatch.setattr(svc.engines, "check", lambda: calls.append(1))
    monkeypatch.setattr(state, "rebuild_verdict", lambda: None)
    # the job is never started: the handlers the install wires are driven with a Runtime event
    monkeypatch.setattr(svc.jobs, "run", lambda factory, parent=None, **kw: wired.update(kw))
    seen = []
    svc.runtimes.install(event=seen.append)
    rt = Runtime("b1-cpu", Path("/x"), Path("/x/llama-server"), "b1", "cpu", "a.zip", "1", ())
    for handler in wired["event"]:
        handler(rt)
    assert calls == [1] and seen == [rt]
    state.server_changed.emit()
    svc.runtimes.changed.emit()
    assert calls == [1, 1, 1]
