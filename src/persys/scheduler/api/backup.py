"""Backup and restore: the persys-backup/v1 document (built from the stored bytes, checked
before anything is written back) and the replica's backup operations (a download, a rolling
local copy, a restore, an operator's confirmation of an empty store)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from persys.scheduler.errors import Frozen, MutationRefused, NotFound
from persys.scheduler.ha.mode_guard import Mode
from persys.scheduler.interpret.group_commit import TXN_MAX_OPS, chunk_ops
from persys.scheduler.mirror import keys
from persys.scheduler.work.shell import Shell
from persys.store.base import Delete, KeyValue, Put

BACKUP_FORMAT = "persys-backup/v1"


def backup_head(revision: int, cluster_id: str, created_at: float) -> bytes:
    """The document's opening, up to where its items start."""
    head = json.dumps({"format": BACKUP_FORMAT, "createdAt": created_at, "revision": revision,
                       "clusterId": cluster_id})
    return head[:-1].encode() + b',"items":['


def backup_items(kvs: list[KeyValue], first: bool) -> bytes:
    """One page of keys as items, from the stored bytes as they are: every value is a JSON
    document already, so nothing is decoded or re-encoded. Ephemeral keys are left out."""
    items = [b'{"key":%s,"value":%s}' % (json.dumps(kv.key).encode(), kv.value)
             for kv in kvs if not keys.is_ephemeral(kv.key)]
    return (b"" if first or not items else b",") + b",".join(items)


def restore_items(doc: dict[str, Any]) -> tuple[list[Put | Delete], bytes]:
    """A backup document's writes, checked before anything is written: (the puts, the cluster
    marker, which goes last so that an interrupted restore is recognised as incomplete)."""
    if doc.get("format") != BACKUP_FORMAT or not isinstance(doc.get("items"), list):
        raise ValueError(f"not a Persys backup (expected format {BACKUP_FORMAT!r})")
    items = [(str(i["key"]), json.dumps(i["value"]).encode()) for i in doc["items"]
             if not keys.is_ephemeral(str(i["key"]))]
    if any(not k.startswith(keys.ROOT) for k, _ in items):
        raise ValueError(f"backup holds keys outside {keys.ROOT}")
    marker = next((v for k, v in items if k == keys.CLUSTER), None)
    if marker is None:
        raise ValueError("backup holds no cluster marker")
    return [Put(k, v) for k, v in items if k != keys.CLUSTER], marker


class Backups:
    def __init__(self, shell: Shell) -> None:
        self.s = shell

    async def backup(self) -> dict[str, Any]:
        """Every durable key, read at one store revision."""
        doc: dict[str, Any] = json.loads(await self.backup_json())
        return doc

    async def backup_json(self) -> bytes:
        """`backup()` as JSON."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The document in pieces, a page of keys at a time: a large cluster's backup never
        sits in memory whole, and no step holds the event loop for more than about a
        millisecond."""
        first = True
        async for kvs, revision in self.s.store.range_pages(keys.ROOT):
            if first:
                yield backup_head(revision, self.s.guard.cluster_id, time.time())
            # A page takes about a millisecond to assemble: done here between other work rather
            # than in a thread, whose contention for the interpreter lock would delay the loop
            # by up to a switch interval (5 ms) at a time.
            chunk = backup_items(kvs, first)
            first = first and not chunk
            yield chunk
            await asyncio.sleep(0)
        yield b"]}"

    async def write_local(self) -> None:
        assert self.s.config.data_dir is not None
        if self.s.state.cluster_marker is None:
            return  # never overwrite a good backup with a wiped store's
        target = self.s.config.data_dir / "backups" / "latest.json"
        tmp = target.with_suffix(".tmp")
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            async for chunk in self.chunks():
                await asyncio.to_thread(f.write, chunk)
        await asyncio.to_thread(tmp.replace, target)  # atomic: a crash never leaves half a backup

    def local_backup(self) -> dict[str, Any]:
        path = self.s.config.data_dir / "backups" / "latest.json" if self.s.config.data_dir else None
        if path is None or not path.exists():
            raise NotFound("local backup (this scheduler has no data directory or has not written one yet)")
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc

    async def restore(self, doc: dict[str, Any], force: bool = False) -> dict[str, Any]:
        """Write a backup back into the store and resume. Only in recovery unless forced."""
        guard = self.s.guard
        if guard.mode == Mode.DEGRADED:
            raise Frozen("cannot restore while the state store is unreachable")
        if guard.mode != Mode.RECOVERY and not force:
            raise MutationRefused("the control plane is not in recovery; restoring would overwrite live state "
                                  "(use --force to do it anyway)")
        ops, marker = restore_items(doc)
        for chunk in chunk_ops(ops, TXN_MAX_OPS):
            await self.s.store.txn([], chunk)
        await self.s.store.put(keys.CLUSTER, marker)
        guard.remember(str(json.loads(marker)["id"]))
        await self.s.state.reset()
        guard.set(Mode.NORMAL)
        restored = len(ops) + 1
        self.s.emit("Restored", "cluster", f"{restored} keys restored (backup of revision {doc.get('revision')})")
        return {"restored": restored, "clusterId": guard.cluster_id}

    async def recover(self) -> dict[str, Any]:
        """The operator confirms that the state store's empty state is the truth."""
        if self.s.guard.mode != Mode.RECOVERY:
            raise MutationRefused("the control plane is not in recovery; nothing to confirm")
        marker = await self.s.guard.create_marker()
        await self.s.state.reset()
        self.s.guard.set(Mode.NORMAL)
        self.s.emit("Recovered", "cluster", "operator confirmed the current state store contents")
        return {"clusterId": marker["id"], "workloads": len(self.s.state.workloads)}
