"""Interleaved A/B of our kernels against FA3: arms of trees and launch options.

    python benchmarks/kernels/ab_arms.py --stock-site /tmp/site --rounds 2 \\
        --arm new=. --arm old=. --arm-args 'old=--prefill-config block_n=64' \\
        --arm branch=/tmp/other-checkout --baseline new --out ab.json \\
        -- --matrix full --kernels prefill --head-sizes 128 --groups 4 8 \\
        --block-sizes 64 --kv-dtypes bf16 --query-lens 512 2048 8192

An arm is a source tree (``NAME=DIR``: its ``bench_kernels.py`` and its
``vllm/attention/ops``) plus bench options of its own (``--arm-args NAME=...``,
e.g. ``--prefill-config ...`` or ``--decode-programs-per-sm 0``). Every arm runs
the bench options after ``--`` (``--callers ours fa3`` is added unless given), so
each arm's points are timed against FA3 in the same process. Runs are interleaved:
round 1 runs every arm in order, round 2 in reverse order, and so on, so that a
drift within a round (the GPU warming up over it, say) favours no arm over two
rounds. Each run is a process of its own (``ARM-rN.json`` in ``--work-dir``; a run
whose file exists is not run again, so rerunning the command resumes; a failed
run's output is removed, so it runs again). Runs with ``--matrix`` write their
records with ``--out``; others into a folder of their own (``--results-dir``).

The record (``--out``): per arm its tree, commit (``--arm-commit NAME=SHA`` where
the tree has no git metadata, else git's, else ``$BENCH_COMMIT``) and options;
``summary`` per arm (points, runs, the median over points of each point's median
ratio to FA3 over the runs, the worst and best point, and the largest ratio of our
max-abs error against the fp32 reference to FA3's; ``points_without_fa3``, those
where FA3 did not run); ``paired`` (each arm against ``--baseline``: per point, the
ratio of the two arms' median ratios to FA3, or, at a point where FA3 did not run (a
feature it lacks), of their median throughputs; its median, min and max, the number
of points where the arm is faster, and ``by_throughput``, how many points were
paired without FA3); ``points`` with every run's numbers (FA3's note where it did
not run); ``not_run``, the points where ours did not run, each with the bench's
notes (why); the GPU, driver and versions of the first run; ``notes``, the
bench's ``note:`` lines (each once; printed too, with the stack: a torch and Triton
other than ``--stock-site``'s say so there); ``complete``.
``--collect`` only writes the record from the runs already in ``--work-dir``;
``--dry-run`` prints the commands.
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
BENCH = Path("benchmarks") / "kernels" / "bench_kernels.py"


def run_notes(work_dir: Path, runs: list[tuple[str, int]]) -> list[str]:
    """The bench's ``note:`` lines in the logs of these runs, each once (e.g. that
    the kernels ran on a torch and Triton other than the stock install's)."""
    notes: list[str] = []
    for name, rnd in runs:
        log = work_dir / f"{name}-r{rnd}.log"
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            if line.startswith("note:") and line not in notes:
                notes.append(line)
    return notes


def parse_named(items: list[str], what: str) -> dict[str, str]:
    """``NAME=VALUE`` items as a dict, in order; a malformed or repeated name
    stops the script with the offending item."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"{what} {item!r}: expected NAME=VALUE")
        if name in out:
            raise SystemExit(f"{what} {item!r}: {name} given twice")
        out[name] = value
    return out


def run_file(work: Path, arm: str, rnd: int) -> Path:
    return work / f"{arm}-r{rnd}.json"


def bench_command(args, arm: str, tree: Path, arm_args: list[str], rnd: int) -> list:
    """The bench invocation of one arm and round."""
    common = list(args.bench_args)
    if "--callers" not in common:
        common += ["--callers", "ours", "fa3"]
    cmd = [sys.executable, str(tree / BENCH), *common, *arm_args]
    if args.stock_site:
        cmd += ["--stock-site", args.stock_site]
    out = run_file(args.work_dir, arm, rnd)
    if "--matrix" in common:
        cmd += ["--out", str(out)]
    else:
        cmd += ["--results-dir", str(out.with_suffix(""))]
    return cmd


def run_records(path: Path) -> dict | None:
    """The bench's JSON of one run (a matrix file, or the one file of a folder)."""
    if path.is_file():
        return json.loads(path.read_text())
    folder = path.with_suffix("")
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if len(files) == 1:
        return json.loads(files[0].read_text())
    return None


def point_key(record: dict) -> tuple:
    """The bench's own name of a record's point (``bench_kernels.record_key``),
    with the model, which tells the native points apart."""
    from benchmarks.kernels import bench_kernels as bk

    return (record.get("model"), *bk.record_key(bk._flat_key_fields(record)))


