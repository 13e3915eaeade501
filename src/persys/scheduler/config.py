"""A scheduler replica's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from persys.scheduler.decide.liveness import GuardConfig

# Seconds the node guard may take beyond its bound (the node grace) to kill a Stop instance: its
# poll (0.5 s) and a kill (3 s at most), plus a margin. The agent side is persys.agent.node_guard.
GUARD_SLACK = 5.0


@dataclass
class SchedulerConfig:
    node_grace_seconds: float = 10.0  # without heartbeats before a node is NotReady (3+ heartbeats)
    heartbeat_interval_seconds: float = 3.0
    report_interval_seconds: float = 2.0
    pending_retry_seconds: float = 5.0
    monitor_interval_seconds: float = 1.0
    batch_size: int = 256  # workloads reconciled per batch
    max_backlog: int = 2_000  # bulk applies wait while more workloads than this await reconciling
    admission_wait_seconds: float = 10.0
    commit_concurrency: int = 16  # placement transactions (of up to 63 placements each) in flight
    # Stop filtering once max(100, this % of nodes) feasible nodes are found (100 = score every
    # node). Like kube-scheduler's percentageOfNodesToScore and Nomad's candidate limit: at 5,000
    # nodes, 2% is about 4x faster per decision than kube's adaptive 10%. Pending decisions
    # always evaluate every node, so refusals are always complete.
    nodes_to_score_percent: int = 2
    # Load-aware scoring: the weight of the observed_load scorer (recent p95 cpu and memory of
    # each node) beside the request-based ones (cpu/memory headroom 1, spread 2); 0: off.
    load_aware_weight: float = 0.0
    load_refresh_seconds: float = 30.0  # how often observations are taken into the snapshot
    # Where the scheduler remembers its cluster's id and keeps a rolling backup (None: nowhere,
    # which disables recognising a wiped store after a restart of the scheduler itself).
    data_dir: Path | None = None
    # More than this share of a replica's nodes going silent at once suspends NotReady marking
    # (with at least liveness_guard_min_nodes nodes), for at most liveness_suspension_seconds
    # (None: six grace periods, 60 s by default; 0: never suspend). See decide/liveness.py.
    max_lost_fraction: float = 0.5
    liveness_guard_min_nodes: int = 10
    liveness_suspension_seconds: float | None = None
    # How long a node this replica has not heard from since it started or was elected keeps its
    # stored status: it is neither placed on nor relocated from (None: six grace periods, 60 s by
    # default; never less than the node grace). See decide/liveness.py.
    restart_grace_seconds: float | None = None
    # Seconds after a lost node's last heartbeat before its `onDisconnect: Stop` instances are
    # relocated (None: node grace + heartbeat interval + GUARD_SLACK): the node guard has killed
    # them by then even if the agent is dead or frozen (persys.agent.node_guard).
    stop_relocation_seconds: float | None = None
    health_interval_seconds: float = 1.0
    replica_id: str = ""  # unique per replica (default: a random id)
    advertise: str = ""  # address agents should use to reach this replica when it is active
    leader_ttl_seconds: float = 2.0  # failover happens within about this long
    # Active-active: node work (agents, liveness, statuses) is spread over all live replicas by
    # rendezvous hashing; placement stays with the elected leader. Off: one active replica.
    sharded: bool = False
    backup_interval_seconds: float = 60.0
    # Log what held the event loop whenever it stalls longer than this (0: off; see replica/stalls.py).
    stall_log_seconds: float = 0.0

    def stop_relocation_delay(self) -> float:
        if self.stop_relocation_seconds is not None:
            return self.stop_relocation_seconds
        return self.node_grace_seconds + self.heartbeat_interval_seconds + GUARD_SLACK

    def restart_grace(self) -> float:
        if self.restart_grace_seconds is None:
            return 6 * self.node_grace_seconds
        return max(self.restart_grace_seconds, self.node_grace_seconds)

    def liveness_guard(self) -> GuardConfig:
        """The mass-loss guard's settings (decide/liveness.py)."""
        return GuardConfig(max_lost_fraction=self.max_lost_fraction, min_nodes=self.liveness_guard_min_nodes,
                           max_seconds=self.liveness_suspension_seconds
                           if self.liveness_suspension_seconds is not None else 6 * self.node_grace_seconds)
