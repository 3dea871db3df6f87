"""Pure functions over e2e records: ratios to FLASH_ATTN, the printed table, and the
agreement of greedy outputs across backends."""

from __future__ import annotations

import hashlib

BASELINE = "FLASH_ATTN"


def record_key(r: dict) -> tuple:
    """What must match for two records to be compared (all but the backend)."""
    return (r["workload"], r["pass"], r.get("kv_cache_dtype", "auto"), r.get("scale"))


def add_ratios(records: list[dict], baseline: str = BASELINE) -> list[dict]:
    """Copy of ``records`` with ``ratio_to_flash_attn`` set (None without a
    baseline)."""
    base = {
        record_key(r): r["total_tok_per_s"] for r in records if r["backend"] == baseline
    }
    out = []
    for r in records:
        b = base.get(record_key(r))
        ratio = r["total_tok_per_s"] / b if b else None
        out.append({**r, "ratio_to_flash_attn": ratio})
    return out


def format_table(records: list[dict]) -> str:
    """Markdown table, one row per record, grouped by workload then pass."""
    order = {"first": 0, "steady": 1}
    rows = sorted(
        records,
        key=lambda r: (
            r["workload"],
            order.get(r["pass"], 9),
            r.get("kv_cache_dtype", "auto"),
            r["backend"] != BASELINE,
            r["backend"],
        ),
    )
    lines = [
        (
            "| workload | pass | kv cache | backend | install | total tok/s | "
            "vs FLASH_ATTN | time (s) |"
        ),
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r.get("ratio_to_flash_attn")
        lines.append(
            f"| {r['workload']} | {r['pass']} | {r.get('kv_cache_dtype', 'auto')} | "
            f"{r['backend']} | {r['install']} | {r['total_tok_per_s']:,.0f} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | {r['elapsed_s']:.1f} |"
        )
    return "\n".join(lines)


def output_digest(token_ids: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def agreement(ours: dict, base: dict) -> dict:
    """Greedy-output agreement of one backend with the baseline on one workload.

    Each argument: {"digests": [...], "heads": [[first tokens], ...]} per request, in
    request order. Returns the fraction of identical full outputs and of identical
    heads (first tokens), and the mean common-prefix length within the heads.
    """
    n = len(base["digests"])
    if n == 0 or len(ours["digests"]) != n:
        raise ValueError("outputs of different request sets cannot be compared")
    same = sum(a == b for a, b in zip(ours["digests"], base["digests"]))
    same_head = 0
    prefix = 0
    for a, b in zip(ours["heads"], base["heads"]):
        same_head += a == b
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefix += k
    return {
        "n": n,
        "identical": same / n,
        "identical_head": same_head / n,
        "mean_common_prefix": prefix / n,
    }
