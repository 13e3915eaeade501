"""Putting images on a node without a registry (none is reachable from our machines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, BinaryIO

import aiodocker
from aiodocker.utils import parse_result

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
    if kind == "rootfs" and not name:
        raise LoadError("importing a root filesystem needs a name, e.g. myapp:1.0")
    docker = aiodocker.Docker(url=docker_url)
    try:
        # The archive is streamed from its file (an upload may be GiBs), never read whole.
        with path.open("rb") as data:
            if kind == "docker":
                # `docker load`: the tarball names its own images.
                out = await _post_archive(docker, "images/load", data, {"quiet": "1"})
                loaded = _loaded(out)
                if not loaded:
                    raise LoadError("docker loaded no image from the archive (is it a `docker save` tarball?)")
                return loaded
            repo, _, tag = name.partition(":")
            # `docker import`: a filesystem tarball becomes a one-layer image.
            out = await _post_archive(docker, "images/create", data,
                                      {"fromSrc": "-", "repo": repo, "tag": tag or "latest"})
            _loaded(out)  # raises the engine's error, if it had one
            return f"image {repo}:{tag or 'latest'} imported"
    except aiodocker.DockerError as err:
        raise LoadError(f"docker refused the image: {err.message}") from None
    finally:
        await docker.close()


async def _post_archive(docker: aiodocker.Docker, path: str, data: BinaryIO, params: dict[str, str]) -> Any:
    """POST a tar archive from an open file (aiohttp reads it in chunks) and parse the answer;
    `_query_json` would JSON-encode anything but bytes."""
    async with docker._query(path, "POST", params=params, data=data,
                             headers={"Content-Type": "application/x-tar"}) as response:
        return await parse_result(response)


def _loaded(out: object) -> str:
    """What the engine's answer stream says was loaded; LoadError with the engine's own words when
    a line reports an error (the engine answers 200 and puts the failure in the stream: a random
    upload was reported as "images loaded")."""
    lines = out if isinstance(out, list) else [out]
    found = []
    for line in lines:
        if isinstance(line, str):
            try:
                line = json.loads(line)
            except ValueError:
                continue
        if not isinstance(line, dict):
            continue
        if line.get("error") or line.get("errorDetail"):
            detail = line.get("errorDetail")
            message = line.get("error") or (detail.get("message") if isinstance(detail, dict) else "")
            message = message or "unknown error"
            raise LoadError(f"docker refused the image: {str(message)[:500]}")
        if "stream" in line:
            found.append(str(line["stream"]).strip())
    return "; ".join(f for f in found if f)
