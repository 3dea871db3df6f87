"""Pure functions over e2e records: ratios to FLASH_ATTN, the printed table, and the
agreement of greedy outputs across backends."""

from __future__ import annotations

import hashlib
import statistics

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


def across_sittings(bodies: list[dict], goals: dict[str, float] | None = None) -> str:
    """Issue #6's table over sittings: per (KV cache dtype, workload, pass, backend) of
    the full-size runs (scale 1), the median ratio to FLASH_ATTN of the same sitting,
    its spread (min-max), the number of sittings and the commits they ran, and the
    median tok/s. A sitting is one result file; ratios are never formed across
    files."""
    groups: dict[tuple, list[tuple[float, float, str]]] = {}
    for body in bodies:
        for r in add_ratios(body["records"]):
            if r.get("scale") != 1.0 or r["backend"] == BASELINE:
                continue
            if r.get("ratio_to_flash_attn") is None:
                continue
            key = (
                r.get("kv_cache_dtype", "auto"),
                r["workload"],
                r["pass"],
                r["backend"],
            )
            groups.setdefault(key, []).append(
                (r["ratio_to_flash_attn"], r["total_tok_per_s"], body.get("commit"))
            )
    lines = [
        (
            "| kv cache | workload | pass | backend | sittings | ratio to FLASH_ATTN "
            "(median) | spread (min-max) | tok/s (median) | goal | commits |"
        ),
        "|---|---|---|---|---:|---:|---|---:|---:|---|",
    ]
    order = {"first": 0, "steady": 1}
    for key in sorted(groups, key=lambda k: (k[0], k[1], order.get(k[2], 9), k[3])):
        vals = groups[key]
        ratios = [v[0] for v in vals]
        goal = (goals or {}).get(key[1]) if key[2] == "steady" else None
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {len(vals)} | "
            f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} | "
            f"{statistics.median(v[1] for v in vals):,.0f} | "
            f"{'-' if goal is None else f'{goal:.2f}x'} | "
            f"{', '.join(sorted({str(v[2] or '?') for v in vals}))} |"
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
