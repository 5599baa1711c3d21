"""Screenshots of the Sweep tab before its first sweep (Basic, Advanced, Start disabled for a file
that is not a GGUF, a model without MTP heads; ``--sweep-form-only`` stops there), then of every
tab after a demo sweep and the engines' device check, then of the Sweep tab's
busy indicator (other programs' share of the machine, the runs they disturbed), then of its
sampler settings (the model's recommended sampler and a temperature axis), then of the Sweep tab
after a second demo sweep that compares two speculative modes, draft-mtp K=1..3 and ngram-mod (on
llama-server; skipped when no llama-server lists ngram-mod), then of the Start page's "Tune for me"
on the demo (the page, the page while it runs and after it, the Results banner it lands on, the
Results tab's Advanced section, and Export after the code verdict's "Command for this"), for
release notes and for looking at the layout:

    xvfb-run -a python packaging/screenshots.py OUT_DIR [--dark] [--decisions-only | --start-only | --sweep-form-only |
                                                --workers-only | --watch-only [--watch-costs FILE] |
                                                --results-only | --one-window-only | --no-heads-only] [--results FILE]

``--one-window-only`` shoots the window as a 1366x768 screen leaves it (1366x720): the Start page
while a real Tune for me runs on the demo (Quick), Export while a real Confirm of the code pick runs
on llama-server and after it (when Quick decided nothing, on ``--results FILE``, e.g. a ``bench
--demo`` sweep, else on the Sweep tab's sweep), and the Sweep tab with Advanced open, then with the
command box too (``--no-tune``: without Tune for me). Run it with PYTHONPATH at the checkout to shoot its
code rather than an installed copy's.

``--no-heads-only`` shoots the Start page's Tune for me on a calibrated model without MTP heads with
a smaller drafter beside it: what it measures and the drafter it picked and why, before and after
(``--model FILE``: on that GGUF instead, e.g. the real Qwen2.5-Coder 1.5B with its 0.5B in the
models folder; ``--thorough``: Thorough instead of Quick).

``--workers-only`` shoots the Machine tab with two RPC workers it starts on 127.0.0.1 (one behind
a 2 ms relay), checked, and the demo model's fit spread over them.

``--results FILE`` also shoots the Results tab (banner, then Advanced) on a recorded results file,
e.g. tests/data/demo_sweep.jsonl: the banner's layout whatever this machine's probe says; then
Export after the first verdict's "Command for this" that has one: over RPC workers, the command
with --rpc and the placement that paid, and each worker's command line under it.
``--results-only`` shoots just these (seconds), e.g. on a sweep of placements over RPC workers
(``bench --demo --rpc-local 2 --placements auto``).

The Watch tab's shot (also alone: --watch-only) watches a real llama-server serving the demo model at
K=3 while a separate client process sends it the demo prompts; ``--watch-costs FILE`` names a
results file with a probe of that server (made through llama-server on this machine) to price the
predictions; without one the tab shows why it cannot predict.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0]])
    if "--dark" in sys.argv:  # what a dark OS theme hands the app (Xvfb has no platform theme)
        from PySide6.QtGui import QColor, QPalette

        app.setStyle("Fusion")
        pal = QPalette()
        for role, color in ((QPalette.Window, "#2b2b2b"), (QPalette.WindowText, "#e6e6e6"),
                            (QPalette.Base, "#1e1e1e"), (QPalette.AlternateBase, "#2b2b2b"),
                            (QPalette.Text, "#e6e6e6"), (QPalette.Button, "#353535"),
                            (QPalette.ButtonText, "#e6e6e6"), (QPalette.Highlight, "#2f65ca"),
                            (QPalette.HighlightedText, "#ffffff"), (QPalette.PlaceholderText, "#9a9a9a")):
            pal.setColor(role, QColor(color))
        app.setPalette(pal)
    from app.gui.main_window import MainWindow

    win = MainWindow(demo=True)
    win.quiet_errors = True
    win.resize(1280, 820)
    win.show()
    if "--watch-only" in sys.argv:  # the Watch tab alone, on a real llama-server (a minute)
        print(watch_panel(win, app, out))
        win.close()
        return 0
    if "--workers-only" in sys.argv:  # the Machine tab with two RPC workers alone (seconds)
        print(machine_workers(win, app, out))
        win.close()
        return 0
    if "--decisions-only" in sys.argv:  # the decision panel alone, without the demo sweep (minutes)
        print(sweep_decisions(win, app, out))
        win.close()
        return 0
    if "--results-only" in sys.argv:  # the recorded file's Results and Export alone (seconds)
        for p in recorded_results(win, app, out):
            print(p)
        win.close()
        return 0
    if "--one-window-only" in sys.argv:  # at 1366x768: Tune for me running, Confirm, Advanced (minutes)
        for p in one_window(win, app, out):
            print(p)
        win.close()
        return 0
    if "--no-heads-only" in sys.argv:  # Tune for me on a model without MTP heads alone (a minute or two)
        for p in start_no_heads(win, app, out):
            print(p)
        win.close()
        return 0
    if "--start-only" in sys.argv:  # the Start page's flow alone (about 2 minutes: Quick)
        for p in start_page(win, app, out) + recorded_results(win, app, out):
            print(p)
        win.close()
        return 0
    for path in sweep_form(win, app, out):  # before the demo sweep: Basic, Advanced, what stops Start
        print(path)
    if "--sweep-form-only" in sys.argv:
        win.close()
        return 0
    # the demo sweep as a newcomer runs it (the demo model sets K, tokens and repetitions)
    loop = QEventLoop()
    win.state.sweep_finished.connect(lambda _cancelled: loop.quit())
    QTimer.singleShot(0, win.sweep_tab.start_sweep)
    loop.exec()
    win.model_tab.search_models()
    # the Machine tab's per-engine devices (and the Sweep tab's "will measure on"): asked on a
    # worker (llama-cpp-python's device registry, llama-server --list-devices); wait for the answer
    job = win.services.engines.check()
    loop = QEventLoop()
    job.finished.connect(loop.quit)
    QTimer.singleShot(120000, loop.quit)  # a hung llama-server: the shot shows "asking…"
    loop.exec()
    for i in range(win.tabs.count()):
        win.tabs.setCurrentIndex(i)
        for _ in range(5):
            app.processEvents()
        name = win.tabs.tabText(i).lower()
        path = out / f"{i + 1}-{name}.png"
        win.grab().save(str(path))
        print(path)
    print(machine_workers(win, app, out))
    print(busy_indicator(win, app, out))
    print(sampler_settings(win, app, out))
    print(sweep_decisions(win, app, out))
    print(watch_panel(win, app, out))
    path = sweep_with_modes(win, app, out)
    print(path or "no llama-server lists ngram-mod: no Sweep tab with two modes")
    for p in start_page(win, app, out) + recorded_results(win, app, out):
        print(p)
    win.close()
    return 0


def recorded_results(win, app, out: Path) -> list[Path]:
    """With ``--results FILE``: the Results tab on that file, its banner, then Advanced open, then
    Export after the first "Command for this" that has a command (its worker lines too)."""
    if "--results" not in sys.argv:
        return []
    path = sys.argv[sys.argv.index("--results") + 1]
    res = win.results_tab
    res.open_results(path)
    paths = [shoot(win, app, res, out, "results-recorded")]
    res.advanced.set_open(True)
    paths.append(shoot(win, app, res, out, "results-recorded-advanced"))
    res.advanced.set_open(False)
    row = next((r for r in res.banner.rows.values() if r.button.isEnabled()), None)
    if row is not None:
        row.button.click()  # the window goes to Export with that verdict's command
        wait_until(app, lambda: not win.export_tab.capabilities.pending(), 60)  # its flags checked on a worker
        paths.append(shoot(win, app, win.export_tab, out, "export-recorded"))
    return paths


def start_page(win, app, out: Path) -> list[Path]:
    """The Start page as a newcomer sees it; one click on Tune for me (the demo, Quick); the page
    while it runs and after; the Results banner the window lands on; its Advanced section open;
    Export after the code verdict's "Command for this"."""
    page = win.start_tab
    page.demo_radio.setChecked(True)
    page.quick.setChecked(True)
    paths = [shoot(win, app, page, out, "start")]
    page.tune_btn.click()
    wait_until(app, lambda: win.state.sweep_running, 120)
    wait_until(app, lambda: not page.running, 20)  # some progress to show
    paths.append(shoot(win, app, page, out, "start-running"))
    wait_until(app, lambda: not page.running, 900)
    paths.append(shoot(win, app, page, out, "start-done"))
    res = win.results_tab
    paths.append(shoot(win, app, res, out, "results-banner"))
    res.advanced.set_open(True)
    paths.append(shoot(win, app, res, out, "results-advanced"))
    res.advanced.set_open(False)
    row = res.banner.rows.get("code")
    if row is not None:
        row.button.click()  # the window goes to Export with code's command
        paths.append(shoot(win, app, win.export_tab, out, "export-for-code"))
    return paths


