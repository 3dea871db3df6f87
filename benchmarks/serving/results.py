"""Pure functions over ``vllm bench serve`` result JSON files: the seed PRs' result
block, records for our results file, and the side-by-side table with ratios."""

from __future__ import annotations

BASELINE = "FLASH_ATTN"

# (result JSON key, label in the block) per section, in the order the seed PRs print.
_SECTIONS = [
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
]

# Metrics of the side-by-side table: (key, label, higher is better).
TABLE_METRICS = [
    ("total_token_throughput", "Total token throughput (tok/s)", True),
    ("output_throughput", "Output token throughput (tok/s)", True),
    ("request_throughput", "Request throughput (req/s)", True),
    ("duration", "Benchmark duration (s)", False),
    ("mean_ttft_ms", "Mean TTFT (ms)", False),
    ("median_ttft_ms", "Median TTFT (ms)", False),
    ("p99_ttft_ms", "P99 TTFT (ms)", False),
    ("mean_tpot_ms", "Mean TPOT (ms)", False),
    ("median_tpot_ms", "Median TPOT (ms)", False),
    ("p99_tpot_ms", "P99 TPOT (ms)", False),
    ("mean_itl_ms", "Mean ITL (ms)", False),
    ("median_itl_ms", "Median ITL (ms)", False),
    ("p99_itl_ms", "P99 ITL (ms)", False),
    ("mean_e2el_ms", "Mean E2EL (ms)", False),
    ("median_e2el_ms", "Median E2EL (ms)", False),
    ("p99_e2el_ms", "P99 E2EL (ms)", False),
]

# Keys copied from a bench result JSON into our record (the rest is per-request data
# or bookkeeping).
KEPT_KEYS = [
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "num_prompts",
    "request_rate",
    "date",
] + [f"{s}_{m}_ms" for m, _, _ in _SECTIONS for s in ("mean", "median", "std", "p99")]


def _row(label: str, value, fmt: str = "{:<10.2f}") -> str:
    return f"{label:<40} " + fmt.format(value)


def result_block(r: dict) -> str:
    """The "Serving Benchmark Result" block as the seed PRs show it, from a result
    JSON (ours or ``vllm bench serve``'s)."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    lines.append(_row("Successful requests:", r["completed"], "{:<10}"))
    rate = r.get("request_rate")
    if rate not in (None, "inf", float("inf")):
        lines.append(_row("Request rate configured (RPS):", float(rate)))
    lines.append(_row("Benchmark duration (s):", r["duration"]))
    lines.append(_row("Total input tokens:", r["total_input_tokens"], "{:<10}"))
    lines.append(_row("Total generated tokens:", r["total_output_tokens"], "{:<10}"))
    lines.append(_row("Request throughput (req/s):", r["request_throughput"]))
    lines.append(_row("Output token throughput (tok/s):", r["output_throughput"]))
    lines.append(_row("Total Token throughput (tok/s):", r["total_token_throughput"]))
    for key, short, header in _SECTIONS:
        if f"mean_{key}_ms" not in r:
            continue
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append(_row(f"Mean {short} (ms):", r[f"mean_{key}_ms"]))
        lines.append(_row(f"Median {short} (ms):", r[f"median_{key}_ms"]))
        if f"p99_{key}_ms" in r:
            lines.append(_row(f"P99 {short} (ms):", r[f"p99_{key}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)


def make_record(
    bench: dict,
    *,
    backend: str,
    install: str,
    attention_backend: str,
    workload: str,
    pass_name: str,
    rate: float | None,
    model: str,
    quick: bool,
    command: str,
) -> dict:
    """Our record of one bench pass: identity + the kept metrics."""
    missing = [
        k for k in ("completed", "duration", "total_token_throughput") if k not in bench
    ]
    if missing:
        raise ValueError(
            f"bench result lacks {missing}; not a vllm bench serve result?"
        )
    rec = {
        "backend": backend,
        "install": install,
        "attention_backend": attention_backend,
        "workload": workload,
        "pass": pass_name,
        "rate": "inf" if rate is None else rate,
        "model": model,
        "quick": quick,
        "command": command,
    }
    rec.update({k: bench[k] for k in KEPT_KEYS if k in bench})
    return rec


def group_key(r: dict) -> tuple:
    return (r["model"], r["workload"], str(r["rate"]), r["pass"], r.get("quick", False))


def side_by_side(records: list[dict], baseline: str = BASELINE) -> str:
    """One markdown table per (model, workload, rate, pass): metrics as rows, backends
    as columns, then each backend's ratio to the baseline (value / baseline value;
    for throughputs > 1 is better, for latencies < 1 is better)."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault(group_key(r), {})[r["backend"]] = r
    out = []
    for key in sorted(
        groups, key=lambda k: (k[0], k[1], k[2] != "inf", k[2], k[3] != "first")
    ):
        model, workload, rate, pass_name, quick = key
        by_backend = groups[key]
        names = sorted(by_backend, key=lambda n: (n != baseline, n))
        base = by_backend.get(baseline)
        others = [n for n in names if n != baseline] if base else []
        head = ["metric"] + names + [f"{n} / {baseline}" for n in others]
        out.append(
            f"### {model} · {workload} · rate {rate} · {pass_name} pass"
            + (" (quick)" if quick else "")
        )
        out.append("| " + " | ".join(head) + " |")
        out.append("|---" + "|---:" * (len(head) - 1) + "|")
        for k, label, _ in TABLE_METRICS:
            if not any(k in by_backend[n] for n in names):
                continue
            cells = [label] + [_fmt(by_backend[n].get(k)) for n in names]
            for n in others:
                cells.append(_ratio(by_backend[n].get(k), base.get(k)))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _ratio(v, b) -> str:
    if v is None or not b:
        return "-"
    return f"{v / b:.2f}x"


def ratio_to_baseline(
    records: list[dict],
    metric: str = "total_token_throughput",
    baseline: str = BASELINE,
) -> list[dict]:
    """[{group..., backend, value, ratio}] for every non-baseline record with a
    baseline in its group."""
    base = {group_key(r): r.get(metric) for r in records if r["backend"] == baseline}
    out = []
    for r in records:
        b = base.get(group_key(r))
        if r["backend"] == baseline or not b or r.get(metric) is None:
            continue
        out.append(
            {
                "model": r["model"],
                "workload": r["workload"],
                "rate": r["rate"],
                "pass": r["pass"],
                "backend": r["backend"],
                "value": r[metric],
                "ratio": r[metric] / b,
            }
        )
    return out
