"""The cluster's workload policy at the scheduler: read from and written to the store (one key,
`/persys/policy`), and applied to every manifest at admission (apply, bulk apply, plan).

Read from the store on each admission rather than from the mirror: an admin's change holds for
the very next apply on every replica. A stored document the model refuses is logged and the
defaults hold (fail closed: never a relaxed policy by accident). While the store is unreachable
the policy last read holds (the defaults if none was), so admission still answers: an apply is
then refused by the scheduler's own frozen mode, naming it, and a plan still works.
"""

from __future__ import annotations

import logging
import pwd
from collections.abc import Sequence

from pydantic import ValidationError

from persys.model import WorkloadManifest
from persys.model.documents import DocumentError, load_json
from persys.model.manifest import ManifestError, format_validation_error
from persys.policy import WorkloadPolicy, check
from persys.scheduler.mirror import keys
from persys.store.base import StateStore, StoreUnavailable

log = logging.getLogger(__name__)


class PolicyRefusedError(ManifestError):
    """A manifest the workload policy refuses; each problem names the field and the rule."""


def host_user_id(name: str) -> int | None:
    """A user name's id in this host's user table: the scheduler's best view of what a name
    means (the agent resolves it again on its node before starting anything)."""
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError, OverflowError):
        return None


def refusals(manifests: Sequence[WorkloadManifest], policy: WorkloadPolicy) -> list[str]:
    """One line per violation; in a batch each is prefixed with its manifest's position."""
    out: list[str] = []
    for i, m in enumerate(manifests):
        prefix = f"manifest {i + 1} ({m.metadata.name}): " if len(manifests) > 1 else ""
        out += [prefix + str(v) for v in check(m.spec, policy, host_user_id)]
    return out


def fill_defaults(manifests: Sequence[WorkloadManifest], policy: WorkloadPolicy) -> None:
    """The policy's defaults written into the specs it admitted, so a node needs no policy of
    its own: a process workload naming no network gets `processNetwork` when that is not
    `host` (unset means `host`, and stays out of the revision of specs written before)."""
    for m in manifests:
        proc = m.spec.process
        if proc is not None and proc.network is None and policy.process_network != "host":
            proc.network = policy.process_network


def parse_policy(raw: bytes | str) -> WorkloadPolicy:
    """A policy document from a client; raises ManifestError naming the fields."""
    try:
        doc = load_json(raw) if raw else {}
    except DocumentError as err:
        raise ManifestError([str(err)]) from None
    try:
        return WorkloadPolicy.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err)) from None


class PolicyGate:
    """The store's policy document, with the defaults a deployment starts from."""

    def __init__(self, store: StateStore, defaults: WorkloadPolicy | None = None) -> None:
        self.store = store
        self.defaults = defaults or WorkloadPolicy()
        self._last: tuple[WorkloadPolicy, bool] | None = None  # the policy last read from the store

    async def _read(self) -> tuple[WorkloadPolicy, bool]:
        try:
            kv = await self.store.get(keys.POLICY)
        except StoreUnavailable:
            if self._last is None:
                return self.defaults, False
            return self._last
        if kv is None:
            self._last = (self.defaults, False)
            return self._last
        try:
            self._last = (WorkloadPolicy.model_validate_json(kv.value), True)
        except ValidationError as err:
            log.error("stored workload policy refused by the model, defaults hold: %s",
                      "; ".join(format_validation_error(err)))
            self._last = (self.defaults, False)
        return self._last

    async def current(self) -> tuple[WorkloadPolicy, bool]:
        """The policy in force and whether it is stored (False: the defaults)."""
        return await self._read()

    async def save(self, policy: WorkloadPolicy) -> None:
        await self.store.put(keys.POLICY, policy.to_json())
        self._last = (policy, True)

    async def admit(self, manifests: Sequence[WorkloadManifest]) -> None:
        """Raise PolicyRefusedError naming every violation; nothing is written before this passes."""
        policy, _ = await self.current()
        problems = refusals(manifests, policy)
        if problems:
            raise PolicyRefusedError(problems)
        fill_defaults(manifests, policy)
