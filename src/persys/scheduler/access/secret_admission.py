"""Admission of workloads' secret references: every secret and key a manifest names must exist
when it is applied (or planned), else INVALID_ARGUMENT naming the field and nothing is written.

The gate extends the workload policy's (`PolicyGate.admit` runs on apply, bulk apply and plan),
so AgentControl needs no second hook. A secret deleted later is reported by the instance's
status when its node cannot get the values (SecretUnavailable)."""

from __future__ import annotations

from collections.abc import Sequence

from persys.model import WorkloadManifest
from persys.model.manifest import ManifestError
from persys.policy import WorkloadPolicy
from persys.scheduler.access.workload_policy import PolicyGate
from persys.secrets import refs
from persys.secrets.base import SecretNotFound, SecretStore, SecretUnavailable
from persys.store.base import StateStore, StoreUnavailable


class SecretRefusedError(ManifestError):
    """A manifest referring to a secret or key that does not exist."""


class SecretAwareGate(PolicyGate):
    def __init__(self, store: StateStore, secrets: SecretStore, defaults: WorkloadPolicy | None = None) -> None:
        super().__init__(store, defaults)
        self.secrets = secrets

    async def admit(self, manifests: Sequence[WorkloadManifest]) -> None:
        await super().admit(manifests)
        wanted = sorted({n for m in manifests if m.spec.secrets is not None for n in m.spec.secrets.names()})
        keys_of: dict[str, tuple[str, ...]] = {}
        for name in wanted:
            try:
                keys_of[name] = (await self.secrets.info(name)).keys
            except SecretNotFound:
                continue
            except SecretUnavailable as err:
                raise StoreUnavailable(f"secret store: {err}") from None
        problems: list[str] = []
        for i, m in enumerate(manifests):
            prefix = f"manifest {i + 1} ({m.metadata.name}): " if len(manifests) > 1 else ""
            problems += [prefix + p for p in refs.missing(m.spec, keys_of)]
        if problems:
            raise SecretRefusedError(problems)
