"""Persys Meter: historical per-workload and per-node telemetry.

Samples arrive over the event bus (never etcd), an ingester writes them to a columnar store
(embedded DuckDB by default, ClickHouse for larger clusters) behind one interface, with
retention and rollups; queries serve `persysctl top --since`, `persysctl meter query` and the
gateway. Losing the meter never affects scheduling.
"""
