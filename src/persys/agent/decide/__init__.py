"""The agent's decisions, pure: data in, data out, no I/O, no clock, no `async def`.

- `merge`: what a desired-state message (a full set or a delta) makes of the desired set the agent
  holds (generation fencing, hold mode, specs this agent cannot read), and what to write or forget.
- `plan`: what to start, stop and remove now, from the desired set and what the runtimes show.
- `report`: what to tell the scheduler about the instances.
- `disconnect`: when an agent that lost every replica stops its `onDisconnect: Stop` instances.

The agent loop (`persys.agent.agent`) does the I/O around them; the import contracts in
pyproject.toml keep this package free of gRPC, the store and the agent's I/O modules.
"""
