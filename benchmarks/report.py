"""Generate docs/performance.md (and the serving plots) from the results JSON files.

Inputs, all optional (sections without data say so):
- ``benchmarks/results/serving/*.json``  (run_serving.py; newest per model and mode)
- ``benchmarks/results/e2e/*.json``      (run_e2e.py; newest per scale and KV dtype)
- ``benchmarks/results/accuracy/summary*.json`` (accuracy/eval.py)
- ``benchmarks/results/kernels/*.json``  (kernels/bench_kernels.py; newest full run)
- ``benchmarks/results/agreement/*.json`` (agreement/agreement.py)
- ``benchmarks/results/soak/*.json``      (soak/run_soak.py)
- ``benchmarks/results/serving-smoke/*.json`` (single-backend `vllm serve` checks)

    python3 benchmarks/report.py            # writes docs/performance.md + PNGs
    python3 benchmarks/report.py --no-plots # text only (no matplotlib needed)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks.e2e import results as e2e_results  # noqa: E402
from benchmarks.serving import results as serving_results  # noqa: E402

PLOT_METRICS = [
    ("total_token_throughput", "total tok/s (higher is better)"),
    ("median_ttft_ms", "median TTFT ms (lower is better)"),
    ("median_tpot_ms", "median TPOT ms (lower is better)"),
]


def _load(paths) -> list[tuple[Path, dict]]:
    out = []
    for p in sorted(paths):
        try:
            out.append((p, json.loads(p.read_text())))
        except (OSError, ValueError) as e:
            print(f"report: skipping unreadable {p}: {e}", file=sys.stderr)
    return out


def _run_date(body: dict) -> str:
    """When the run wrote its file: its environment's date (one per install), or its
    own ``date_utc``; "" where the file has neither (e2e files before f18652a: the
    newest is then the last by name)."""
    env = body.get("environment", {})
    dates = [e.get("date_utc", "") for e in env.values() if isinstance(e, dict)]
    return max(dates + [env.get("date_utc", ""), body.get("date_utc") or ""])


def newest_sitting(
    items: list[tuple[Path, dict]], key
) -> list[list[tuple[Path, dict]]]:
    """Per ``key(body)``: all files of its newest sitting, i.e. of the newest run's day
    and commit (a two-GPU sitting writes one file per GPU, ``-gpu<i>``)."""
    groups: dict = {}
    for p, body in items:
        groups.setdefault(key(body), []).append((p, body))
    out = []
    for k in sorted(groups, key=str):
        files = groups[k]
        _, newest = max(files, key=lambda it: (_run_date(it[1]), it[0].name))
        day, commit = _run_date(newest)[:10], newest.get("commit")
        out.append(
            sorted(
                [
                    (p, b)
                    for p, b in files
                    if _run_date(b)[:10] == day and b.get("commit") == commit
                ],
                key=lambda it: it[0].name,
            )
        )
    return out


def _gpu_label(body: dict) -> str:
    return f"GPU {body['gpu_tag'][4:]}" if body.get("gpu_tag") else "-"


def plot_serving(body: dict, plot_dir: Path) -> list[Path]:
    """One PNG per workload: grouped bars (backends) per (rate, pass), three metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    records = body["records"]
    out = []
    for workload in sorted({r["workload"] for r in records}):
        rs = [r for r in records if r["workload"] == workload]
        groups = sorted(
            {(str(r["rate"]), r["pass"]) for r in rs},
            key=lambda g: (g[0] != "inf", g[0], g[1] != "first"),
        )
        backends = sorted(
            {r["backend"] for r in rs}, key=lambda n: (n != serving_results.BASELINE, n)
        )
        fig, axes = plt.subplots(
            1, len(PLOT_METRICS), figsize=(5 * len(PLOT_METRICS), 4)
        )
        width = 0.8 / max(1, len(backends))
        for ax, (metric, label) in zip(axes, PLOT_METRICS):
            for i, b in enumerate(backends):
                vals = []
                for rate, pass_name in groups:
                    hit = [
                        r
                        for r in rs
                        if (str(r["rate"]), r["pass"], r["backend"])
                        == (rate, pass_name, b)
                    ]
                    vals.append(hit[0].get(metric, 0.0) if hit else 0.0)
                xs = [g + i * width for g in range(len(groups))]
                ax.bar(xs, vals, width=width, label=b)
            ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
            ax.set_xticklabels([f"rate {r}\n{p}" for r, p in groups], fontsize=8)
            ax.set_title(label, fontsize=10)
        axes[0].legend(fontsize=8)
        mode = body.get("mode", "")
        fig.suptitle(
            f"{body.get('model')} · {workload} · {mode} · commit {body.get('commit')}",
            fontsize=10,
        )
        fig.tight_layout()
        gpu = body.get("gpu_tag") or ""
        png = plot_dir / f"{body.get('model')}-{mode}{gpu}-{workload}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        out.append(png)
    return out


