"""Client keepalive pings never cost a connection: a client that pings while idle (as every
Persys client does, every 10 s) keeps working against Persys servers, where a server on gRPC's
defaults answers GOAWAY "too_many_pings" and fails the next call (issue #16, item 7).

Real gRPC servers and channels; the client pings every 0.5 s so the policy shows in seconds."""

from __future__ import annotations

import asyncio

import grpc

from persys.security.grpc_tls import SERVER_KEEPALIVE_OPTIONS

METHOD = "/persys.test.Echo/Echo"
EAGER_CLIENT = [("grpc.keepalive_time_ms", 500), ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


async def _echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
    return request


async def idle_then_call(server_options: list[tuple[str, int]]) -> tuple[set[str], grpc.StatusCode]:
    """The channel's states while idle (READY throughout: the connection held), and how a call
    after the idle time ended."""
    server = grpc.aio.server(options=server_options)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "persys.test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=EAGER_CLIENT) as ch:
            call = ch.unary_unary(METHOD)
            assert await call(b"hi", timeout=10) == b"hi"
            states = set()
            for _ in range(40):  # 4 s idle: only pings travel
                states.add(ch.get_state().name)
                await asyncio.sleep(0.1)
            try:
                await call(b"again", timeout=10)
            except grpc.aio.AioRpcError as err:
                return states, err.code()
            return states, grpc.StatusCode.OK
    finally:
        await server.stop(None)


async def test_an_idle_pinging_client_keeps_its_connection() -> None:
    states, code = await idle_then_call(SERVER_KEEPALIVE_OPTIONS)
    assert states == {"READY"} and code == grpc.StatusCode.OK


async def test_the_control_grpc_defaults_end_the_connection() -> None:
    # What the test guards against: a server on gRPC's defaults sends GOAWAY too_many_pings and
    # the connection ends (a call racing it fails; this one reconnects, so only the state shows).
    states, _ = await idle_then_call([])
    assert states - {"READY"}, states
