"""What the REST API accepts and answers, as pydantic models and OpenAPI fragments.

Small JSON bodies (labels, taints) are pydantic request models that FastAPI validates, so a
wrongly typed field is a 422 naming it. Manifest, batch, backup and image bodies are read with a
size limit and parsed off the event loop (`bodies`), so they are described to OpenAPI here from
the same pydantic models instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from persys.model.automation import PolicyManifest
from persys.model.bucket import BucketManifest
from persys.model.limits import BATCH_MAX_ITEMS, EXEC_STDIN_MAX_BYTES, EXEC_TIMEOUT_MAX_SECONDS, EXEC_TIMEOUT_SECONDS
from persys.model.names import NAME_RE
from persys.model.volume import VolumeManifest
from persys.model.workload import WorkloadManifest


def _encodable(v: str) -> str:
    # JSON may carry lone surrogates ("\ud800"): valid for Python, not for protobuf's UTF-8.
    try:
        v.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return v


Key = Annotated[StrictStr, Field(min_length=1, max_length=253), AfterValidator(_encodable)]
Value = Annotated[StrictStr, Field(max_length=1024), AfterValidator(_encodable)]

WORKLOAD_ID = NAME_RE.pattern
INSTANCE_ID = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[0-9]{1,9})?$"
ImageKind = Literal["docker", "rootfs", "disk", "kernel", "initrd"]
HeldImageKind = Literal["docker", "disk", "kernel", "initrd"]  # rootfs imports become docker images


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LabelChange(_Body):
    """Set and remove operator labels of a node."""

    set: dict[Key, Value] = Field(default_factory=dict, max_length=256)
    remove: list[Key] = Field(default_factory=list, max_length=256)


class RollbackRequest(_Body):
    """Which kept revision of a workload to apply again (`persysctl rollout undo`)."""

    generation: int = Field(0, ge=0, le=2**62, strict=True, description=(
        "A generation listed by GET /v1/workloads/{id}/revisions; 0 or absent: the one before the newest"))


class TaintSpec(_Body):
    key: Key
    value: Value = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class TaintChange(_Body):
    """Add operator taints to a node; `remove` holds keys or `key:Effect`."""

    add: list[TaintSpec] = Field(default_factory=list, max_length=256)
    remove: list[Key] = Field(default_factory=list, max_length=256)


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


# Statuses every route that asks the scheduler may answer (scheduler errors map onto these).
SCHEDULER_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("Invalid request (each problem names its field path)"),
    403: _error("The scheduler refused this certificate"),
    404: _error("Not found"),
    409: _error("Conflict or failed precondition (e.g. the cluster is not in a mode that allows this)"),
    422: {"description": "Invalid parameter or body field (FastAPI validation; `detail` names each)"},
    502: _error("The scheduler or an agent failed in an unexpected way"),
    503: {**_error("The scheduler is unreachable, degraded or in recovery; or overloaded: a read (GET) it cannot "
                   "answer within the gateway's read budget (`persys gateway --read-budget SECONDS`), or beyond "
                   "the gateway's bounded queue of scheduler reads, is shed at once with `Retry-After` rather "
                   "than answered late"),
          "headers": {"Retry-After": {"description": "Seconds to wait before asking again (sent when the "
                                                     "request was shed: the gateway or the scheduler is busy)",
                                      "schema": {"type": "integer", "minimum": 1}}}},
    504: _error("A write the scheduler did not answer within the gateway's 10 s timeout (it may still have been "
                "applied: writes are idempotent, ask again); reads are shed with 503 instead"),
}


def answers(model: type[BaseModel], description: str = "Successful Response") -> dict[int | str, dict[str, Any]]:
    """A 200 answer's schema from a scheduler view model (scheduler/views/models.py): documentation only,
    the JSON the scheduler sends is passed on unchanged."""
    return {200: {"model": model, "description": description}}


TOO_LARGE: dict[int | str, dict[str, Any]] = {413: _error("The body exceeds its size limit (named in the answer)")}
AGENT_ERRORS: dict[int | str, dict[str, Any]] = {501: _error("The node's agent serves no such endpoint")}

ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "code": {"type": "string"},
                   "problems": {"type": "array", "items": {"type": "string"}}, "limit": {"type": "integer"}},
    "required": ["error"],
}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "description": description,
                            "content": {"application/json": {"schema": schema}}}}


MANIFEST_BODY = json_body({"$ref": "#/components/schemas/WorkloadManifest"},
                          "A workload manifest as JSON (YAML is accepted too)")
BATCH_BODY = json_body({"type": "array", "maxItems": BATCH_MAX_ITEMS,
                        "items": {"$ref": "#/components/schemas/WorkloadManifest"}},
                       "A list of workload manifests as JSON (YAML is accepted too)")
BACKUP_BODY = {"requestBody": {"required": False, "description": "A backup written by GET /v1/admin/backup "
                               "(omit with `latest`)",
                               "content": {"application/json": {"schema": {"type": "object"}}}}}
IMAGE_BODY = {"requestBody": {"required": True, "description": "The image file, streamed",
                              "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                  "format": "binary"}}}}}


def add_components(doc: dict[str, Any]) -> dict[str, Any]:
    """Put the manifest's JSON schema and the error shape into the OpenAPI document's components."""
    schema = WorkloadManifest.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(schema.pop("$defs", {}))
    schemas["WorkloadManifest"] = schema
    vschema = VolumeManifest.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    schemas.update(vschema.pop("$defs", {}))
    schemas["VolumeManifest"] = vschema
    bschema = BucketManifest.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    schemas.update(bschema.pop("$defs", {}))
    schemas["BucketManifest"] = bschema
    pschema = PolicyManifest.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    schemas.update(pschema.pop("$defs", {}))
    schemas["PolicyManifest"] = pschema
    schemas["Error"] = ERROR_SCHEMA
    return doc


Arg = Annotated[StrictStr, Field(max_length=4096), AfterValidator(_encodable)]
COMPOSE_SERVICE = r"^$|^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$"


BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # padded, as b64decode takes it


class ExecBody(_Body):
    """A command to run in a running instance (persysctl exec)."""

    command: list[Arg] = Field(min_length=1, max_length=256, description="argv, run as is (no shell)")
    instance: str = Field("", pattern=f"^$|{INSTANCE_ID}", description="empty: the first instance")
    service: str = Field("", pattern=COMPOSE_SERVICE,
                         description="compose: the service whose container runs it (needed when there are several)")
    timeout: int = Field(EXEC_TIMEOUT_SECONDS, ge=1, le=EXEC_TIMEOUT_MAX_SECONDS,
                         description="seconds; the command is killed then")
    stdin: str = Field("", max_length=4 * ((EXEC_STDIN_MAX_BYTES + 2) // 3), pattern=BASE64,
                       json_schema_extra={"format": "byte"},
                       description="base64: given to the command as its input, then end of input (at most 1 MiB)")


class TerminalQuery(_Body):
    """What a terminal's URL (console, exec -t) may say."""

    instance: str = Field("", pattern=f"^$|{INSTANCE_ID}")
    command: list[Arg] = Field(default_factory=list, max_length=256)
    service: str = Field("", pattern=COMPOSE_SERVICE)
    cols: int = Field(0, ge=0, le=1000)
    rows: int = Field(0, ge=0, le=1000)


