"""The serial console check both VM runtimes pass (libvirt VMs, QEMU microVMs), on a running guest
whose console runs a shell (tests/vm_fixtures.py, tests/microvm_fixtures.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState
from persys.agent.runtimes.terminal import NO_EXIT_CODE


async def check_console(rt: Any, wid: str, run_id: str) -> None:
    """Keys typed on the serial console reach the guest's shell and its answer comes back (and is
    logged); one client at a time; detaching leaves the VM running and lets the next attach."""
    token = f"console-{run_id}"
    console = await rt.open_console(wid)
    try:
        await console.write(f"echo {token}-$((6*7))\n".encode())  # only the shell's answer says 42
        seen = b""
        try:
            async with asyncio.timeout(60):
                while f"{token}-42".encode() not in seen:
                    piece = await console.read()
                    assert piece, f"the console ended early: {seen!r}"
                    seen += piece
        except TimeoutError:
            raise AssertionError(f"no answer on the console: {seen!r}; log: {await rt.logs(wid, 40)}") from None
        with pytest.raises(RuntimeFailure) as second:
            await rt.open_console(wid)
        assert second.value.code == "InUse", second.value
    finally:
        assert await console.close() == NO_EXIT_CODE
    assert f"{token}-42" in await rt.logs(wid, tail=1000)
    again = await rt.open_console(wid)
    await again.close()
    obs = await rt.inspect(wid)
    assert obs is not None and obs.state is RuntimeState.RUNNING
