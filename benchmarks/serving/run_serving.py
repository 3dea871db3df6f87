"""Serving benchmark (issue #4): ``vllm serve`` + ``vllm bench serve`` per backend.

For each backend (own ``PYTHONPATH``: stock or fork install) start one server on a
dummy-weight model directory (``benchmarks/models``), wait for ``/health`` (progress
every 15 s, hard timeout; on failure print the server log tail and go on to the next
backend, exiting non-zero at the end), then run the workloads of
``benchmarks/serving/workloads.py``, and before stopping the server send one greedy
completion and one chat request (issue #5: the OpenAI-compatible endpoints answer; a
failure is reported the same way). Every (workload, rate) gets two timed passes over
the same requests: ``first`` (what a fresh server sees; Triton JIT included) and
``steady`` (the first pass was its warm-up; ``bench serve`` itself sends one untimed
test request before each pass). Prefix caching is off so the repeat pays its prefill.
A steady pass resumed on a new server first gets an untimed pass of its own.
``--quick --rates`` adds the request rates at quick sizes, one steady pass each
(they follow the saturated passes over the same requests).

Resumable: each pass's ``vllm bench serve`` JSON lands in
``<work-dir>/<model>-<mode>/<backend>/<pass key>.json`` and is not rerun; a backend
with every pass done does not even start a server. ``--budget-s`` bounds one
invocation.

Prints the seed PRs' result block per pass and a side-by-side table with ratios to
FLASH_ATTN; writes (environment + records)
``<results-dir>/<date>-<commit>-<model>[-quick|-quick-rates][-gpu<i>].json``.
``benchmarks/report.py`` turns those files into docs/performance.md + plots.

    python3 benchmarks/serving/run_serving.py --quick \
        --backends FLASH_ATTN,TRITON_ATTN-fork --model-dir /tmp/models/llama-3.1-8b
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402
from benchmarks.models import MODEL_CONFIGS, model_entry  # noqa: E402
from benchmarks.serving import results as sres  # noqa: E402
from benchmarks.serving.workloads import (  # noqa: E402
    WORKLOADS,
    Run,
    bench_command,
    plan_runs,
    serve_command,
)

DEFAULT_BACKENDS = "FLASH_ATTN,TRITON_ATTN-stock,ROCM_ATTN-stock,TRITON_ATTN-fork"
QUICK_BACKENDS = "FLASH_ATTN,TRITON_ATTN-fork"
# Budget planning: no server start with less than STARTUP_ALLOWANCE_S left (cold
# torch.compile start ~140 s), no bench pass with less than PASS_ALLOWANCE_S left.
STARTUP_ALLOWANCE_S = 150.0
PASS_ALLOWANCE_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    proc: subprocess.Popen, port: int, log: Path, timeout_s: float, what: str
) -> bool:
    """Poll /health until 200; False (after printing the log tail) if the server dies
    or ``timeout_s`` passes."""
    url = f"http://127.0.0.1:{port}/health"
    t0 = time.monotonic()
    last_note = t0
    while True:
        elapsed = time.monotonic() - t0
        if proc.poll() is not None:
            _fail(
                what,
                f"server exited with code {proc.returncode} after {elapsed:.0f}s",
                log,
            )
            return False
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    print(f"[{what}] server healthy after {elapsed:.0f}s", flush=True)
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if elapsed > timeout_s:
            _fail(what, f"server not healthy after {timeout_s:.0f}s", log)
            return False
        if time.monotonic() - last_note >= 15:
            last_note = time.monotonic()
            last = harness.tail(log, 1).strip()[:160]
            print(
                f"[{what}] waiting for /health: {elapsed:.0f}s; log: {last}", flush=True
            )
        time.sleep(0.5 if elapsed < 10 else 2.0)


@contextlib.contextmanager
def running_server(
    cmd: list[str], env, port: int, log: Path, timeout_s: float, what: str
):
    """Start ``vllm serve`` (own process group, output to ``log``), wait for /health;
    yields the process, or None if it did not come up (the log tail is printed). The
    server's process group is killed on exit."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd="/tmp",
            start_new_session=True,
        )
        try:
            yield proc if wait_healthy(proc, port, log, timeout_s, what) else None
        finally:
            harness.kill_group(proc)


