#!/usr/bin/env bash
# Install Persys into ./.venv (idempotent). With --test, also the Debian packages and Python
# tools the test suite needs (etcd, Redis, Docker engine, busybox for local images).
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  if ((${#missing[@]})); then
    echo "==> apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  apt_install python3 python3-venv python3-dev
  PY=python3
fi

if ((want_test)); then
  apt_install etcd-server etcd-client redis-server docker.io containerd runc tini busybox-static iptables procps \
    iproute2 git qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu \
    libvirt-dev pkg-config gcc python3-dev e2fsprogs prometheus
  # storage tests: nfs-ganesha (userspace NFS server) with libnfs' client tools, a one-node Ceph
  # (mon, mgr, osd, rgw) with its Python bindings; qemu-block-extra: QEMU's nfs and rbd block drivers
  apt_install nfs-ganesha nfs-ganesha-vfs libnfs-utils qemu-block-extra \
    ceph ceph-mon ceph-osd ceph-mgr radosgw ceph-common python3-rados python3-rbd
  # image pulls: a real registry (distribution 2.8; the tests start it themselves, never its unit)
  # with htpasswd authentication (apache2-utils' htpasswd writes the bcrypt file)
  apt_install docker-registry apache2-utils
  # the dashboard's browser tests drive Debian's chromium through Playwright (never a downloaded browser)
  apt_install chromium
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
# Debian's librados/librbd bindings (python3-rados, python3-rbd: built for CPython 3.11, the .venv's
# ABI) made importable narrowly: a folder holding only their symlinks, named by a .pth file (not
# the system site-packages). Redone on every run: cheap, and a package upgrade moves nothing.
ceph_py=/usr/lib/python3/dist-packages
if compgen -G "$ceph_py/rados.cpython-311-*.so" >/dev/null && compgen -G "$ceph_py/rbd.cpython-311-*.so" >/dev/null \
  && .venv/bin/python -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  mkdir -p .venv/ceph-bindings
  ln -sf "$ceph_py"/rados.cpython-311-*.so "$ceph_py"/rbd.cpython-311-*.so .venv/ceph-bindings/
  echo "$PWD/.venv/ceph-bindings" > "$site/persys-ceph-bindings.pth"
fi
extra=""
((want_test)) && extra="[test]"
# The install is editable: only the dependencies (pyproject.toml) and the generated protobuf code
# (proto/) need pip again. Skip it when neither changed since the last good install.
stamp=".venv/.persys-install-${want_test}"
want=$(cat pyproject.toml $(find proto -name '*.proto' | sort) | sha256sum | cut -d' ' -f1)
# A test install (--test) holds everything a plain one does: its stamp satisfies both.
if [[ ( -f "$stamp" && "$(cat "$stamp")" == "$want" ) || ( -f .venv/.persys-install-1 && "$(cat .venv/.persys-install-1)" == "$want" ) ]] \
  && .venv/bin/python -c 'import persys._pb.persys.v1.control_pb2' 2>/dev/null; then
  echo "==> .venv is up to date (pyproject.toml and proto/ unchanged)"
  exit 0
fi
echo "==> pip install -e .${extra}"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
log=$(mktemp)
if ! .venv/bin/python -m pip install -q -e ".${extra}" >"$log" 2>&1; then
  grep -v -i "^WARNING: Location" "$log" | tail -30 >&2
  echo "error: pip install failed (full log: $log)" >&2
  exit 1
fi
rm -f "$log"
.venv/bin/python -c 'import persys._pb.persys.v1.control_pb2' || { echo "install failed: generated protobuf modules missing" >&2; exit 1; }
echo "$want" > "$stamp"