def _env_line(env: dict) -> str:
    keys = ["gpu", "driver", "torch", "triton", "vllm", "commit"]
    return ", ".join(f"{k} {env.get(k, '?')}" for k in keys)


def serving_section(items, plot_dir: Path | None, doc_dir: Path) -> list[str]:
    lines = ["## Serving (`vllm bench serve`)", ""]
    if not items:
        return lines + [
            (
                "No serving results yet: run `bash benchmarks/gpu_session.sh "
                "serving-quick` on the GPU host."
            ),
            "",
        ]
    sittings = newest_sitting(items, lambda b: (b.get("model"), b.get("mode")))
    for files in sittings:
        if len(files) > 1:
            lines += _serving_lanes_table(files)
        lines += _serving_file(files, plot_dir, doc_dir)
    return lines


def _serving_lanes_table(files) -> list[str]:
    """One table over the GPUs of a sitting: each ratio is to FLASH_ATTN on the same
    GPU (a lane runs FLASH_ATTN itself), never across GPUs."""
    body = files[0][1]
    lines = [
        f"### {body.get('model')} · {body.get('mode')} mode · all GPUs of the sitting",
        "",
        "Total token throughput relative to FLASH_ATTN on the same GPU:",
        "",
        "| workload | rate | pass | backend | GPU | total tok/s | vs FLASH_ATTN |",
        "|---|---|---|---|---|---:|---:|",
    ]
    rows = []
    for _, b in files:
        for r in serving_results.ratio_to_baseline(b["records"]):
            rows.append((r["workload"], str(r["rate"]), r["pass"], r["backend"], b, r))
    for w, rate, pas, backend, b, r in sorted(rows, key=lambda x: x[:4]):
        lines.append(
            f"| {w} | {rate} | {pas} | {backend} | {_gpu_label(b)} | "
            f"{r['value']:,.0f} | {r['ratio']:.2f}x |"
        )
    return lines + [""]


def _serving_file(files, plot_dir: Path | None, doc_dir: Path) -> list[str]:
    lines = []
    for path, body in files:
        gpu = f" · {_gpu_label(body)}" if body.get("gpu_tag") else ""
        lines.append(
            f"### {body.get('model')} · {body.get('mode')} mode{gpu} "
            f"({path.name}{'' if body.get('complete') else ', INCOMPLETE'})"
        )
        lines.append("")
        for inst, env in sorted(body.get("environment", {}).items()):
            lines.append(f"- {inst} install: {_env_line(env)}")
        lines.append(f"- command: `{body.get('command', '?')}`")
        if body.get("command_full"):
            lines.append(f"- session step: `{body['command_full']}`")
        if body.get("provenance"):
            lines.append(f"- provenance: {body['provenance']}")
        if body.get("server_starts"):
            lines.append(
                "- server start to healthy, s (kernels Triton compiled while serving, "
                "from vLLM's JIT monitor in the server log): "
                + "; ".join(
                    f"{name} "
                    + ", ".join(
                        f"{s['healthy_after_s']:.0f} ({_late_jit_cell(s)})"
                        for s in starts
                    )
                    for name, starts in body["server_starts"].items()
                )
            )
        if body.get("openai_check"):
            lines.append(
                "- OpenAI-compatible requests after start (one greedy completion, "
                "one chat): "
                + "; ".join(
                    f"{name} "
                    + ", ".join(
                        f"{kind} {'ok' if res['ok'] else 'FAILED'}"
                        for kind, res in check.items()
                    )
                    for name, check in body["openai_check"].items()
                )
            )
        lines.append("")
        ratios = serving_results.ratio_to_baseline(body["records"])
        if ratios:
            lines += [
                "Total token throughput relative to FLASH_ATTN:",
                "",
                "| workload | rate | pass | backend | total tok/s | vs FLASH_ATTN |",
                "|---|---|---|---|---:|---:|",
            ]
            for r in ratios:
                lines.append(
                    f"| {r['workload']} | {r['rate']} | {r['pass']} | "
                    f"{r['backend']} | {r['value']:,.0f} | {r['ratio']:.2f}x |"
                )
            lines.append("")
        lines.append(
            serving_results.side_by_side(body["records"]).replace("### ", "#### ")
        )
        if plot_dir is not None:
            try:
                pngs = plot_serving(body, plot_dir)
            except ImportError as e:
                lines.append(f"(plots skipped: {e})")
                pngs = []
            for png in pngs:
                rel = os.path.relpath(png.resolve(), doc_dir.resolve())
                lines.append(f"![{png.stem}]({Path(rel).as_posix()})")
            lines.append("")
        lines.append(
            "<details><summary>Result blocks (as printed by vllm bench serve)</summary>"
        )
        lines.append("")
        for r in body["records"]:
            lines.append(
                f"{r['backend']} · {r['workload']} · rate {r['rate']} · "
                f"{r['pass']} pass"
            )
            lines.append("```")
            lines.append(serving_results.result_block(r))
            lines.append("```")
        lines += ["</details>", ""]
    return lines


