"""Backend x workload matrix through vLLM's own benchmark tools; writes one JSON record.

    python benchmarks/run_matrix.py e2e   --model llama-3.1-8b --out e2e.json
    python benchmarks/run_matrix.py serve --model llama-3.1-8b --out serve.json

``e2e`` starts one offline ``vllm.LLM`` per backend and run (``offline_worker.py``)
and times every workload's passes in it. It uses the ``LLM`` API rather than
``vllm bench throughput`` because the CLI has no knob to time more than one workload
and pass per engine start, and an 8B engine takes one to three minutes to start.
``serve`` runs ``vllm bench sweep serve`` (one ``vllm serve`` per backend and run,
``vllm bench serve`` for each workload and pass). Every vLLM command runs with the
install's Python and site (``--python``/``--site``), so stock vLLM and the fork may
live in two environments.

Measuring rules:
- Backends are interleaved (run 1: A, B; run 2: A, B; ...), ``--runs`` >= 3; the
  summary is the median over runs of each backend's ratio to FLASH_ATTN of the same
  run, with the min and max.
- Each timed pass gets fresh prompts of the same shape: the random dataset's
  ``--seed`` differs per run and pass (all backends of a run and pass get the same
  prompts). Prefix caching stays at vLLM's default; no pass can hit an earlier one.
- ``first`` is the workload's first pass in its engine or server (e2e records say
  ``engine_fresh`` for the engine's very first pass); ``warm`` is timed after the
  ``first`` pass of the same shape.

Raw outputs go to ``--work-dir``; rerunning the same command skips finished steps.
Model directories are config-only (``benchmarks/models``, ``--load-format dummy``).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402
from benchmarks.models import make_model_dir, model_names  # noqa: E402

CLI = ["-m", "vllm.entrypoints.cli.main"]
KINDS = ("e2e", "serve")
PASSES = ("first", "warm")


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    range_ratio: float
    num_prompts: int

    def longest(self) -> int:
        """Prompt plus output tokens of the longest request it draws."""
        grow = 1 + self.range_ratio
        return math.ceil(self.input_len * grow) + math.ceil(self.output_len * grow)


# The seed PR's tables, as vLLM's random dataset. sharegpt-like: ShareGPT's mean
# lengths (215 prompt / 197 output tokens) spread by --random-range-ratio 0.9.
WORKLOADS = {
    "sharegpt-like": Workload(215, 197, 0.9, 1000),
    "random-10k-100": Workload(10000, 100, 0.0, 100),
    "random-5k-100": Workload(5000, 100, 0.0, 200),
    # The longest prompts that models of 8192 and 4096 positions take with 100
    # output tokens (Gemma-2, Phi-3-mini-4k; with --max-model-len 8192 or 4096).
    "random-8k-100": Workload(8000, 100, 0.0, 125),
    "random-3900-100": Workload(3900, 100, 0.0, 250),
    "decode-1k-1k": Workload(1000, 1000, 0.0, 256),
}
DEFAULT_WORKLOADS = ("sharegpt-like", "random-10k-100", "random-5k-100", "decode-1k-1k")
# The workload whose throughput moves most between identical runs.
NOISY = "sharegpt-like"


def seed_of(base: int, run: int, pass_name: str) -> int:
    """Distinct per run and pass."""
    return base + 4 * run + 2 * PASSES.index(pass_name)


def engine_args(args, b: harness.Backend) -> list[str]:
    return [
        "--load-format", "dummy",
        "--dtype", "bfloat16",
        "--attention-backend", b.attention_backend,
        "--kv-cache-dtype", args.kv_cache_dtype,
        "--max-model-len", str(args.max_model_len),
        "--tensor-parallel-size", str(args.tp),
    ]  # fmt: skip


def prompts(args, w: Workload) -> int:
    if args.num_prompts:
        return args.num_prompts
    return max(1, round(w.num_prompts * args.scale))


WORKER = Path(__file__).resolve().parent / "offline_worker.py"


def run_e2e(args, installs, backends, workloads, model_dir: Path) -> list[dict]:
    """One ``vllm.LLM`` per backend and run (offline_worker.py), every workload's
    first and warm pass in it."""
    from benchmarks.models.configs import BENCH_TOKENIZER_VOCAB

    records = []
    for run in range(args.runs):
        for b in backends:  # interleaved: A, B, A, B
            spec = {
                "model": str(model_dir),
                "vocab": BENCH_TOKENIZER_VOCAB,
                "engine": {
                    "load_format": "dummy",
                    "dtype": "bfloat16",
                    "attention_config": {"backend": b.attention_backend},
                    "kv_cache_dtype": args.kv_cache_dtype,
                    "max_model_len": args.max_model_len,
                    "tensor_parallel_size": args.tp,
                    "seed": 0,
                },
                "workloads": [
                    asdict(WORKLOADS[w])
                    | {
                        "name": w,
                        "num_prompts": prompts(args, WORKLOADS[w]),
                        "passes": [
                            {"pass": p, "seed": seed_of(args.seed, run, p)}
                            for p in args.passes
                        ],
                    }
                    for w in workloads
                ],
            }
            name = f"e2e-{b.name}-s{seed_of(args.seed, run, args.passes[0])}"
            spec_file = raw_dir(args) / f"{name}.spec.json"
            raw = raw_dir(args) / f"{name}.json"
            if raw.is_file() and not same_matrix(json.loads(raw.read_text()), spec):
                if args.collect or args.dry_run:
                    continue  # outputs of another matrix: not these records
                raw.unlink()  # outputs of another matrix (workloads, scale): redo
            spec_file.parent.mkdir(parents=True, exist_ok=True)
            spec_file.write_text(json.dumps(spec, indent=1))
            inst = installs[b.install]
            # -P: the worker's folder (benchmarks/) is not put on sys.path
            cmd = [inst.python, "-P", str(WORKER), str(spec_file), str(raw)]
            step(args, cmd, inst, raw, f"{b.name} e2e run {run}")
            if not raw.is_file():
                continue
            out = json.loads(raw.read_text())
            for r in out["results"]:
                records.append(
                    record(args, b, r["workload"], r["pass"], run, r["seed"],
                           r["num_prompts"])
                    | {
                        k: r[k]
                        for k in ("total_tok_per_s", "output_tok_per_s",
                                  "elapsed_s", "engine_fresh")
                    }
                    | {"engine_startup_s": out["startup_s"]}
                )  # fmt: skip
    return records


def same_matrix(out: dict, spec: dict) -> bool:
    """Whether an e2e output was made for ``spec`` (the model directory's path
    aside: outputs collected on another machine live elsewhere)."""
    theirs = out.get("spec") or {}
    return {k: v for k, v in theirs.items() if k != "model"} == {
        k: v for k, v in spec.items() if k != "model"
    }


def run_serve(args, installs, backends, workloads, model_dir: Path) -> list[dict]:
    records = []
    for run in range(args.runs):
        for b in backends:  # one server per backend and run, interleaved
            inst = installs[b.install]
            port = str(args.port)
            serve = [
                inst.python, *CLI, "serve", str(model_dir), "--port", port,
                *engine_args(args, b),
            ]  # fmt: skip
            bench = [
                inst.python, *CLI, "bench", "serve", "--backend", "vllm",
                "--model", str(model_dir), "--port", port, "--ignore-eos",
                "--metric-percentiles", "50,99", "--disable-tqdm",
            ]  # fmt: skip
            params = {}
            for wname in workloads:
                w = WORKLOADS[wname]
                for pass_name in args.passes:
                    params[f"{wname}.{pass_name}"] = {
                        "random_input_len": w.input_len,
                        "random_output_len": w.output_len,
                        "random_range_ratio": w.range_ratio,
                        "num_prompts": prompts(args, w),
                        "seed": seed_of(args.seed, run, pass_name),
                    }
            out_dir = raw_dir(args) / "sweep"
            exp = out_dir / f"{b.name}-s{seed_of(args.seed, run, args.passes[0])}"
            params_file = raw_dir(args) / f"{exp.name}.params.json"
            params_file.parent.mkdir(parents=True, exist_ok=True)
            params_file.write_text(json.dumps(params, indent=1))
            cmd = [
                inst.python, *CLI, "bench", "sweep", "serve",
                "--serve-cmd", shlex.join(serve),
                "--bench-cmd", shlex.join(bench),
                "--bench-params", str(params_file),
                "--num-runs", "1",
                "--output-dir", str(out_dir),
                "--experiment-name", exp.name,
                "--server-ready-timeout", str(args.timeout_s),
                # Nothing to reset between benchmarks: every pass has fresh prompts.
                "--after-bench-cmd", "true",
                "--show-stdout",
            ]  # fmt: skip
            if exp.is_dir():
                cmd.append("--resume")  # vLLM skips the finished benchmarks
            done = params.keys() <= sweep_results(exp).keys()
            step(args, cmd, inst, exp if done else None, f"{b.name} run {run}")
            results = sweep_results(exp)
            for key, p in params.items():
                if key not in results:
                    continue
                out = results[key]
                wname, pass_name = key.split(".")
                records.append(
                    record(args, b, wname, pass_name, run, p["seed"], p["num_prompts"])
                    | {
                        "total_tok_per_s": out["total_token_throughput"],
                        "output_tok_per_s": out.get("output_throughput"),
                        "median_ttft_ms": out.get("median_ttft_ms"),
                        "median_tpot_ms": out.get("median_tpot_ms"),
                        "p99_ttft_ms": out.get("p99_ttft_ms"),
                    }
                )
    return records


def sweep_results(exp: Path) -> dict[str, dict]:
    """The sweep's per-benchmark results (``EXP/BENCH-.../run=0.json``) by the
    ``_benchmark_name`` that vLLM copies into each from the bench params."""
    out = {}
    for f in exp.glob("*/run=0.json"):
        body = json.loads(f.read_text())
        out[body.get("_benchmark_name")] = body
    return out


def raw_dir(args) -> Path:
    """Raw outputs of one setting; their names hold workload, prompts and seed."""
    tag = f"{args.model}-kv{args.kv_cache_dtype}-tp{args.tp}-len{args.max_model_len}"
    return args.work_dir / tag


def record(args, b, workload, pass_name, run, seed, num_prompts) -> dict:
    return {
        "model": args.model,
        "workload": workload,
        "backend": b.name,
        "install": b.install,
        "attention_backend": b.attention_backend,
        "kv_cache_dtype": args.kv_cache_dtype,
        "pass": pass_name,
        "run": run,
        "seed": seed,
        "num_prompts": num_prompts,
    }


def step(args, cmd, inst, done: Path | None, what: str) -> None:
    """Run one vLLM command unless its output exists (resume)."""
    if args.collect:
        return
    if done is not None and done.exists():
        print(f"[{what}] done already: {done}", flush=True)
        return
    if args.dry_run:
        print(shlex.join(cmd), flush=True)
        return
    log = raw_dir(args) / "logs" / (what.replace(" ", "-") + ".log")
    # cwd: not the repository, whose vllm/ directory would shadow the install's.
    rc = harness.run_logged(
        cmd,
        env=inst.env(),
        log=log,
        timeout_s=args.timeout_s,
        what=what,
        cwd=args.work_dir,
    )
    if rc != 0 and args.stop_on_error:
        raise SystemExit(f"[{what}] failed (exit {rc}); log: {log}")


def summarize(records: list[dict]) -> list[dict]:
    """Per (model, workload, kv dtype, pass, backend): median, min and max over runs
    of total tok/s divided by FLASH_ATTN's of the same run."""
    base = {
        (r["model"], r["workload"], r["kv_cache_dtype"], r["pass"], r["run"]): r
        for r in records
        if r["backend"] == harness.BASELINE
    }
    groups: dict[tuple, list[float]] = {}
    for r in records:
        key = (r["model"], r["workload"], r["kv_cache_dtype"], r["pass"])
        ref = base.get((*key, r["run"]))
        if ref is not None and r["backend"] != harness.BASELINE:
            ratio = r["total_tok_per_s"] / ref["total_tok_per_s"]
            groups.setdefault((*key, r["backend"]), []).append(ratio)
    names = ("model", "workload", "kv_cache_dtype", "pass", "backend")
    return [
        dict(zip(names, key))
        | {
            "median_ratio_to_flash_attn": round(statistics.median(v), 4),
            "min_ratio": round(min(v), 4),
            "max_ratio": round(max(v), 4),
            "runs": len(v),
        }
        for key, v in groups.items()
    ]


