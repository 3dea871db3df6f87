"""End-to-end offline throughput (issue #6): ``vllm.LLM`` on Llama-3.1-8B dimensions.

Per backend, in its own process (``PYTHONPATH`` = its install): dummy bf16 weights,
``max_model_len`` 12288, prefix caching off (passes repeat the same prompts), default
torch.compile + CUDA graphs, all requests of a workload submitted at once, greedy with
``ignore_eos``. Per workload:

1. a few requests (``--warmup-requests``, 16 output tokens each) untimed, so the pass
   below is what a fresh engine sees on its first real batch (Triton JIT included);
2. ``first`` pass: every request, timed;
3. ``steady`` pass: the same requests again, timed (pass 2 was its untimed warm-up).

total tok/s = (prompt tokens + generated tokens) / wall time of the pass. Greedy outputs
of the steady pass are compared with FLASH_ATTN's (fraction identical). With
``--profile-requests N`` the engine also has vLLM's torch profiler, and once every
timed pass has run, each workload's first N requests run once more under it: the
results get that run's GPU time per kernel category (``profiles``;
benchmarks/e2e/profile_table.py), so two backends can be compared by where their time
goes. Results:
``<results-dir>/<date>-<commit>.json``; per-backend partial files in ``--work-dir`` make
the run resumable: a rerun skips (backend, workload) pairs already measured, and
``--budget-s`` bounds one invocation (work that does not fit is left for the rerun).

    python3 benchmarks/e2e/run_e2e.py --model-dir /tmp/models/llama-3.1-8b --scale 0.25
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import harness  # noqa: E402
from benchmarks.e2e import profile_table  # noqa: E402
from benchmarks.e2e import results as res  # noqa: E402
from benchmarks.e2e.workloads import (  # noqa: E402
    WORKLOADS,
    make_requests,
    parse_workloads,
    token_counts,
)

DEFAULT_BACKENDS = "FLASH_ATTN,TRITON_ATTN-stock,ROCM_ATTN-stock,TRITON_ATTN-fork"
HEAD_TOKENS = 32  # output tokens kept per request for the agreement check
# Budget planning: a backend is not started with less than STARTUP_ALLOWANCE_S left
# (a cold torch.compile start of the 8B model takes ~140 s), and a worker starts no
# new workload once less than WORKLOAD_ALLOWANCE_S of its time is left.
STARTUP_ALLOWANCE_S = 150.0
WORKLOAD_ALLOWANCE_S = 60.0
WARMUP_TOKENS = 16  # output tokens of each warm-up request
PROFILE_MAX_ITERATIONS = 256  # engine steps of a --profile-requests run


def start_allowance(scale: float, num_workloads: int) -> float:
    """Seconds a backend needs to be worth starting: the engine start plus about a
    minute per workload at full size (two passes); starting it with less wastes the
    start-up (seen on 2026-11-30: a 140 s start cut off before its first result)."""
    return STARTUP_ALLOWANCE_S + WORKLOAD_ALLOWANCE_S * max(1.0, scale * num_workloads)


def stop_after(timeout_s: float) -> float:
    """Seconds after which a worker with ``timeout_s`` starts no further workload (the
    first one always runs: the engine start must not be wasted)."""
    return max(0.75 * timeout_s, timeout_s - WORKLOAD_ALLOWANCE_S)


def partial_name(backend: str, scale: float, kv: str) -> str:
    return f"{backend}-s{scale:g}-kv{kv}.json"


def profile_workload(llm, prompts, params, profile_dir: Path) -> dict:
    """Run ``prompts`` once under vLLM's torch profiler and summarise its kernel
    table; the traces (large) are deleted, the table is kept next to them."""
    table = profile_dir / "profiler_out_0.txt"
    # vLLM overwrites the table at each stop: one left from the previous workload
    # must not pass for this one's when this stop writes none.
    table.unlink(missing_ok=True)
    llm.start_profile()
    llm.generate(prompts, params, use_tqdm=False)
    llm.stop_profile()
    if not table.is_file():
        raise RuntimeError(f"vLLM's profiler wrote no {table}")
    text = table.read_text()
    for trace in profile_dir.iterdir():  # *.pt.trace.json.gz, tens of MB each
        if trace.is_file() and trace != table:
            trace.unlink()
    return {"requests": len(prompts), **profile_table.summarize(text)}


# ----------------------------------------------------------------------------- worker


def worker(args) -> int:
    import vllm
    from vllm import LLM, SamplingParams

    path = Path(args.partial)
    state = (
        harness.read_json(path)
        if path.is_file()
        else {
            "backend": args.label,
            "install": args.install,
            "attention_backend": args.attention_backend,
            "records": [],
            "outputs": {},
        }
    )
    # Versions as this process sees them (its PYTHONPATH), without importing torch.
    versions = harness.library_versions(None)
    state["versions"] = {
        "vllm": vllm.__version__,
        "torch": versions.get("torch"),
        "triton": versions.get("triton"),
    }
    profile_dir = path.parent / f"profile-{args.label}"
    extra = {}
    if args.profile_requests:
        profile_dir.mkdir(parents=True, exist_ok=True)
        extra["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(profile_dir.resolve()),
            "torch_profiler_with_stack": False,
            "ignore_frontend": True,  # the worker's GPU kernels are what we want
            # A decode-heavy workload runs ~1000 engine steps; a few hundred show
            # the same mix with traces and a table that stay small.
            "max_iterations": PROFILE_MAX_ITERATIONS,
        }
    t0 = time.monotonic()
    llm = LLM(
        model=str(args.model_dir),
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=args.max_model_len,
        attention_backend=args.attention_backend,
        kv_cache_dtype=args.kv_cache_dtype,
        enable_prefix_caching=False,
        seed=0,
        gpu_memory_utilization=args.gpu_memory_utilization,
        **extra,
    )
    state["startup_s"] = round(time.monotonic() - t0, 1)
    print(f"[e2e {args.label}] engine up in {state['startup_s']}s", flush=True)

    measured = []  # (workload, prompts, params) of the passes run here
    for i, w in enumerate(parse_workloads(args.workloads)):
        used = time.monotonic() - t0
        if i > 0 and args.stop_after_s is not None and used > args.stop_after_s:
            print(
                f"[e2e {args.label}] {used:.0f}s used, stopping before {w.name} "
                "(rerun to resume)",
                flush=True,
            )
            break
        reqs = make_requests(w, args.scale, args.seed)
        prompts = [{"prompt_token_ids": p} for p, _ in reqs]
        params = [
            SamplingParams(
                temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False
            )
            for _, n in reqs
        ]
        n_in, n_out_planned = token_counts(reqs)
        # A few requests, short outputs: enough to run every kernel once, so that the
        # first pass still shows what a fresh engine pays on its first real batch.
        k = min(args.warmup_requests, len(prompts))
        short = SamplingParams(
            temperature=0.0, max_tokens=WARMUP_TOKENS, ignore_eos=True, detokenize=False
        )
        llm.generate(prompts[:k], short, use_tqdm=False)
        first_digests: list[str] = []
        for pass_name in ("first", "steady"):
            t1 = time.monotonic()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.monotonic() - t1
            token_ids = [list(o.outputs[0].token_ids) for o in outs]
            n_out = sum(map(len, token_ids))
            if n_out != n_out_planned:
                print(
                    f"[e2e {args.label}] WARNING {w.name}: generated {n_out} tokens, "
                    f"expected {n_out_planned} (ignore_eos should make them equal)"
                )
            rec = {
                "workload": w.name,
                "backend": args.label,
                "install": args.install,
                "attention_backend": args.attention_backend,
                "kv_cache_dtype": args.kv_cache_dtype,
                "pass": pass_name,
                "scale": args.scale,
                "num_requests": len(reqs),
                "input_tokens": n_in,
                "output_tokens": n_out,
                "elapsed_s": round(elapsed, 3),
                "total_tok_per_s": (n_in + n_out) / elapsed,
                "output_tok_per_s": n_out / elapsed,
            }
            state["records"] = [
                r
                for r in state["records"]
                if (r["workload"], r["pass"]) != (w.name, pass_name)
            ]
            state["records"].append(rec)
            digests = [res.output_digest(t) for t in token_ids]
            if pass_name == "first":
                first_digests = digests
            else:
                # Greedy outputs of the same requests in the same engine: anything
                # below 1.0 means batch-composition-dependent numerics.
                same = sum(a == b for a, b in zip(digests, first_digests))
                rec["steady_equals_first"] = same / max(1, len(digests))
                state["outputs"][w.name] = {
                    "digests": digests,
                    "heads": [t[:HEAD_TOKENS] for t in token_ids],
                }
            harness.write_json(path, state)
            print(
                f"[e2e {args.label}] {w.name} {pass_name}: "
                f"{rec['total_tok_per_s']:,.0f} tok/s ({elapsed:.1f}s, "
                f"{len(reqs)} requests)",
                flush=True,
            )
        measured.append((w.name, prompts, params))
    # Profiles after every timed pass, so that no timed pass runs after the profiler.
    for name, prompts, params in measured if args.profile_requests else ():
        used = time.monotonic() - t0
        if args.stop_after_s is not None and used > args.stop_after_s:
            print(f"[e2e {args.label}] {used:.0f}s used, no profile of {name}")
            break
        n = min(args.profile_requests, len(prompts))
        try:
            prof = profile_workload(llm, prompts[:n], params[:n], profile_dir)
        except (RuntimeError, ValueError) as exc:
            # The timed passes stand without it: say why, keep going.
            print(f"[e2e {args.label}] {name}: no profile: {exc}", flush=True)
            state.setdefault("profile_errors", {})[name] = str(exc)
            harness.write_json(path, state)
            continue
        state.setdefault("profiles", {})[name] = prof
        harness.write_json(path, state)
        cats = ", ".join(f"{k} {v:,.0f}" for k, v in prof["categories"].items())
        print(
            f"[e2e {args.label}] {name} profile of {n} requests: GPU "
            f"{prof['total_ms']:,.0f} ms ({cats})",
            flush=True,
        )
    return 0


# ----------------------------------------------------------------------- orchestrator


def missing_workloads(partial: Path, wanted: list[str]) -> list[str]:
    if not partial.is_file():
        return list(wanted)
    state = harness.read_json(partial)
    done = {r["workload"] for r in state.get("records", []) if r["pass"] == "steady"}
    return [w for w in wanted if w not in done]


def aggregate(work_dir: Path, backends, scale: float, kv: str, wanted: list[str]):
    """Records of all backends (ratios added) and steady-output agreement vs FA."""
    states = {}
    for b in backends:
        f = work_dir / partial_name(b.name, scale, kv)
        if f.is_file():
            states[b.name] = harness.read_json(f)
    records = [
        r for s in states.values() for r in s["records"] if r["workload"] in wanted
    ]
    records = res.add_ratios(records)
    agree = []
    base = states.get(res.BASELINE)
    for name, s in states.items():
        if base is None or name == res.BASELINE:
            continue
        for w, outs in s.get("outputs", {}).items():
            if w in base.get("outputs", {}) and w in wanted:
                try:
                    a = res.agreement(outs, base["outputs"][w])
                except ValueError:
                    continue
                agree.append({"backend": name, "workload": w, **a})
    return states, records, agree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/models/llama-3.1-8b"))
    p.add_argument(
        "--backends",
        default=DEFAULT_BACKENDS,
        help=f"comma list of {', '.join(harness.BACKENDS)}",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies request counts (e.g. 0.25 for a short session)",
    )
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 | fp8_e4m3 ...")
    p.add_argument("--max-model-len", type=int, default=12288)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--warmup-requests", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--profile-requests",
        type=int,
        default=0,
        help="once every timed pass has run, profile each workload's first N "
        "requests (vLLM's torch profiler; GPU time per kernel category in the "
        "results)",
    )
    p.add_argument("--timeout-s", type=float, default=480.0, help="per backend process")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget of this invocation: backends get what is left, "
        "unfinished work resumes on the next run",
    )
    p.add_argument(
        "--work-dir", type=Path, default=REPO / "benchmarks/results/e2e/work"
    )
    p.add_argument("--results-dir", type=Path, default=REPO / "benchmarks/results/e2e")
    p.add_argument("--site-stock")
    p.add_argument("--site-fork")
    # worker-only
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--label", help=argparse.SUPPRESS)
    p.add_argument("--install", help=argparse.SUPPRESS)
    p.add_argument("--attention-backend", help=argparse.SUPPRESS)
    p.add_argument("--partial", help=argparse.SUPPRESS)
    p.add_argument("--stop-after-s", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    if not (args.model_dir / "config.json").is_file():
        raise SystemExit(
            f"no model dir at {args.model_dir}; make it with "
            f"`python3 -m benchmarks.models /tmp/models llama-3.1-8b`"
        )
    backends = harness.parse_backends(args.backends)
    wanted = [w.name for w in parse_workloads(args.workloads)]
    sites = harness.resolve_sites(args.site_stock, args.site_fork)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    budget = harness.Budget(args.budget_s)
    failed = []
    for b in backends:
        partial = args.work_dir / partial_name(b.name, args.scale, args.kv_cache_dtype)
        todo = missing_workloads(partial, wanted)
        if not todo:
            print(f"[e2e] {b.name}: all workloads done ({partial}), skipping")
            continue
        if not budget.allows(start_allowance(args.scale, len(todo))):
            print(f"[e2e] budget spent; {b.name} not started (rerun to resume)")
            failed.append(b.name)
            continue
        problem = harness.site_problem(b, sites)
        if problem:
            print(f"[e2e] FAILED: {problem}", flush=True)
            failed.append(b.name)
            continue
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--label",
            b.name,
            "--install",
            b.install,
            "--attention-backend",
            b.attention_backend,
            "--partial",
            str(partial),
            "--model-dir",
            str(args.model_dir.resolve()),
            "--workloads",
            ",".join(todo),
            "--scale",
            str(args.scale),
            "--kv-cache-dtype",
            args.kv_cache_dtype,
            "--max-model-len",
            str(args.max_model_len),
            "--gpu-memory-utilization",
            str(args.gpu_memory_utilization),
            "--warmup-requests",
            str(args.warmup_requests),
            "--seed",
            str(args.seed),
            "--profile-requests",
            str(args.profile_requests),
            "--stop-after-s",
            str(stop_after(budget.timeout(args.timeout_s))),
        ]
        log = args.work_dir / partial.name.replace(".json", ".log")
        rc = harness.run_logged(
            cmd,
            env=harness.backend_env(b, sites),
            log=log,
            timeout_s=budget.timeout(args.timeout_s),
            what=f"e2e {b.name}",
            cwd=Path("/tmp"),
        )
        if rc != 0 or missing_workloads(partial, wanted):
            failed.append(b.name)

    states, records, agree = aggregate(
        args.work_dir, backends, args.scale, args.kv_cache_dtype, wanted
    )
    if not records:
        print("[e2e] no results")
        return 1
    env = harness.environment(None)
    versions = next((s["versions"] for s in states.values() if "versions" in s), {})
    env.update({k: v for k, v in versions.items() if v})
    body = {
        "commit": env["commit"],
        "gpu": env.get("gpu"),
        "vllm": env.get("vllm"),
        "torch": env.get("torch"),
        "triton": env.get("triton"),
        "driver": env.get("driver"),
        "date_utc": env.get("date_utc"),
        "command": shlex.join([sys.executable] + sys.argv),
        "scale": args.scale,
        "kv_cache_dtype": args.kv_cache_dtype,
        "model": args.model_dir.name,
        "max_model_len": args.max_model_len,
        "startup_s": {k: s.get("startup_s") for k, s in states.items()},
        "settings": env.get("settings", {}),
        "records": records,
        "output_agreement": agree,
        "complete": not failed,
    }
    for field in ("profiles", "profile_errors"):
        found = {k: s[field] for k, s in states.items() if s.get(field)}
        if found:
            body[field] = found
    date = time.strftime("%Y-%m-%d", time.gmtime())
    kv = "" if args.kv_cache_dtype == "auto" else f"-kv{args.kv_cache_dtype}"
    scale = "" if args.scale == 1.0 else f"-s{args.scale:g}"
    out = (
        args.results_dir / f"{date}-{env['commit']}{kv}{scale}{harness.gpu_tag()}.json"
    )
    harness.write_json(out, body)
    print(res.format_table(records))
    for r in records:
        if "steady_equals_first" in r and r["steady_equals_first"] < 1.0:
            print(
                f"note: {r['backend']} {r['workload']}: only "
                f"{r['steady_equals_first']:.1%} of steady greedy outputs equal the "
                "first pass's (batch-dependent numerics)"
            )
    for a in agree:
        print(
            f"greedy outputs {a['backend']} vs FLASH_ATTN on {a['workload']}: "
            f"{a['identical']:.1%} identical, first {HEAD_TOKENS} tokens identical "
            f"{a['identical_head']:.1%}, mean common prefix "
            f"{a['mean_common_prefix']:.1f}"
        )
    print(f"[e2e] wrote {out}")
    if failed:
        print(
            f"[e2e] INCOMPLETE: {', '.join(failed)} did not finish; rerun the same "
            "command to resume"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
