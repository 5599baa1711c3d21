"""The Sweep tab's table of server flags as axes (Advanced, Engine and threads): its rows feed the
sweep's request as bench --axis does, checked against the llama-server; a bad row is one line. The
window's answer for one value is the user's command with that value."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from app.core.common.errors import UserError  # noqa: E402
from app.core.session.sweep import prepare  # noqa: E402


@pytest.mark.server  # the rows are checked against the real llama-server's --help
def test_axes_table_feeds_the_request(sweep_tab, state, server_bin, qtbot):
    state.use_demo_model()
    form = sweep_tab.form
    sweep_tab.resize(1240, 700)  # the window's smallest size
    sweep_tab.show()
    form.advanced_btn.click()
    assert form.axes.isVisible() and "-ub with 256,512" in form.axes.toolTip()
    form.axes.set_texts(["--n-cpu-moe=20,24,28", "-ub=64,128"])  # both rows shown, the area no wider
    qtbot.wait(100)
    assert form.advanced_area.horizontalScrollBar().maximum() == 0
    form.axes.set_texts([])
    assert form.request().axes == ()  # no rows: no axes
    form.axes.set_texts(["-ub=64,128"])
    assert form.axes.texts() == ["-ub=64,128"]
    prepared = prepare(form.request())
    ub, = prepared.request.axes
    assert ub.values == ("64", "128") and "--ubatch-size" in ub.aliases
    assert prepared.request.plan.engine.value == "server"  # only llama-server runs axes, and says so
    assert any("--axis flags" in n for n in prepared.notes)
    form.axes.set_texts(["-np=1,2"])
    with pytest.raises(UserError, match="the measurement owns this flag"):
        form.request()


def test_the_windows_answer_has_the_settings_value(tmp_path):
    """The window's Export for one value of an axis: the user's command with that value in place of
    theirs (their other flags and their order kept)."""
    from app.core.engines.shell_split import split_command
    from app.core.engines.user_command import parse_argv
    from app.gui.own_command import OwnCommand
    from tests.helpers import make_record

    class Holder:
        def set_model(self, path):
            pass

        def rebuild_verdict(self):
            pass

    own = OwnCommand(Holder())
    model = tmp_path / "m.gguf"
    own.set(parse_argv(split_command(f"llama-server -m {model} -ub 128 -fa on --port 9")[0], "bash", None), None)
    runs = [make_record(model_path=str(model), server_args=("-ub", "64", "-fa", "on"))]
    assert own.base_argv_for(runs) == ("llama-server", "-m", str(model), "-ub", "64", "-fa", "on", "--port", "9")
    runs = [make_record(model_path=str(model), server_args=("-ub", "128", "-fa", "on"))]  # the reference
    assert own.base_argv_for(runs) == ("llama-server", "-m", str(model), "-ub", "128", "-fa", "on", "--port", "9")
    assert own.base_argv_for([make_record(model_path="/other.gguf")]) is None
