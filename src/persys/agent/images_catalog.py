"""What images a node holds, and removing one (`persysctl image ls|rm`): the container engine's
images and the VM image registry. Which instances use an image comes from `image_usage` (pure);
this module does the reading and the removing."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiodocker

from persys.agent.image_usage import ImageKey, docker_ref
from persys.agent.runtimes.vm.images import KINDS as VM_KINDS
from persys.agent.runtimes.vm.images import ImageError, ImageRegistry

QCOW2_MAGIC = b"QFI\xfb"


class CatalogError(Exception):
    """`code`: "NotFound", "InUse" or "InvalidArgument"; the message is one line for the user."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class NodeImage:
    kind: str
    name: str
    id: str
    size: int
    created: float
    used_by: list[str] = field(default_factory=list)
    format: str = ""


async def list_images(registry: ImageRegistry, used: Mapping[ImageKey, list[str]],
                      docker_url: str | None = None) -> tuple[list[NodeImage], list[str]]:
    """Every image here (engine images one entry per tag) and the sources that could not be read."""
    images: list[NodeImage] = []
    unavailable: list[str] = []
    try:
        records = await asyncio.to_thread(registry.list)
    except (ImageError, OSError) as err:
        records = []
        unavailable.append(f"vm image registry: {err}")
    images += [NodeImage(r.kind, r.name, r.sha256, r.size, r.registered_at, used.get((r.kind, r.name), []), r.format)
               for r in records]
    docker = aiodocker.Docker(url=docker_url)
    try:
        for i in await docker.images.list():
            tags = [t for t in i.get("RepoTags") or [] if t != "<none>:<none>"] or ["<none>"]
            for tag in tags:
                images.append(NodeImage("docker", tag, str(i.get("Id", "")), int(i.get("Size") or 0),
                                        float(i.get("Created") or 0), used.get(("docker", docker_ref(tag)), [])))
    except (aiodocker.DockerError, OSError, ValueError) as err:
        unavailable.append(f"docker engine: {getattr(err, 'message', None) or err or type(err).__name__}")
    finally:
        await docker.close()
    return images, unavailable


async def remove_image(kind: str, name: str, registry: ImageRegistry, used: Mapping[ImageKey, list[str]],
                       vm_dir: Path, docker_url: str | None = None) -> str:
    """Remove one image; a one-line account of what went. Raises CatalogError."""
    kind = kind or "docker"
    if not name or len(name) > 512:
        raise CatalogError("name: an image name of 1 to 512 characters is needed", "InvalidArgument")
    if kind == "docker":
        return await _remove_docker(name, used, docker_url)
    if kind not in VM_KINDS:
        raise CatalogError(f"kind: {kind!r} is not docker, {', '.join(VM_KINDS)}", "InvalidArgument")
    return await asyncio.to_thread(_remove_vm_image, kind, name, registry, used, vm_dir)


async def _users(docker: aiodocker.Docker, name: str, used: Mapping[ImageKey, list[str]]) -> list[str]:
    """The instances on this node whose image the removal of `name` would take: by a tag, the
    users of that tag (the image stays while other tags hold it); by an image id or a digest,
    the users of every tag and digest of the image (they all go with it)."""
    users = used.get(("docker", docker_ref(name)), [])
    if users:
        return users
    try:
        info = await docker.images.inspect(name)
    except aiodocker.DockerError:
        return []  # not there (the removal says so) or not inspectable: the engine's answer follows
    refs = {docker_ref(r) for r in (info.get("RepoTags") or []) + (info.get("RepoDigests") or [])}
    if docker_ref(name) in refs:
        return []
    return sorted({u for r in refs for u in used.get(("docker", r), [])})


async def _remove_docker(name: str, used: Mapping[ImageKey, list[str]], docker_url: str | None) -> str:
    docker = aiodocker.Docker(url=docker_url)
    try:
        users = await _users(docker, name, used)
        if users:
            raise CatalogError(f"image {name} is used by {', '.join(users)} on this node; delete or change those "
                               "workloads first", "InUse")
        gone = await docker.images.delete(name)
    except aiodocker.DockerError as err:
        if err.status == 404:
            raise CatalogError(f"image {name} is not on this node", "NotFound") from None
        if err.status == 409:  # a container (any, also not Persys') uses it: the engine's words
            raise CatalogError(f"the engine keeps {name}: {err.message}", "InUse") from None
        raise CatalogError(f"the engine refused to remove {name}: {err.message}", "InvalidArgument") from None
    except OSError as err:
        raise CatalogError(f"docker engine not reachable: {err or type(err).__name__}", "Unavailable") from None
    finally:
        await docker.close()
    untagged = sum(1 for g in gone if "Untagged" in g)
    deleted = sum(1 for g in gone if "Deleted" in g)
    return f"image {name} removed ({untagged} tag(s) untagged, {deleted} layer(s) deleted)"


def _remove_vm_image(kind: str, name: str, registry: ImageRegistry, used: Mapping[ImageKey, list[str]],
                     vm_dir: Path) -> str:
    try:
        rec = registry.get(name)
    except ImageError as err:
        raise CatalogError(str(err), "InvalidArgument") from None
    if rec is None:
        raise CatalogError(f"{kind} {name} is not registered on this node", "NotFound")
    if rec.kind != kind:
        raise CatalogError(f"{name} is a {rec.kind}, not a {kind} (--kind {rec.kind})", "InvalidArgument")
    users = used.get((kind, name), [])
    if users:
        raise CatalogError(f"{kind} {name} is used by {', '.join(users)} on this node; delete or change those "
                           "workloads first", "InUse")
    disks = based_on(Path(rec.path), vm_dir)
    registry.unregister(name, delete_blob=not disks)
    if disks:
        return f"{kind} {name} unregistered; its file stays: the disks of {', '.join(disks)} are based on it"
    return f"{kind} {name} removed"


def based_on(blob: Path, vm_dir: Path) -> list[str]:
    """The VM instances here whose disk overlay has `blob` as its backing file."""
    out = []
    for disk in sorted(vm_dir.glob("*/disk.qcow2")):
        if qcow2_backing_file(disk) == str(blob):
            out.append(disk.parent.name)
    return out


def qcow2_backing_file(path: Path) -> str:
    """The backing file a qcow2 image's header names ("" for none, or not a readable qcow2)."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
            if len(head) < 20 or head[:4] != QCOW2_MAGIC:
                return ""
            offset, size = int.from_bytes(head[8:16], "big"), int.from_bytes(head[16:20], "big")
            if not offset or not 0 < size <= 4096:
                return ""
            f.seek(offset)
            return f.read(size).decode("utf-8", "replace")
    except OSError:
        return ""
