"""The scheduler's decisions as one pure step (etcd raft's `RawNode`/`Ready`, Nomad's reconciler).

Owns: the `Mirror` (the cluster's documents and their indexes, as data), the `Effects` a step
returns (intents to write with their guards and continuations, placement needs, deliveries to
wake, events, usage to forget) and the step functions over them (`step`: on_changes, on_report,
on_tick, on_placed), and which replica serves which node (`shards`, rendezvous hashing).
Nothing here does I/O, awaits, reads a clock or knows the store's key
layout: an import-linter allow-list keeps this package to `persys.model` and itself. The
interpreter (`persys.scheduler.interpret`) turns effects into store operations.
"""