def one_window(win, app, out: Path) -> list[Path]:
    """At 1366x720 (a 1366x768 screen less its title bar and taskbar): the Start page while a real
    Tune for me runs on the demo (Quick, a few runs in); Export while a real Confirm of the code
    pick runs on llama-server, and after it; the Sweep tab with Advanced open, then with the
    command box open too."""
    win.resize(1366, 720)
    if "--no-tune" in sys.argv and "--results" not in sys.argv:  # the Sweep tab's shots alone (seconds)
        return sweep_advanced_1366(win, app, out)
    paths = [] if "--no-tune" in sys.argv else tune_for_me(win, app, out)
    return paths + confirm_on_export(win, app, out) + sweep_advanced_1366(win, app, out)


def tune_for_me(win, app, out: Path) -> list[Path]:
    """The Start page a few runs into a real Tune for me on the demo (Quick), and after it."""
    page = win.start_tab
    page.demo_radio.setChecked(True)
    page.quick.setChecked(True)
    page.tune_btn.click()
    wait_until(app, lambda: win.state.sweep_running, 120)
    t_end = time.monotonic() + 6  # a few runs in: the progress and the time left show
    wait_until(app, lambda: time.monotonic() > t_end or not win.state.sweep_running, 20)
    paths = [shoot(win, app, page, out, "start-mid-sweep")]
    wait_until(app, lambda: not page.running and not win.state.sweep_running, 900)
    paths.append(shoot(win, app, page, out, "start-after-tune"))
    return paths


