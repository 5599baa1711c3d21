"""The Machine tab's RPC workers: added, refused when malformed or twice, removed; checked off the
GUI thread on real loopback workers and a dead port; and the memory fit spread over this machine
and the workers (Machine and Model tabs)."""

from __future__ import annotations

import pytest

from app.core.engines.server.rpc_worker import RpcWorker, free_port

pytest.importorskip("PySide6")


def test_workers_are_added_checked_for_form_and_removed(window, qtbot):
    box = window.machine_tab.workers
    state = window.state
    assert state.rpc_workers == () and not box.check_btn.isEnabled()
    box.edit.setText("no-port-here")
    box.add()
    assert "HOST:PORT" in box.note.text() and state.rpc_workers == ()
    with qtbot.waitSignal(state.rpc_workers_changed):
        box.edit.setText("192.168.1.20:50052")
        box.add()
    box.edit.setText("[::1]:50053")
    box.add()
    assert state.rpc_workers == ("192.168.1.20:50052", "[::1]:50053") and box.edit.text() == ""
    box.edit.setText("192.168.1.20:50052")
    box.add()
    assert "already" in box.note.text() and len(state.rpc_workers) == 2
    assert [box.list.item(r, 1).text() for r in range(2)] == ["not checked", "not checked"]
    box.list.selectRow(0)
    with qtbot.waitSignal(state.rpc_workers_changed):
        box.remove()
    assert state.rpc_workers == ("[::1]:50053",) and box.list.rowCount() == 1


def test_check_shows_each_worker_and_the_fit_across_them(window, qtbot, rpc_worker_bin, server_bin, make_model):
    from app.core.machine.modelinfo import inspect

    box = window.machine_tab.workers
    state = window.state
    state.set_model_info(inspect(make_model(0.5)))
    dead = f"127.0.0.1:{free_port()}"
    with RpcWorker(rpc_worker_bin, threads=1) as a, RpcWorker(rpc_worker_bin, threads=1) as b:
        for w in (str(a.endpoint), str(b.endpoint), dead):
            box.edit.setText(w)
            box.add()
        with qtbot.waitSignal(state.rpc_workers_changed, timeout=60000):
            box.check_btn.click()
            assert not box.check_btn.isEnabled()
        qtbot.waitUntil(lambda: box.job is None and box.check_btn.isEnabled(), timeout=60000)
    rows = [[box.list.item(r, c).text() for c in range(5)] for r in range(3)]
    for row in rows[:2]:
        assert row[1] == "yes" and row[2].endswith(" ms") and "GiB free of" in row[3]
        assert row[4].startswith("same RPC protocol as this machine")
    assert rows[2][1] == f"no: refused: nothing listens at {dead}"
    assert set(state.rpc_worker_free) == {str(a.endpoint), str(b.endpoint)}
    note = box.note.text()
    assert note.startswith("memory fit with the workers:") and "fits across this machine (" in note
    assert "and 2 workers (" in note
    model_fit = window.model_tab.fit_label.text()  # the demo model's fit, spread the same way
    assert "\nbaseline: fits across this machine (" in model_fit and "\nmtp: fits across this machine (" in model_fit
    # a worker removed takes its memory out of the fits
    box.list.selectRow(0)
    box.remove()
    assert list(state.rpc_worker_free) == [str(b.endpoint)] and "and 1 worker (" in box.note.text()
    assert "and 1 worker (" in window.model_tab.fit_label.text()


def test_the_fit_spreads_over_free_memory_in_words():
    from app.core.machine.fit import FitResult, spread_line

    gib = 2**30
    f = FitResult("mtp", int(30.2 * gib), int(12.1 * gib), "does not fit", (), None, {}, "")
    assert spread_line(f, [int(11.7 * gib)] * 2) == (
        "mtp: fits across this machine (12.1 GiB free) and 2 workers (23.4 GiB free): needs 30.2 GiB of 35.5 GiB, "
        "about 10.3 GiB here and 19.9 GiB on the workers")
    assert spread_line(f, [gib]).startswith("mtp: does not fit across this machine (12.1 GiB free) and 1 worker "
                                            "(1.0 GiB free): needs 30.2 GiB, 13.1 GiB free in all")
