"""The replica's loops and what they share: the reconcile worker, the placer (with preemption
and instance moves, which it finishes), the node monitor, desired-state delivery, the volume
controller, taint eviction, the report queue, telemetry and the loops' metrics. `shell` is the
narrow protocol the replica lends them and `api/` (so they never import the replica)."""
