"""The Buckets gRPC service (proto/persys/v1/buckets.proto): buckets on Ceph RGW for clients,
authorized by the interceptor (security.permissions: list and get for viewers, the rest for
operators and admins) and audited. No answer carries a key's secret value."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from persys._pb.persys.v1 import buckets_pb2 as pb
from persys._pb.persys.v1 import buckets_pb2_grpc as pb_grpc
from persys.aborting import aborting
from persys.model.bucket import KEY_ID_RE, BucketManifest, bucket_name_rule
from persys.model.documents import DocumentError, load_json
from persys.model.kinds import validate_bucket
from persys.model.manifest import ManifestError
from persys.scheduler.access.admission import InputLimits
from persys.scheduler.api.buckets import BucketApi, BucketsUnavailable
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rpc.status import UNAVAILABLE_METADATA, dumps, mapped
from persys.secrets.base import SecretStore
from persys.storage.rgw import RgwAdmin


def parse_bucket(raw: bytes) -> BucketManifest:
    try:
        doc = load_json(raw)
    except DocumentError as err:
        raise ManifestError([str(err)]) from None
    return validate_bucket(doc)


@aborting
@contextlib.asynccontextmanager
async def bucket_errors(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    async with mapped(context):
        try:
            yield
        except BucketsUnavailable as err:
            # This replica answered: the client must not take it for unreachable and fail over.
            context.set_trailing_metadata(((UNAVAILABLE_METADATA, err.dependency),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))


class BucketsService(pb_grpc.BucketsServicer):
    def __init__(self, scheduler: Scheduler, rgw: RgwAdmin | None, secrets: SecretStore | None,
                 limits: InputLimits | None = None) -> None:
        self.api = BucketApi(scheduler, rgw, secrets)
        self.limits = limits or InputLimits()

    async def _name(self, context: grpc.aio.ServicerContext, name: str, field: str = "name") -> None:
        problem = bucket_name_rule(name)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem[:200]}")

    async def CreateBucket(self, request: pb.CreateBucketRequest, context: grpc.aio.ServicerContext  # noqa: N802
                           ) -> pb.BucketAnswer:
        problem = self.limits.manifest_problem(request.manifest_json)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        async with bucket_errors(context):
            b, created = await self.api.create(parse_bucket(request.manifest_json), request.dry_run)
            return pb.BucketAnswer(bucket_json=dumps(self.api.view(b)), created=created)

    async def GetBucket(self, request: pb.GetBucketRequest, context: grpc.aio.ServicerContext  # noqa: N802
                        ) -> pb.BucketAnswer:
        await self._name(context, request.name)
        async with bucket_errors(context):
            return pb.BucketAnswer(bucket_json=dumps(await self.api.get(request.name)))

    async def ListBuckets(self, request: pb.ListBucketsRequest, context: grpc.aio.ServicerContext  # noqa: N802
                          ) -> pb.ListBucketsResponse:
        async with bucket_errors(context):
            return pb.ListBucketsResponse(items=[dumps(d) for d in await self.api.list_all()])

    async def DeleteBucket(self, request: pb.DeleteBucketRequest, context: grpc.aio.ServicerContext  # noqa: N802
                           ) -> pb.DeleteBucketResponse:
        await self._name(context, request.name)
        async with bucket_errors(context):
            deleted, gone = await self.api.delete(request.name, request.purge)
            return pb.DeleteBucketResponse(deleted=deleted, already_gone=gone)

    async def CreateBucketKey(self, request: pb.CreateBucketKeyRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> pb.BucketKeyAnswer:
        await self._name(context, request.bucket, "bucket")
        async with bucket_errors(context):
            key = await self.api.create_key(request.bucket, request.role)
            return pb.BucketKeyAnswer(key_json=dumps(key.to_doc()))

    async def ListBucketKeys(self, request: pb.ListBucketKeysRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> pb.ListBucketKeysResponse:
        await self._name(context, request.bucket, "bucket")
        async with bucket_errors(context):
            return pb.ListBucketKeysResponse(items=[dumps(k) for k in await self.api.list_keys(request.bucket)])

    async def DeleteBucketKey(self, request: pb.DeleteBucketKeyRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext) -> pb.DeleteBucketKeyResponse:
        await self._name(context, request.bucket, "bucket")
        if not KEY_ID_RE.fullmatch(request.key_id):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "keyId: 6 lowercase letters or digits")
        async with bucket_errors(context):
            deleted, gone = await self.api.delete_key(request.bucket, request.key_id)
            return pb.DeleteBucketKeyResponse(deleted=deleted, already_gone=gone)