def confirm_on_export(win, app, out: Path) -> list[Path]:
    """Export while a real Confirm of the code pick runs on llama-server, and after it."""
    paths: list[Path] = []
    export = win.export_tab
    if (win.state.verdict is None or not export.confirm_btn.isEnabled()) and "--results" in sys.argv:
        win.results_tab.open_results(sys.argv[sys.argv.index("--results") + 1])  # Quick gave none: a demo sweep's
    if win.state.verdict is None or not export.confirm_btn.isEnabled():  # Quick decided nothing here:
        from PySide6.QtCore import QEventLoop, QTimer  # the Sweep tab's demo sweep, for a pick to confirm

        loop = QEventLoop()
        win.state.sweep_finished.connect(lambda _cancelled: loop.quit())
        QTimer.singleShot(0, win.sweep_tab.start_sweep)
        loop.exec()
    row = win.results_tab.banner.rows.get("code")
    if row is not None and row.button.isEnabled():
        row.button.click()  # Export with code's command
    else:
        win.tabs.setCurrentWidget(export)
    wait_until(app, lambda: not export.capabilities.pending(), 60)
    if export.confirm_btn.isEnabled():
        done: list[bool] = []
        export.confirm_finished.connect(lambda: done.append(True))
        export.confirm_btn.click()
        import re

        wait_until(app, lambda: done or re.search(r"[1-9] of \d+ runs", export.confirm_label.text()), 300)
        paths.append(shoot(win, app, export, out, "export-confirm-running"))
        wait_until(app, lambda: bool(done), 600)
    paths.append(shoot(win, app, export, out, "export-after-confirm"))
    return paths


