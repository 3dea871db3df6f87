# SPDX-License-Identifier: Apache-2.0
"""Sweep prefix-prefill launch configs on this GPU and write its tuning table.

For each problem key (head size, dtypes, group, page size, max-query-length bucket)
it times every valid candidate of ``PREFILL_CONFIG_SPACE`` on a batch typical of
the bucket, after checking the candidate against ``ref_paged_attention`` on a small
batch, and stores the fastest in ``prefix_prefill_<gpu>.json`` (merged into the
existing file). ``--untuned`` writes the heuristic's choice instead (no GPU timing).

    python -m vllm.attention.ops.tuning.tune_prefix_prefill \\
        --head-sizes 128 --groups 4 8 --block-sizes 64 --budget-minutes 8

Candidates that share (head size, group, page size, dtypes) share compiled kernels
across query-length buckets, so sweep all buckets of a shape in one run.
"""

import argparse
import datetime
import itertools
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict

import torch
import triton

from vllm.attention.ops.prefix_prefill import prefix_prefill_attention
from vllm.attention.ops.reference import ref_paged_attention
from vllm.attention.ops.tuning.prefill_configs import (
    PREFILL_CONFIG_SPACE,
    PREFILL_TABLE,
    QUERY_LEN_BUCKETS,
    PrefillConfig,
    heuristic_prefill_config,
    is_valid_config,
    problem_key,
    table_entry,
    table_path,
)
from vllm.attention.ops.tuning.tables import table_text

NUM_KV_HEADS = 8
KEY_FIELDS = tuple(PREFILL_TABLE.key_fields)
# The swept fields, in PrefillConfig order (the space declares them).
SPACE_FIELDS = tuple(PREFILL_CONFIG_SPACE)
# (num_seqs, context_len) of the timed batch per query-length bucket: about 16k new
# tokens (fewer for the short buckets) over realistic contexts.
BATCH_FOR_BUCKET = {
    16: (64, 2000),
    64: (64, 2000),
    256: (32, 2048),
    1024: (12, 1024),
    4096: (4, 4096),
    16384: (1, 16384),
}


def _dtype(name: str) -> torch.dtype:
    return {"fp8": torch.float8_e4m3fn}.get(name) or getattr(torch, name)


def _make_batch(
    *, seqs, head_size, group, block_size, q_dtype, kv_dtype, gen, device="cuda"
):
    """Random paged batch (shuffled pages), sized for ``seqs``."""
    pages = [math.ceil(kv / block_size) for _, kv in seqs]
    num_blocks = sum(pages)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros((len(seqs), max(pages)), dtype=torch.int32)
    start = 0
    for s, n in enumerate(pages):
        table[s, :n] = perm[start : start + n]
        start += n
    shape = (num_blocks, 2, NUM_KV_HEADS, block_size, head_size)
    is_fp8 = kv_dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    scale = torch.tensor([0.05], device=device) if is_fp8 else None
    kv = torch.randn(shape, device=device)
    kv = (kv / scale if is_fp8 else kv).to(kv_dtype)
    q_lens = [q for q, _ in seqs]
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    query = torch.randn(
        (sum(q_lens), NUM_KV_HEADS * group, head_size), device=device, dtype=q_dtype
    )
    return {
        "query": query,
        "key_cache": kv[:, 0],
        "value_cache": kv[:, 1],
        "block_table": table.to(device),
        "query_start_loc": starts.to(device),
        "seq_lens": torch.tensor(
            [kv for _, kv in seqs], dtype=torch.int32, device=device
        ),
        "max_query_len": max(q_lens),
        "k_scale": scale,
        "v_scale": scale,
    }


def _run(batch, config, head_size):
    output = torch.empty_like(batch["query"])
    prefix_prefill_attention(
        output=output, softmax_scale=head_size**-0.5, config=config, **batch
    )
    return output


def _is_correct(config, small, head_size) -> bool:
    out = _run(small, config, head_size).float()
    ref = ref_paged_attention(
        query=small["query"],
        key_cache=small["key_cache"],
        value_cache=small["value_cache"],
        block_table=small["block_table"],
        query_start_loc=small["query_start_loc"],
        seq_lens=small["seq_lens"],
        softmax_scale=head_size**-0.5,
        k_scale=None if small["k_scale"] is None else small["k_scale"].item(),
        v_scale=None if small["v_scale"] is None else small["v_scale"].item(),
    )
    # fp8_qk rounds the query to e4m3 as well (tests/kernels: ~0.07 at outputs ~3).
    atol, rtol = (0.15, 0.05) if config.fp8_qk else (2e-2, 2e-2)
    return bool(torch.allclose(out, ref, atol=atol, rtol=rtol))


