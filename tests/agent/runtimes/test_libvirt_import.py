"""The libvirt binding is tried again at every probe until it imports (issue #16: a failed import
was cached, so a binding installed while the agent ran was never picked up)."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

from persys.agent.runtimes.vm import libvirt as lv


def test_a_binding_installed_later_is_picked_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A real import from a folder on sys.path, hiding whatever libvirt this environment has:
    # first the folder holds no binding, then "pip" puts one there.
    monkeypatch.setattr(lv, "_loaded", [])
    monkeypatch.delitem(sys.modules, "libvirt", raising=False)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *[p for p in sys.path if "site-packages" not in p]])
    mod, why = lv.load_libvirt()
    assert mod is None and "pip install libvirt-python" in why

    # A stand-in module: the point is the import system, not libvirt itself (tests/agent/runtimes/
    # test_runtime_vm.py drives the real binding).
    # Its event loop waits forever in the loader's daemon thread, as the real one waits for events.
    (tmp_path / "libvirt.py").write_text("import threading\n\ndef registerErrorHandler(f, ctx):\n    pass\n\n"
                                         "def virEventRegisterDefaultImpl():\n    pass\n\n"
                                         "def virEventRunDefaultImpl():\n    threading.Event().wait()\n")
    mod, why = lv.load_libvirt()
    assert isinstance(mod, types.ModuleType) and why == "" and mod.__file__ == str(tmp_path / "libvirt.py")
    assert lv.load_libvirt()[0] is mod  # loaded once, then kept
    sys.modules.pop("libvirt")  # the stand-in; monkeypatch puts back what was there before
    importlib.invalidate_caches()
