"""Serving soak: one ``vllm serve`` under steady mixed load for a fixed time.

Starts the server of one backend (prefix caching on, the vLLM default), then keeps
``--concurrency`` client threads busy for ``--duration-s`` with streamed
``/v1/completions`` requests of mixed prompt lengths, a share of them opening with one
of a few long shared prefixes (prefix-cache hits), and a share cancelled by the client
after a few streamed chunks. A sampler records GPU memory (``nvidia-smi``) and the
server's ``/metrics`` every ``--sample-s``. Before and after the load one fixed greedy
request runs; its tokens must be the same.

Pass: no request error (cancellations are not errors), the server still healthy at the
end, the fixed request's answer unchanged, and GPU memory used at the end no more than
``--max-growth-mib`` above the level after the first ``--settle-s`` of load.

    python -m benchmarks.models models llama-3.1-8b
    python benchmarks/soak/run_soak.py --model-dir models/llama-3.1-8b \
        --backend TRITON_ATTN-fork --duration-s 1800 --out-dir OUT \
        [--python fork=... --site fork=...]

Writes ``<out-dir>/<date>-<commit>-<backend>-<minutes>min.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402
from benchmarks.models.configs import BENCH_TOKENIZER_VOCAB  # noqa: E402

SERVER_MAX_MODEL_LEN = 12288

# Request mix, as data: (share, min prompt tokens, max prompt tokens).
# With a shared prefix (<= 2048) and the output (<= 256) the longest request stays
# inside the server's max_model_len (SERVER_MAX_MODEL_LEN).
LENGTH_MIX = [(0.70, 16, 512), (0.25, 512, 4096), (0.05, 4096, 9000)]
MAX_OUTPUT_TOKENS = 256
SHARED_PREFIXES = 8  # distinct long prefixes, 1024-2048 tokens each
P_SHARED_PREFIX = 0.3
P_CANCEL = 0.1  # the client closes the stream after 1-8 chunks
FIXED_PROMPT_LEN = 1500
FIXED_OUTPUT_TOKENS = 32


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ok: int = 0
    cancelled: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    error_examples: list[str] = field(default_factory=list)

    def add(self, kind: str, prompt: int = 0, output: int = 0, note: str = "") -> None:
        with self.lock:
            setattr(self, kind, getattr(self, kind) + 1)
            self.prompt_tokens += prompt
            self.output_tokens += output
            if kind == "errors" and len(self.error_examples) < 10:
                self.error_examples.append(note[:300])


def make_request(
    rng: random.Random, prefixes: list[list[int]]
) -> tuple[list, int, bool]:
    """(prompt token ids, max_tokens, cancel?) drawn from the mix above."""
    r, acc = rng.random(), 0.0
    lo, hi = LENGTH_MIX[-1][1:]
    for share, a, b in LENGTH_MIX:
        acc += share
        if r < acc:
            lo, hi = a, b
            break
    n = rng.randint(lo, hi)
    ids = [rng.randrange(10, BENCH_TOKENIZER_VOCAB) for _ in range(n)]
    if rng.random() < P_SHARED_PREFIX:
        ids = rng.choice(prefixes) + ids
    return ids, rng.randint(1, MAX_OUTPUT_TOKENS), rng.random() < P_CANCEL


def stream_completion(
    port: int,
    model: str,
    prompt: list[int],
    max_tokens: int,
    cancel_after: int | None,
    timeout_s: float = 600.0,
) -> tuple[str, int, str]:
    """One streamed completion. Returns (kind, output chunks, note): kind is "ok",
    "cancelled" (we closed the stream after ``cancel_after`` chunks) or "errors"."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    chunks = 0
    try:
        conn.request(
            "POST", "/v1/completions", body, {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            return "errors", 0, f"HTTP {resp.status}: {resp.read()[:200]!r}"
        done = False
        for raw in resp:
            event = harness.sse_event(raw)
            if event is None:
                continue
            if event == harness.SSE_DONE:
                done = True
                break
            if "error" in event:
                return "errors", chunks, f"stream error: {json.dumps(event)[:200]}"
            chunks += 1
            if cancel_after is not None and chunks >= cancel_after:
                return "cancelled", chunks, ""
        if not done:
            return "errors", chunks, "stream ended without [DONE]"
        return "ok", chunks, ""
    except (OSError, http.client.HTTPException, ValueError) as e:
        return "errors", chunks, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def greedy_text(port: int, model: str, prompt: list[int]) -> dict:
    """The fixed request, not streamed: ``{"text": ...}`` or ``{"error": ...}``."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": FIXED_OUTPUT_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request(
            "POST", "/v1/completions", body, {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {raw[:200]!r}"}
        return {"text": json.loads(raw)["choices"][0]["text"]}
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def same_answer(before: list[dict], after: dict) -> bool:
    """The fixed request's answer after the load must equal one of its answers before:
    the first (computed from scratch) or the second (its prefix served from the cache,
    which sums in another order). The cache may or may not still hold it at the end."""
    return "text" in after and any(b == after for b in before if "text" in b)


def nvidia_smi_query(visible: str | None) -> list[str]:
    """The memory query, limited to the server's GPUs when CUDA_VISIBLE_DEVICES names
    them (another job may use the host's other GPUs). nvidia-smi counts GPUs in PCI
    bus order: set CUDA_DEVICE_ORDER=PCI_BUS_ID so that the indices agree."""
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    if visible and visible.strip():
        cmd += ["-i", visible.strip()]
    return cmd


def gpu_memory_mib() -> list[int]:
    try:
        out = subprocess.run(
            nvidia_smi_query(os.environ.get("CUDA_VISIBLE_DEVICES")),
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
        return [int(x) for x in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def process_session(pid: int) -> int | None:
    """The session id of process ``pid`` (``/proc/<pid>/stat``), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # after "pid (comm)": state, ppid, pgrp, session, ...
        return int(stat.rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def session_gpu_memory_mib(session: int) -> int | None:
    """GPU memory (MiB) that nvidia-smi counts for the processes of ``session``: a
    server started in its own session (``start_new_session``) with its engine
    processes, apart from another server on the same GPU. None when nvidia-smi
    lists none of them (no such process, or PIDs of another PID namespace)."""
    cmd = nvidia_smi_query(os.environ.get("CUDA_VISIBLE_DEVICES"))
    cmd[1] = "--query-compute-apps=pid,used_memory"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        rows = [line.split(",") for line in out.splitlines() if line.strip()]
        used = [(int(pid), int(mib)) for pid, mib in rows]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    mine = [mib for pid, mib in used if process_session(pid) == session]
    return sum(mine) if mine else None


METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)


def scrape_metrics(port: int) -> dict[str, float]:
    """Sums of the ``METRICS`` series in the server's Prometheus text."""
    out: dict[str, float] = {}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except (OSError, http.client.HTTPException):
        return out
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in METRICS:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# memory_verdict's "source": the server processes' own memory, or the whole GPU's.
SERVER_MEMORY, WHOLE_GPU_MEMORY = "the server's processes", "the whole GPU"


def memory_verdict(
    samples: list[dict], settle_s: float, max_growth_mib: int
) -> dict[str, object]:
    """Compare GPU memory after the settle time with the end of the soak: the
    server's own processes' (``server_gpu_mib``) where every sample has it, else the
    whole GPU's (``gpu_mib``), as ``source`` says.

    ``steps`` tells how it grew: each sample after the settle time whose memory rose
    above every sample before it, with the engine's running requests then and their
    largest count before it (a step at a new high of the load is the allocator
    reaching a larger batch, a step at a familiar load is not)."""
    own = bool(samples) and all(s.get("server_gpu_mib") is not None for s in samples)
    if own:
        mem = [(s, s["server_gpu_mib"]) for s in samples]
    else:
        mem = [(s, sum(s["gpu_mib"])) for s in samples if s.get("gpu_mib")]
    if not mem:
        return {"checked": False, "why": "no nvidia-smi samples"}
    settled = [m for s, m in mem if s["t"] >= settle_s] or [mem[-1][1]]
    baseline = settled[0]
    end = mem[-1][1]
    steps, high, busiest = [], None, None
    for s, m in mem:
        running = s.get("vllm:num_requests_running")
        if s["t"] >= settle_s and high is not None and m > high:
            steps.append(
                {
                    "t": s["t"],
                    "mib": m - high,
                    "running": running,
                    "running_max_before": busiest,
                }
            )
        high = m if high is None else max(high, m)
        if running is not None:
            busiest = running if busiest is None else max(busiest, running)
    return {
        "checked": True,
        "source": SERVER_MEMORY if own else WHOLE_GPU_MEMORY,
        "after_settle_mib": baseline,
        "end_mib": end,
        "max_mib": max(m for _, m in mem),
        "growth_mib": end - baseline,
        "max_growth_mib": max_growth_mib,
        "steps": steps,
        "ok": end - baseline <= max_growth_mib,
    }


def run_load(args, port: int, model: str, tally: Tally, samples: list) -> None:
    rng0 = random.Random(args.seed)
    prefixes = [
        [
            rng0.randrange(10, BENCH_TOKENIZER_VOCAB)
            for _ in range(rng0.randint(1024, 2048))
        ]
        for _ in range(SHARED_PREFIXES)
    ]
    stop_at = time.monotonic() + args.duration_s
    t0 = time.monotonic()

    def client(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        while time.monotonic() < stop_at:
            prompt, max_tokens, cancel = make_request(rng, prefixes)
            cancel_after = rng.randint(1, 8) if cancel else None
            kind, chunks, note = stream_completion(
                port, model, prompt, max_tokens, cancel_after
            )
            tally.add(kind, len(prompt), chunks, note)

    def sampler() -> None:
        while time.monotonic() < stop_at:
            s = {"t": round(time.monotonic() - t0, 1), "gpu_mib": gpu_memory_mib()}
            s.update(scrape_metrics(port))
            with tally.lock:
                s.update(ok=tally.ok, cancelled=tally.cancelled, errors=tally.errors)
            samples.append(s)
            print(f"[soak] {s}", flush=True)
            time.sleep(args.sample_s)

    threads = [threading.Thread(target=sampler, daemon=True)]
    threads += [
        threading.Thread(target=client, args=(i,), daemon=True)
        for i in range(args.concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.duration_s + 900)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--backend", default="TRITON_ATTN-fork")
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--settle-s", type=float, default=120.0)
    p.add_argument("--max-growth-mib", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--out-dir", type=Path, required=True)
    harness.add_install_args(p)
    args = p.parse_args(argv)

    (backend,) = harness.parse_backends(args.backend)
    inst = harness.parse_installs(args.python, args.site)[backend.install]
    harness.require_vllm(backend.install, inst)
    args.out_dir = args.out_dir.resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    port = harness.free_port()
    model = args.model_dir.name
    cmd = [
        inst.python, "-m", "vllm.entrypoints.cli.main", "serve",
        str(args.model_dir.resolve()),
        "--served-model-name", model,
        "--load-format", "dummy",
        "--dtype", "bfloat16",
        "--max-model-len", str(SERVER_MAX_MODEL_LEN),
        "--attention-backend", backend.attention_backend,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--seed", "0",
    ]  # fmt: skip
    log = args.out_dir / f"soak-{backend.name}-server.log"
    print(f"[soak] $ {shlex.join(cmd)}\n[soak] server log: {log}", flush=True)
    tally, samples = Tally(), []
    fixed = [
        random.Random(args.seed + 7).randrange(10, BENCH_TOKENIZER_VOCAB)
        for _ in range(FIXED_PROMPT_LEN)
    ]
    started = time.monotonic()
    with harness.running_server(
        cmd, inst.env(), port, log, args.startup_timeout_s
    ) as proc:
        if proc is None:
            return 1
        server_up_s = time.monotonic() - started
        before = [greedy_text(port, model, fixed) for _ in range(2)]
        run_load(args, port, model, tally, samples)
        healthy_end = proc.poll() is None and healthy(port)
        after = greedy_text(port, model, fixed)

    memory = memory_verdict(samples, args.settle_s, args.max_growth_mib)
    unchanged = same_answer(before, after)
    verdict = (
        tally.errors == 0 and healthy_end and unchanged and bool(memory.get("ok", True))
    )
    env = harness.environment(inst)
    body = {
        "kind": "soak",
        "commit": env.get("commit"),
        "environment": env,
        "backend": backend.as_dict(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "server_command": shlex.join(cmd),
        "server_up_s": round(server_up_s, 1),
        "duration_s": args.duration_s,
        "concurrency": args.concurrency,
        "mix": {
            "lengths": LENGTH_MIX,
            "max_output_tokens": MAX_OUTPUT_TOKENS,
            "shared_prefixes": SHARED_PREFIXES,
            "p_shared_prefix": P_SHARED_PREFIX,
            "p_cancel": P_CANCEL,
        },
        "requests": {
            "ok": tally.ok,
            "cancelled": tally.cancelled,
            "errors": tally.errors,
            "error_examples": tally.error_examples,
            "prompt_tokens": tally.prompt_tokens,
            "output_tokens": tally.output_tokens,
        },
        "server_healthy_at_end": healthy_end,
        "fixed_request_same_answer": unchanged,
        "fixed_request_before": before,
        "fixed_request_after": after,
        "memory": memory,
        "samples": samples,
        "pass": verdict,
    }
    date = time.strftime("%Y-%m-%d", time.gmtime())
    minutes = round(args.duration_s / 60)
    out = args.out_dir / f"{date}-{env.get('commit')}-{backend.name}-{minutes}min.json"
    harness.write_json(out, body)
    print(
        f"[soak] {tally.ok} ok, {tally.cancelled} cancelled, {tally.errors} errors; "
        f"healthy at end: {healthy_end}; fixed request same answer: {unchanged}; "
        f"memory: {memory}\n[soak] {'PASS' if verdict else 'FAIL'} -> {out}",
        flush=True,
    )
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
