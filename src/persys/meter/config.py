"""`--meter`: where Persys Meter keeps its samples, or off."""

from __future__ import annotations

from pathlib import Path

from persys.meter.base import MeterStore
from persys.meter.query import Retention

HELP = ("Persys Meter (historical usage) in this process: duckdb (DATA_DIR/meter.duckdb), duckdb:PATH, "
        "clickhouse://[user@]host[:port]/database[?secure=1] (password in $PERSYS_METER_PASSWORD), "
        "chdb:PATH (the ClickHouse engine in-process); publish: only send this replica's samples to the "
        "meter another replica runs (on the Redis event bus); off: neither. DuckDB files have one writer: "
        "run it on one replica and publish on the others; ClickHouse may serve every replica.")


def check_spec(spec: str) -> str:
    """The spec if it names a backend, else ValueError naming the option."""
    scheme = spec.partition(":")[0]
    if spec not in ("off", "publish") and scheme not in ("duckdb", "clickhouse", "chdb"):
        raise ValueError(f"--meter: {spec!r} is not duckdb[:PATH], clickhouse://..., chdb:PATH, publish or off")
    if scheme == "chdb" and not spec.partition(":")[2]:
        raise ValueError("--meter: chdb needs a directory (chdb:PATH)")
    return spec


def open_meter_store(spec: str, data_dir: Path, retention: Retention | None = None) -> MeterStore | None:
    """None for `off` and `publish`. Blocking (opens files, connects): call it off the event loop."""
    check_spec(spec)
    scheme, _, rest = spec.partition(":")
    if spec in ("off", "publish"):
        return None
    if scheme == "duckdb":
        from persys.meter.duckdb_store import open_duckdb

        return open_duckdb(Path(rest) if rest else data_dir / "meter.duckdb", retention)
    if scheme == "chdb":
        from persys.meter.clickhouse_store import open_chdb

        return open_chdb(Path(rest), retention)
    from persys.meter.clickhouse_store import open_clickhouse

    return open_clickhouse(spec, retention)
