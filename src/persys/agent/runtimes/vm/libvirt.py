"""The libvirt binding (imported lazily: the agent runs on nodes without libvirt), one shared
connection, and the translation of what libvirt says (domain states, stats, addresses) into ours."""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState

DEFAULT_URI = "qemu:///system"
LIBVIRT_QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")


_loaded: list[Any] = []  # the module once imported; a failure is not remembered
_loading = threading.Lock()  # probes and calls run in worker threads: one import and event loop


def load_libvirt() -> tuple[Any, str]:
    """(module, "") or (None, why). Imported lazily so the agent runs on nodes without libvirt,
    and tried again at every probe until it imports: a binding installed while the agent runs
    is picked up at its next capability probe, without a restart."""
    if _loaded:
        return _loaded[0], ""
    with _loading:
        return _load()


def _load() -> tuple[Any, str]:
    if _loaded:
        return _loaded[0], ""
    importlib.invalidate_caches()  # the import system's directory caches may predate the install
    try:
        mod = importlib.import_module("libvirt")
    except ImportError as exc:
        return None, (f"python binding not installed ({exc}); install it with "
                      "`.venv/bin/pip install libvirt-python` (needs Debian's libvirt-dev, pkg-config, gcc)")
    # libvirt's default handler prints every error to stderr; they arrive as exceptions anyway.
    mod.registerErrorHandler(lambda _ctx, _err: None, None)
    # An event loop before any connection opens: without one the remote driver reads a stream's
    # incoming data (a console's output) only while a call is in flight, so a non-blocking
    # console would never see any. It runs in a daemon thread of its own.
    mod.virEventRegisterDefaultImpl()
    threading.Thread(target=_run_events, args=(mod,), name="libvirt-events", daemon=True).start()
    _loaded.append(mod)
    return mod, ""


def _run_events(mod: Any) -> None:
    while True:
        mod.virEventRunDefaultImpl()


def lv_module() -> Any:
    mod, why = load_libvirt()
    if mod is None:
        raise RuntimeFailure(why, code="RuntimeUnavailable")
    return mod


def err_code(exc: BaseException) -> int:
    get = getattr(exc, "get_error_code", None)
    return int(get() or 0) if get is not None else 0


def version_str(v: int) -> str:
    return f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"

class Connection:
    """One libvirt connection shared by worker threads (every libvirt call blocks), reopened
    when it died (libvirtd restarted)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        lv = lv_module()
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except lv.libvirtError:
                    pass
                with contextlib.suppress(lv.libvirtError):
                    self._conn.close()
                self._conn = None
            try:
                self._conn = lv.open(self.uri)
            except lv.libvirtError as exc:
                raise RuntimeFailure(f"libvirt not reachable at {self.uri}: {exc}") from exc
            return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def map_state(lv: Any, state: int, reason: int) -> tuple[RuntimeState, int | None, str]:
    """libvirt (state, reason) -> (state, exit code, message). A guest that powered itself off
    counts as exit code 0, so `OnFailure` does not restart it."""
    if state in (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_BLOCKED):
        return RuntimeState.RUNNING, None, ""
    if state == lv.VIR_DOMAIN_PAUSED:
        return RuntimeState.RUNNING, None, "paused"
    if state == lv.VIR_DOMAIN_PMSUSPENDED:
        return RuntimeState.RUNNING, None, "suspended by the guest"
    if state == lv.VIR_DOMAIN_SHUTDOWN:
        return RuntimeState.RUNNING, None, "shutting down"
    if state == lv.VIR_DOMAIN_CRASHED:
        return RuntimeState.FAILED, None, "guest crashed"
    if state == lv.VIR_DOMAIN_SHUTOFF:
        return _shutoff_state(lv, reason)
    return RuntimeState.FAILED, None, f"unknown domain state {state}/{reason}"


def _shutoff_state(lv: Any, reason: int) -> tuple[RuntimeState, int | None, str]:
    """A shut-off domain by why it stopped: only a guest's own power-off is a clean exit."""
    if reason == lv.VIR_DOMAIN_SHUTOFF_SHUTDOWN:
        return RuntimeState.STOPPED, 0, "guest powered off"
    if reason == lv.VIR_DOMAIN_SHUTOFF_DESTROYED:
        return RuntimeState.STOPPED, None, "powered off from the host"
    if reason == lv.VIR_DOMAIN_SHUTOFF_CRASHED:
        return RuntimeState.FAILED, None, "guest crashed"
    if reason == lv.VIR_DOMAIN_SHUTOFF_FAILED:
        return RuntimeState.FAILED, None, "QEMU failed to start the VM"
    if reason == getattr(lv, "VIR_DOMAIN_SHUTOFF_DAEMON", -1):
        return RuntimeState.FAILED, None, "QEMU ended while libvirtd was down"
    return RuntimeState.STOPPED, None, "not running"


def sum_indexed(stats: Mapping[str, Any], group: str, key: str) -> int:
    count = int(stats.get(f"{group}.count", 0) or 0)
    return sum(int(stats.get(f"{group}.{i}.{key}", 0) or 0) for i in range(count))


def addresses(lv: Any, dom: Any, ask_agent: bool) -> list[str]:
    """Best effort, cheapest first: libvirt's DHCP leases, the host's ARP table, and (only when
    asked: a round trip into the guest, which can wait on a busy agent) the guest agent."""
    sources = [lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP]
    if ask_agent:
        sources.append(lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
    for src in sources:
        try:
            ifaces = dom.interfaceAddresses(src)
        except lv.libvirtError:
            continue
        ips = [
            a["addr"]
            for name, iface in sorted((ifaces or {}).items())
            if name != "lo"
            for a in (iface.get("addrs") or [])
            if a.get("addr") and not str(a["addr"]).startswith(("127.", "::1", "fe80:"))
        ]
        if ips:
            return ips
    return []
