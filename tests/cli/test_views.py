"""`apply -f` reads what `get -o yaml|json` printed (persys.cli.views): views become manifests."""

from __future__ import annotations

from persys.cli.views import as_manifests

WORKLOAD_VIEW = {"id": "web", "name": "web", "type": "process", "labels": {"app": "web"}, "revision": "abc",
                 "phase": "Running", "node": "n1", "usage": {"cpuPercent": 1.0},
                 "spec": {"type": "process", "process": {"command": ["sleep", "1"]}}}
VOLUME_VIEW = {"id": "data", "phase": "Ready", "spec": {"driver": "local", "sizeMb": 16}, "usedBy": []}
MANIFEST = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "m"}, "spec": {"type": "process"}}


def test_views_become_manifests_and_lists_open() -> None:
    got = as_manifests([[WORKLOAD_VIEW, VOLUME_VIEW], MANIFEST])
    assert got == [
        {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "web", "labels": {"app": "web"}},
         "spec": WORKLOAD_VIEW["spec"]},
        {"apiVersion": "persys.dev/v1", "kind": "Volume", "metadata": {"name": "data", "labels": {}},
         "spec": VOLUME_VIEW["spec"]},
        MANIFEST,
    ]


def test_what_is_not_a_view_is_left_for_the_model_to_refuse() -> None:
    odd = [{"name": "x", "spec": {}}, "text", {"spec": "not a mapping", "revision": "r", "name": "n", "type": "t"}]
    assert as_manifests(odd) == odd
