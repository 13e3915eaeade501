"""The meter on ClickHouse: a server through clickhouse-connect (clusters that outgrow one
machine), or the same engine in-process through chDB (the contract suite, benchmarks). Both send
the statements of clickhouse_sql.py and sql.py."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from persys.events.samples import Sample
from persys.meter import clickhouse_sql
from persys.meter.query import Retention
from persys.meter.sql_store import SqlMeterStore

PASSWORD_ENV = "PERSYS_METER_PASSWORD"  # never in the URL (it would show in process lists and logs)


class ChdbExecutor:
    """The ClickHouse engine in this process (chDB), its data in `path`."""

    transactional = False

    def __init__(self, path: Path, database: str = "persys") -> None:
        import chdb
        from chdb import session

        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        open_session: Any = session.Session  # chdb ships no type hints
        self.s: Any = open_session(str(path))
        self.s.query(f"CREATE DATABASE IF NOT EXISTS {database}")
        self.dialect = clickhouse_sql.dialect(database)
        version = json.loads(str(self.s.query("SELECT version()", "JSONCompact")))["data"][0][0]
        self.engine = f"clickhouse {version} (chdb {chdb.__version__})"

    def rows(self, statement: str) -> list[tuple[Any, ...]]:
        text = str(self.s.query(statement, "JSONCompact"))
        return [tuple(r) for r in json.loads(text)["data"]] if text.strip() else []

    def run(self, statement: str) -> None:
        self.s.query(statement)

    def insert(self, samples: Sequence[Sample]) -> None:
        self.s.query(clickhouse_sql.insert_sql(self.dialect, samples))

    def size(self) -> int:
        self.s.query("OPTIMIZE TABLE " + self.dialect.prefix + "meter_raw FINAL")
        got = self.rows(f"SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = "
                        f"{clickhouse_sql.quote(self.dialect.prefix.rstrip('.'))}")
        return int(got[0][0]) if got else 0

    def close(self) -> None:
        self.s.close()


class ClickHouseServerExecutor:
    """A ClickHouse server: `clickhouse://[user@]host[:port]/database[?secure=1]` (HTTP interface,
    8123 by default, 8443 with secure=1); the password from $PERSYS_METER_PASSWORD."""

    transactional = False

    def __init__(self, url: str) -> None:
        import clickhouse_connect

        parts = urlsplit(url)
        if parts.password is not None:
            raise ValueError(f"meter URL: no password in the URL; set ${PASSWORD_ENV}")
        secure = parse_qs(parts.query).get("secure", ["0"])[0] in ("1", "true")
        database = parts.path.strip("/") or "persys"
        self.client: Any = clickhouse_connect.get_client(
            host=parts.hostname or "localhost", port=parts.port or (8443 if secure else 8123),
            username=parts.username or "default", password=os.environ.get(PASSWORD_ENV, ""), secure=secure)
        self.client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
        self.dialect = clickhouse_sql.dialect(database)
        self.engine = f"clickhouse {self.client.server_version} (server)"

    def rows(self, statement: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.client.query(statement).result_rows]

    def run(self, statement: str) -> None:
        self.client.command(statement)

    def insert(self, samples: Sequence[Sample]) -> None:
        self.client.command(clickhouse_sql.insert_sql(self.dialect, samples))

    def size(self) -> int:
        got = self.rows(f"SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = "
                        f"{clickhouse_sql.quote(self.dialect.prefix.rstrip('.'))}")
        return int(got[0][0]) if got and got[0][0] is not None else 0

    def close(self) -> None:
        self.client.close()


def open_chdb(path: Path, retention: Retention | None = None) -> SqlMeterStore:
    return SqlMeterStore(ChdbExecutor(path), retention)


def open_clickhouse(url: str, retention: Retention | None = None) -> SqlMeterStore:
    return SqlMeterStore(ClickHouseServerExecutor(url), retention)