def _fail(what: str, why: str, log: Path) -> None:
    bar = "!" * 78
    print(
        f"\n{bar}\n[{what}] FAILED: {why}\n--- server log tail ({log}) ---\n"
        f"{harness.tail(log, 80)}\n{bar}\n",
        flush=True,
    )


def openai_check(port: int, served: str) -> dict:
    """One greedy request to each OpenAI-compatible endpoint issue #5 names
    (``/v1/completions`` and ``/v1/chat/completions``): ok and the text, or the
    error. Run once per backend, after its passes (the first pass stays the
    server's first traffic)."""
    requests = {
        "completions": (
            "/v1/completions",
            {"prompt": "The capital of France is", "max_tokens": 8},
            lambda body: body["choices"][0]["text"],
        ),
        "chat": (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8},
            lambda body: body["choices"][0]["message"]["content"],
        ),
    }
    out = {}
    for name, (path, payload, text_of) in requests.items():
        data = json.dumps({"model": served, "temperature": 0, **payload}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                text = text_of(json.loads(resp.read()))
            out[name] = {"ok": isinstance(text, str), "text": text}
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def bench_pass(
    run: Run,
    name: str,
    env,
    args,
    work: Path,
    served: str,
    port: int,
    budget: harness.Budget,
    what: str,
) -> tuple[list[str], int]:
    """One ``vllm bench serve`` pass; its JSON goes to ``<work>/<name>.bench.json``."""
    bcmd = bench_command(
        sys.executable,
        run,
        str(args.model_dir.resolve()),
        served,
        port,
        str(work),
        f"{name}.bench.json",
    )
    rc = harness.run_logged(
        bcmd,
        env=env,
        log=work / f"{name}.log",
        timeout_s=budget.timeout(args.pass_timeout_s),
        what=f"{what} {name}",
        cwd=Path("/tmp"),
    )
    return bcmd, rc


def run_backend(
    b: harness.Backend,
    runs: list[Run],
    args,
    sites: dict[str, str],
    work: Path,
    budget: harness.Budget,
) -> bool:
    """All pending passes of one backend on one server. True if nothing failed."""
    todo = [r for r in runs if not (work / f"{r.key}.json").is_file()]
    if not todo:
        print(f"[serving {b.name}] all {len(runs)} passes done, skipping")
        return True
    if not budget.allows(STARTUP_ALLOWANCE_S):
        print(f"[serving {b.name}] budget spent; not started (rerun to resume)")
        return False
    problem = harness.site_problem(b, sites)
    if problem:
        print(f"[serving {b.name}] FAILED: {problem}", flush=True)
        return False
    env = harness.backend_env(b, sites)
    port = free_port()
    served = args.model_dir.name
    tp = args.tp
    if tp is None:
        tp = model_entry(served)["serving_tp"] if served in MODEL_CONFIGS else 1
    cmd = serve_command(
        sys.executable,
        str(args.model_dir.resolve()),
        served,
        port,
        b.attention_backend,
        tp,
    )
    log = work / "server.log"
    work.mkdir(parents=True, exist_ok=True)
    what = f"serving {b.name}"
    print(f"[{what}] $ {shlex.join(cmd)}\n[{what}] server log: {log}", flush=True)
    ok = True
    starts_file = work / "server-starts.json"
    starts = harness.read_json(starts_file) if starts_file.is_file() else []
    t0 = time.monotonic()
    with running_server(
        cmd, env, port, log, budget.timeout(args.startup_timeout_s), what
    ) as proc:
        if proc is None:
            return False
        # Issue #5 asks for the startup time; a resumed run adds a start.
        starts.append(
            {
                "healthy_after_s": round(time.monotonic() - t0, 1),
                "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        harness.write_json(starts_file, starts)
        # Workloads whose requests this server has seen: every pass of a workload
        # sends the same requests (same seed and count), whatever its rate.
        served_here: set[str] = set()
        for run in todo:
            if not budget.allows(PASS_ALLOWANCE_S):
                print(
                    f"[{what}] budget spent; {run.key} and later passes "
                    "left for a rerun"
                )
                ok = False
                break
            group = run.key.rsplit("-", 1)[0]
            if run.pass_name == "steady" and run.workload.name not in served_here:
                # Resumed after the workload's earlier passes ran on an earlier
                # server: the steady pass needs an untimed pass over its requests.
                bench_pass(
                    run,
                    f"{group}-warmup",
                    env,
                    args,
                    work,
                    served,
                    port,
                    budget,
                    what,
                )
                (work / f"{group}-warmup.bench.json").unlink(missing_ok=True)
            bcmd, rc = bench_pass(
                run, run.key, env, args, work, served, port, budget, what
            )
            served_here.add(run.workload.name)
            tmp = work / f"{run.key}.bench.json"
            if rc != 0 or not tmp.is_file():
                _fail(what, f"bench pass {run.key} failed (exit {rc})", log)
                ok = False
                if proc.poll() is not None:
                    break
                continue
            meta = {"command": shlex.join(bcmd), "server_command": shlex.join(cmd)}
            body = harness.read_json(tmp)
            body["_meta"] = meta
            harness.write_json(work / f"{run.key}.json", body)
            tmp.unlink()
        # After the passes, so that the first pass is the server's first traffic.
        check_file = work / "openai-check.json"
        earlier = harness.read_json(check_file) if check_file.is_file() else {}
        if not earlier or not all(res["ok"] for res in earlier.values()):
            check = openai_check(port, served)
            harness.write_json(check_file, check)
            for name, res in check.items():
                state = "ok" if res["ok"] else f"FAILED ({res.get('error')})"
                print(f"[{what}] OpenAI {name} request: {state}", flush=True)
            if not all(res["ok"] for res in check.values()):
                _fail(what, "an OpenAI-compatible endpoint did not answer", log)
                ok = False
    # The server is down and its log complete (TP workers write to it too): vLLM's
    # JIT monitor reported there any kernel Triton compiled while serving.
    late = harness.late_jit_compiles_in(log)
    starts[-1]["late_jit_compiles"] = late
    harness.write_json(starts_file, starts)
    if late:
        print(
            f"[{what}] WARNING: Triton compiled while serving: {', '.join(late)} "
            f"(vLLM's JIT monitor, see {log})",
            flush=True,
        )
    return ok


def collect(
    work_root: Path, backends, runs: list[Run], model: str, quick: bool
) -> list[dict]:
    records = []
    for b in backends:
        for run in runs:
            f = work_root / b.name / f"{run.key}.json"
            if not f.is_file():
                continue
            bench = harness.read_json(f)
            records.append(
                sres.make_record(
                    bench,
                    backend=b.name,
                    install=b.install,
                    attention_backend=b.attention_backend,
                    workload=run.workload.name,
                    pass_name=run.pass_name,
                    rate=run.rate,
                    model=model,
                    quick=quick,
                    command=bench.get("_meta", {}).get("command", ""),
                )
            )
    return records


def _per_backend(work_root: Path, backends, name: str) -> dict:
    """{backend: the JSON file ``name`` of its work folder}, for those that have it."""
    files = {b.name: work_root / b.name / name for b in backends}
    return {b: harness.read_json(f) for b, f in files.items() if f.is_file()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=Path("/tmp/models/llama-3.1-8b"),
        help="made by `python3 -m benchmarks.models /tmp/models NAME`",
    )
    p.add_argument(
        "--backends",
        default=None,
        help=f"default {DEFAULT_BACKENDS} ({QUICK_BACKENDS} with --quick)",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument(
        "--quick",
        action="store_true",
        help="small prompt counts, no request-rate sweeps (~5 min, 2 backends)",
    )
    p.add_argument("--no-rates", action="store_true", help="skip request-rate passes")
    p.add_argument(
        "--rates",
        action="store_true",
        help="with --quick: add the request-rate passes, one per rate (mode "
        "'quick-rates'; ~5 min per backend on an H200 besides its start)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=None,
        help="tensor parallel size (default: the model's serving_tp)",
    )
    p.add_argument("--startup-timeout-s", type=float, default=420.0)
    p.add_argument("--pass-timeout-s", type=float, default=600.0)
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget of this invocation; unfinished passes resume on rerun",
    )
    p.add_argument(
        "--work-dir", type=Path, default=REPO / "benchmarks/results/serving/work"
    )
    p.add_argument(
        "--results-dir", type=Path, default=REPO / "benchmarks/results/serving"
    )
    p.add_argument("--site-stock")
    p.add_argument("--site-fork")
    args = p.parse_args(argv)

    if not (args.model_dir / "config.json").is_file():
        raise SystemExit(
            f"no model dir at {args.model_dir}; make it with "
            "`python3 -m benchmarks.models /tmp/models llama-3.1-8b`"
        )
    backends = harness.parse_backends(
        args.backends or (QUICK_BACKENDS if args.quick else DEFAULT_BACKENDS)
    )
    names = [s.strip() for s in args.workloads.split(",") if s.strip()]
    if args.rates and not args.quick:
        raise SystemExit("--rates is for --quick (full mode runs the rates already)")
    with_rates = args.rates or not (args.quick or args.no_rates)
    runs = plan_runs(names, quick=args.quick, with_rates=with_rates)
    sites = harness.resolve_sites(args.site_stock, args.site_fork)
    model = args.model_dir.name
    mode = ("quick-rates" if args.rates else "quick") if args.quick else "full"
    work_root = args.work_dir / f"{model}-{mode}"
    budget = harness.Budget(args.budget_s)
    failed = []
    for b in backends:
        if not run_backend(b, runs, args, sites, work_root / b.name, budget):
            failed.append(b.name)

    records = collect(work_root, backends, runs, model, args.quick)
    if not records:
        print("[serving] no results")
        return 1
    for r in records:
        print(
            f"\n{r['backend']} · {r['workload']} · rate {r['rate']} · {r['pass']} pass"
        )
        print(sres.result_block(r))
    print()
    print(sres.side_by_side(records))
    envs = {
        inst: harness.environment(sites[inst])
        for inst in sorted({b.install for b in backends})
    }
    commit = next(iter(envs.values()))["commit"]
    body = {
        "kind": "serving",
        "model": model,
        "mode": mode,
        "commit": commit,
        "environment": envs,
        "command": shlex.join([sys.executable] + sys.argv),
        "backends": [b.as_dict() for b in backends],
        "complete": not failed,
        "records": records,
        "server_starts": _per_backend(work_root, backends, "server-starts.json"),
        "openai_check": _per_backend(work_root, backends, "openai-check.json"),
    }
    date = time.strftime("%Y-%m-%d", time.gmtime())
    gpu = harness.gpu_tag()
    body["gpu_tag"] = gpu or None
    out = (
        args.results_dir
        / f"{date}-{commit}-{model}{'' if mode == 'full' else '-' + mode}{gpu}.json"
    )
    harness.write_json(out, body)
    print(f"[serving] wrote {out}")
    try:
        from benchmarks.report import plot_serving

        for png in plot_serving(body, args.results_dir / "plots"):
            print(f"[serving] plot {png}")
    except ImportError as e:
        print(
            f"[serving] no plots here ({e}); run benchmarks/report.py where "
            "matplotlib is installed"
        )
    if failed:
        print(
            f"[serving] INCOMPLETE/FAILED: {', '.join(failed)}; rerun the same "
            "command to resume"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