def sweep_advanced_1366(win, app, out: Path) -> list[Path]:
    """The Sweep tab with Advanced open; then the command box opened and Advanced after it."""
    paths = []
    tab = win.sweep_tab
    tab.form.show_advanced(True)
    paths.append(shoot(win, app, tab, out, "sweep-advanced-1366x768"))
    tab.form.show_advanced(False)
    tab.command_box.setChecked(True)  # the command box open, then Advanced (it scrolls into view)
    tab.form.show_advanced(True)
    paths.append(shoot(win, app, tab, out, "sweep-advanced-command-box-1366x768"))
    tab.command_box.setChecked(False)
    tab.form.show_advanced(False)
    return paths


def machine_workers(win, app, out: Path) -> Path:
    """The Machine tab's RPC workers: two real workers on 127.0.0.1 started here, the second behind
    a relay adding 2 ms each way (a LAN-like round trip), checked, with the demo model's memory fit
    spread over this machine and them. The workers stop before this returns."""
    from app.core.engines.server.binary import find_server_binary
    from app.core.engines.server.relay import LatencyRelay
    from app.core.engines.server.rpc_worker import RpcWorker, find_worker

    binary = find_worker(find_server_binary(win.state.server_bin))
    if binary is None:
        return out / "no RPC worker beside this llama-server: no Machine tab with workers"
    box = win.machine_tab.workers
    with RpcWorker(binary, threads=1) as a, RpcWorker(binary, threads=1) as b, LatencyRelay(b.endpoint, 2) as relay:
        for w in (a.endpoint, relay.endpoint):
            box.edit.setText(str(w))
            box.add()
        box.check()
        wait_until(app, lambda: box.job is None, 60)
        path = shoot(win, app, win.machine_tab, out, "machine-workers")
    return path


def busy_indicator(win, app, out: Path) -> Path:
    """The Sweep tab's busy indicator after the demo sweep: what other programs take now (measured
    while the tab shows, every 2 s), the sweep's disturbed runs and the thread count it chose."""
    win.tabs.setCurrentWidget(win.sweep_tab)
    t_end = time.monotonic() + 2.5  # one poll of the indicator's timer while the tab shows
    while time.monotonic() < t_end:
        app.processEvents()
        time.sleep(0.02)
    path = out / "sweep-busy.png"
    win.grab().save(str(path))
    return path


def start_no_heads(win, app, out: Path) -> list[Path]:
    """Tune for me on a model without MTP heads (a calibrated one, its smaller drafter beside it):
    the Start page with what it measures and the drafter it picked and why, then after the run."""
    import tempfile

    from app.core.calibrated.gguf import make_no_heads_pair

    if "--model" in sys.argv:
        target = Path(sys.argv[sys.argv.index("--model") + 1])
    else:
        target, _drafter = make_no_heads_pair(Path(tempfile.mkdtemp(prefix="mtp-tuner-shots-")), 0.2)
    page = win.start_tab
    page.choose_model(str(target))
    (page.thorough if "--thorough" in sys.argv else page.quick).setChecked(True)
    wait_until(app, lambda: page.plan.arms is not None, 60)
    paths = [shoot(win, app, page, out, "start-no-heads")]
    page.tune_btn.click()
    wait_until(app, lambda: win.state.sweep_running, 120)
    wait_until(app, lambda: not page.running, 3600)
    paths.append(shoot(win, app, page, out, "start-no-heads-done"))
    return paths