def point_fields(key: tuple) -> dict:
    from benchmarks.kernels import bench_kernels as bk

    return dict(zip(("model", *bk.KEY_FIELDS), key))


def summarize(arms: dict, runs: dict, baseline: str | None) -> dict:
    """``summary``, ``paired`` and ``points`` of the record from ``runs``
    (``{(arm, round): bench JSON}``). A point counts where ours ran; its ratio
    to FA3 where FA3 ran too."""
    per_arm: dict[str, dict[tuple, list]] = {arm: {} for arm in arms}
    not_run = []  # points where ours did not run, with why
    for (arm, rnd), data in sorted(runs.items()):
        for rec in data.get("records", []):
            notes = rec.get("notes") or {}
            if not rec.get("ours"):
                not_run.append({"arm": arm, "run": rnd, **point_fields(point_key(rec)),
                                "notes_ours": notes.get("ours"),
                                "notes_fa3": notes.get("fa3")})  # fmt: skip
                continue
            err = rec.get("max_abs_err") or {}
            rms = rec.get("rms_err") or {}
            run = {
                "run": rnd,
                "ratio_vs_fa3": rec.get("ratio_vs_fa3"),
                "ours": rec["ours"],
                "fa3": rec.get("fa3"),
                "unit": rec.get("unit"),
                "max_abs_err_ours": err.get("ours"),
                "max_abs_err_fa3": err.get("fa3"),
                "rms_err_ours": rms.get("ours"),
                "rms_err_fa3": rms.get("fa3"),
                "notes_ours": notes.get("ours"),
            }
            if rec.get("ratio_vs_fa3") is None:
                run["notes_fa3"] = notes.get("fa3")
            per_arm[arm].setdefault(point_key(rec), []).append(run)

    def median_of(field: str) -> dict:
        """Per arm and point, the median of ``field`` over the runs that have it."""
        return {
            arm: {
                k: statistics.median(vals)
                for k, v in pts.items()
                if (vals := [r[field] for r in v if r[field] is not None])
            }
            for arm, pts in per_arm.items()
        }

    medians, throughputs = median_of("ratio_vs_fa3"), median_of("ours")
    summary = {}
    for arm, pts in per_arm.items():
        meds = list(medians[arm].values())
        if not meds:
            summary[arm] = {"points": 0, "points_without_fa3": len(pts)}
            continue
        errs, rms = (
            [
                r[f"{stat}_ours"] / r[f"{stat}_fa3"]
                for v in pts.values() for r in v
                if r.get(f"{stat}_ours") is not None and r.get(f"{stat}_fa3")
            ]
            for stat in ("max_abs_err", "rms_err")
        )  # fmt: skip
        summary[arm] = {
            "points": len(meds),
            "points_without_fa3": len(pts) - len(meds),
            "runs": sorted({r["run"] for v in pts.values() for r in v}),
            "median_ratio_vs_fa3": round(statistics.median(meds), 4),
            "worst_ratio_vs_fa3": round(min(meds), 4),
            "best_ratio_vs_fa3": round(max(meds), 4),
            "worst_err_ratio_vs_fa3": round(max(errs), 4) if errs else None,
            "worst_rms_err_ratio_vs_fa3": round(max(rms), 4) if rms else None,
        }
    paired = {}
    if baseline is not None:
        for arm in arms:
            if arm == baseline:
                continue
            ratios, by_throughput = [], 0
            for k in per_arm[arm].keys() & per_arm[baseline].keys():
                if k in medians[arm] and k in medians[baseline]:
                    ratios.append(medians[arm][k] / medians[baseline][k])
                else:  # FA3 missing in one arm: ours against ours (same unit)
                    ratios.append(throughputs[arm][k] / throughputs[baseline][k])
                    by_throughput += 1
            if not ratios:
                continue
            paired[f"{arm}/{baseline}"] = {
                "points": len(ratios),
                "median": round(statistics.median(ratios), 4),
                "min": round(min(ratios), 4),
                "max": round(max(ratios), 4),
                "faster_points": sum(r > 1 for r in ratios),
                "by_throughput": by_throughput,
            }
    points = [
        {"arm": arm, **point_fields(key),
         "median_ratio_vs_fa3": (round(medians[arm][key], 4)
                                 if key in medians[arm] else None),
         "runs": v}
        for arm, pts in per_arm.items() for key, v in pts.items()
    ]  # fmt: skip
    return {"summary": summary, "paired": paired, "points": points,
            "not_run": not_run}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    bench_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, bench_args = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument(
        "--arm-args", action="append", default=[], metavar="NAME=ARGS",
        help="bench options of one arm only (shell words)",
    )  # fmt: skip
    ap.add_argument(
        "--arm-commit", action="append", default=[], metavar="NAME=SHA",
        help="the commit an arm's tree holds, where git cannot tell (a git "
        "archive, a copy without .git)",
    )  # fmt: skip
    ap.add_argument("--baseline", help="the arm the others are paired with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stock-site", help="folder holding stock vLLM (for FA3)")
    ap.add_argument("--work-dir", type=Path, default=Path("ab-work"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--what", default="", help="what the A/B compares (the record's)")
    ap.add_argument("--timeout-s", type=float, default=600, help="per run")
    ap.add_argument("--collect", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    args.bench_args = bench_args
    arms = parse_named(args.arm, "--arm") or {"head": str(REPO)}
    extra = {
        k: shlex.split(v) for k, v in parse_named(args.arm_args, "--arm-args").items()
    }
    given_commits = parse_named(args.arm_commit, "--arm-commit")
    for option, names in (("--arm-args", extra), ("--arm-commit", given_commits)):
        for name in names.keys() - arms.keys():
            raise SystemExit(f"{option} {name}: no such arm ({', '.join(arms)})")
    if args.baseline is not None and args.baseline not in arms:
        raise SystemExit(f"--baseline {args.baseline}: no such arm ({', '.join(arms)})")
    trees = {name: Path(tree).resolve() for name, tree in arms.items()}
    for name, tree in trees.items():
        if not (tree / BENCH).is_file():
            raise SystemExit(f"--arm {name}: {tree} has no {BENCH}")
    args.work_dir = args.work_dir.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)

    from benchmarks import harness

    # As given (--arm-commit); else git's; a copied tree without git metadata:
    # $BENCH_COMMIT names it.
    commits = {
        name: given_commits.get(name) or harness.tree_commit(tree)
        for name, tree in trees.items()
    }
    commits = {
        name: os.environ.get("BENCH_COMMIT", c) if c == "unknown" else c
        for name, c in commits.items()
    }
    runs: dict[tuple[str, int], dict] = {}
    for rnd in range(1, args.rounds + 1):
        # Even rounds reversed (the module doc says why).
        order = list(trees.items())
        for name, tree in order if rnd % 2 else order[::-1]:
            path = run_file(args.work_dir, name, rnd)
            cmd = bench_command(args, name, tree, extra.get(name, []), rnd)
            if args.dry_run:
                print(shlex.join(cmd))
                continue
            data = run_records(path)
            if data is None and not args.collect:
                t0 = time.time()
                env = {**os.environ, "BENCH_COMMIT": commits[name]}
                try:
                    proc = subprocess.run(
                        cmd, cwd=tree, env=env, capture_output=True, text=True,
                        timeout=args.timeout_s,
                    )  # fmt: skip
                    failed = proc.returncode != 0
                    log = proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as exc:
                    failed, log = True, f"timed out after {exc.timeout} s"
                (args.work_dir / f"{name}-r{rnd}.log").write_text(log)
                if failed:  # a partial output must not pass for a finished run
                    path.unlink(missing_ok=True)
                    shutil.rmtree(path.with_suffix(""), ignore_errors=True)
                print(f"round {rnd} {name}: {'FAILED' if failed else 'ok'} "
                      f"({time.time() - t0:.0f} s)", flush=True)  # fmt: skip
                data = None if failed else run_records(path)
            if data is not None:
                runs[(name, rnd)] = data
    if args.dry_run:
        return 0
    first = next(iter(runs.values()), {})  # runs hold round 1's arms first
    notes = run_notes(args.work_dir, list(runs))
    record = {
        "what": args.what,
        "gpu": first.get("gpu"),
        "driver": first.get("driver"),
        "torch": first.get("torch"),
        "triton": first.get("triton"),
        "versions": first.get("versions"),
        "notes": notes,
        "command": shlex.join(
            ["benchmarks/kernels/ab_arms.py", *argv, "--", *bench_args]
        ),
        "arms": {
            name: {
                "tree": str(trees[name]),
                "commit": commits[name],
                "extra_args": shlex.join(extra.get(name, [])),
            }
            for name in arms
        },  # fmt: skip
        "baseline": args.baseline,
        "rounds": args.rounds,
        "complete": len(runs) == args.rounds * len(arms),
        **summarize(arms, runs, args.baseline),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    stack = {k: record[k] for k in ("gpu", "torch", "triton", "versions")}
    print("stack:", json.dumps(stack))
    for note in notes:
        print(note)
    for name, row in record["summary"].items():
        print(name, json.dumps(row))
    for name, row in record["paired"].items():
        print(name, json.dumps(row))
    for row in record["not_run"]:
        print("not run:", json.dumps(row))
    return 0 if record["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
