"""Python's cycle collector runs on the GUI thread only (app/gui/collector.py): garbage made and
left by a worker thread is collected by the window's timer, on the main thread, never in the
worker that happened to allocate past the threshold."""

from __future__ import annotations

import gc
import threading

from app.gui.collector import MainThreadCollector, collect_due


class _Cycle:
    """A self-referencing object: only the cycle collector frees it; says on which thread."""

    freed_on: list[str] = []

    def __init__(self):
        self.me = self

    def __del__(self):
        _Cycle.freed_on.append(threading.current_thread().name)


def _worker_makes_garbage_then_allocates():
    # far more cyclic garbage than generation 0's threshold (its count is net of what any thread
    # frees meanwhile): an automatic collection would run in here
    for _ in range(20 * gc.get_threshold()[0]):
        _Cycle()


def _run_worker() -> None:
    t = threading.Thread(target=_worker_makes_garbage_then_allocates, name="sweep-worker")
    t.start()
    t.join()


def test_without_the_collector_a_worker_thread_collects_the_garbage():
    # the hazard itself, shown so the test below can fail: Python collects where it allocates
    _Cycle.freed_on.clear()
    gc.collect()
    gc.enable()
    try:
        _run_worker()
    finally:
        gc.disable()  # the tests' own policy (conftest)
    assert "sweep-worker" in _Cycle.freed_on
    gc.collect()


def test_the_window_timer_collects_a_workers_garbage_on_the_main_thread(qtbot):
    _Cycle.freed_on.clear()
    gc.collect()
    gc.enable()  # as a fresh process starts
    collector = MainThreadCollector(interval_ms=50).install()
    try:
        assert not gc.isenabled()
        _run_worker()
        assert _Cycle.freed_on == []  # the worker allocated past the threshold and collected nothing
        qtbot.waitUntil(lambda: _Cycle.freed_on != [], timeout=10000)
    finally:
        collector.uninstall()
        assert gc.isenabled()  # put back as it was
        gc.disable()
    assert set(_Cycle.freed_on) == {"MainThread"}


def test_collect_due_follows_pythons_thresholds():
    gc.collect()
    assert collect_due() == -1  # nothing is due right after a full collection
    junk = [[] for _ in range(gc.get_threshold()[0] + 100)]
    assert collect_due() >= 0
    del junk


def test_a_job_runs_its_generator_on_a_plain_thread_and_emits_on_the_gui_thread(qtbot):
    """The worker never calls Qt: its events reach the handlers on the GUI thread, in order, then
    the failure in words, then ``finished`` with the thread gone."""
    from PySide6.QtCore import QCoreApplication, QThread

    from app.gui.adapter import CoreJob

    ran_on: list[threading.Thread] = []

    def factory(cancel):
        ran_on.append(threading.current_thread())
        for i in range(500):  # more than one look of the GUI thread takes
            yield i
        raise RuntimeError("boom")

    job = CoreJob(factory)
    got, failed, where = [], [], []
    job.core_event.connect(lambda e: (got.append(e), where.append(QThread.currentThread())))
    job.failed.connect(failed.append)
    job.finished.connect(lambda: where.append(("finished", job.is_running(), len(got), list(failed))))
    with qtbot.waitSignal(job.finished, timeout=10000):
        job.start()
    assert ran_on[0].name == "mtp-tuner-worker" and not isinstance(ran_on[0], threading._DummyThread)
    assert got == list(range(500)) and failed == ["RuntimeError: boom"]
    app_thread = QCoreApplication.instance().thread()
    assert all(w is app_thread or w == app_thread for w in where[:-1])
    assert where[-1] == ("finished", False, 500, ["RuntimeError: boom"])


def test_after_wait_one_turn_of_the_event_loop_delivers_the_rest(qtbot):
    from PySide6.QtCore import QCoreApplication

    from app.gui.adapter import CoreJob

    job = CoreJob(lambda cancel: iter(range(20)))
    got, ended = [], []
    job.core_event.connect(got.append)
    job.finished.connect(lambda: ended.append(True))
    job.start()
    assert job.wait(10000) and not job.is_running()
    QCoreApplication.processEvents()
    assert got == list(range(20)) and ended == [True]
