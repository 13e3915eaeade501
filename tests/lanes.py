"""The fast lane: which tests need no external service (`scripts/test.sh --fast` runs them).

A test is marked `unit` unless something says it needs a service: a marker (etcd, redis, docker,
e2e, vm), a fixture that starts one, a directory whose tests all start processes (end-to-end
clusters, the gateway's cluster, the runtimes driving Docker, libvirt, QEMU and cgroups), or a
module that starts etcd or Redis itself. The lane runs with those binaries off PATH, so a
misclassified test fails there instead of passing slowly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SERVICE_MARKERS = frozenset({"etcd", "redis", "docker", "e2e", "vm"})
SERVICE_FIXTURES = frozenset({
    "etcd_server", "redis_server", "store_url", "_etcd_session", "_redis_session",
    "docker_engine", "vm_host", "test_guest", "microvm_guest", "bao_server", "secure_backends",
    "docker_registry",  # Debian's docker-registry with TLS and htpasswd (tests/registry_server.py)
    "loop_pool", "nfs_server", "ceph_cluster",  # storage: loop devices and mounts (root), nfs-ganesha, Ceph
})
SERVICE_DIRS = (Path("e2e"), Path("gateway"), Path("agent") / "runtimes")
SERVICE_STARTERS = ("start_etcd", "start_redis", "start_bao",  # module globals that start a server in the test body
                    "start_cluster", "ready_cluster")  # scheduler, agent, gateway processes (gateway/cluster.py)

TESTS = Path(__file__).resolve().parent


def needs_service(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(name) is not None for name in SERVICE_MARKERS):
        return True
    if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    path = Path(str(item.path)).resolve()
    if any(path.is_relative_to(TESTS / d) for d in SERVICE_DIRS):
        return True
    module = getattr(item, "module", None)
    return module is not None and any(hasattr(module, name) for name in SERVICE_STARTERS)


def mark_unit_tests(items: list[pytest.Item]) -> None:
    for item in items:
        if not needs_service(item):
            item.add_marker(pytest.mark.unit)
