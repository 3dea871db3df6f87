"""Reliability suite: one backend's ``vllm serve`` (on 127.0.0.1) under six scenarios.

    python -m benchmarks.reliability.run_reliability --scenario all \
        --backend FLASH_ATTN,TRITON_ATTN-fork --model llama-3.1-8b --rate 50 \
        --python stock=/envs/stock/bin/python --python fork=/envs/fork/bin/python \
        --out-dir reliability

Scenarios (docs/reliability.md has the pass rules), in the order they run:
length-limits, abort-storm, soak, spec-decode, preemption, prefix-caching. Every
server has --max-model-len; each scenario compares servers that differ in one
setting (mostly against the plain reference server), and a server is kept running
while the next use asks for the same arguments. Every scenario also fails on an
HTTP 5xx, an ERROR line in a server log, or a server that does not come up. Writes
``<out-dir>/<scenario>-<backend>.json`` per scenario and backend, and the greedy
outputs under ``<out-dir>/outputs/`` (the reference backend's are compared with the
others': whichever of them runs second, in the same call or a later one with the
same ``--out-dir``).

Backends run one after the other, each with the whole GPU; with ``--together`` they
run side by side on one GPU, scenario by scenario: each server gets an equal share
of the GPU memory and of ``--rate``, and the open-loop scenarios start their load
on every backend at once, after all servers are up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import resource
import shlex
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402
from benchmarks.models import make_model_dir, model_names  # noqa: E402
from benchmarks.models.configs import BENCH_TOKENIZER_VOCAB  # noqa: E402
from benchmarks.reliability import client  # noqa: E402
from benchmarks.soak import run_soak  # noqa: E402

PREEMPTIONS = "vllm:num_preemptions_total"  # counter vllm:num_preemptions (v1)
PREFIX_HITS = "vllm:prefix_cache_hits_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
ERROR_LINE = re.compile(r"\bERROR \d\d-\d\d \d\d:\d\d:\d\d\b|^ERROR\b|Traceback \(")
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
# The pressure servers' page size unless --block-size is given (vLLM's CUDA default).
DEFAULT_BLOCK_SIZE = 16
# Per scenario: duration (s, for the timed ones) and the greedy agreement needed.
DURATION = {"abort-storm": 600.0, "soak": 900.0}
MIN_AGREEMENT = {"preemption": 0.99}  # others: 1.0 (identical)
# A memory failure names its largest steps, this many (run_soak.memory_verdict).
MEMORY_STEPS_TOLD = 3


class ServerDown(Exception):
    pass


# Metrics whose change over one use of a server a scenario checks.
COUNTERS = (PREEMPTIONS, PREFIX_HITS, SPEC_DRAFTS)


def last_error(log: Path) -> str:
    """The last ERROR or exception line of a server log, else its last line."""
    lines = [ln.strip() for ln in harness.tail(log, 200).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ERROR_LINE.search(ln) or "Error:" in ln]
    return (errors or lines or ["(empty log)"])[-1][-400:]


@dataclass
class Running:
    extra: tuple  # the arguments it was started with beyond the pool's common ones
    command: str
    tag: str
    port: int
    proc: object
    log: Path
    stack: contextlib.ExitStack


class Lockstep:
    """Backends side by side (``--together``): their open-loop scenarios start the
    load together, once every backend's server is up. A backend that leaves the
    scenario early (its server did not come up) releases the others."""

    def __init__(self, n: int, timeout_s: float):
        self.barrier = threading.Barrier(n, timeout=timeout_s) if n > 1 else None

    def wait(self) -> bool | None:
        """True when all started together, False when one left, None when alone."""
        if self.barrier is None:
            return None
        try:
            self.barrier.wait()
            return True
        except threading.BrokenBarrierError:
            return False

    def leave(self) -> None:
        if self.barrier is not None:
            self.barrier.abort()

    def reset(self) -> None:
        if self.barrier is not None:
            self.barrier.reset()


class Servers:
    """One backend's ``vllm serve`` processes, one at a time. A use that asks for the
    arguments of the server already running reuses it (scenarios share the plain
    reference server); any other use stops it and starts the one asked for. Each use
    is recorded on its own: the log lines written during it, the counters' change,
    GPU memory and health at its start and end."""

    def __init__(self, args, backend, inst, model_dir: Path, work: Path,
                 together: tuple[str, ...] = (), switch_lock=None):  # fmt: skip
        self.args, self.backend, self.inst = args, backend, inst
        self.model_dir, self.work = model_dir, work
        self.together = together  # the backends sharing the GPU, if any
        self.share = len(together) or 1
        # Side by side, one server at a time starts or stops: vLLM sizes its KV
        # cache from the GPU memory that changed while it started, so another
        # server's allocations or frees in that window would count as its own.
        self.switch_lock = switch_lock or threading.RLock()
        self.current: Running | None = None
        self.started = 0

    def command(self, extra: list[str], port: int) -> list[str]:
        a = self.args
        return [
            self.inst.python, "-m", "vllm.entrypoints.cli.main", "serve",
            str(self.model_dir), "--served-model-name", a.model,
            *(["--load-format", "dummy"] if not a.model_dir else []),
            "--max-model-len", str(a.max_model_len),
            "--attention-backend", self.backend.attention_backend,
            "--host", "127.0.0.1", "--port", str(port), "--seed", "0",
            *(["--block-size", str(a.block_size)] if a.block_size else []),
            *([f"--gpu-memory-utilization={0.9 / self.share:.2f}"]
              if self.share > 1 else []),
            *a.server_arg, *extra,
        ]  # fmt: skip

    def _start(self, tag: str, extra: list[str], info: dict) -> Running:
        port = harness.free_port()
        cmd = self.command(extra, port)
        self.started += 1
        self.work.mkdir(parents=True, exist_ok=True)
        log = self.work / f"server-{self.started}-{tag}.log"
        info.update(command=shlex.join(cmd), log=str(log), started=True,
                    start_unix=round(time.time(), 3))  # fmt: skip
        print(f"[reliability] {tag}: $ {info['command']}", flush=True)
        t0, stack = time.monotonic(), contextlib.ExitStack()
        proc = stack.enter_context(harness.running_server(
            cmd, self.inst.env(), port, log, self.args.startup_timeout_s
        ))  # fmt: skip
        if proc is None:
            info["log_tail"] = harness.tail(log, 40)
            stack.close()
            raise ServerDown(f"server {tag} did not come up: {last_error(log)}")
        info["up_s"] = round(time.monotonic() - t0, 1)
        info["up_unix"] = round(time.time(), 3)
        return Running(tuple(extra), info["command"], tag, port, proc, log, stack)

    def stop(self) -> None:
        with self.switch_lock:
            if self.current is not None:
                self.current.stack.close()
                self.current = None

    @contextlib.contextmanager
    def use(self, tag: str, extra: list[str], uses: list):
        info: dict = {"tag": tag}
        uses.append(info)
        cur = self.current
        if cur is not None and cur.extra == tuple(extra):
            info.update(command=cur.command, log=str(cur.log), started=False,
                        reused=cur.tag)  # fmt: skip
        else:
            with self.switch_lock:
                self.stop()
                self.current = cur = self._start(tag, extra, info)
        offset = cur.log.stat().st_size if cur.log.exists() else 0
        before = client.scrape(cur.port)
        info["gpu_mib_start"] = run_soak.gpu_memory_mib()
        live = argparse.Namespace(port=cur.port, base=f"http://127.0.0.1:{cur.port}",
                                  info=info, session=cur.proc.pid)  # fmt: skip
        try:
            yield live
        finally:
            healthy = cur.proc.poll() is None and run_soak.healthy(cur.port)
            after = client.scrape(cur.port) if healthy else {}
            info.update(healthy_at_end=healthy, gpu_mib_end=run_soak.gpu_memory_mib(),
                        metrics_end=after)  # fmt: skip
            # a server that died has no metrics: its counters read 0, and the
            # use fails as unhealthy
            info["counters"] = {k: max(0.0, after.get(k, 0.0) - before.get(k, 0.0))
                                for k in COUNTERS}  # fmt: skip
            with open(cur.log, errors="replace") as f:
                f.seek(offset)
                lines = f.read().splitlines()
            errors = [ln for ln in lines if ERROR_LINE.search(ln)]
            info.update(error_lines=len(errors), error_examples=errors[:5])
            info["late_jit_compiles"] = harness.late_jit_compiles(lines)
            if not healthy:
                info["log_tail"] = harness.tail(cur.log, 40)
                self.stop()


@dataclass
class Ctx:
    """One scenario on one backend: its server uses and its requests' results."""

    args: argparse.Namespace
    backend: harness.Backend
    pool: Servers
    lockstep: Lockstep
    servers: list = field(default_factory=list)  # one record per server use
    results: list = field(default_factory=list)

    def server(self, tag: str, extra: list[str]):
        return self.pool.use(tag, extra, self.servers)

    def batch(self, live, reqs: list[client.Req], concurrency: int = 0):
        res = asyncio.run(
            client.batch(live.base, self.args.model, reqs, concurrency=concurrency)
        )
        self.results += res
        return res


