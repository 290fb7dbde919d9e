"""Imports ahead of need at the lowest CPU priority: only the importing thread is lowered (Linux), and an import
that fails there fails again, with its own error, where the module is really imported."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from torchrepro._core.background import LOWEST, import_in_background, lower_this_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value per thread is Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux
def test_lowering_a_thread_leaves_the_others_at_their_priority():
    before = _nice()
    seen: list[object] = []

    def work() -> None:
        seen.append(lower_this_thread())
        seen.append(_nice())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [True, LOWEST]
    assert _nice() == before  # the caller's thread (here the main one) is untouched


@linux
def test_a_module_imported_in_the_background_is_imported_by_a_thread_at_the_lowest_priority(tmp_path, monkeypatch):
    (tmp_path / "tr_bg_probe.py").write_text(
        "import os, threading\nNICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "MAIN = threading.current_thread() is threading.main_thread()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _nice()
    thread = import_in_background(["tr_bg_probe"], name="probe")
    assert not thread.daemon  # the interpreter waits for it at exit
    thread.join()
    import tr_bg_probe

    assert (tr_bg_probe.NICE, tr_bg_probe.MAIN) == (LOWEST, False)
    assert _nice() == before
    del sys.modules["tr_bg_probe"]


def test_a_failing_import_is_left_to_the_callers_own_import(tmp_path, monkeypatch):
    (tmp_path / "tr_bg_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    thread = import_in_background(["tr_bg_broken", "json"], name="probe")  # the next name is still imported
    thread.join()
    assert "tr_bg_broken" not in sys.modules and "json" in sys.modules
    with pytest.raises(RuntimeError, match="broken at import"):
        import tr_bg_broken  # noqa: F401


def test_elsewhere_than_linux_nothing_is_lowered(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    calls: list[tuple] = []
    monkeypatch.setattr(os, "setpriority", lambda *a: calls.append(a), raising=False)
    assert lower_this_thread() is False and calls == []  # there it would lower the whole process, for good


@linux
def test_modules_named_first_are_imported_by_the_calling_thread_at_its_priority(tmp_path, monkeypatch):
    """For modules that start threads at import (numpy's OpenBLAS): those threads must not inherit nice 19."""
    (tmp_path / "tr_bg_first.py").write_text(
        "import os, threading\nNICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "MAIN = threading.current_thread() is threading.main_thread()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_in_background(["json"], name="probe", first=["tr_bg_first", "tr_bg_not_installed"]).join()
    import tr_bg_first

    assert (tr_bg_first.NICE, tr_bg_first.MAIN) == (_nice(), True)
    del sys.modules["tr_bg_first"]
