"""The same sweep headless vs in the window with its live plots on screen (the Sweep tab;
offscreen Qt), interleaved;
tok/s ratio GUI/headless per arm (medians). Goal: >= 0.99."""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from _common import bench_model, threads  # noqa: E402

from app.core.engines.inprocess import InProcessEngine  # noqa: E402
from app.core.measure.plan import Plan, make_arms  # noqa: E402
from app.core.measure.runner import run_sweep  # noqa: E402
from app.core.session.events import RunFinished  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--no-live", action="store_true", help="diagnosis: the window without live plot updates")
    a = ap.parse_args()
    model = str(bench_model(a.p))
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    from app.gui.main_window import MainWindow

    if a.no_live:
        from app.gui.tabs.sweep.plots import LivePlots

        LivePlots.repaint = lambda self, force=False: None

    app = QApplication.instance() or QApplication([])
    speeds = {"headless": {}, "gui": {}}
    for rnd in range(a.rounds):
        for mode in (("headless", "gui") if rnd % 2 == 0 else ("gui", "headless")):
            if mode == "headless":
                # same prompt as the window's (first code prompt); on a worker thread like the window's
                # (llama.cpp's OpenMP pool runs ~30 % slower on one thread once another thread of the
                # process has used it, so both modes must call it from worker threads)
                import threading

                from app.core.measure.prompts import select_prompts

                plan = Plan(model=model, arms=make_arms([2]), prompts=tuple(select_prompts(["code"], per_task=1)),
                            n_predict=a.n_predict, reps=2, warmup=1)
                recs = []
                engine = InProcessEngine(threads=threads())  # the runner sizes it for the widest K
                t = threading.Thread(target=lambda: recs.extend(
                    e.record for e in run_sweep(plan, engine) if isinstance(e, RunFinished)))
                t.start()
                t.join()
                engine.close()
            else:
                w = MainWindow()
                w.quiet_errors = True
                w.show()
                sw = w.sweep_tab
                w.tabs.setCurrentWidget(sw)
                w.state.set_model(model)
                sw.k_edit.setText("2")
                sw.threads.setValue(threads())
                sw.npredict.setValue(a.n_predict)
                sw.reps.setValue(2)
                sw.per_task.setValue(1)
                for t, cb in sw.task_boxes.items():
                    cb.setChecked(t == "code")
                loop = QEventLoop()
                w.state.sweep_finished.connect(lambda _cancelled: loop.quit())
                sw.start_btn.click()
                loop.exec()
                recs = list(w.state.records)
                w.close()
            for r in recs:
                speeds[mode].setdefault(r.k, []).append(r.tok_s)
    print(f"model {os.path.basename(model)}, {a.rounds} interleaved rounds, n_predict {a.n_predict}")
    ok = True
    for k in sorted(speeds["headless"], key=lambda x: -1 if x is None else x):
        h, g = statistics.median(speeds["headless"][k]), statistics.median(speeds["gui"][k])
        ok &= g / h >= 0.99
        print(f"{'baseline' if k is None else f'K={k}':<9} headless {h:7.2f} tok/s  gui {g:7.2f} tok/s  ratio {g / h:.3f}")
        print("          headless runs:", " ".join(f"{x:.2f}" for x in speeds["headless"][k]))
        print("          gui runs:     ", " ".join(f"{x:.2f}" for x in speeds["gui"][k]))
    print("goal: GUI/headless >= 0.99:", "PASS" if ok else "MISS",
          f"(CPU threads for llama.cpp: {threads()} of {os.cpu_count()} cores; BENCH_THREADS=N changes it)")


if __name__ == "__main__":
    main()