class ExecAnswer(BaseModel):
    """How the command ended and what it wrote (each stream base64; both together at most 4 MiB)."""

    instance: str
    node: str
    runtime: str
    target: str = Field(description="where it ran: the container's name, or the process workload's pid")
    exitCode: int  # noqa: N815 (the JSON field)
    stdout: str = Field(json_schema_extra={"format": "byte"})
    stderr: str = Field(json_schema_extra={"format": "byte"})
    truncated: bool = Field(description="output beyond the limit was dropped; the command ran on")
    timedOut: bool = Field(description="killed at the timeout")  # noqa: N815


class NodeImageView(BaseModel):
    """One image on a node: a container engine tag, or a VM image registry entry."""

    kind: Literal["docker", "disk", "kernel", "initrd"]
    name: str = Field(description="repo:tag (`<none>` when untagged), or the VM registry name")
    id: str = Field(description="the engine's image id, or the VM file's sha256")
    size: int = Field(description="bytes")
    createdAt: float = Field(description="unix seconds: built (engine) or registered (VM registry)")  # noqa: N815
    usedBy: list[str] = Field(description="instances desired on the node that name it")  # noqa: N815
    format: str = Field("", description="VM disks: qcow2, raw, ...")


class NodeImages(BaseModel):
    """What a node holds (`persysctl image ls`)."""

    node: str
    images: list[NodeImageView]
    unavailable: list[str] = Field(description="sources that could not be read, each with why")


# Sent as application/x-tar by persysctl; documented as octet-stream, which every client can send.
TAR_BODY = {"requestBody": {"required": True, "description": "A tar archive with one file or folder at its top",
                            "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                "format": "binary"}}}}}
TAR_ANSWER: dict[int | str, dict[str, Any]] = {200: {
    "description": "A tar archive of the path (its base name at the top)",
    "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}}}
