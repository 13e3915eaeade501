"""Which images the instances desired on a node name: pure, for `persysctl image ls` (USED BY)
and for refusing `persysctl image rm` of an image something here still needs."""

from __future__ import annotations

from collections.abc import Iterable

from persys.model.documents import DocumentError, load_yaml
from persys.model.workload import WorkloadSpec

ImageKey = tuple[str, str]  # (kind, name): ("docker", "busybox:1.36"), ("disk", "debian-12"), ...
DEFAULT_REGISTRY_PREFIXES = ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/")


def docker_ref(ref: str) -> str:
    """One spelling of a container image reference, as the engine lists its tags: Docker Hub's
    implicit registry dropped, `:latest` where neither a tag nor a digest is given."""
    ref = ref.strip()
    for prefix in DEFAULT_REGISTRY_PREFIXES:
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
            break
    if "@" in ref:
        return ref
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last else ref + ":latest"


def _compose_images(inline: str) -> list[str]:
    """Literal `image:` values of an inline compose document (interpolated ones are skipped)."""
    try:
        doc = load_yaml(inline)
    except DocumentError:
        return []
    services = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(services, dict):
        return []
    return [s["image"] for s in services.values()
            if isinstance(s, dict) and isinstance(s.get("image"), str) and "$" not in s["image"]]


def image_keys(spec: WorkloadSpec) -> list[ImageKey]:
    """The node images one spec needs (registry names and engine tags; node paths are not images)."""
    out: list[ImageKey] = []
    if spec.container is not None:
        out.append(("docker", docker_ref(spec.container.image)))
    if spec.compose is not None and spec.compose.inline:
        out += [("docker", docker_ref(i)) for i in _compose_images(spec.compose.inline)]
    if spec.vm is not None:
        vm = spec.vm
        if vm.image_url() and vm.image_sha256:
            out.append(("disk", f"sha256-{vm.image_sha256}"))
        elif not vm.image.startswith("/"):
            out.append(("disk", vm.image))
        out += [(kind, name) for kind, name in (("kernel", vm.kernel), ("initrd", vm.initrd))
                if name and not name.startswith("/")]
    return out


def images_in_use(desired: Iterable[tuple[str, WorkloadSpec]]) -> dict[ImageKey, list[str]]:
    """(kind, name) -> the instances (sorted) whose specs name it."""
    used: dict[ImageKey, set[str]] = {}
    for instance, spec in desired:
        for key in image_keys(spec):
            used.setdefault(key, set()).add(instance)
    return {k: sorted(v) for k, v in used.items()}
