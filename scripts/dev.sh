#!/usr/bin/env bash
# One command for a fresh Debian 12 machine: install Persys and start an all-in-one cluster
# on embedded defaults (SQLite store, in-process events). Docker is used when it runs here.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
echo "==> starting persys dev (persysctl is at $(pwd)/.venv/bin/persysctl)"
exec .venv/bin/persys dev "$@"
