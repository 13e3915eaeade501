"""Every gRPC method the scheduler's services declare, by full name: the permission-table test
and the role matrix both check that each has a rule."""

from __future__ import annotations

from google.protobuf.descriptor import MethodDescriptor

from persys._pb.persys.v1 import (
    auth_pb2,
    automation_pb2,
    buckets_pb2,
    certificates_pb2,
    control_pb2,
    meter_pb2,
    policy_pb2,
    secrets_pb2,
    volumes_pb2,
    watch_pb2,
)

MODULES = (control_pb2, auth_pb2, policy_pb2, secrets_pb2, certificates_pb2, watch_pb2, meter_pb2, volumes_pb2,
           buckets_pb2, automation_pb2)


def scheduler_methods() -> dict[str, MethodDescriptor]:
    return {f"/{s.full_name}/{m.name}": m for module in MODULES
            for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods}