def plain(a) -> list[str]:
    """The reference server: vLLM's defaults, with a token budget that holds a whole
    prompt of ``--max-model-len`` (prefixes are cached, as by default)."""
    return ["--max-num-batched-tokens", str(a.max_model_len)]


def pressure(a) -> list[str]:
    """A KV cache of ``--pressure-kv-tokens`` only: preemptions and evictions. The
    cache is a number of blocks and backends default to different page sizes
    (TRITON_ATTN-fork: 64), so these servers always get ``--block-size`` (16 unless
    given; when given, every server gets it)."""
    bs = a.block_size or DEFAULT_BLOCK_SIZE
    return [*plain(a), *([] if a.block_size else ["--block-size", str(bs)]),
            "--num-gpu-blocks-override", str(a.pressure_kv_tokens // bs)]  # fmt: skip


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, BENCH_TOKENIZER_VOCAB) for _ in range(n)]


def sharegpt_like(rng: random.Random, max_len: int) -> tuple[list[int], int]:
    """vLLM's random dataset at ShareGPT's means (215 in, 197 out), range ratio 0.9,
    cut to fit ``max_len`` tokens in all."""
    n, m = rng.randint(22, 408), rng.randint(20, 374)
    m = min(m, max_len // 2)
    return ids(rng, min(n, max_len - m)), m


def agreement(a: dict, b: dict) -> dict:
    """Share of the keys both have whose greedy outputs are identical."""
    common = sorted(set(a) & set(b))
    same = sum(a[k] == b[k] for k in common)
    diff = [k for k in common if a[k] != b[k]]
    return {"compared": len(common), "identical": same,
            "fraction": same / len(common) if common else None,
            "differing_keys": diff[:10]}  # fmt: skip


def outputs(results) -> dict:
    return {r.key: r.output() for r in results if r.kind == "ok"}


def check_agreement(name: str, agree: dict, need: float, reasons: list) -> None:
    frac = agree["fraction"]
    if frac is None or frac < need:
        reasons.append(f"{name}: {agree['identical']}/{agree['compared']} identical "
                       f"greedy outputs, need >= {need:.0%}")  # fmt: skip


def memory_flat(samples, args, reasons) -> dict:
    mem = run_soak.memory_verdict(samples, args.settle_s, args.max_growth_mib)
    if mem.get("checked") and not mem["ok"]:
        steps = ", ".join(
            f"+{st['mib']} MiB at {st['t']:.0f} s with {st['running']:.0f} running "
            f"requests (before it at most {st['running_max_before']:.0f})"
            if st["running"] is not None and st["running_max_before"] is not None
            else f"+{st['mib']} MiB at {st['t']:.0f} s"
            for st in sorted(mem["steps"], key=lambda st: -st["mib"])[
                :MEMORY_STEPS_TOLD
            ]
        )
        if len(mem["steps"]) > MEMORY_STEPS_TOLD:
            steps += f" and {len(mem['steps']) - MEMORY_STEPS_TOLD} more steps"
        own = mem["source"] == run_soak.SERVER_MEMORY
        whose = f" of {run_soak.SERVER_MEMORY}" if own else ""
        reasons.append(f"GPU memory{whose} grew {mem['growth_mib']} MiB after the "
                       "settle time" + (f": {steps}" if steps else ""))  # fmt: skip
    return mem


def all_complete(results, reasons) -> None:
    bad = [r for r in results if r.kind == "failed"]
    if bad:
        reasons.append(f"{len(bad)} non-cancelled requests did not complete, e.g. "
                       f"{bad[0].key}: {bad[0].note}")  # fmt: skip


def rate(ctx: Ctx) -> float:
    """This server's share of the saturating rate ``--rate`` of the GPU."""
    return ctx.args.rate / ctx.pool.share


def open_loop(ctx: Ctx, live, rate: float, cancel_frac: float, stop_at_cap=False):
    a = ctx.args

    def make(i: int) -> client.Req:
        rng = random.Random(a.seed * 1_000_003 + i)
        prompt, mt = sharegpt_like(rng, a.max_model_len)
        req = client.Req(f"r{i}", prompt, mt)
        if rng.random() < cancel_frac:
            if rng.random() < 0.5:
                req.cancel, req.cancel_at = "before_first_token", rng.uniform(0, 0.05)
            else:
                req.cancel, req.cancel_at = "mid_decode", rng.randint(1, max(1, mt - 1))
        return req

    warm_up(ctx, live)
    together = ctx.lockstep.wait()
    if together is not None:
        live.info["load_started_together"] = together
    live.info["load_start_unix"] = round(time.time(), 3)
    res, samples, load = asyncio.run(client.open_loop(
        live.base, live.port, a.model, make, rate=rate, duration_s=a.duration_s,
        drain_s=a.drain_s, sample_s=a.sample_s, seed=a.seed,
        server_session=live.session,  # started with start_new_session
        max_in_flight=a.max_in_flight, stop_at_cap=stop_at_cap,
    ))  # fmt: skip
    ctx.results += res
    return res, samples, load


def warm_up(ctx: Ctx, live) -> None:
    """``--warmup-requests`` ShareGPT-like requests at once, before an open loop
    starts its clock: the server runs the largest batches it will take (vLLM's
    default ``max_num_seqs`` is 1024 on GPUs of 70 GiB or more) while the load
    comes up. vLLM empties PyTorch's allocator cache after CUDA-graph capture, so
    the first batch larger than any before it allocates its activations from the
    device and keeps them cached; without a warm-up that step lands in the measured
    minutes at whatever moment the Poisson load first peaks. The results count
    with the scenario's requests (a failed one fails it); their outputs are not
    compared."""
    a = ctx.args
    if not a.warmup_requests:
        return
    reqs = []
    for i in range(a.warmup_requests):
        # a seed of its own: the open loop's prompts must not hit their prefixes
        prompt, mt = sharegpt_like(random.Random(f"warmup-{a.seed}-{i}"),
                                   a.max_model_len)  # fmt: skip
        reqs.append(client.Req(f"warmup{i}", prompt, mt))
    t0 = time.monotonic()
    res = ctx.batch(live, reqs)
    live.info["warmup"] = {**client.tally(res),
                           "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def warmup_failures(live, reasons: list) -> dict | None:
    """The warm-up's tally (None without one); its failed requests fail the
    scenario like the open loop's."""
    warm = live.info.get("warmup")
    if warm and warm["failed"]:
        reasons.append(f"{warm['failed']} warm-up requests did not complete, e.g. "
                       f"{warm['failure_examples'][0]}")  # fmt: skip
    return warm


def load_sent(load: dict, reasons: list) -> None:
    """Checks the open loop's load (``client.load_summary``): a client that fell
    behind its schedule did not put the asked rate on the server, so the run shows
    nothing."""
    if load["max_send_lag_s"] > client.MAX_SEND_LAG_S:
        reasons.append(
            f"the client fell {load['max_send_lag_s']} s behind its schedule "
            f"(sent {load['sent_rate']} of {load['asked_rate']} req/s): the server "
            "did not get the asked load"
        )


def abort_storm(ctx: Ctx) -> tuple[dict, dict, list]:
    reasons: list[str] = []
    with ctx.server("plain", plain(ctx.args)) as live:
        res, samples, load = open_loop(ctx, live, 2 * rate(ctx), ctx.args.cancel_frac)
    all_complete(res, reasons)
    warm = warmup_failures(live, reasons)
    load_sent(load, reasons)
    mem = memory_flat(samples, ctx.args, reasons)
    nums = {"rate": 2 * rate(ctx), "warmup": warm, "load": load,
            "server": server_load(samples), "memory": mem,
            "samples": samples}  # fmt: skip
    return nums, outputs(res), reasons


def preemption(ctx: Ctx) -> tuple[dict, dict, list]:
    a, reasons = ctx.args, []
    rng = random.Random(a.seed)
    top = min(1024, a.max_model_len - a.max_tokens)  # >= 256 (check_lengths)
    reqs = [client.Req(f"p{i}", ids(rng, rng.randint(256, top)), a.max_tokens)
            for i in range(a.num_requests)]  # fmt: skip
    out = {}
    for tag, extra in (("plain", plain(a)), ("pressure", pressure(a))):
        with ctx.server(tag, extra) as live:
            res = ctx.batch(live, reqs)
        all_complete(res, reasons)
        out[tag] = outputs(res)
    pre = live.info["counters"][PREEMPTIONS]
    if pre <= 0:
        reasons.append(f"no preemptions ({PREEMPTIONS} = {pre}) under KV pressure")
    agree = agreement(out["pressure"], out["plain"])
    check_agreement("pressure vs none", agree, a.min_agreement, reasons)
    nums = {"pressure_kv_tokens": a.pressure_kv_tokens, "preemptions": pre,
            "agreement": agree}  # fmt: skip
    return nums, out["pressure"], reasons


# (case, prompt length from max_model_len L and max_tokens m, max_tokens, status).
# vLLM rejects a prompt of L tokens for generation (the input processor needs
# room for one output token), so that case expects 400 like the longer one.
LENGTH_CASES = (
    ("L-max_tokens", lambda L, m: L - m, None, 200),
    ("L-1, max_tokens 1", lambda L, m: L - 1, 1, 200),
    ("L", lambda L, m: L, None, 400),
    ("L+1", lambda L, m: L + 1, None, 400),
)


def length_limits(ctx: Ctx) -> tuple[dict, dict, list]:
    a, reasons = ctx.args, []
    L, m, rng = a.max_model_len, a.max_tokens, random.Random(a.seed)
    cases = {}
    long_reqs = [client.Req(f"long{i}", ids(rng, L - m), m) for i in range(4)]
    out = {}
    # The chunked servers take the four long prompts at once; the reference one at
    # a time, so that each fits the token budget of one step: no chunking.
    for tag, extra, concurrency in (
        ("chunk-512", ["--max-num-batched-tokens", "512"], 0),
        ("chunk-2048", ["--max-num-batched-tokens", "2048"], 0),
        ("plain", plain(a), 1),
    ):
        with ctx.server(tag, extra) as live:
            if tag == "plain":
                for name, n, mt, want in LENGTH_CASES:
                    req = client.Req(name, ids(rng, n(L, m)), mt or m)
                    r = ctx.batch(live, [req])[0]
                    cases[name] = {"prompt_tokens": n(L, m), "status": r.status,
                                   "expected": want}  # fmt: skip
                    if r.status != want:
                        reasons.append(
                            f"prompt {name}: HTTP {r.status}, expected {want}"
                        )
                if not run_soak.healthy(live.port):
                    reasons.append("server unhealthy after the over-length prompts")
            res = ctx.batch(live, long_reqs, concurrency=concurrency)
        all_complete(res, reasons)
        out[tag] = outputs(res)
    nums = {"cases": cases}
    for tag in ("chunk-512", "chunk-2048"):
        nums[f"agreement_{tag}"] = agree = agreement(out[tag], out["plain"])
        check_agreement(f"{tag} vs no chunking", agree, a.min_agreement, reasons)
    return nums, out["plain"], reasons


def flush_requests(a, rng: random.Random) -> list[client.Req]:
    """Distinct prompts (one output token each) that together need twice the small
    cache's tokens: a cache that frees its least recently used blocks first has
    evicted every block cached before them once they are served."""
    length = min(1024, a.max_model_len - 2)
    count = -(-2 * a.pressure_kv_tokens // (length + 1))
    return [client.Req(f"flush-{i}", ids(rng, length), 1) for i in range(count)]


def prefix_caching(ctx: Ctx) -> tuple[dict, dict, list]:
    a, reasons = ctx.args, []
    bs, rng = a.block_size or DEFAULT_BLOCK_SIZE, random.Random(a.seed)
    lengths = [1, bs - 1, bs + 1, 3 * bs + 5]
    reqs = []
    for n in lengths:
        for g in range(a.prefix_groups):
            prefix = ids(rng, n)
            for j in range(8):
                suffix = ids(rng, rng.randint(1, 2 * bs))
                reqs.append(
                    client.Req(f"len{n}-g{g}-{j}", prefix + suffix, a.max_tokens)
                )
    flush = flush_requests(a, rng)
    # Three rounds of the same requests on the small cache: "first" fills it,
    # "again" hits what it holds, "evicted" runs after the flush has evicted it
    # (hits only between requests of the round), so fewer hits than "again".
    rounds = ("first", "again", "evicted")
    out, hits = {}, {}
    for tag, extra in (
        ("pressure", pressure(a)),
        ("pressure-no-prefix-caching", [*pressure(a), "--no-enable-prefix-caching"]),
    ):
        res, hits[tag] = [], {}
        with ctx.server(tag, extra) as live:
            for name in rounds:
                if name == "evicted":
                    all_complete(ctx.batch(live, flush), reasons)
                before = client.scrape(live.port).get(PREFIX_HITS, 0.0)
                batch = [client.Req(f"{name}:{r.key}", r.prompt, r.max_tokens)
                         for r in reqs]  # fmt: skip
                res += ctx.batch(live, batch)
                after = client.scrape(live.port).get(PREFIX_HITS, 0.0)
                hits[tag][name] = after - before
        all_complete(res, reasons)
        out[tag] = outputs(res)
    cached = hits["pressure"]
    if cached["again"] <= 0:
        reasons.append(f"no prefix-cache hits on the repeated round ({cached})")
    elif cached["evicted"] >= cached["again"]:
        reasons.append(
            f"eviction not shown: {cached['evicted']} hits after the flush, "
            f"{cached['again']} before it"
        )
    agree = agreement(out["pressure"], out["pressure-no-prefix-caching"])
    check_agreement("prefix caching vs none", agree, a.min_agreement, reasons)
    nums = {"block_size": bs, "prefix_lengths": lengths,
            "prefix_hits": sum(cached.values()), "prefix_hits_by_round": cached,
            "flush": {"requests": len(flush), "prompt_tokens": len(flush[0].prompt)},
            "agreement": agree}  # fmt: skip
    return nums, out["pressure"], reasons


def spec_decode(ctx: Ctx) -> tuple[dict, dict, list]:
    a, reasons = ctx.args, []
    rng = random.Random(a.seed)
    reqs = []
    for n in a.spec_prompt_lens:
        for j in range(2):  # repeated segments: n-grams the proposer can find
            seg = ids(rng, rng.randint(20, 200))
            reqs.append(client.Req(f"len{n}-{j}", (seg * (n // len(seg) + 1))[:n],
                                   a.max_tokens))  # fmt: skip
    out = {}
    spec = ["--speculative-config", json.dumps(NGRAM)]
    for tag, extra in (("plain", plain(a)), ("ngram", [*plain(a), *spec])):
        with ctx.server(tag, extra) as live:
            res = ctx.batch(live, reqs)
        all_complete(res, reasons)
        out[tag] = outputs(res)
    drafts = live.info["counters"][SPEC_DRAFTS]
    if drafts <= 0:
        reasons.append(f"no speculative drafts ({SPEC_DRAFTS} = {drafts})")
    agree = agreement(out["ngram"], out["plain"])
    check_agreement("ngram vs no speculation", agree, a.min_agreement, reasons)
    nums = {"speculative_config": NGRAM, "drafts": drafts, "agreement": agree}
    return nums, out["ngram"], reasons


def throughput_windows(results, duration_s: float, window_s: float) -> dict:
    """Output tokens/s of the requests completed in the first and the last window."""
    w = min(window_s, duration_s / 2)

    def tps(lo: float, hi: float) -> float:
        toks = sum(len(r.token_ids) for r in results
                   if r.kind == "ok" and lo <= r.t_end < hi)  # fmt: skip
        return toks / w

    first, last = tps(0, w), tps(duration_s - w, duration_s)
    change = (last - first) / first if first else None
    return {"window_s": w, "first_tok_per_s": first, "last_tok_per_s": last,
            "change": change}  # fmt: skip


API_CPU = "process_cpu_seconds_total"  # the API server process's (one API server)
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
OPEN_FDS = "process_open_fds"
# The API server process, not the engine, limits a load that keeps it at this median
# CPU share while the engine has a queue in at most ENGINE_QUEUED_SHARE of the
# samples (a backlog flushed from the API server queues briefly in the engine).
FRONTEND_BOUND_CPU = 0.9
ENGINE_QUEUED_SHARE = 0.1


def server_load(samples: list[dict]) -> dict:
    """Where the server held an open loop's requests, from the metrics samples: the
    API server process's CPU share between samples (median and max; None where the
    server exports no process metrics, as with several API servers), its open file
    descriptors (about one per open connection), the engine's running and waiting
    requests, and the share of samples in which the engine had a queue."""
    shares = [
        (b[API_CPU] - a[API_CPU]) / (b["t"] - a["t"])
        for a, b in zip(samples, samples[1:])
        if API_CPU in a and API_CPU in b and b["t"] > a["t"]
    ]

    def most(name: str) -> float | None:
        return max((s[name] for s in samples if name in s), default=None)

    waiting = [s[WAITING] for s in samples if WAITING in s]
    return {
        "api_server_cpu_share_median": (
            round(statistics.median(shares), 3) if shares else None
        ),
        "api_server_cpu_share_max": round(max(shares), 3) if shares else None,
        "max_open_fds": most(OPEN_FDS),
        "max_engine_running": most(RUNNING),
        "max_engine_waiting": most(WAITING),
        "engine_queued_share": (
            round(sum(w > 0 for w in waiting) / len(waiting), 3) if waiting else None
        ),
    }


def saturated(load: dict, server: dict, reasons: list) -> None:
    """An arrival that found the client's in-flight cap full: the server did not
    keep up. Says which part: the API server (a busy process while the engine
    rarely had a queue) or the engine."""
    if not load["not_sent_at_cap"]:
        return
    what = f"{load['not_sent_at_cap']} arrivals found the client's in-flight cap full"
    cpu = server["api_server_cpu_share_median"]
    queued = server["engine_queued_share"]
    if (
        cpu is not None
        and cpu >= FRONTEND_BOUND_CPU
        and (queued or 0.0) <= ENGINE_QUEUED_SHARE
    ):
        reasons.append(
            f"{what}: the API server process was saturated (median CPU share {cpu} "
            f"of a core, up to {server['max_open_fds']:.0f} open files) while the "
            f"engine had a queue in {queued:.0%} of the samples; the rate is past "
            "what one API server takes: lower --rate, or serve with --api-server-count"
        )
    else:
        reasons.append(
            f"{what}: the engine was saturated (a queue in {queued or 0.0:.0%} of the "
            f"samples, up to {server['max_engine_waiting']} requests waiting)"
        )


def soak(ctx: Ctx) -> tuple[dict, dict, list]:
    a, reasons = ctx.args, []
    with ctx.server("plain", plain(a)) as live:
        res, samples, load = open_loop(ctx, live, 0.8 * rate(ctx), a.soak_cancel_frac,
                                       stop_at_cap=a.stop_when_saturated)  # fmt: skip
    all_complete(res, reasons)
    warm = warmup_failures(live, reasons)
    load_sent(load, reasons)
    server = server_load(samples)
    saturated(load, server, reasons)
    if load["stopped_at_s"] is None:
        tput = throughput_windows(res, a.duration_s, a.window_s)
        if tput["change"] is None or abs(tput["change"]) > a.max_throughput_change:
            reasons.append(f"throughput of the last window vs the first: {tput}")
    else:  # failed already (saturated); a cut-short run has no last window
        tput = {"not_checked": f"the load stopped at {load['stopped_at_s']} s"}
    late = live.info.get("late_jit_compiles", [])
    if late:
        reasons.append(f"Triton compiled while serving: {', '.join(late[:5])}")
    nums = {"rate": 0.8 * rate(ctx), "warmup": warm, "load": load, "server": server,
            "throughput": tput, "memory": memory_flat(samples, a, reasons),
            "samples": samples}  # fmt: skip
    return nums, outputs(res), reasons


# In the order of ``--scenario all``, which lets consecutive uses of one server
# configuration share a process: 7 server starts per backend, not 11.
SCENARIOS = {
    "length-limits": length_limits,
    "abort-storm": abort_storm,
    "soak": soak,
    "spec-decode": spec_decode,
    "preemption": preemption,
    "prefix-caching": prefix_caching,
}


def run_one(name: str, ctx: Ctx, env: dict) -> dict:
    a = ctx.args
    a.duration_s = a.duration or DURATION.get(name, 0.0)
    a.min_agreement = a.min_agreement_arg or MIN_AGREEMENT.get(name, 1.0)
    try:
        nums, outs, reasons = SCENARIOS[name](ctx)
    except ServerDown as e:
        nums, outs, reasons = {}, {}, [str(e)]
    finally:
        ctx.lockstep.leave()
    reqs = client.tally(ctx.results)
    for s in ctx.servers:
        if s.get("error_lines"):
            reasons.append(f"server {s['tag']}: {s['error_lines']} ERROR log lines")
        if s.get("healthy_at_end") is False:
            reasons.append(f"server {s['tag']} not healthy at the end")
    if reqs["http_5xx"]:
        reasons.append(f"{reqs['http_5xx']} HTTP 5xx answers")
    pre = [s.get("counters", {}).get(PREEMPTIONS) for s in ctx.servers]
    rec = {
        "kind": "reliability", "scenario": name, "backend": ctx.backend.as_dict(),
        "model": a.model, "commit": env.get("commit"), "gpu": env.get("gpu"),
        "driver": env.get("driver"), "environment": env,
        "command": shlex.join([sys.executable, *sys.argv]),
        "parameters": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in vars(a).items()},
        "requests": reqs, "servers": ctx.servers, "preemptions": pre,
        "together": list(ctx.pool.together) or None,
        "agreement_with_reference": None, "numbers": nums,
        "pass": not reasons, "reasons": reasons,
    }  # fmt: skip
    return rec, outs


def record(name: str, backend: harness.Backend, rec: dict, outs: dict, a) -> bool:
    """Write a scenario's outputs and record (with its agreement with the reference
    backend's outputs of the same scenario, when those exist) and print the verdict."""
    out_dir = a.out_dir / "outputs"
    harness.write_json(out_dir / f"{name}-{backend.name}.json", outs)
    ref = out_dir / f"{name}-{harness.BASELINE}.json"
    if backend.name != harness.BASELINE and ref.exists():
        vs_ref = agreement(outs, harness.read_json(ref))
        rec["agreement_with_reference"] = {**vs_ref, "reference": harness.BASELINE}
    path = a.out_dir / f"{name}-{backend.name}.json"
    harness.write_json(path, rec)
    if backend.name == harness.BASELINE:
        compare_earlier(name, outs, a.out_dir)
    print(f"[reliability] {name} {backend.name}: {'PASS' if rec['pass'] else 'FAIL'}"
          f" {rec['requests']} {'; '.join(rec['reasons'])} -> {path}",
          flush=True)  # fmt: skip
    return rec["pass"]


def compare_earlier(name: str, ref_outs: dict, out_dir: Path) -> None:
    """The reference backend ran after the others (a later call with the same
    ``--out-dir``): their records of ``name`` get their agreement with its outputs."""
    for path in sorted(out_dir.glob(f"{name}-*.json")):
        other = path.stem[len(name) + 1 :]
        outs = out_dir / "outputs" / path.name
        if other not in harness.BACKENDS or other == harness.BASELINE:
            continue
        if not outs.exists():
            continue
        rec = harness.read_json(path)
        vs_ref = agreement(harness.read_json(outs), ref_outs)
        rec["agreement_with_reference"] = {**vs_ref, "reference": harness.BASELINE}
        harness.write_json(path, rec)
        print(f"[reliability] {name} {other}: {vs_ref['identical']}/"
              f"{vs_ref['compared']} identical to {harness.BASELINE} -> {path}",
              flush=True)  # fmt: skip


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--scenario", default="all", help=f"all or one of: {', '.join(SCENARIOS)}")
    add("--backend", default="FLASH_ATTN,TRITON_ATTN-fork",
        help=f"comma-separated: {', '.join(harness.BACKENDS)}")  # fmt: skip
    add("--model", required=True, help=f"one of: {', '.join(model_names())}")
    add("--model-dir", type=Path, help="serve this model directory (real weights)")
    add("--out-dir", type=Path, required=True)
    add("--rate", type=float, default=10.0, help="saturating request rate (req/s)")
    add("--duration-s", dest="duration", type=float, help="abort-storm 600, soak 900")
    add("--drain-s", type=float, default=300.0, help="wait for in-flight requests")
    add("--sample-s", type=float, default=10.0)
    add("--settle-s", type=float, default=60.0, help="memory baseline after this")
    add("--warmup-requests", type=int, default=1024,
        help="sent at once before abort-storm's and soak's load (0: none)")  # fmt: skip
    add("--max-growth-mib", type=int, default=256)
    add("--cancel-frac", type=float, default=0.3)
    add("--soak-cancel-frac", type=float, default=0.05)
    add("--max-in-flight", type=int, default=2048,
        help="the load client's cap on open requests: an arrival that finds it "
             "full is not sent (and fails a soak)")  # fmt: skip
    add("--stop-when-saturated", action="store_true",
        help="end the soak's load at the first arrival that finds the client's "
             "in-flight cap full (the run has failed then), sparing the GPU time "
             "of the rest of --duration-s")  # fmt: skip
    add("--window-s", type=float, default=300.0)
    add("--max-throughput-change", type=float, default=0.05)
    add("--max-model-len", type=int, default=10240, help="of every server")
    add("--max-tokens", type=int, default=64)
    add("--num-requests", type=int, default=128)
    add("--pressure-kv-tokens", type=int, default=12288,
        help="KV cache of the pressure servers (>= --max-model-len)")  # fmt: skip
    add("--block-size", type=int,
        help="KV block size of every server (default: each backend's own; the "
             "small-cache servers get 16)")  # fmt: skip
    add("--prefix-groups", type=int, default=4)
    add("--spec-prompt-lens", type=lambda s: [int(x) for x in s.split(",")],
        default=[128, 1024, 4096, 10000])  # fmt: skip
    add(
        "--min-agreement",
        dest="min_agreement_arg",
        type=float,
        help="greedy agreement needed (default: preemption 0.99, others 1.0)",
    )
    add("--seed", type=int, default=0)
    add("--startup-timeout-s", type=float, default=900.0)
    add("--server-arg", action="append", default=[], help="extra `vllm serve` arg")
    add("--together", action="store_true",
        help="run the backends side by side on one GPU, each with an equal share "
             "of its memory and of --rate")  # fmt: skip
    harness.add_install_args(p)
    return p.parse_args(argv)


def check_lengths(a) -> None:
    """Every server has ``--max-model-len``; refuse what it cannot hold before any
    server starts."""
    L = a.max_model_len
    need = {
        "--spec-prompt-lens (longest) + --max-tokens": max(a.spec_prompt_lens)
        + a.max_tokens,
        "--max-tokens + 256": a.max_tokens + 256,
    }
    for what, n in need.items():
        if n > L:
            raise SystemExit(f"{what} = {n} exceeds --max-model-len {L}: raise "
                             f"--max-model-len or shorten the prompts")  # fmt: skip
    if a.pressure_kv_tokens < L:
        raise SystemExit(
            f"--pressure-kv-tokens {a.pressure_kv_tokens} is below --max-model-len "
            f"{L}: vLLM refuses a KV cache that cannot hold one full request"
        )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    names = harness.pick("scenario", a.scenario, [*SCENARIOS, "all"])
    names = [n for n in SCENARIOS if n in names or "all" in names]  # reuse order
    backends = harness.parse_backends(a.backend)
    backends.sort(key=lambda b: b.name != harness.BASELINE)  # reference first
    if a.model not in model_names() and not a.model_dir:
        raise SystemExit(
            f"unknown model {a.model!r}; valid: {', '.join(model_names())}"
        )
    check_lengths(a)
    if a.together and len(backends) < 2:
        raise SystemExit("--together runs several backends side by side: give two or "
                         "more in --backend")  # fmt: skip
    installs = harness.parse_installs(a.python, a.site)
    for b in backends:
        harness.require_vllm(b.install, installs[b.install])
    a.out_dir = a.out_dir.resolve()
    model_dir = a.model_dir or make_model_dir(a.model, a.out_dir / "models" / a.model)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # `timeout` and job schedulers stop with SIGTERM: leave through the finally
    # blocks, which stop the server (its GPU memory would block every later start).
    signal.signal(signal.SIGTERM, _on_sigterm)
    together = tuple(b.name for b in backends) if a.together else ()
    switch_lock = threading.RLock()
    pools = {
        b.name: Servers(a, b, installs[b.install], model_dir.resolve(),
                        a.out_dir / "work" / b.name, together, switch_lock)
        for b in backends
    }  # fmt: skip
    envs = {b.name: harness.environment(installs[b.install]) for b in backends}
    # a backend may wait for every other server's start before its own
    lockstep = Lockstep(len(together) or 1,
                        (a.startup_timeout_s + 60) * len(backends))  # fmt: skip
    ok = True
    try:
        if a.together:
            for name in names:
                ok &= run_side_by_side(name, backends, pools, envs, lockstep, a)
        else:
            for b in backends:
                for name in names:
                    ctx = Ctx(a, b, pools[b.name], lockstep)
                    ok &= record(name, b, *run_one(name, ctx, envs[b.name]), a)
                pools[b.name].stop()
    finally:
        _LEAVING.set()  # from here on a SIGTERM is not delivered again
        for pool in pools.values():
            pool.stop()
    for b in backends:
        print(f"[reliability] {b.name}: {pools[b.name].started} server starts",
              flush=True)  # fmt: skip
    return 0 if ok else 1


# Set once main's last cleanup (stopping the servers) has begun.
_LEAVING = threading.Event()
# Seconds after which a SIGTERM is delivered again while the suite has not left.
SIGTERM_REDELIVER_S = 2.0


def _on_sigterm(signum, frame):
    """Leave with exit status 143 through the finally blocks. The exception can
    land in code that swallows it (a ``__del__`` run by the garbage collector, such
    as an asyncio transport's: "Exception ignored in"), so until main's cleanup
    begins the signal is sent again every ``SIGTERM_REDELIVER_S``."""

    def again():
        if not _LEAVING.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(SIGTERM_REDELIVER_S, again)
    timer.daemon = True
    timer.start()
    sys.exit(128 + signal.SIGTERM)


def run_side_by_side(name, backends, pools, envs, lockstep, a) -> bool:
    """One scenario on every backend at once, each in its own thread (daemon
    threads: SIGTERM leaves through main's ``finally``, which stops the servers)."""
    done: dict = {}

    def one(b):
        try:
            done[b.name] = run_one(name, Ctx(a, b, pools[b.name], lockstep),
                                   envs[b.name])  # fmt: skip
        except BaseException as e:  # re-raised below, in the main thread
            done[b.name] = e

    threads = [threading.Thread(target=one, args=(b,), daemon=True) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(1.0)
    lockstep.reset()
    ok = True
    for b in backends:  # the reference first: the others compare with its outputs
        if isinstance(done[b.name], BaseException):
            raise done[b.name]
        ok &= record(name, b, *done[b.name], a)
    return ok


if __name__ == "__main__":
    sys.exit(main())