def plot(summary: list[dict], path: Path, title: str) -> None:
    """Bars of the median ratio per workload and backend, whiskers min-max."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", flush=True)
        return
    rows = [s for s in summary if s["pass"] == "warm"] or summary
    workloads = list(dict.fromkeys(s["workload"] for s in rows))
    backends = list(dict.fromkeys(s["backend"] for s in rows))
    fig, ax = plt.subplots(figsize=(1.8 * len(workloads) + 2, 3.6))
    width = 0.8 / max(1, len(backends))
    for i, b in enumerate(backends):
        xs, ys, lo, hi = [], [], [], []
        for j, w in enumerate(workloads):
            for s in rows:
                if (s["workload"], s["backend"]) == (w, b):
                    xs.append(j + i * width)
                    ys.append(s["median_ratio_to_flash_attn"])
                    lo.append(ys[-1] - s["min_ratio"])
                    hi.append(s["max_ratio"] - ys[-1])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=b)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(workloads))])
    ax.set_xticklabels(workloads)
    ax.set_ylabel("total tok/s / FLASH_ATTN")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("kind", choices=KINDS)
    p.add_argument("--model", required=True, help=f"one of: {', '.join(model_names())}")
    p.add_argument("--backends", default="FLASH_ATTN,TRITON_ATTN-fork")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--num-prompts", type=int, help="override every workload's count")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every workload's prompt count (a smaller or larger matrix)",
    )
    p.add_argument(
        "--passes",
        default=",".join(PASSES),
        help="timed passes: first (fresh engine), warm, or both (default)",
    )
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=12288)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout-s", type=int, default=3600, help="per vLLM command")
    p.add_argument("--work-dir", type=Path, default=Path("bench-work"))
    p.add_argument("--out", type=Path, required=True, help="JSON record to write")
    p.add_argument("--plot", type=Path, help="PNG of the summary (needs matplotlib)")
    p.add_argument("--dry-run", action="store_true", help="print the vLLM commands")
    p.add_argument(
        "--collect",
        action="store_true",
        help="run nothing: write the record from the outputs already in --work-dir "
        "(an interrupted run, or outputs copied from the GPU host)",
    )
    p.add_argument("--stop-on-error", action="store_true")
    harness.add_install_args(p)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    command = shlex.join([sys.executable, "benchmarks/run_matrix.py", *argv])

    if args.model not in model_names():
        raise SystemExit(
            f"unknown model {args.model!r}; valid: {', '.join(model_names())}"
        )
    backends = harness.parse_backends(args.backends)
    workloads = harness.pick("workload", args.workloads, WORKLOADS)
    picked = harness.pick("pass", args.passes, PASSES)
    args.passes = [p for p in PASSES if p in picked]
    if args.passes == ["warm"]:
        raise SystemExit(
            f"{args.kind} times the warm pass after the first in the same "
            f"{'server' if args.kind == 'serve' else 'engine'}: "
            "use --passes first,warm or --passes first"
        )
    if args.num_prompts and args.scale != 1.0:
        raise SystemExit("give --num-prompts or --scale, not both")
    if args.scale <= 0:
        raise SystemExit(f"--scale must be positive, got {args.scale}")
    if args.runs < 2 and not args.dry_run:
        raise SystemExit("--runs must be at least 2 (median and spread over runs)")
    if args.runs < 3 and NOISY in workloads and not args.dry_run:
        raise SystemExit(
            f"{NOISY} throughput moves 13-20% between identical runs: "
            "--runs must be at least 3 with it"
        )
    for name in workloads:
        if (longest := WORKLOADS[name].longest()) > args.max_model_len:
            raise SystemExit(
                f"workload {name}: requests of up to {longest} tokens (prompt and "
                f"output) do not fit --max-model-len {args.max_model_len}"
            )
    if harness.BASELINE not in [b.name for b in backends]:
        raise SystemExit(f"--backends must include {harness.BASELINE} (the reference)")
    installs = harness.parse_installs(args.python, args.site)
    used = list(dict.fromkeys(b.install for b in backends))

    args.work_dir = args.work_dir.resolve()
    provenance_file = raw_dir(args) / "provenance.json"
    if args.collect:
        try:
            provenance = json.loads(provenance_file.read_text())
        except (OSError, ValueError):
            provenance = {}  # outputs of a run that wrote none: provenance unknown
    elif not args.dry_run:
        env = harness.environment()
        provenance = {
            "commit": env["commit"],
            "gpu": env["gpu"],
            "driver": env["driver"],
            "versions": {i: harness.require_vllm(i, installs[i]) for i in used},
            "date_utc": env["date_utc"],
            "settings": env["settings"],
            "command": command,
        }
        # Kept with the raw outputs, so --collect can write the record later.
        harness.write_json(provenance_file, provenance)
    model_dir = make_model_dir(args.model, args.work_dir / "models" / args.model)
    run = {"e2e": run_e2e, "serve": run_serve}[args.kind]
    records = run(args, installs, backends, workloads, model_dir)
    if args.dry_run:
        return 0
    summary = summarize(records)
    expected = args.runs * len(workloads) * len(args.passes) * len(backends)
    body = {
        "kind": args.kind,
        **{
            k: provenance.get(k, "unknown")
            for k in ("commit", "gpu", "driver", "versions", "date_utc", "settings")
        },
        "command": provenance.get("command", "unknown"),
        "collected_by": command if args.collect else None,
        "complete": len(records) == expected,
        "prompts": "fresh per pass (random dataset seed per run and pass); "
        "prefix caching at vLLM's default",
        "workloads": {
            w: asdict(WORKLOADS[w]) | {"num_prompts": prompts(args, WORKLOADS[w])}
            for w in workloads
        },
        "passes": args.passes,
        "records": records,
        "summary": summary,
    }
    harness.write_json(args.out, body)
    print(f"wrote {args.out}")
    for s in summary:
        print(
            f"{s['workload']:>15} {s['pass']:>5} {s['backend']:>18} "
            f"{s['median_ratio_to_flash_attn']:.3f} "
            f"[{s['min_ratio']:.3f}, {s['max_ratio']:.3f}] x{s['runs']}"
        )
    if args.plot:
        plot(summary, args.plot, f"{args.model} {args.kind} ({args.kv_cache_dtype})")
    return 0 if body["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
