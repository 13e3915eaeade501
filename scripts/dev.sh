#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install Persys and start an all-in-one cluster
# on embedded defaults (SQLite store and event log). The runtimes whose daemons are installed
# here are started first (Docker for containers and compose, libvirt for VMs); for each one that
# is not, one line says what is skipped and how to add it (the agent picks it up within 30 s of
# its daemon starting, no restart needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh

skip() { echo "==> skipped: $1" >&2; }
if [[ -x /usr/sbin/dockerd ]] && command -v docker >/dev/null; then
  scripts/start-dockerd.sh >/dev/null || skip "Docker (container, compose): dockerd did not start, see /tmp/persys-dockerd.log"
else
  skip "Docker (container and compose workloads): apt-get install docker.io containerd runc, then scripts/start-dockerd.sh"
fi
if [[ -x /usr/sbin/libvirtd ]]; then
  scripts/start-libvirtd.sh >/dev/null || skip "libvirt (VM workloads): libvirtd did not start, see /tmp/persys-libvirtd.log"
  .venv/bin/python -c 'import libvirt' 2>/dev/null ||
    skip "VM workloads: .venv/bin/pip install libvirt-python (needs apt-get install libvirt-dev pkg-config gcc python3-dev)"
else
  skip "VM workloads: apt-get install qemu-system-x86 qemu-utils libvirt-daemon-system, then scripts/start-libvirtd.sh"
fi
echo "==> starting persys dev (persysctl is at $(pwd)/.venv/bin/persysctl)"
exec .venv/bin/persys dev "$@"