def _candidates(head_size, kv_dtype, group, block_size, space):
    group_pad = triton.next_power_of_2(group)
    for values in itertools.product(*(space[name] for name in SPACE_FIELDS)):
        config = PrefillConfig(**dict(zip(SPACE_FIELDS, values)))
        if config.use_tma and block_size % config.block_n:
            continue  # would run the pointer loads: same as use_tma=False
        if config.block_m >= group_pad and is_valid_config(
            config, head_size=head_size, kv_dtype=kv_dtype
        ):
            yield config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--head-sizes", type=int, nargs="+", default=[128])
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--q-dtypes", nargs="+", default=["bfloat16"])
    parser.add_argument("--kv-dtypes", nargs="+", default=["same"])
    parser.add_argument(
        "--query-lens",
        type=int,
        nargs="+",
        default=list(QUERY_LEN_BUCKETS),
        choices=QUERY_LEN_BUCKETS,
        help="max_query_len buckets to tune (the table's keys)",
    )
    parser.add_argument("--budget-minutes", type=float, default=8.0)
    for name in SPACE_FIELDS:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            nargs="+",
            default=None,
            help=f"restrict the sweep (default {PREFILL_CONFIG_SPACE[name]}"
            + (", as 0/1)" if isinstance(PREFILL_CONFIG_SPACE[name][0], bool) else ")"),
        )
    parser.add_argument(
        "--untuned", action="store_true", help="write heuristic values, no timing"
    )
    parser.add_argument("--gpu-name", default=None, help="default: this GPU's name")
    parser.add_argument(
        "--commit",
        default=os.environ.get("BENCH_COMMIT"),
        help="commit of the kernels, recorded in the provenance (default: "
        "$BENCH_COMMIT, else git HEAD of the checkout, else 'unknown')",
    )
    parser.add_argument("--out", default=None, help="default: the table for the GPU")
    parser.add_argument(
        "--record",
        default=None,
        help="also write every timing (JSON) here, for benchmarks/results/tuning/",
    )
    args = parser.parse_args()

    space = {
        name: PREFILL_CONFIG_SPACE[name]
        if getattr(args, name) is None
        else tuple(type(PREFILL_CONFIG_SPACE[name][0])(v) for v in getattr(args, name))
        for name in SPACE_FIELDS
    }
    gpu_name = args.gpu_name or torch.cuda.get_device_name()
    path = args.out or table_path(gpu_name)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"configs": []}
    entries = {
        problem_key(**{k: v for k, v in e.items() if k != "config"}): e
        for e in data["configs"]
    }
    deadline = time.monotonic() + 60 * args.budget_minutes
    gen = torch.Generator().manual_seed(0)
    tuned = 0
    records = []
    shapes = itertools.product(
        args.head_sizes, args.groups, args.block_sizes, args.q_dtypes, args.kv_dtypes
    )
    for head_size, group, block_size, q_name, kv_name in shapes:
        q_dtype = _dtype(q_name)
        shape = {
            "head_size": head_size,
            "group": group,
            "block_size": block_size,
            "q_dtype": q_dtype,
            "kv_dtype": q_dtype if kv_name == "same" else _dtype(kv_name),
        }
        for bucket in args.query_lens:
            if not args.untuned and time.monotonic() > deadline:
                print("budget spent; the remaining keys keep their old entries")
                break
            key = problem_key(max_query_len=bucket, **shape)
            if args.untuned:
                best = heuristic_prefill_config(
                    head_size=head_size, group=group, max_query_len=bucket
                )
            else:
                previous = entries.get(key, {}).get("config")
                best, record = _tune_one(shape, bucket, gen, space, previous)
                records.append({"key": dict(zip(KEY_FIELDS, key)), **record})
                tuned += 1
            entries[key] = table_entry(key, best)
            print(key, "->", best, flush=True)

    provenance = {
        "gpu": gpu_name,
        "driver": _driver_version(),
        "commit": args.commit or _git_commit(),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "vllm": _vllm_source(),
        "method": "untuned: heuristic_prefill_config values"
        if args.untuned
        else "triton.testing.do_bench median (ms), fastest correct candidate",
        "date": datetime.date.today().isoformat(),
        "command": " ".join(
            ["python3 -m vllm.attention.ops.tuning.tune_prefix_prefill", *sys.argv[1:]]
        ),
    }
    earlier = data.get("provenance")
    if earlier:
        # Entries of earlier runs stay in the file: keep how they were made.
        provenance["earlier"] = {k: v for k, v in earlier.items() if k != "earlier"}
    with open(path, "w") as f:
        f.write(table_text(provenance, [entries[k] for k in sorted(entries)]))
    print(f"wrote {path} ({len(entries)} entries, {tuned} tuned now)")
    if args.record:
        with open(args.record, "w") as f:
            json.dump({**provenance, "space": space, "records": records}, f, indent=1)
        print(f"wrote {args.record}")