# Issue #6's steady-state goals per workload (fork TRITON_ATTN / FLASH_ATTN).
ISSUE6_GOALS = {"sharegpt": 1.05, "long10k": 1.00, "decode": 1.05}


def e2e_section(items) -> list[str]:
    lines = ["## End-to-end offline throughput (`vllm.LLM`, issue #6)", ""]
    if not items:
        return lines + [
            (
                "No e2e results yet: run `bash benchmarks/gpu_session.sh "
                "e2e-quick` on the GPU host."
            ),
            "",
        ]
    full = [body for _, body in items if body.get("scale") == 1.0]
    if full:
        lines.append(
            "### Across sittings (full size; issue #6 asks for three: median, spread)"
        )
        lines.append("")
        lines.append(e2e_results.across_sittings(full, ISSUE6_GOALS))
        lines.append("")
    newest = newest_sitting(items, lambda b: (b.get("scale"), b.get("kv_cache_dtype")))
    for path, body in [item for files in newest for item in files]:
        lines.append(
            f"### scale {body.get('scale')} · KV cache "
            f"{body.get('kv_cache_dtype')} ({path.name}"
            f"{'' if body.get('complete') else ', INCOMPLETE'})"
        )
        lines.append("")
        lines.append(f"- {_env_line(body)}")
        lines.append(
            f"- model {body.get('model')}, max_model_len "
            f"{body.get('max_model_len')}, startup s: {body.get('startup_s')}"
        )
        lines.append(f"- command: `{body.get('command', '?')}`")
        if body.get("command_full"):
            lines.append(f"- session step: `{body['command_full']}`")
        if body.get("provenance"):
            lines.append(f"- provenance: {body['provenance']}")
        lines.append("")
        lines.append(e2e_results.format_table(body["records"]))
        lines.append("")
        lines += _profile_lines(body.get("profiles"))
        for backend, errors in body.get("profile_errors", {}).items():
            for workload, why in sorted(errors.items()):
                lines.append(f"- no profile of {workload} for {backend}: {why}")
        for a in body.get("output_agreement", []):
            lines.append(
                f"- greedy outputs {a['backend']} vs FLASH_ATTN, "
                f"{a['workload']}: {a['identical']:.1%} identical, first "
                f"tokens identical {a['identical_head']:.1%}, mean common "
                f"prefix {a['mean_common_prefix']:.1f}"
            )
        lines.append("")
    return lines


def _profile_lines(profiles: dict | None) -> list[str]:
    """Where each backend's GPU time went in the profiled requests (run_e2e.py
    --profile-requests), per workload: ms per kernel category and the share."""
    if not profiles:
        return []
    cats = sorted(
        {c for p in profiles.values() for w in p.values() for c in w["categories"]}
    )
    rows = []
    for backend, per_workload in profiles.items():
        for workload, prof in sorted(per_workload.items()):
            total = prof["total_ms"] or 1.0
            rows.append(
                [workload, backend, prof["requests"], f"{prof['total_ms']:,.0f}"]
                + [
                    f"{prof['categories'].get(c, 0.0):,.0f} "
                    f"({prof['categories'].get(c, 0.0) / total:.0%})"
                    for c in cats
                ]
            )
    rows.sort(key=lambda r: (r[0], r[1]))
    head = ["workload", "backend", "requests", "GPU ms"] + [f"{c} ms" for c in cats]
    return [
        (
            "GPU time of a few requests under vLLM's torch profiler, run after the "
            "timed passes (kernel categories: benchmarks/e2e/profile_table.py):"
        ),
        "",
        *_table(head, rows),
        "",
    ]


