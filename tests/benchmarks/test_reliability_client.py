"""The reliability suite's load client on its own: the open loop's schedule under a
busy event loop, and pooled connections against a server that closes idle ones."""

import asyncio
import json
import random
import socket
import struct
import time

import pytest

from benchmarks.reliability import client

pytest.importorskip("aiohttp")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scheduled(rate: float, duration_s: float, seed: int) -> int:
    rng, n = random.Random(seed), 0
    due = rng.expovariate(rate)
    while due < duration_s:
        n, due = n + 1, due + rng.expovariate(rate)
    return n


def _open_loop(rate, busy_s, duration_s=1.0, seed=3):
    port = _closed_port()  # every request fails at once: only the sending is timed

    def make(i):
        time.sleep(busy_s)  # the loop is busy with other work at every arrival
        return client.Req(f"r{i}", [1, 2, 3], 4)

    return asyncio.run(
        client.open_loop(
            f"http://127.0.0.1:{port}", port, "m", make, rate=rate,
            duration_s=duration_s, drain_s=10, sample_s=5, seed=seed,
        )
    )  # fmt: skip


def test_open_loop_sends_every_arrival_of_its_schedule_when_the_loop_is_busy():
    # 150 req/s with 3 ms of other work per arrival: a loop that slept a fresh gap
    # after each send would send ~100 (6.7 ms + 3 ms apart) and fall ever further
    # behind; sends at their scheduled times keep the rate.
    results, _, load = _open_loop(rate=150, busy_s=0.003)
    assert load["sent"] == len(results) == _scheduled(150, 1.0, 3)
    assert load["not_sent_at_cap"] == 0
    assert load["max_send_lag_s"] < client.MAX_SEND_LAG_S
    assert load["sent_rate"] == pytest.approx(load["sent"] / 1.0)


def test_open_loop_reports_a_client_that_cannot_keep_up():
    # 20 ms of work per arrival at 150 req/s: the client is the bottleneck
    _, _, load = _open_loop(rate=150, busy_s=0.02)
    assert load["max_send_lag_s"] > client.MAX_SEND_LAG_S
    from benchmarks.reliability import run_reliability

    reasons = []
    run_reliability.load_sent(load, reasons)
    assert reasons and "behind its schedule" in reasons[0]


async def _loop_against_a_server_that_never_answers(stop_at_cap, duration_s):
    release = asyncio.Event()

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await release.wait()  # the request stays open
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await client.open_loop(
            f"http://127.0.0.1:{port}", _closed_port(), "m",
            lambda i: client.Req(f"r{i}", [1, 2, 3], 4), rate=100,
            duration_s=duration_s, drain_s=0.3, sample_s=5, max_in_flight=3,
            stop_at_cap=stop_at_cap,
        )  # fmt: skip
    finally:
        release.set()
        server.close()


def test_open_loop_stops_at_the_cap_only_when_asked():
    # three requests stay open: the 4th arrival finds the cap full
    _, _, load = asyncio.run(_loop_against_a_server_that_never_answers(True, 30.0))
    assert load["sent"] == 3 and load["not_sent_at_cap"] == 1
    assert load["stopped_at_s"] is not None and load["stopped_at_s"] < 5
    assert load["sent_rate"] == pytest.approx(3 / load["stopped_at_s"], rel=0.01)
    _, _, load = asyncio.run(_loop_against_a_server_that_never_answers(False, 0.5))
    assert load["stopped_at_s"] is None
    assert load["sent"] == 3 and load["not_sent_at_cap"] > 1


async def _keepalive_server(idle_limit_s: float, resets: list):
    """HTTP/1.1 keep-alive server answering one streamed completion per request; a
    request that arrives on a connection idle for more than ``idle_limit_s`` is
    answered with a TCP reset, as when a server's keep-alive timer closes the
    connection while the request is on its way."""
    event = {"choices": [{"text": " t5", "token_ids": [5]}]}
    body = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()

    async def handle(reader, writer):
        idle_since = None
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if idle_since is not None and time.monotonic() - idle_since > idle_limit_s:
                resets.append(1)
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                struct.pack("ii", 1, 0))  # fmt: skip
                writer.transport.abort()
                return
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            idle_since = time.monotonic()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_client_does_not_reuse_a_connection_the_server_may_be_closing():
    # the server resets requests on connections idle for more than 1.5 s; a pooled
    # connection left idle 1.6 s is past the client's keep-alive (a second) and is
    # not reused

    async def go():
        resets = []
        server = await _keepalive_server(1.5, resets)
        port = server.sockets[0].getsockname()[1]
        base, req = f"http://127.0.0.1:{port}", client.Req("a", [1, 2], 1)
        async with server, client._client(30) as http:
            first = await client.send(http, base, "m", req, time.monotonic())
            await asyncio.sleep(1.6)  # past the server's limit too
            second = await client.send(http, base, "m", req, time.monotonic())
        return first, second, resets

    first, second, resets = asyncio.run(go())
    assert (first.kind, first.token_ids) == ("ok", [5]), first.note
    assert (second.kind, second.token_ids) == ("ok", [5]), second.note
    assert not resets