def shoot(win, app, tab, out: Path, name: str) -> Path:
    """The window with ``tab`` shown, saved as ``<tab number>-<name>.png`` in ``out``."""
    index = win.tabs.indexOf(tab)
    win.tabs.setCurrentIndex(index)
    for _ in range(5):
        app.processEvents()
    path = out / f"{index + 1}-{name}.png"
    win.grab().save(str(path))
    return path


def wait_until(app, done, timeout_s: float) -> bool:
    """Turn the event loop until ``done()`` or the timeout; whether it is done."""
    end = time.monotonic() + timeout_s
    while not done() and time.monotonic() < end:
        app.processEvents()
        time.sleep(0.02)
    return done()


def sweep_decisions(win, app, out: Path) -> Path:
    """The Sweep tab's decision panel as an adaptive sweep shows it while it runs: one task decided,
    one decided off, one undecided with the time it needs (recorded states, as the session's
    Decisions event carries them)."""
    from app.core.analysis.decide import TaskDecision
    from app.core.analysis.stats import Ratio
    from app.core.records.arm import Arm
    from app.core.session.events import Decisions

    tab = win.sweep_tab
    tab.form.mode_box.setCurrentText("adaptive")
    tasks = (TaskDecision("code", True, Arm(2, 0.0), Ratio(6, 1.38, 1.33, 1.43, 0.322, 0.01), more_reps=0),
             TaskDecision("tongue-twister", True, None, Ratio(5, 0.84, 0.80, 0.88, -0.17, 0.02), more_reps=0,
                          reason="every interval lies below 1"),
             TaskDecision("story", False, None, Ratio(4, 0.98, 0.91, 1.06, -0.02, 0.025), (None, Arm(1, 0.0)),
                          Arm(1, 0.0), 6, "reaches down to 1", eta_s=62.0))
    tab.decisions.show_decisions(Decisions(tasks, 27, 3456, 74.0, 62.0))
    path = shoot(win, app, tab, out, "sweep-decisions")
    tab.decisions.show_decisions(Decisions(tasks, 31, 3968, 121.0, 62.0, final=True, stopped="budget"))
    shoot(win, app, tab, out, "sweep-decisions-final")
    tab.decisions.clear()
    tab.form.mode_box.setCurrentText("exhaustive")
    return path


def sweep_form(win, app, out: Path) -> list[Path]:
    """The Sweep tab before its first sweep: Basic (the demo model named, the Quick preset and the
    run count; no time yet), Advanced open, then Start disabled for a file that is not a GGUF and
    the lasting note of a model without MTP heads; the demo model again after."""
    import tempfile

    from app.core.calibrated import gguf as calibrated_gguf

    tab = win.sweep_tab
    demo = win.state.model
    shots = [shoot(win, app, tab, out, "sweep-basic")]
    tab.form.show_advanced(True)
    shots.append(shoot(win, app, tab, out, "sweep-advanced"))
    tab.form.show_advanced(False)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "notes.gguf"
        text.write_text("hello, this is not a model")
        win.state.set_model(str(text))
        shots.append(shoot(win, app, tab, out, "sweep-not-gguf"))
        plain = calibrated_gguf.make_model(Path(tmp) / "Qwen3.6-27B-Q4_K_M.gguf", 0.0, "embedding", mtp=False)
        win.state.set_model(str(plain))
        shots.append(shoot(win, app, tab, out, "sweep-no-mtp"))
    win.state.use_demo_model()
    return shots