def accuracy_section(items) -> list[str]:
    from benchmarks.accuracy.eval import lm_eval_table, not_informative_note

    lines = ["## Accuracy (tiny trained Llama through vLLM)", ""]
    if not items:
        return lines + [
            (
                "No accuracy results yet: run `bash benchmarks/gpu_session.sh "
                "train` then `... accuracy` on the GPU host."
            ),
            "",
        ]
    # the newest run: files of one day sort by commit hash, so by the run's own date
    path, body = max(items, key=lambda it: (_run_date(it[1]), it[0].name))
    lines.append(f"({path.name}; {_env_line(body.get('environment', {}))})")
    lines.append("")
    for label, r in body.get("backends", {}).items():
        lines.append(lm_eval_table(f"**{label}** ({r.get('install')})", r["summary"]))
        lines.append("")
    for r in body.get("comparison", []):
        if r["task"] == "*":
            lines.append(
                f"- {r['backend']}: {r['answers_differing']}/{r['n']} answers "
                "differ from FLASH_ATTN"
            )
        else:
            lines.append(
                f"- {r['backend']} {r['task']}: {r['acc']:.4f} vs "
                f"{r['baseline_acc']:.4f} (stderr {r['baseline_stderr']:.4f}) "
                f"{'PASS' if r['pass'] else 'FAIL'}"
                + ("" if r.get("informative", True) else not_informative_note(r))
            )
    lines.append("")
    weak = sorted(
        {r["task"] for r in body.get("comparison", []) if r.get("informative") is False}
    )
    overall = "PASS" if body.get("pass") else "FAIL or incomplete"
    if weak:
        overall += f"; not informative (model did not learn it): {', '.join(weak)}"
    lines.append(f"Overall: {overall}")
    lines.append("")
    return lines


def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def kernels_section(items) -> list[str]:
    """One roofline table per full (non-quick) microbenchmark file, newest first
    (ratios to FA3 are only comparable within one file: one sitting)."""
    lines = ["## Kernels (`benchmarks/kernels/bench_kernels.py`)", ""]
    full = [(p, b) for p, b in items if "quick" not in p.name]
    if not full:
        return lines + ["No kernel results yet.", ""]
    full.sort(key=lambda item: (item[1].get("date", ""), item[0].name), reverse=True)
    for path, body in full:
        lines += _kernel_table(path, body)
    return lines


