"""Why a scheduler replica refuses a call: the errors its API raises and its servers map to
status codes (rpc/agent_control.py, the gateway)."""

from __future__ import annotations


class MutationRefused(Exception):
    """The control plane cannot accept a change right now (concurrent writers, ...)."""


class Frozen(MutationRefused):
    """Refused because the control plane is degraded or in recovery."""


class NotFound(KeyError):
    pass


class NotActive(Exception):
    """This replica is a standby; `leader` is the active replica's address ('' if unknown)."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"this scheduler replica is a standby; the active one is {leader or 'not elected yet'}")
        self.leader = leader


class CatchingUp(NotActive):
    """Elected, but the mirror has not applied every change up to this replica's own leader key
    yet: it acts on nothing until it has. Agents are told the leader is this replica and retry."""

    def __init__(self, address: str, revision: int, needed: int) -> None:
        Exception.__init__(self, f"this scheduler replica was elected and is catching up with the state store "
                                 f"(mirror at revision {revision}, needs {needed}); retry shortly")
        self.leader = address