def _vllm_source() -> str:
    """Where the timed kernels came from: the installed vLLM distribution's version
    (a fork install says ``+tritonattn``) or a checkout without one, and the path of
    the kernel module."""
    import importlib.metadata

    from vllm.attention.ops import prefix_prefill

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = "no vllm distribution"
    return f"{version}; kernels from {os.path.dirname(prefix_prefill.__file__)}"


def _run_text(cmd: list[str]) -> str | None:
    """stdout of ``cmd`` stripped, or None when it cannot run or fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _driver_version() -> str | None:
    """The NVIDIA driver of GPU 0 (nvidia-smi), None elsewhere."""
    text = _run_text(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"]
    )
    return text.splitlines()[0] if text else None


def _git_commit() -> str:
    """Short HEAD of the checkout this file is in, or 'unknown' (a copied tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return _run_text(["git", "-C", here, "rev-parse", "--short", "HEAD"]) or "unknown"


def _tune_one(shape, bucket, gen, space, previous=None):
    """Fastest correct candidate for one key, and a record of every timing.

    The heuristic's config and the ``previous`` table entry are always candidates,
    whatever the sweep, so a new entry is never slower (in this run) than the
    config it replaces for the key."""
    num_seqs, context = BATCH_FOR_BUCKET[bucket]
    seqs = [(bucket, context + bucket)] * num_seqs
    batch = _make_batch(seqs=seqs, gen=gen, **shape)
    small = _make_batch(seqs=[(min(bucket, 100), 300), (1, 77)], gen=gen, **shape)
    # Causal attention FLOPs: q.k and p.v, 2 * head_size each, per visible pair.
    visible_pairs = sum(sum(range(kv - q + 1, kv + 1)) for q, kv in seqs)
    num_q_heads = NUM_KV_HEADS * shape["group"]
    flops = 4 * shape["head_size"] * num_q_heads * visible_pairs
    best, best_ms, timings = None, math.inf, {}
    fallback = heuristic_prefill_config(
        head_size=shape["head_size"], group=shape["group"], max_query_len=bucket
    )
    previous = PrefillConfig(**previous) if previous else None
    candidates = list(
        _candidates(
            shape["head_size"],
            shape["kv_dtype"],
            shape["group"],
            shape["block_size"],
            space,
        )
    )
    candidates += [c for c in (fallback, previous) if c and c not in candidates]
    for config in candidates:
        try:
            if not _is_correct(config, small, shape["head_size"]):
                print("  wrong result, skipped:", config)
                continue
            ms = triton.testing.do_bench(
                lambda c=config: _run(batch, c, shape["head_size"]),
                warmup=10,
                rep=50,
                return_mode="median",
            )
        except triton.runtime.errors.OutOfResources as exc:
            print("  out of resources, skipped:", config, exc)
            continue
        except (triton.compiler.errors.CompilationError, RuntimeError) as exc:
            # a candidate the compiler rejects must not end the whole sweep
            print("  does not compile, skipped:", config, type(exc).__name__, exc)
            continue
        print(f"  {config}: {ms:.3f} ms, {flops / ms * 1e-9:.0f} TFLOP/s")
        timings[config] = ms
        if ms < best_ms:
            best, best_ms = config, ms
    if best is None:
        raise RuntimeError(f"no valid config for {shape} bucket {bucket}")
    print(
        f"  best {best}: {best_ms:.3f} ms ({flops / best_ms * 1e-9:.0f} TFLOP/s); "
        f"heuristic {fallback}: {timings.get(fallback, math.nan):.3f} ms"
    )

    def timing(config):
        ms = timings.get(config)
        return (
            None
            if ms is None
            else {"ms": round(ms, 4), "tflops": round(flops / ms * 1e-9, 1)}
        )

    return best, {
        "batch": {"num_seqs": num_seqs, "query_len": bucket, "context_len": context},
        "best": asdict(best),
        "best_timing": timing(best),
        "heuristic": asdict(fallback),
        "heuristic_timing": timing(fallback),
        "previous": previous and asdict(previous),
        "previous_timing": previous and timing(previous),
        "candidates": [{**asdict(c), **timing(c)} for c in timings],
    }


if __name__ == "__main__":
    main()
