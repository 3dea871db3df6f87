"""Where a pass's GPU time goes: vLLM's torch-profiler kernel table, summarised.

vLLM's profiler (``profiler_config={"profiler": "torch", ...}``; ``LLM.start_profile``
/ ``stop_profile``) writes ``profiler_out_<rank>.txt`` into its directory: torch's
``key_averages().table`` sorted by self CUDA time. ``summarize`` reads that text into
the kernel rows, their sum per category (attention, KV-cache write, GEMM, other) and
the table's total, so that two backends' passes can be compared by where they differ.
"""

from __future__ import annotations

import re

# First match wins (case-insensitive substrings of the kernel name; torch truncates
# long names, so the patterns are prefixes of what the kernels are called).
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "attention",
        (
            "prefix_prefill",
            "paged_decode",
            "paged_attention",
            "unified_attention",
            "flash_fwd",
            "flashattn",
            "flash::",
            "fmha",
        ),
    ),
    ("kv_cache_write", ("reshape_and_cache", "paged_cache_write", "cache_write")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul")),
)
_UNITS_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
_TIME = re.compile(r"^([0-9.]+)(s|ms|us|ns)$")


def category(name: str) -> str:
    low = name.lower()
    for cat, patterns in CATEGORIES:
        if any(p in low for p in patterns):
            return cat
    return "other"


def _ms(text: str) -> float:
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a profiler time: {text!r}")
    return float(m[1]) * _UNITS_MS[m[2]]


def _columns(rule: str) -> list[tuple[int, int]]:
    """Character spans of the columns, from a table rule line (runs of dashes)."""
    return [m.span() for m in re.finditer(r"-+", rule)]


def summarize(table: str, top: int = 25) -> dict:
    """``{"total_ms", "categories": {cat: ms}, "kernels": [{name, category,
    self_cuda_ms, calls}]}`` of one profiler table (rows with self CUDA time only,
    the ``top`` longest listed). Raises ValueError on a table without CUDA times."""
    lines = table.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"[- ]*-[- ]*", line)]
    if len(rules) < 3:
        raise ValueError("no profiler table (expected three rule lines)")
    spans = _columns(lines[rules[0]])
    header = [lines[rules[0] + 1][a:b].strip() for a, b in spans]
    for needed in ("Name", "Self CUDA", "# of Calls"):
        if needed not in header:
            raise ValueError(f"profiler table has no {needed!r} column: {header}")
    col = {name: spans[header.index(name)] for name in ("Name", "Self CUDA")}
    calls_span = spans[header.index("# of Calls")]
    rows = []
    for line in lines[rules[1] + 1 : rules[2]]:
        name = line[slice(*col["Name"])].strip()
        ms = _ms(line[slice(*col["Self CUDA"])])
        if ms > 0:
            calls = int(line[slice(*calls_span)].strip())
            rows.append(
                {
                    "name": name,
                    "category": category(name),
                    "self_cuda_ms": round(ms, 4),
                    "calls": calls,
                }
            )
    footer = re.search(r"Self CUDA time total:\s*(\S+)", table)
    listed = sum(r["self_cuda_ms"] for r in rows)
    total = _ms(footer[1]) if footer else listed
    categories = {cat: 0.0 for cat, _ in CATEGORIES} | {"other": 0.0}
    for r in rows:
        categories[r["category"]] += r["self_cuda_ms"]
    # Rows past torch's row limit are only in the total: count them as "other".
    categories["other"] += max(0.0, total - listed)
    return {
        "total_ms": round(total, 3),
        "categories": {k: round(v, 3) for k, v in categories.items()},
        "kernels": sorted(rows, key=lambda r: -r["self_cuda_ms"])[:top],
    }
