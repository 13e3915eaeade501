"""Operating modes: when the state store cannot be trusted, freeze instead of guessing.

normal    the store answers and holds this cluster's marker: scheduling and mutations run.
degraded  the store does not answer: mutations are refused, agents hold (keep what runs, start
          and stop nothing on their own), reads come from the last known state.
recovery  the store answers but this cluster's state is gone (no marker, another cluster's
          marker, or its revision went backwards): frozen, nothing is deleted anywhere, until
          an operator restores a backup or confirms the empty state (`persysctl admin recover`).

The scheduler remembers its cluster's id in its data directory, so an empty store after a
restart is recognised as a lost database, not as a new cluster.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from persys.scheduler.mirror import keys
from persys.store.base import Compare, Put, StateStore, StoreUnavailable

log = logging.getLogger(__name__)


class Mode(StrEnum):
    NORMAL = "normal"
    DEGRADED = "degraded"
    RECOVERY = "recovery"


class ModeGuard:
    def __init__(
        self,
        store: StateStore,
        data_dir: Path | None,
        on_change: Callable[[Mode, Mode, str], None],
        mirror_revision: Callable[[], int],
    ) -> None:
        self.store = store
        self.data_dir = data_dir
        self.on_change = on_change
        self.mirror_revision = mirror_revision
        self.mode = Mode.NORMAL
        self.reason = ""
        self.store_revision = 0  # the store's revision as the last probe read it
        self.cluster_id = self._remembered()

    # ------------------------------------------------------------------ the remembered cluster id

    def _id_file(self) -> Path | None:
        return self.data_dir / "cluster-id" if self.data_dir else None

    def _remembered(self) -> str:
        f = self._id_file()
        try:
            return f.read_text().strip() if f else ""
        except OSError:
            return ""

    def remember(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        f = self._id_file()
        if f is not None:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(cluster_id + "\n")

    # ------------------------------------------------------------------ transitions

    def set(self, mode: Mode, reason: str = "") -> None:
        if mode == self.mode and reason == self.reason:
            return
        old, self.mode, self.reason = self.mode, mode, reason
        if old != mode:
            log.warning("operating mode %s -> %s: %s", old, mode, reason or "ok")
            self.on_change(old, mode, reason)

    async def establish(self, marker: dict[str, object] | None, store_has_state: bool) -> None:
        """Decide the mode at start-up, creating the marker only for a genuinely new cluster."""
        if marker is None:
            if self.cluster_id:
                self.set(Mode.RECOVERY, f"the state store holds no cluster marker, but this scheduler belongs to "
                                        f"cluster {self.cluster_id}: refusing to treat an empty store as an empty "
                                        "cluster (restore a backup, or confirm with `persysctl admin recover`)")
                return
            if store_has_state:
                self.set(Mode.RECOVERY, "the state store holds workloads but no cluster marker")
                return
            await self.create_marker()
            return
        found = str(marker.get("id", ""))
        if self.cluster_id and found and found != self.cluster_id:
            self.set(Mode.RECOVERY, f"the state store belongs to cluster {found}, not {self.cluster_id}")
            return
        self.remember(found or self.cluster_id)
        self.set(Mode.NORMAL)

    async def create_marker(self, cluster_id: str = "") -> dict[str, object]:
        marker: dict[str, object] = {"id": cluster_id or self.cluster_id or uuid.uuid4().hex,
                                     "created_at": time.time()}
        created = await self.store.txn([Compare(keys.CLUSTER, 0)], [Put(keys.CLUSTER, json.dumps(marker).encode())])
        if created is None:  # another replica created it first: join that cluster
            kv = await self.store.get(keys.CLUSTER)
            if kv is not None:
                marker = json.loads(kv.value)
        self.remember(str(marker["id"]))
        return marker

    async def check(self) -> None:
        """One health probe of the store; moves between modes."""
        # Read our own position first: writes landing while the probe runs must not make the
        # store look as if it went backwards.
        seen = self.mirror_revision()
        try:
            status = await self.store.status()
            kv = await self.store.get(keys.CLUSTER)
        except StoreUnavailable as err:
            self.set(Mode.DEGRADED, f"state store unreachable: {err}")
            return
        marker_id = ""
        if kv is not None:
            try:
                marker_id = str(json.loads(kv.value).get("id", ""))
            except (ValueError, AttributeError):
                marker_id = ""
        revision = int(status.get("revision", 0) or 0)  # type: ignore[call-overload]
        self.store_revision = revision
        if status.get("full"):
            # Reads answer, writes do not: nothing can be decided durably (no lease, no commit).
            self.set(Mode.DEGRADED, f"state store full: {status['full']}")
            return
        if not marker_id:
            self.set(Mode.RECOVERY, "the state store answers but this cluster's marker is gone (was it wiped?); "
                                    "frozen: restore a backup or confirm with `persysctl admin recover`")
        elif self.cluster_id and marker_id != self.cluster_id:
            self.set(Mode.RECOVERY, f"the state store now belongs to cluster {marker_id}, not {self.cluster_id}")
        elif revision and revision < seen:
            self.set(Mode.RECOVERY, f"the state store's revision went backwards ({revision} < {seen}): "
                                    "it was replaced")
        else:
            if not self.cluster_id:
                self.remember(marker_id)
            self.set(Mode.NORMAL)
