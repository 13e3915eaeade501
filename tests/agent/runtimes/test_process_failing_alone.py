"""A failing instance fails alone, with real processes (issue 30, finding 3): random process specs
(any user spelling, network, command, working directory, env) for one workload through the agent
and the real process runtime; a second workload on the node still starts, stops and is deleted.
Few examples (each starts, stops and deletes a real process), the finding's uids always."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from persys.agent.agent import Agent, AgentConfig
from persys.agent.runtimes.base import RuntimeState
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS
from persys.agent.runtimes.process_isolation import tools_missing
from tests.agent.runtimes.test_runtime_process import CG
from tests.agent.test_failing_alone import BAD, GOOD, _walk_good_through

users = st.one_of(st.none(), st.from_regex(r"[0-9]{1,10}", fullmatch=True),
                  st.sampled_from(["root", "nobody", "daemon", "no-such-user", "toor", "4294967295", "4294967296",
                                   "00", "0000000000", "4294967294"]))
process_specs = st.builds(
    lambda command, user, network, wd, env: {"type": "process", "process": {
        "command": command, **({"user": user} if user is not None else {}),
        **({"network": network} if network else {}), **({"workingDir": wd} if wd else {}), "env": env}},
    command=st.sampled_from([["sleep", "300"], ["/nonexistent/binary"], ["true"], ["sh", "-c", "exit 3"],
                             ["sh", "-c", "kill -9 $$"], [""], ["./relative"]]),
    user=users, network=st.sampled_from([None, "host", "isolated"]),
    wd=st.sampled_from(["", "/", "/nonexistent", "relative"]),
    env=st.dictionaries(st.sampled_from(["PATH", "HOME", "A", "LD_PRELOAD"]),
                        st.sampled_from(["", "/nonexistent", "x" * 300]), max_size=2),
)


@pytest.mark.skipif(os.geteuid() != 0 or bool(tools_missing()), reason="a root agent that isolates processes")
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad_spec=process_specs)
@example(bad_spec={"type": "process", "process": {"command": ["sleep", "300"], "user": "4294967295"}})
@example(bad_spec={"type": "process", "process": {"command": ["sleep", "300"], "user": "4294967296"}})
def test_random_specs_of_one_workload_never_stop_another(bad_spec: dict[str, object]) -> None:
    async def scenario(state_dir: Path, claims: Path) -> None:
        rt = ProcessRuntime(state_dir / "runtimes", grace_seconds=1.0, uid_range=(63000, 63999),
                            uid_claims=claims, agent_id=f"alone-{os.getpid()}")
        agent = Agent(AgentConfig(node_id="n1", scheduler="a", state_dir=state_dir, orphan_grace=0.0), [rt])
        await agent.probe_runtimes()

        async def seen() -> bool:
            return await rt.inspect(GOOD) is not None

        async def is_state(s: RuntimeState) -> bool:
            o = await rt.inspect(GOOD)
            return o is not None and o.state is s

        try:
            await _walk_good_through(agent, ("Running", json.dumps(bad_spec)), seen, is_state)
            o = await rt.inspect(BAD)
            failure = agent.failures.get(BAD)
            # The bad one ran (a spec that works: the runtime shows it) or failed with the reason.
            assert o is not None or (failure is not None and failure.message), (o, failure)
        finally:
            for o in await rt.list():
                await rt.remove(o.workload_id)
            await rt.close()
            agent.local.close()
            for ctl in CGROUP_CONTROLLERS:
                with contextlib.suppress(OSError):
                    (CG / ctl / rt.cgroup_parent).rmdir()

    base = Path(tempfile.mkdtemp(prefix="persys-alone-", dir="/tmp"))
    base.chmod(0o711)  # the workloads' users pass through to their working directories
    try:
        asyncio.run(scenario(base / "agent", base / "claims"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