def sampler_settings(win, app, out: Path) -> Path:
    """The Sweep tab's sampler settings: the demo model's recommended sampler (its family's table,
    with the source) and a temperature axis, greedy and 0.6."""
    tab = win.sweep_tab
    tab.form.show_advanced(True)  # the sampler is an Advanced setting
    tab.form.sampler.preset_box.setCurrentText("model's recommended")
    tab.form.sampler.axis.setText("0,0.6")
    for _ in range(5):
        app.processEvents()
    tab.form.advanced_area.ensureWidgetVisible(tab.form.sampler.axis)  # the temperature axis, in view
    path = shoot(win, app, tab, out, "sweep-sampler")
    tab.form.sampler.preset_box.setCurrentText("greedy")
    tab.form.sampler.axis.setText("")
    tab.form.show_advanced(False)
    return path


def sweep_with_modes(win, app, out: Path) -> Path | None:
    """The Sweep tab after the demo sweep of draft-mtp K=1..3 and ngram-mod: ticked in the tab, which
    moves the sweep to llama-server (the in-process engine runs only the model's own MTP heads) and
    says so. None when no llama-server lists ngram-mod."""
    tab = win.sweep_tab
    tab.form.modes.refresh()  # the modes the llama-server lists, read on a worker
    wait_until(app, lambda: not win.services.capabilities.reading(), 120)
    if "ngram-mod" not in tab.form.modes.listed_modes():
        return None
    tab.form.modes.set_modes(["draft-mtp", "ngram-mod"])
    index = win.tabs.indexOf(tab)
    win.tabs.setCurrentIndex(index)
    tab.start_sweep()
    if tab.sweeps.job is None:  # refused (the error is in the status bar)
        print(f"the two-mode sweep did not start: {win.state.last_error}")
        return None
    wait_until(app, lambda: tab.sweeps.job is None, 3600)
    return shoot(win, app, tab, out, "sweep-modes")


WATCH_CLIENT = """
import json, sys, urllib.request
url, prompts = sys.argv[1], json.loads(sys.argv[2])
for _ in range(2):
    for text in prompts:
        body = json.dumps({"prompt": text, "n_predict": 64, "temperature": 0, "cache_prompt": False}).encode()
        urllib.request.urlopen(urllib.request.Request(url + "/completion", body,
                                                      {"Content-Type": "application/json"}), timeout=300).read()
"""


def watch_panel(win, app, out: Path) -> Path | str:
    """The Watch tab watching a real llama-server (the demo model at K=3, --metrics, -np 1) while a
    separate client process sends it the demo prompts twice."""
    import json
    import subprocess
    import urllib.request

    from app.core.calibrated.demo import demo_model, demo_prompts
    from app.core.common.errors import UserError
    from app.core.engines.server.binary import child_env, find_server_binary, group_kwargs, kill_group
    from app.core.engines.server.process import free_port

    try:
        binary = find_server_binary()
    except UserError as e:
        return f"no Watch tab shot: {e}"
    model = demo_model()
    tab = next(win.tabs.widget(i) for i in range(win.tabs.count()) if win.tabs.tabText(i) == "Watch")
    port = free_port()
    server = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "-m", str(model), "-np", "1",
                               "-c", "2048", "-t", "1", "--metrics", "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(), **group_kwargs())
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        if not wait_until(app, up, 120):
            return "no Watch tab shot: the llama-server did not start"
        prompts = [p.text for p in demo_prompts(model) or []]
        tab.url.setText(url)
        if "--watch-costs" in sys.argv:
            tab.costs.setText(sys.argv[sys.argv.index("--watch-costs") + 1])
        tab.minutes.setValue(10.0)
        tab.interval.setValue(1.0)
        win.tabs.setCurrentWidget(tab)
        tab.start_watch()
        wait_until(app, lambda: tab.last is not None, 30)
        client = subprocess.Popen([sys.executable, "-c", WATCH_CLIENT, url, json.dumps(prompts)])
        wait_until(app, lambda: client.poll() is not None, 600)
        wait_until(app, lambda: False, 2.5)  # the last reading after the traffic
        tab.stop_watch()
        wait_until(app, lambda: tab.job is None, 30)
        return shoot(win, app, tab, out, "watch")
    finally:
        kill_group(server)
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
