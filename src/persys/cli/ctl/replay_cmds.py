"""`persysctl explain W --at REV`: a past decision replayed on the store as it was then
(docs/placement.md, "Replay"). Rendering only; the scheduler rebuilds and decides."""

from __future__ import annotations

from persys.cli.ctl.api import Api, emit, out


def show_replay(api: Api, name: str, at: int, output: str) -> None:
    r = api.request("GET", f"/v1/workloads/{name}/explain", params={"at": str(at)})
    if output != "text":
        emit(r, output)
        return
    for rep in r["replicas"]:
        verdict = "agrees" if rep["agrees"] else "DIFFERS"
        out.print(f"workload/{rep['instance']} at revision {r['at']}: replay {verdict}", highlight=False)
        seen = rep.get("seen") or {}
        inflight = len(str(seen.get("inflight", "")).split())
        extra = [f"{inflight} node(s) with reservations in flight"] if inflight else []
        if seen.get("unheard"):
            extra.append(f"{len(seen['unheard'])} node(s) not heard from")
        beyond = f"; saw beyond the store: {', '.join(extra)}" if extra else ""
        out.print(f"  engine {seen.get('engine', '?')}{beyond}", markup=False, highlight=False)
        out.print(f"  recorded: {rep['recorded']['explanation']}", markup=False, highlight=False)
        if not rep["agrees"]:
            out.print(f"  replayed: {rep['replayed']['explanation']}", markup=False, highlight=False)
