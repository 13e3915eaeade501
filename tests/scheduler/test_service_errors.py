"""How the scheduler's gRPC service maps failures to status codes (a stub scheduler, a stub
context that records the abort)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys.scheduler.errors import NotFound
from persys.scheduler.rpc.agent_control import AgentControlService


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def set_trailing_metadata(self, md: Any) -> None:
        pass


class NoBackup:
    def local_backup(self) -> dict[str, Any]:
        raise NotFound("local backup (this scheduler has no data directory or has not written one yet)")

    async def restore(self, doc: dict[str, Any], force: bool = False) -> dict[str, Any]:
        raise AssertionError("not reached")


class Replica:
    """The parts of a replica the service takes; a restore calls only the backups."""
    store = None  # the service's policy gate holds it; restore never reads the policy
    workload_api = agent_api = node_api = node_volumes = None
    backups = NoBackup()


async def restore_code(request: pb.RestoreRequest) -> tuple[grpc.StatusCode, str]:
    service = AgentControlService(Replica(), require_identity=False)  # type: ignore[arg-type]
    with pytest.raises(Aborted) as caught:
        await service.Restore(request, Context())  # type: ignore[arg-type]
    return caught.value.code, caught.value.details


async def test_restore_without_a_local_backup_is_not_found() -> None:
    code, details = await restore_code(pb.RestoreRequest(latest_local=True))
    assert code == grpc.StatusCode.NOT_FOUND and "local backup" in details and "invalid" not in details


async def test_restore_of_a_malformed_backup_is_invalid() -> None:
    code, details = await restore_code(pb.RestoreRequest(backup_json=b"[1, 2]"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("invalid backup")
