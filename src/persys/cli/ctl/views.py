"""What `persysctl get -o yaml|json` prints, read back as manifests: `apply -f` takes a file of
workload or volume views (one, or a list as `get` prints it) as it takes manifests, so
`persysctl get workload web -o yaml > web.yaml`, an edit, then `persysctl apply -f web.yaml` works
as with kubectl. The status fields of a view (phase, node, usage, ...) are dropped: only what a
manifest says (name, labels, spec) is applied."""

from __future__ import annotations

from typing import Any

API_VERSION = "persys.dev/v1"


def workload_manifest(view: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Workload",
            "metadata": {"name": view["name"], "labels": view.get("labels") or {}}, "spec": view["spec"]}


def volume_manifest(view: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Volume",
            "metadata": {"name": view["id"], "labels": view.get("labels") or {}}, "spec": view["spec"]}


def _as_manifest(doc: Any) -> Any:
    """A view as its manifest; anything else (a manifest, or what no rule knows) as it is, for
    the model to accept or refuse with its own message."""
    if not isinstance(doc, dict) or "apiVersion" in doc or not isinstance(doc.get("spec"), dict):
        return doc
    if "revision" in doc and "name" in doc and "type" in doc:  # a workload view (get workloads)
        return workload_manifest(doc)
    if "driver" in doc["spec"] and "id" in doc and "phase" in doc:  # a volume view (get volumes)
        return volume_manifest(doc)
    return doc


def as_manifests(docs: list[Any]) -> list[Any]:
    """The documents of a file with each view turned into its manifest and a list (what `get`
    prints for several objects) opened into its items."""
    out: list[Any] = []
    for doc in docs:
        out.extend(_as_manifest(d) for d in (doc if isinstance(doc, list) else [doc]))
    return out
