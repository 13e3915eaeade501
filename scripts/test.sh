#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install what the tests need (etcd, Redis, Docker
# engine, ...), start the Docker engine if it is not running, and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --test
scripts/start-dockerd.sh
scripts/start-libvirtd.sh
examples/images/build-busybox.sh >/dev/null
echo "==> lint"
.venv/bin/ruff check src tests bench
.venv/bin/mypy src
echo "==> tests"
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
