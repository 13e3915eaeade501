"""The meter's ClickHouse dialect: DDL, literals and the VALUES of an insert. One module for both
ClickHouse backends (a server through clickhouse-connect, the in-process engine through chDB), so
the contract suite on chDB runs the statements production sends to a server."""

from __future__ import annotations

from collections.abc import Sequence

from persys.events.samples import COLUMNS, METRICS, Sample
from persys.meter import sql

_KEYS = ("kind LowCardinality(String), node LowCardinality(String), workload LowCardinality(String), "
         "instance String, runtime LowCardinality(String), labels LowCardinality(String)")


def quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _metric(name: str) -> str:
    # Gauges change slowly: Gorilla XOR encoding then ZSTD keeps a sample near a few bytes.
    return f"{name} Float64 CODEC(Gorilla, ZSTD(1))"


def _create(table: str, rollup: bool) -> str:
    if not rollup:
        return (f"CREATE TABLE IF NOT EXISTS {table} (ts Float64 CODEC(DoubleDelta, ZSTD(1)), {_KEYS}, "
                + ", ".join(_metric(m) for m in METRICS)
                + ") ENGINE = MergeTree ORDER BY (kind, workload, instance, ts)")
    cols = ", ".join(_metric(f"{m}_{p}") for m in METRICS for p in ("sum", "min", "max", "last"))
    return (f"CREATE TABLE IF NOT EXISTS {table} (bucket Float64, {_KEYS}, n UInt64, last_ts Float64, {cols}) "
            "ENGINE = MergeTree ORDER BY (kind, workload, instance, bucket)")


def dialect(database: str) -> sql.Dialect:
    prefix = f"{database}." if database else ""
    return sql.Dialect(
        name="clickhouse", arg_max="argMax", quote=quote,
        contains=lambda col, needle: f"position(concat(',', {col}, ','), {needle}) > 0",
        create=_create,
        add_column=lambda table, col: f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {_metric(col)}",
        create_marks=f"CREATE TABLE IF NOT EXISTS {prefix}meter_{sql.MARKS} (name String, value Float64) "
                     "ENGINE = MergeTree ORDER BY name",
        prefix=prefix,
    )


def insert_sql(d: sql.Dialect, samples: Sequence[Sample]) -> str:
    values = ",".join("(" + ",".join(sql.literal(v, quote) for v in s.row()) + ")" for s in samples)
    return f"INSERT INTO {sql.table_name(d, 'raw')} ({', '.join(COLUMNS)}) VALUES {values}"
