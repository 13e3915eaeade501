"""Rightsizing acceptance on real processes: `persys dev` (its meter on DuckDB) runs a container
burning a known, varying CPU load (one `yes` busy 2, 5 then 9 seconds of every 10); once it has
two minutes of history (twelve 10 s samples, the finest step rightsizing reads: four turns of
the load's 30 s cycle), `GET /v1/rightsize` must recommend a CPU request covering the samples'
p90 within 15 %, and its backtest must count exactly what a replay of the same samples counts.
The check is of the same samples on both sides, so more of them add wall time, not coverage:
the percentile arithmetic itself is table-tested (tests/intelligence).
Also: `persys dev` serves the intelligence routes (the all-in-one has them)."""

from __future__ import annotations

import json
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.e2e.harness import Proc, ctl, eventually, persys

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

LOAD = "while true; do for b in 2 5 9; do yes > /dev/null & p=$!; sleep $b; kill $p; sleep $((10 - b)); done; done"
REQUEST = 1500
SAMPLES = 12  # 10 s steps: two minutes (24, four minutes, until 2026-12-06: 254 s a run)


def test_rightsize_covers_the_p90_and_its_backtest_is_a_replay(tmp_path: Path, docker_engine: Any) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"PERSYS_HOME": str(home)}
    node = f"intel-{uuid.uuid4().hex[:6]}"
    dev = Proc("dev", persys("dev", "--port", "0", "--node-id", node), home, env=env)
    dev.wait_for("Press Ctrl-C to stop.", timeout=120)
    cfg = yaml.safe_load((home / "config.yaml").read_text())
    tls = ssl.create_default_context(cafile=cfg["ca"])
    tls.load_cert_chain(cfg["cert"], cfg["key"])
    http = httpx.Client(base_url=cfg["server"], verify=tls, timeout=60)
    try:
        ctl("apply", "-f", "-", env=env, stdin=json.dumps({
            "apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "burner"},
            "spec": {"type": "container", "resources": {"cpuMillicores": REQUEST, "memoryMb": 64},
                     "container": {"image": docker_engine.image, "pullPolicy": "Never",
                                   "command": ["sh", "-c", LOAD]}}}))

        def samples() -> list[float]:
            r = http.get("/v1/meter/workloads/burner", params={"since": "1h", "step": "10s", "metric": "cpu"})
            assert r.status_code == 200, r.text
            return [p[1] * 10 for s in r.json()["series"] for p in s["points"]]  # millicores

        eventually(lambda: len(samples()) >= SAMPLES or None, 400, "two minutes of CPU samples")
        ctl("stop", "burner", env=env)
        # No sample comes after the stop: the history the test replays is the one the API read.
        eventually(lambda: (lambda a: a if a == samples() else None)(samples()), 60, "the history settles")
        milli = samples()
        r = http.get("/v1/rightsize/workloads/burner", params={"since": "1h"})
        assert r.status_code == 200, r.text
        rec = r.json()
        cpu = rec["cpu"]
        p90 = float(np.percentile(milli, 90))
        print(f"\nrightsize burner: {len(milli)} samples, p90 {p90:.0f}m, target {cpu['target']}m "
              f"({cpu['target'] / p90:.3f} x p90), at target {cpu['backtest']['atTarget']}, "
              f"confidence {rec['confidence']} ({rec['confidenceText']}), bounds {cpu['lower']}-{cpu['upper']}")
        assert p90 <= cpu["target"] + 0.5 and cpu["target"] <= 1.15 * p90 + 0.5, (p90, cpu)
        assert rec["samples"] == len(milli)
        over = cpu["backtest"]["atTarget"]["over"]
        assert sum(1 for m in milli if m > cpu["target"] + 0.5) <= over <= sum(1 for m in milli
                                                                               if m > cpu["target"] - 0.5)
        assert cpu["backtest"]["atCurrent"] == {"request": REQUEST, "unit": "millicores",
                                                "over": sum(1 for m in milli if m > REQUEST), "samples": len(milli)}
        assert rec["memory"]["observedPeak"] > 0 and rec["memory"]["backtest"]["atTarget"]["over"] == 0
        assert rec["confidenceText"] == "low"  # minutes of history, not days
        why = http.get("/v1/why/workloads/burner")
        assert why.status_code == 200 and why.json()["subject"] == "workload/burner"
    finally:
        ctl("delete", "workload", "burner", env=env, check=False)
        http.close()
        dev.stop()
