#!/usr/bin/env bash
# Run every Persys benchmark, in order:
#   1. the placement-engine micro-benchmark (bench/placement_micro.py: the pure engine, no I/O);
#   2. the scale benchmark (bench/scale/scale.py: hollow agents, a real scheduler process,
#      real etcd and Redis; results in bench/results/scale-<timestamp>.json).
#
#   bench/run.sh            full size: 5,000 nodes, 50,000 workloads (budget: 15 min of placing)
#   bench/run.sh --quick    500 nodes, 5,000 workloads (about a minute)
#   bench/run.sh --nodes 2000 --workloads 20000 --concurrency 128   (any scale.py option)
#
# Needs: .venv with persys installed (scripts/dev.sh or scripts/test.sh create it), etcd and
# redis-server on PATH (Debian: apt-get install etcd-server redis-server), and py-spy in the
# venv for the CPU profile (.venv/bin/pip install py-spy; without it the profile is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [[ ! -x $PY ]]; then
  echo "error: $PY not found; create the venv first (scripts/dev.sh or scripts/test.sh)" >&2
  exit 1
fi
for bin in etcd redis-server; do
  command -v "$bin" >/dev/null || { echo "error: $bin not found on PATH" >&2; exit 1; }
done
[[ -x .venv/bin/py-spy ]] || echo "note: .venv/bin/py-spy missing: no CPU profile (.venv/bin/pip install py-spy)" >&2

echo "== Placement engine (micro): bench/placement_micro.py =="
"$PY" bench/placement_micro.py --nodes 5000
"$PY" bench/placement_micro.py --nodes 5000 --percentage 100
echo
echo "== Scale: bench/scale/scale.py $* =="
exec "$PY" bench/scale/scale.py "$@"