def _kernel_table(path: Path, body: dict) -> list[str]:
    copy = body.get("copy_bandwidth_gbs")
    peak = body.get("bf16_dense_peak_tflops")
    lines = [
        f"### `{path.name}`",
        "",
        (
            f"{_env_line(body)}. Decode in GB/s of K/V read (plus q and "
            f"out), prefill in TFLOP/s of causally visible work (formulas in "
            f"docs/kernels.md). Ceilings: device copy "
            + (f"{copy:.0f} GB/s measured in the same run" if copy else "not recorded")
            + f", bf16 dense {peak:.0f} TFLOP/s. `%roof` = ours / ceiling."
        ),
        "",
    ]
    if body.get("provenance"):
        lines += [f"Provenance: {body['provenance']}.", ""]
    lines += [
        f"Command: `{body.get('command')}`",
        "",
        (
            "| kernel | model | page | batch | q | ctx | kv | ours | FA3 "
            "| stock Triton | ours/FA3 | ours/stock | %roof | max err |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in body["records"]:
        roof = copy if r["kernel"] == "decode" else peak
        pct = f"{100 * r['ours'] / roof:.0f}%" if roof else "-"
        err = r["max_abs_err"]
        err = err.get("ours") if isinstance(err, dict) else err
        lines.append(
            f"| {r['kernel']} | {r['model']} | {r['block_size']} | {r['batch']} "
            f"| {r['query_len']} | {r['context']} | {r['kv_dtype']} "
            f"| {r['ours']:.0f} {r['unit']} | {_fmt(r.get('fa3'))} "
            f"| {_fmt(r.get('stock_triton'))} | {_fmt(r.get('ratio_vs_fa3'))} "
            f"| {_fmt(r.get('ratio_vs_stock_triton'))} "
            f"| {pct} | {err:.1e} |"
        )
    ratios = [r["ratio_vs_stock_triton"] for r in body["records"]]
    lines += [
        "",
        (f"Ours / stock Triton: min {min(ratios):.2f} over {len(ratios)} points."),
        "",
    ]
    return lines


def tuning_section(items) -> list[str]:
    """Per tuning record with timings of the previous table entry: the winner."""
    lines = ["## Prefill tuning runs (`tune_prefix_prefill --record`)", ""]
    recorded = [(p, b) for p, b in items if b.get("records") and "space" in b]
    if not recorded:
        return lines + ["No recorded tuning runs yet.", ""]
    for path, body in recorded:
        lines += [
            (
                f"`{path.name}`: {_env_line(body)}. Batch per bucket as in "
                "tune_prefix_prefill.BATCH_FOR_BUCKET; TFLOP/s of causally "
                "visible work."
            ),
            "",
            (
                "| key (head, group, page, q bucket) | best config | TFLOP/s "
                "| previous entry | TFLOP/s | heuristic TFLOP/s |"
            ),
            "|---|---|---|---|---|---|",
        ]
        for r in body["records"]:
            k = r["key"]
            prev = r.get("previous_timing") or {}
            lines.append(
                f"| {k['head_size']}, {k['group']}, {k['block_size']}, "
                f"{k['max_query_len']} | {_cfg(r['best'])} "
                f"| {r['best_timing']['tflops']:.0f} | {_cfg(r.get('previous'))} "
                f"| {_fmt(prev.get('tflops'), 0)} "
                f"| {_fmt((r.get('heuristic_timing') or {}).get('tflops'), 0)} |"
            )
        lines.append("")
    return lines


def _cfg(config: dict | None) -> str:
    if not config:
        return "-"
    text = (
        f"{config['block_m']}x{config['block_n']} w{config['num_warps']} "
        f"s{config['num_stages']}"
    )
    text += " tma" if config.get("use_tma") else ""
    text += f" r{config['maxnreg']}" if config.get("maxnreg") else ""
    text += " fp8_qk" if config.get("fp8_qk") else ""
    text += " lazy_rescale" if config.get("lazy_rescale") else ""
    return text + (" fast_exp" if config.get("fast_exp") else "")


def notes_section(path: Path) -> list[str]:
    """The hand-written analysis (what moved the numbers), kept next to the data."""
    if not path.is_file():
        return []
    return [path.read_text().rstrip(), ""]


def _table(head: list[str], rows: list[list]) -> list[str]:
    """A markdown table of ``head`` and ``rows`` (cells formatted by the caller)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _backend_cell(b: dict) -> str:
    """The backend, and its speculative decoding with vLLM's draft counters if any."""
    spec = b.get("backend_speculative")
    if not spec:
        return b["backend"]
    method = spec.get("config", {}).get("method", "?")
    return "{} + {} spec. decoding ({}/{} draft tokens accepted)".format(
        b["backend"],
        method,
        spec.get("num_accepted_tokens"),
        spec.get("num_draft_tokens"),
    )


def _late_jit_cell(side: dict) -> str:
    """vLLM's JIT-monitor reports of an agreement side or a server start ("-" for
    runs from before they were read)."""
    if "late_jit_compiles" not in side:
        return "-"
    return ", ".join(side["late_jit_compiles"]) or "none"


def agreement_section(items) -> list[str]:
    lines = ["## Greedy agreement with FLASH_ATTN", ""]
    if not items:
        return lines + ["No agreement results yet.", ""]
    head = ["file", "model", "kv cache", "reference", "backend", "tp", "prompts"]
    head += ["tokens equal", "fraction", "diverged (at near-ties)"]
    head += ["compiled while serving (all processes)"]
    rows = [
        [
            f"`{p.name}`",
            b.get("model", "llama-3.1-8b"),
            b.get("kv_cache_dtype", "auto"),
            b["reference"],
            _backend_cell(b),
            b["tp"],
            b["prompts"],
            f"{b['tokens_equal']}/{b['tokens_compared']}",
            f"{b['fraction_equal']:.4f}",
            "{} ({})".format(
                b.get("prompts_diverged", "?"), b.get("divergences_at_near_ties", "?")
            ),
            _late_jit_cell(b.get("sides", {}).get(b["backend"], {})),
        ]
        for p, b in items
    ]
    return lines + _table(head, rows) + [""]


def soak_section(items) -> list[str]:
    lines = ["## Serving soak (`benchmarks/soak/run_soak.py`, issue #5)", ""]
    if not items:
        return lines + ["None yet.", ""]
    head = ["file", "minutes", "clients", "completed", "cancelled", "errors"]
    head += ["same answer after", "memory growth", "verdict"]
    rows = []
    for p, b in items:
        req, mem = b.get("requests", {}), b.get("memory", {})
        rows.append(
            [
                f"`{p.name}`",
                f"{b.get('duration_s', 0) / 60:.0f}",
                b.get("concurrency"),
                req.get("ok"),
                req.get("cancelled"),
                req.get("errors"),
                b.get("fixed_request_same_answer"),
                f"{mem['growth_mib']} MiB" if mem.get("checked") else "not checked",
                "PASS" if b.get("pass") else "FAIL",
            ]
        )
    return lines + _table(head, rows) + [""]


def smoke_section(items) -> list[str]:
    lines = ["## Single-backend serving checks", ""]
    if not items:
        return lines + ["None yet.", ""]
    for p, b in items:
        r = b.get("results", {})
        lines.append(
            f"- `{p.name}` ({_env_line(b)}): {b.get('model')}; server up in "
            f"{b.get('server_up_s')} s; {b.get('pass')}; "
            f"{r.get('Successful requests', '?'):.0f} requests, total "
            f"{r.get('Total token throughput (tok/s)', 0):.0f} tok/s, median TTFT "
            f"{r.get('Median TTFT (ms)', 0):.0f} ms, median TPOT "
            f"{r.get('Median TPOT (ms)', 0):.2f} ms. "
            f"Command: `{b.get('bench_command')}`"
        )
    return lines + [""]


def build(results_dir: Path, doc: Path, plots: bool) -> str:
    serving = _load((results_dir / "serving").glob("*.json"))
    e2e = _load((results_dir / "e2e").glob("*.json"))
    acc = _load((results_dir / "accuracy").glob("summary*.json"))
    plot_dir = results_dir / "serving" / "plots" if plots else None
    lines = [
        "# Performance",
        "",
        (
            "Generated by `python3 benchmarks/report.py` from the JSON files under "
            "`benchmarks/results/`; do not edit by hand. Models are config-only "
            "(`benchmarks/models/`, real dimensions, `--load-format dummy`), so "
            "numbers measure speed, not quality; quality is the accuracy section's "
            "tiny trained model. Ratios are value / FLASH_ATTN value (throughput: "
            "higher is better, latency: lower is better). `first` = a fresh "
            "server/engine's first pass over the requests; `steady` = the same "
            "requests again."
        ),
        "",
        (
            "Reproduce on the GPU host, one step per call (the call sequence with "
            "times: `benchmarks/gpu/README.md`): `bash benchmarks/gpu_session.sh "
            "prefill-tune`, `fork`, `kernel-bench`, `e2e-full`, `train`, `accuracy`, "
            "`serving-quick`, `serving-70b` (see the script's header), or a whole "
            "sitting as one detached job (`benchmarks/gpu/sittings/`); unpack the "
            "`results*.tgz` into `benchmarks/results/` and run "
            "`python3 benchmarks/report.py`."
        ),
        "",
    ]
    lines += notes_section(results_dir / "NOTES.md")
    lines += serving_section(serving, plot_dir, doc.parent)
    lines += e2e_section(e2e)
    lines += accuracy_section(acc)
    lines += kernels_section(_load((results_dir / "kernels").glob("*.json")))
    lines += tuning_section(_load((results_dir / "tuning").glob("*.json")))
    lines += agreement_section(_load((results_dir / "agreement").glob("*.json")))
    lines += soak_section(_load((results_dir / "soak").glob("*.json")))
    lines += smoke_section(_load((results_dir / "serving-smoke").glob("*.json")))
    # Per-line rstrip: the seed PRs' result blocks pad their values with spaces.
    return (
        "\n".join(line.rstrip() for line in "\n".join(lines).split("\n")).rstrip()
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--results-dir", type=Path, default=REPO / "benchmarks/results")
    p.add_argument("--out", type=Path, default=REPO / "docs/performance.md")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    text = build(args.results_dir, args.out, plots=not args.no_plots)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"report: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
