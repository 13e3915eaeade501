"""Persys: an explainable compute control plane for machines you control."""

import os

# gRPC's fork handlers must stay off: the agent starts workloads with fork+exec (setgroups rules
# out vfork) while gRPC's poller threads run, and with the handlers on a child can abort in the
# poller's at-fork reset before it reaches exec (seen in CI: "Check failed:
# next_worker->initialized_cv", a workload that never started). Persys never forks without exec,
# so it needs none of what they do. Read when gRPC initialises, so set before any import of it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
