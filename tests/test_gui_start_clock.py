"""The Start page's How long, from this machine's measured speed: plain words until a speed is
known (a cost probe, or an earlier sweep's baseline), then about how long Quick and Thorough take
here (the core's flow_estimate), Quick never said longer than its budget."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("PySide6")


def test_how_long_says_the_time_here_once_the_speed_is_measured(window):
    from app.core.session.tune import QUICK_S
    from tests.helpers import fake_costs

    page, state = window.start_tab, window.state
    assert page.demo_radio.isChecked()
    page._update()
    assert page.quick.text() == "Quick (about 2 minutes)" and page.thorough.text() == "Thorough (until decided)"
    # a recorded probe of the demo model: 10 ms a token, so the flow takes well under Quick's time
    state.add_probe(dataclasses.replace(fake_costs({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0}, 0.5),
                                        model_path=state.model))
    page._update()
    quick = page.estimate(page.request(quick=True))
    assert quick is not None and quick < QUICK_S
    assert page.quick.text().startswith("Quick (about ") and "here, at most 2 minutes)" in page.quick.text()
    assert page.thorough.text().startswith("Thorough (until decided: about ") and "here" in page.thorough.text()
