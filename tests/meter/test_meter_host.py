"""Where the meter runs in a scheduler process (`--meter`): off builds nothing, publish needs a
bus other replicas share, a store runs the meter on the replica's own sample bus."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.events.sample_memory import MemorySampleBus
from persys.meter.config import check_spec
from persys.scheduler.rpc.meter_host import start_meter


async def test_off_publish_and_a_store(tmp_path: Path) -> None:
    events = MemoryEventBus()
    assert await start_meter("off", None, events, tmp_path, "r0", lambda: True) == (None, None)
    with pytest.raises(ValueError, match="Redis"):
        await start_meter("publish", None, events, tmp_path, "r0", lambda: True)
    bus, meter = await start_meter(f"duckdb:{tmp_path / 'm.duckdb'}", None, events, tmp_path, "r0", lambda: True)
    assert isinstance(bus, MemorySampleBus) and meter is not None and meter.bus is bus
    assert meter.status()["engine"].startswith("duckdb") and meter.status()["ok"]
    await meter.stop()
    assert (tmp_path / "m.duckdb").exists()


@pytest.mark.parametrize("spec", ["mysql://x", "chdb", "duckdb-ish", ""])
def test_unknown_specs_are_refused_naming_the_option(spec: str) -> None:
    with pytest.raises(ValueError, match="--meter"):
        check_spec(spec)
