"""Load client of the reliability suite: streamed greedy ``/v1/completions``
requests over aiohttp (vLLM depends on it, so every install has it), open-loop
(Poisson arrivals at a rate, for a time) or as one batch; a sampler of GPU memory and
/metrics. Run on asyncio's own loop: uvloop, though faster, swallows the
``SystemExit`` that the suite's SIGTERM handler raises inside a callback, so a
stopped suite would keep its load (and its server) running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import urllib.request
from dataclasses import dataclass, field

from benchmarks import harness
from benchmarks.soak import run_soak

# vLLM's API server closes a keep-alive connection after 5 idle seconds
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE). A request sent on a pooled connection just as the
# server closes it fails with "Connection reset by peer" although the server never
# saw it; the client drops its idle connections well before the server does.
KEEPALIVE_S = 1.0
# An open loop whose sends fall further behind their Poisson schedule than this did
# not put the asked load on the server (the client was the bottleneck).
MAX_SEND_LAG_S = 1.0


@dataclass
class Req:
    key: str
    prompt: list[int]
    max_tokens: int
    cancel: str | None = None  # None | "before_first_token" | "mid_decode"
    cancel_at: float = 0.0  # seconds after sending | chunks received


@dataclass
class Result:
    key: str
    kind: str = "failed"  # ok | cancelled | failed
    status: int | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    note: str = ""
    t_end: float = 0.0

    def output(self):
        """What greedy agreement compares: token ids when the server sent them."""
        return self.token_ids or self.text


def body(model: str, req: Req) -> dict:
    return {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }


async def _stream(http, url: str, model: str, req: Req, res: Result) -> None:
    chunks, done = 0, False
    async with http.post(url, json=body(model, req)) as resp:
        res.status = resp.status
        if resp.status != 200:
            res.note = f"HTTP {resp.status}: {(await resp.text())[:300]}"
            return
        async for raw in resp.content:
            event = harness.sse_event(raw)
            if event is None:
                continue
            if event == harness.SSE_DONE:
                done = True
                break
            if "error" in event:
                res.note = f"stream error: {json.dumps(event)[:300]}"
                return
            for ch in event.get("choices", []):
                res.text += ch.get("text") or ""
                res.token_ids += ch.get("token_ids") or []
            chunks += 1
            if req.cancel == "mid_decode" and chunks >= req.cancel_at:
                resp.close()  # drop the connection: the server must abort it
                res.kind = "cancelled"
                return
    n = len(res.token_ids)
    if not done:
        res.note = "stream ended without [DONE]"
    elif res.token_ids and n != req.max_tokens:
        res.note = f"{n} of {req.max_tokens} tokens"
    else:
        res.kind = "ok"


async def send(http, base: str, model: str, req: Req, t0: float) -> Result:
    res = Result(req.key)
    coro = _stream(http, base + "/v1/completions", model, req, res)
    try:
        if req.cancel == "before_first_token":
            try:
                await asyncio.wait_for(coro, req.cancel_at)
            except asyncio.TimeoutError:
                if not res.text and not res.token_ids:
                    res.kind = "cancelled"
                else:  # the first token came first: it was cancelled mid-decode
                    res.kind, res.note = "cancelled", "after first token"
        else:
            await coro
    except Exception as e:  # noqa: BLE001 - any client-side failure is a failure
        res.kind, res.note = "failed", f"{type(e).__name__}: {e}"[:300]
    res.t_end = time.monotonic() - t0
    return res


def _client(timeout_s: float):
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )


async def _gather(tasks, drain_s: float, keys: list[str]) -> list[Result]:
    done, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else ((), ())
    for t in pending:
        t.cancel()
    out = []
    for key, t in zip(keys, tasks):
        if t in done:
            out.append(t.result())
        else:
            out.append(Result(key, note=f"unfinished {drain_s:.0f}s after the load"))
    return out


async def batch(base, model, reqs, *, concurrency=0, timeout_s=1800.0) -> list:
    """All ``reqs`` at once (at most ``concurrency`` in flight when > 0), in order."""
    sem = asyncio.Semaphore(concurrency or len(reqs) or 1)
    t0 = time.monotonic()
    async with _client(timeout_s) as s:

        async def one(r):
            async with sem:
                return await send(s, base, model, r, t0)

        tasks = [asyncio.create_task(one(r)) for r in reqs]
        return await _gather(tasks, timeout_s, [r.key for r in reqs])


def scrape(port: int) -> dict[str, float]:
    """Sums of every series in the server's Prometheus text, by metric name."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=10
        ) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        with contextlib.suppress(ValueError, IndexError):
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def open_loop(
    base, port, model, make_req, *, rate, duration_s, drain_s, sample_s,
    max_in_flight=2048, seed=0, server_session=None, stop_at_cap=False,
) -> tuple[list[Result], list[dict], dict]:  # fmt: skip
    """Poisson arrivals at ``rate`` req/s for ``duration_s`` (at most ``max_in_flight``
    open: an arrival past that is not sent; with ``stop_at_cap`` the schedule ends
    there, ``stopped_at_s`` in the load), then up to ``drain_s`` for the rest; GPU
    memory (the whole GPU's, and with ``server_session`` the server processes' own:
    ``run_soak.session_gpu_memory_mib``) and metrics every ``sample_s``. Each
    request goes out at its scheduled time, or at once when the loop is behind, so a
    busy moment delays sends without thinning them. Returns (results in sending
    order, samples, the load as sent: ``load_summary``)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    cpu0 = time.process_time()
    samples: list[dict] = []
    tasks, keys = [], []
    stop = asyncio.Event()
    open_now, not_sent, lag, stopped_at = 0, 0, 0.0, None

    def finished(_task) -> None:
        nonlocal open_now
        open_now -= 1

    async def sampler():
        while True:
            s = {"t": round(time.monotonic() - t0, 1)}
            s["gpu_mib"] = await asyncio.to_thread(run_soak.gpu_memory_mib)
            if server_session is not None:
                s["server_gpu_mib"] = await asyncio.to_thread(
                    run_soak.session_gpu_memory_mib, server_session
                )
            s.update(await asyncio.to_thread(scrape, port))
            s["sent"] = len(tasks)
            samples.append(s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), sample_s)
            if stop.is_set():
                return

    async with _client(duration_s + drain_s + 60) as s:
        sampling = asyncio.create_task(sampler())
        due = rng.expovariate(rate)
        while due < duration_s:
            wait = due - (time.monotonic() - t0)
            await asyncio.sleep(max(0.0, wait))  # 0: let the responses run
            lag = max(lag, -wait)
            if open_now < max_in_flight:
                req = make_req(len(tasks) + not_sent)
                task = asyncio.create_task(send(s, base, model, req, t0))
                task.add_done_callback(finished)
                tasks.append(task)
                keys.append(req.key)
                open_now += 1
            else:
                not_sent += 1
                if stop_at_cap:
                    stopped_at = round(time.monotonic() - t0, 3)
                    break
            due += rng.expovariate(rate)
        load = load_summary(
            rate=rate, duration_s=duration_s, sent=len(tasks), not_sent=not_sent,
            lag_s=lag, cpu_s=time.process_time() - cpu0, stopped_at_s=stopped_at,
        )  # fmt: skip
        results = await _gather(tasks, drain_s, keys)
        stop.set()
        await sampling
    return results, samples, load


def load_summary(
    *, rate, duration_s, sent, not_sent, lag_s, cpu_s, stopped_at_s=None
) -> dict:
    """What an open loop put on the server: the asked and the sent rate, arrivals
    not sent at the in-flight cap, the furthest a send fell behind its schedule, the
    client's CPU seconds per second of load, and the second at which a schedule
    stopped at the cap ended (None: it ran its whole duration); the rates are over
    the time it ran."""
    ran_s = duration_s if stopped_at_s is None else stopped_at_s
    return {
        "asked_rate": rate,
        "sent_rate": round(sent / ran_s, 3) if ran_s else None,
        "sent": sent,
        "not_sent_at_cap": not_sent,
        "max_send_lag_s": round(lag_s, 3),
        "client_cpu_share": round(cpu_s / ran_s, 3) if ran_s else None,
        "stopped_at_s": stopped_at_s,
    }


def tally(results: list[Result]) -> dict:
    kinds = [r.kind for r in results]
    failed = [r for r in results if r.kind == "failed"]
    return {
        "sent": len(results),
        "completed": kinds.count("ok"),
        "cancelled": kinds.count("cancelled"),
        "failed": len(failed),
        "http_5xx": sum(1 for r in results if (r.status or 0) >= 500),
        "failure_examples": [f"{r.key}: {r.note}" for r in failed[:5]],
    }
