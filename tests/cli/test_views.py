"""`apply -f` reads what `get -o yaml|json` printed (persys.cli.ctl.views): views become manifests."""

from __future__ import annotations

from persys.cli.ctl.views import as_manifests

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


def test_watch_rows_line_up() -> None:
    """`get -w` prints each change alone: every row pads to the same running widths, so columns
    line up (they were drawn as separate tables, each as wide as its own cells)."""
    from persys.cli.output.listing_rows import columns, row, watch_line

    header = columns("workloads", False)
    w1 = {"name": "web", "type": "process", "ready": "1/1", "phase": "Running", "node": "n1", "revision": "abc",
          "restarts": 0, "createdAt": 0}
    w2 = {**w1, "name": "a-much-longer-name", "phase": "Pending", "node": "", "reason": "Unschedulable"}
    head, widths = watch_line(header, list(header), [])
    first, widths = watch_line(header, row("workloads", w1, False), widths)
    second, widths = watch_line(header, row("workloads", w2, False), widths)
    starts = [head.index(h) for h in header]
    for line, item in ((first, w1), (second, w2)):
        for c, start in zip(row("workloads", item, False), starts, strict=True):
            assert line[start:].startswith(c), (head, line, c)
