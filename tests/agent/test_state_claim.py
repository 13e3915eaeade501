"""An agent's state folder names its cluster: claimed at the first start (also a folder from
before cluster ids), taken again by the same cluster, refused to another cluster's agent with
what to do (two clusters sharing one --state-dir would adopt and remove each other's instances)."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.agent.state_claim import MARKER, StateDirTaken, claim_state_dir
from persys.cli.servers.common import default_runtimes
from persys.cli.servers.errors import ServerError


def test_claimed_kept_and_refused_to_another_cluster(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    (state / "runtimes").mkdir(parents=True)  # a folder from before cluster ids: claimed as it is
    claim_state_dir(state, "c0ffee01")
    assert (state / MARKER).read_text() == "c0ffee01\n"
    claim_state_dir(state, "c0ffee01")  # a restart
    with pytest.raises(StateDirTaken, match=r"belongs to cluster c0ffee01.*its own --state-dir"):
        claim_state_dir(state, "c0ffee02")
    assert (state / MARKER).read_text() == "c0ffee01\n"
    claim_state_dir(tmp_path / "none", "")  # no cluster id (a bare runtime): nothing recorded
    assert not (tmp_path / "none").exists()


def test_the_agent_refuses_another_clusters_state_dir(tmp_path: Path) -> None:
    default_runtimes(tmp_path, "n1", cluster_id="c0ffee01")
    with pytest.raises(ServerError, match="belongs to cluster c0ffee01, not this agent's cluster c0ffee02"):
        default_runtimes(tmp_path, "n1", cluster_id="c0ffee02")
