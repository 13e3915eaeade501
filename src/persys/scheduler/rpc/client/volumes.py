"""The Volumes gRPC service (proto/persys/v1/volumes.proto): volume objects for clients,
authorized by the interceptor (security.permissions: list and get for viewers, apply and delete
for operators and admins) and audited."""

from __future__ import annotations

import json
from typing import Any

import grpc

from persys._pb.persys.v1 import volumes_pb2 as pb
from persys._pb.persys.v1 import volumes_pb2_grpc as pb_grpc
from persys.model.documents import DocumentError, load_json
from persys.model.kinds import validate_volume
from persys.model.manifest import ManifestError
from persys.model.volume import VolumeManifest
from persys.scheduler.access.admission import InputLimits
from persys.scheduler.api.volumes import VolumeApi
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rpc.status import mapped

MAX_NAME = 63


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_volume(raw: bytes) -> VolumeManifest:
    try:
        doc = load_json(raw)
    except DocumentError as err:
        raise ManifestError([str(err)]) from None
    return validate_volume(doc)


class VolumesService(pb_grpc.VolumesServicer):
    def __init__(self, scheduler: Scheduler, limits: InputLimits | None = None) -> None:
        self.api = VolumeApi(scheduler)
        self.limits = limits or InputLimits()

    async def _name(self, context: grpc.aio.ServicerContext, name: str) -> None:
        if not name or len(name) > MAX_NAME:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"name: 1-{MAX_NAME} characters")

    async def ApplyVolume(self, request: pb.ApplyVolumeRequest, context: grpc.aio.ServicerContext  # noqa: N802
                          ) -> pb.VolumeAnswer:
        problem = self.limits.manifest_problem(request.manifest_json)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        async with mapped(context):
            v, created, changed = await self.api.apply(parse_volume(request.manifest_json), request.dry_run)
            return pb.VolumeAnswer(volume_json=_dumps(v.to_doc()), created=created, changed=changed)

    async def GetVolume(self, request: pb.GetVolumeRequest, context: grpc.aio.ServicerContext  # noqa: N802
                        ) -> pb.VolumeAnswer:
        await self._name(context, request.name)
        async with mapped(context):
            return pb.VolumeAnswer(volume_json=_dumps(self.api.get(request.name)))

    async def ListVolumes(self, request: pb.ListVolumesRequest, context: grpc.aio.ServicerContext  # noqa: N802
                          ) -> pb.ListVolumesResponse:
        return pb.ListVolumesResponse(items=[_dumps(d) for d in self.api.list()])

    async def SnapshotVolume(self, request: pb.SnapshotVolumeRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> pb.VolumeAnswer:
        await self._name(context, request.name)
        async with mapped(context):
            v, changed = await self.api.snapshot(request.name, request.snapshot[:200], request.delete)
            return pb.VolumeAnswer(volume_json=_dumps(v.to_doc()), changed=changed)

    async def DeleteVolume(self, request: pb.DeleteVolumeRequest, context: grpc.aio.ServicerContext  # noqa: N802
                           ) -> pb.DeleteVolumeResponse:
        await self._name(context, request.name)
        async with mapped(context):
            deleted, gone = await self.api.delete(request.name)
            return pb.DeleteVolumeResponse(deleted=deleted, already_gone=gone)
