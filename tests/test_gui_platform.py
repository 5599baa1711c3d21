"""When Qt's X11 platform plugin cannot load (a minimal Linux without the xcb libraries), the app
names the missing system libraries and how to install them, instead of Qt's abort."""

from __future__ import annotations

import pytest

from app.gui import main as gui_main

X11 = {"DISPLAY": ":0"}
GONE = {"libxcb-icccm.so.4", "libxcb-cursor.so.0"}


def _loads(soname: str) -> bool:
    return soname not in GONE


def _broken() -> str:
    return "libxcb-icccm.so.4: cannot open shared object file: No such file or directory"


def test_the_missing_libraries_and_both_install_commands_are_named():
    text = gui_main.xcb_problem(X11, "linux", _broken, _loads)
    assert "libxcb-icccm4, libxcb-cursor0" in text
    assert "sudo apt install libxcb-icccm4 libxcb-cursor0\n" in text
    assert "sudo dnf install xcb-util-wm xcb-util-cursor\n" in text
    assert "libxcb-image0" not in text  # only what is missing


@pytest.mark.parametrize("env, platform", [
    ({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, "linux"),  # another plugin
    ({}, "linux"),  # no X display: Qt does not try xcb
    ({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}, "linux"),
    (X11, "darwin"), (X11, "win32"),
])
def test_no_check_where_qt_does_not_use_its_x11_plugin(env, platform):
    assert gui_main.xcb_problem(env, platform, _broken, _loads) is None


def test_a_plugin_that_loads_is_left_to_qt():
    assert gui_main.xcb_problem(X11, "linux", lambda: None, _loads) is None
    assert gui_main.xcb_problem({"QT_QPA_PLATFORM": "xcb"}, "linux", lambda: None, lambda s: False) is None


def test_another_missing_library_is_named_in_the_loaders_words():
    text = gui_main.xcb_problem({"QT_QPA_PLATFORM": "xcb"}, "linux", lambda: "libEGL.so.1: cannot open shared "
                                "object file", lambda s: True)
    assert "does not load: libEGL.so.1" in text


def test_the_app_says_so_and_exits_1_before_qt_aborts(monkeypatch, capsys):
    monkeypatch.setattr(gui_main.sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(gui_main, "xcb_plugin_error", _broken)
    monkeypatch.setattr(gui_main, "can_load", _loads)
    assert gui_main.main(["--exit-after-init"]) == 1
    err = capsys.readouterr().err
    assert "the window cannot open" in err and "sudo apt install libxcb-icccm4 libxcb-cursor0" in err
