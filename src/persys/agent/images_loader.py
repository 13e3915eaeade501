"""Putting images on a node without a registry (none is reachable from our machines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiodocker

from persys.agent.runtimes.vm.images import ImageError, ImageRegistry

CONTAINER_KINDS = ("docker", "rootfs")
VM_KINDS = ("disk", "kernel", "initrd")


class LoadError(Exception):
    pass


async def load_image(kind: str, name: str, path: Path, registry_dir: Path, docker_url: str | None = None) -> str:
    """Load the file at `path`; returns a one-line description of what is now on the node."""
    if kind in VM_KINDS:
        if not name:
            raise LoadError("a VM image needs a name to be registered under")
        try:
            rec = await asyncio.to_thread(ImageRegistry(registry_dir).register, name, path, kind=kind)  # type: ignore[arg-type]
        except ImageError as err:
            raise LoadError(str(err)) from None
        return f"{rec.kind} {rec.name} registered ({rec.format}, sha256:{rec.sha256[:12]})"
    if kind not in CONTAINER_KINDS:
        raise LoadError(f"kind must be one of {', '.join(CONTAINER_KINDS + VM_KINDS)}")
    docker = aiodocker.Docker(url=docker_url)
    try:
        data = await asyncio.to_thread(path.read_bytes)
        if kind == "docker":
            # `docker load`: the tarball names its own images.
            out = await docker._query_json("images/load", method="POST", data=data,
                                           headers={"Content-Type": "application/x-tar"},
                                           params={"quiet": "1"})
            return _loaded(out) or "images loaded"
        if not name:
            raise LoadError("importing a root filesystem needs a name, e.g. myapp:1.0")
        repo, _, tag = name.partition(":")
        # `docker import`: a filesystem tarball becomes a one-layer image.
        await docker._query_json("images/create", method="POST", data=data,
                                 headers={"Content-Type": "application/x-tar"},
                                 params={"fromSrc": "-", "repo": repo, "tag": tag or "latest"})
        return f"image {repo}:{tag or 'latest'} imported"
    except aiodocker.DockerError as err:
        raise LoadError(f"docker refused the image: {err.message}") from None
    finally:
        await docker.close()


def _loaded(out: object) -> str:
    lines = out if isinstance(out, list) else [out]
    found = []
    for line in lines:
        if isinstance(line, str):
            try:
                line = json.loads(line)
            except ValueError:
                continue
        if isinstance(line, dict) and "stream" in line:
            found.append(str(line["stream"]).strip())
    return "; ".join(f for f in found if f)
