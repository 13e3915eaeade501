"""The policy's defaults written into the specs it admits (scheduler.workload_policy): a process
workload naming no network gets `processNetwork`; unset stays unset while that is `host`, so
specs written before the field keep their revision."""

from __future__ import annotations

from persys.model import WorkloadManifest
from persys.policy import WorkloadPolicy
from persys.scheduler.access.workload_policy import fill_defaults, host_user_id, refusals


def _m(process: dict[str, object]) -> WorkloadManifest:
    return WorkloadManifest.model_validate({"apiVersion": "persys.dev/v1", "kind": "Workload",
                                           "metadata": {"name": "p"},
                                           "spec": {"type": "process", "process": process}})


def test_unset_network_takes_the_policy_default() -> None:
    plain, named = _m({"command": ["sleep", "1"]}), _m({"command": ["sleep", "1"], "network": "host"})
    before = plain.spec.spec_revision()
    fill_defaults([plain, named], WorkloadPolicy())
    assert plain.spec.process is not None and plain.spec.process.network is None
    assert plain.spec.spec_revision() == before
    fill_defaults([plain, named], WorkloadPolicy(process_network="isolated"))
    assert plain.spec.process.network == "isolated"
    assert named.spec.process is not None and named.spec.process.network == "host"  # named: kept


def test_refusals_resolve_names_with_the_host_table() -> None:
    assert host_user_id("root") == 0 and host_user_id("no-such-user-here") is None
    assert refusals([_m({"command": ["id"], "user": "0000"})], WorkloadPolicy()) == [
        "spec.process.user: refused by workload policy (rootProcess): processes run as root ('0000' is uid 0) "
        "only where the policy sets allowRootProcesses"]
