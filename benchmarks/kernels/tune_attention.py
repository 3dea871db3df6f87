# SPDX-License-Identifier: Apache-2.0
"""Tune the attention kernels' launch configs on this GPU and write their tables.

    python3 benchmarks/kernels/tune_attention.py --kernel prefill \\
        --head-sizes 128 --groups 4 8 --block-sizes 64 --budget-minutes 8 \\
        --record $OUT/prefill-record.json
    python3 benchmarks/kernels/tune_attention.py --kernel decode --quick \\
        --results-dir $OUT

``--kernel prefill``: for each problem key (head size, dtypes, group, page size,
max-query-length bucket) times every valid candidate of ``PREFILL_CONFIG_SPACE`` on
a batch typical of the bucket, after checking it against ``ref_paged_attention`` on
a small batch, and stores the fastest in ``prefix_prefill_<gpu>.json`` (merged into
the existing file, or ``--out``). ``--untuned`` writes the heuristic's choice (no
GPU timing). Candidates that share (head size, group, page size, dtypes) share
compiled kernels across buckets, so sweep all buckets of a shape in one run.

``--kernel decode``: times the valid configs of ``DECODE_CONFIG_SPACE`` on the
decode points of ``bench_kernels.py``'s sweep that share a problem key (head size,
dtypes, group, page size, split), with that benchmark's inputs, reference check and
CUDA-graph timing, and writes ``paged_decode_<gpu>.json`` (winners under
``configs``, every timing under ``records``) to ``--results-dir`` after each key.

``--kernel prefill --held-out --record FILE``: "no shape left to luck". For each
of ``HELD_OUT_SHAPES`` (prefill shapes the shipped H200 table was not tuned on; with
``--held-out-set unseen``, ``UNSEEN_SHAPES``, which nothing was fitted on), the
exhaustive tune of the key (as above, nothing written to a table) and the time of
the config a launch would pick (``PREFILL_TABLE.lookup`` on this GPU: its table,
else the heuristic), one record per shape, written after each and skipped on a
rerun: picked vs best and whether the pick is within 5% of the best.

Both write the loader's format (``vllm/attention/ops/tuning/README.md``); a record
is merged into a shipped table with ``merge_tuning.py`` in this folder. Every
option travels in the parsed arguments; nothing is a module global.
"""

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.harness import git_commit, gpu_info  # noqa: E402
from benchmarks.kernels.merge_tuning import table_text  # noqa: E402
from vllm.attention.ops.prefix_prefill import prefix_prefill_attention  # noqa: E402
from vllm.attention.ops.reference import ref_paged_attention  # noqa: E402
from vllm.attention.ops.tuning import decode_configs as dc  # noqa: E402
from vllm.attention.ops.tuning.prefill_configs import (  # noqa: E402
    PREFILL_CONFIG_SPACE,
    PREFILL_TABLE,
    QUERY_LEN_BUCKETS,
    PrefillConfig,
    heuristic_prefill_config,
    is_valid_config,
)
from vllm.attention.ops.tuning.tables import device_gpu_name  # noqa: E402

# ----------------------------------------------------------------------------------
# Prefill
# ----------------------------------------------------------------------------------

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


# Prefill shapes held out of the tuning: no shape with their (head size, group,
# page, dtypes) was tuned, whatever the bucket. A launch takes the heuristic there
# (other groups, padded head sizes, pages of 16 and 128, an fp8 cache), except
# group 7, which takes the entry of its group class (8): its record measures the
# class. (head_size, group, block_size, kv_dtype, max_query_len bucket); the query
# is bf16. The tests check that only class members are held by the table. A shape
# leaves the set when the table takes its key: Phi-3-mini's (96, 1, 64, 4k),
# since head size 96 on pages of 64 has table entries (groups 1 and 4), and
# (256, 4, 64, 64), since head size 256 on pages of 64 has entries for group 4.
HELD_OUT_SHAPES = [
    (64, 1, 16, "bfloat16", 4096),
    (80, 2, 64, "bfloat16", 1024),
    (112, 3, 16, "bfloat16", 1024),
    (128, 7, 64, "bfloat16", 4096),  # Qwen2.5-7B
    (128, 5, 16, "bfloat16", 16384),  # Qwen2.5-14B, page 16
    (192, 6, 64, "bfloat16", 256),
    (256, 2, 16, "bfloat16", 4096),  # Gemma-2-9B, page 16
    (128, 16, 128, "bfloat16", 1024),
    (128, 12, 64, "fp8", 4096),
    (64, 8, 128, "fp8", 16384),
]
# A second set, fixed before any of its shapes was timed: the heuristic was fitted
# with HELD_OUT_SHAPES' records, so those measure it in sample; these do not. No
# shape here is in HELD_OUT_SHAPES, the shipped table or a tuning record's keys;
# (128, 3, 64) and (128, 6, 64, fp8) take their group class's table entry. As
# above, (96, 3, 64, 16k) left it when the table took head size 96 on pages of 64
# (group 3 is group 4's class), and (256, 6, 64, 16k) when it took head size 256's
# class 5-8 on pages of 64. (64, 4, 64, 1k) left it when the table took head size
# 64 on pages of 64 (groups 1, 4, 8); (64, 2, 16, 1k), untimed, took its place.
UNSEEN_SHAPES = [
    (64, 2, 16, "bfloat16", 1024),
    (80, 5, 16, "bfloat16", 4096),
    (112, 8, 64, "bfloat16", 4096),
    (128, 3, 64, "bfloat16", 4096),
    (128, 6, 128, "bfloat16", 1024),
    (192, 2, 16, "bfloat16", 1024),
    (128, 6, 64, "fp8", 4096),
    (64, 16, 16, "fp8", 256),
]
HELD_OUT_SETS = {"fitted": HELD_OUT_SHAPES, "unseen": UNSEEN_SHAPES}
HELD_OUT_TOLERANCE = 1.05  # the pick may be at most 5% slower than the best


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


def _gluon_candidate(config):
    """The one candidate per tile (and ``fp8_qk``: an fp8 key needs it set, a
    16-bit one unset; ``split_head``, where the validity filter lets the Gluon
    kernel split the head) that a ``gluon`` sweep times: the Gluon kernel loads
    by TMA, starts longest first and has none of the portable kernel's other
    knobs (``prefill_configs.gluon_entry_refusal``)."""
    return dataclasses.replace(config, use_tma=True, longest_first=True)


def _candidates(head_size, kv_dtype, group, block_size, space):
    # Any group: rows are packed, a tile may start and end inside a token.
    for values in itertools.product(*(space[name] for name in SPACE_FIELDS)):
        config = PrefillConfig(**dict(zip(SPACE_FIELDS, values)))
        if config.gluon:
            if config != _gluon_candidate(config):
                continue  # the Gluon kernel ignores the other knobs: one per tile
        elif config.use_tma and block_size % config.block_n:
            continue  # would run the pointer loads: same as use_tma=False
        if is_valid_config(config, head_size=head_size, kv_dtype=kv_dtype):
            yield config


def add_prefill_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="compile each key's candidates in this many processes before timing "
        "them (one CUDA context each; the host's CPU cores, say)",
    )
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
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="tune the held-out shapes exhaustively and time the config a launch "
        "picks for each; writes --record (required), resumed on a rerun; no table "
        "written",
    )
    parser.add_argument(
        "--held-out-set",
        choices=sorted(HELD_OUT_SETS),
        default="fitted",
        help="fitted: HELD_OUT_SHAPES (the heuristic was fitted with their "
        "records); unseen: UNSEEN_SHAPES (never timed before)",
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


def tune_prefill(args: argparse.Namespace) -> None:
    """Sweep the prefill keys of ``args`` and write the table (and ``--record``)."""
    space = _space(args)
    gpu_name = args.gpu_name or torch.cuda.get_device_name()
    path = args.out or PREFILL_TABLE.path(gpu_name)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"configs": []}
    entries = {
        PREFILL_TABLE.key(**{k: v for k, v in e.items() if k != "config"}): e
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
            key = PREFILL_TABLE.key(max_query_len=bucket, **shape)
            if args.untuned:
                best = heuristic_prefill_config(
                    head_size=head_size,
                    group=group,
                    block_size=block_size,
                    max_query_len=bucket,
                )
            else:
                previous = entries.get(key, {}).get("config")
                best, record = _tune_one(
                    shape, bucket, gen, space, previous, jobs=args.jobs
                )
                records.append({"key": dict(zip(KEY_FIELDS, key)), **record})
                tuned += 1
            entries[key] = PREFILL_TABLE.entry(key, best)
            print(key, "->", best, flush=True)

    provenance = _provenance(
        args,
        gpu_name,
        method="untuned: heuristic_prefill_config values"
        if args.untuned
        else "triton.testing.do_bench median (ms), fastest correct candidate",
        earlier=data.get("provenance"),
    )
    with open(path, "w") as f:
        f.write(table_text(provenance, [entries[k] for k in sorted(entries)]))
    print(f"wrote {path} ({len(entries)} entries, {tuned} tuned now)")
    if args.record:
        with open(args.record, "w") as f:
            record = {k: v for k, v in provenance.items() if k != "records"}
            json.dump({**record, "space": space, "records": records}, f, indent=1)
        print(f"wrote {args.record}")


def _space(args) -> dict:
    """PREFILL_CONFIG_SPACE, restricted by the --<field> options given."""
    return {
        name: PREFILL_CONFIG_SPACE[name]
        if getattr(args, name) is None
        else tuple(type(PREFILL_CONFIG_SPACE[name][0])(v) for v in getattr(args, name))
        for name in SPACE_FIELDS
    }


def held_out_key(head_size, group, block_size, kv_dtype, bucket) -> tuple:
    """The table key of one HELD_OUT_SHAPES entry (bf16 query)."""
    return PREFILL_TABLE.key(
        head_size=head_size,
        q_dtype="bfloat16",
        kv_dtype=kv_dtype,
        group=group,
        block_size=block_size,
        max_query_len=bucket,
    )


def run_held_out(args, shapes=HELD_OUT_SHAPES) -> dict:
    """For each shape: the exhaustive tune (``_tune_one``: every valid candidate,
    checked and timed) with the config ``PREFILL_TABLE.lookup`` gives a launch on
    this GPU always among the candidates (as the key's ``previous``), and a record
    of picked vs best. The record file is rewritten after each shape; shapes
    already in it are skipped (rerun to go on after --budget-minutes)."""
    path = Path(args.record)
    gpu = device_gpu_name(torch.device("cuda"))
    body = json.loads(path.read_text()) if path.is_file() else None
    if body is None:
        body = _provenance(
            args,
            torch.cuda.get_device_name(),
            method="exhaustive tune per held-out shape (triton.testing.do_bench "
            "median) vs the config PREFILL_TABLE.lookup picks",
            earlier=None,
        )
        body = {**body, "lookup_gpu_name": gpu, "space": _space(args), "records": []}
    done = {tuple(r["shape"].values()) for r in body["records"] if "shape" in r}
    deadline = time.monotonic() + 60 * args.budget_minutes
    gen = torch.Generator().manual_seed(0)
    table = PREFILL_TABLE.load(gpu)
    for head_size, group, block_size, kv_name, bucket in shapes:
        key = held_out_key(head_size, group, block_size, kv_name, bucket)
        if (head_size, group, block_size, kv_name, bucket) in done:
            continue
        if time.monotonic() > deadline:
            print("budget spent; rerun to go on with the remaining shapes")
            break
        shape = {
            "head_size": head_size,
            "group": group,
            "block_size": block_size,
            "q_dtype": torch.bfloat16,
            "kv_dtype": _dtype(kv_name),
        }
        # Exactly the launch's choice (prefix_prefill_attention with config=None).
        picked = PREFILL_TABLE.lookup(
            gpu_name=gpu,
            max_query_len=bucket,
            is_hip=torch.version.hip is not None,
            **shape,
        )
        try:
            best, tuned = _tune_one(
                shape, bucket, gen, _space(args), asdict(picked), jobs=args.jobs
            )
        except RuntimeError as exc:  # no candidate ran: recorded, not retried
            best, tuned = None, {"best_timing": None, "previous_timing": None}
            tuned.update(batch=None, candidates=[], error=str(exc))
        best_ms = tuned["best_timing"] and tuned["best_timing"]["ms"]
        picked_timing = tuned["previous_timing"]
        picked_ms = picked_timing and picked_timing["ms"]
        ratio = picked_ms / best_ms if picked_ms and best_ms else None
        record = {
            "shape": {
                "head_size": head_size,
                "group": group,
                "block_size": block_size,
                "kv_dtype": kv_name,
                "max_query_len": bucket,
            },
            "key": dict(zip(KEY_FIELDS, key)),  # the table's (group class, bucket)
            "picked_from": "table" if key in table else "heuristic",
            "picked": asdict(picked),
            "picked_ms": picked_ms,
            "best": best and asdict(best),
            "best_ms": best_ms,
            "ratio": None if ratio is None else round(ratio, 4),
            "within_5pct": ratio is not None and ratio <= HELD_OUT_TOLERANCE,
            "batch": tuned["batch"],
            "candidates": tuned["candidates"],
        }
        if ratio is None:
            record["why"] = tuned.get("error") or (
                "the picked config failed (wrong result or no compile)"
            )
        body["records"].append(record)
        path.write_text(json.dumps(body, indent=1) + "\n")
        print(
            f"held-out {record['shape']}: picked {picked} {picked_ms} ms, best "
            f"{best} {best_ms} ms, ratio {record['ratio']}, "
            f"within 5%: {record['within_5pct']}",
            flush=True,
        )
    missed = [r["shape"] for r in body["records"] if not r["within_5pct"]]
    print(
        f"wrote {path}: {len(body['records'])} shapes recorded, "
        f"{len(missed)} not within 5%" + (f": {missed}" if missed else "")
    )
    return body


def _provenance(args, gpu_name: str, *, method: str, earlier: dict | None) -> dict:
    """A table's provenance as short structured fields; the records of earlier runs
    whose entries stay in the file are kept in ``records``."""
    records = list((earlier or {}).get("records", []))
    if getattr(args, "record", None):
        records.append(args.record)
    return {
        "gpu": gpu_name,
        "commit": args.commit or git_commit(),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "driver": gpu_info()["driver"],
        "vllm": _vllm_source(),
        "method": method,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(
            ["python3 benchmarks/kernels/tune_attention.py", *sys.argv[1:]]
        ),
        "records": records,
    }


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


def _tune_batches(shape, bucket, gen):
    """``(seqs, timed batch, small checked batch)`` of one key's tune."""
    num_seqs, context = BATCH_FOR_BUCKET[bucket]
    seqs = [(bucket, context + bucket)] * num_seqs
    batch = _make_batch(seqs=seqs, gen=gen, **shape)
    small = _make_batch(seqs=[(min(bucket, 100), 300), (1, 77)], gen=gen, **shape)
    return seqs, batch, small


def job_shares(candidates: list, jobs: int) -> list[list]:
    """``candidates`` dealt round-robin into at most ``jobs`` non-empty shares."""
    return [s for s in (candidates[i::jobs] for i in range(jobs)) if s]


def _compile_share(shape, bucket, configs) -> None:
    """Run each config once on batches of the tune's shapes (the same compiled
    specialisations) so that Triton's cache holds its kernels; failures are left to
    the timing loop, which meets them again and reports them."""
    _, batch, small = _tune_batches(shape, bucket, torch.Generator().manual_seed(0))
    for config in configs:
        for inputs in (small, batch):
            try:
                _run(inputs, config, shape["head_size"])
            except Exception:  # noqa: BLE001 - reported by the timing loop
                break
    torch.cuda.synchronize()


def precompile(shape, bucket, candidates, jobs: int) -> None:
    """Compile the candidates in ``jobs`` processes (spawned, one CUDA context each)
    before the timing loop, which then loads them from Triton's cache: compiling,
    not timing, is most of a sweep's time, and it runs on the host's CPU cores."""
    spawn = multiprocessing.get_context("spawn")
    shares = job_shares(candidates, jobs)
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=spawn) as pool:
        for done in [pool.submit(_compile_share, shape, bucket, s) for s in shares]:
            try:
                done.result()
            except Exception as exc:  # noqa: BLE001 - a worker lost its context
                print("  precompile worker failed:", type(exc).__name__, exc)


def _tune_one(shape, bucket, gen, space, previous=None, jobs=1):
    """Fastest correct candidate for one key, and a record of every timing.

    The heuristic's config and the ``previous`` table entry are always candidates,
    whatever the sweep, so a new entry is never slower (in this run) than the
    config it replaces for the key. ``jobs > 1`` compiles the candidates in that
    many processes first (``precompile``)."""
    num_seqs, context = BATCH_FOR_BUCKET[bucket]
    seqs, batch, small = _tune_batches(shape, bucket, gen)
    # Causal attention FLOPs: q.k and p.v, 2 * head_size each, per visible pair.
    visible_pairs = sum(sum(range(kv - q + 1, kv + 1)) for q, kv in seqs)
    num_q_heads = NUM_KV_HEADS * shape["group"]
    flops = 4 * shape["head_size"] * num_q_heads * visible_pairs
    best, best_ms, timings = None, math.inf, {}
    fallback = heuristic_prefill_config(
        head_size=shape["head_size"],
        group=shape["group"],
        block_size=shape["block_size"],
        max_query_len=bucket,
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
    # (once each: the previous entry is often the heuristic's config)
    candidates = list(
        dict.fromkeys(candidates + [c for c in (fallback, previous) if c])
    )
    if jobs > 1:
        precompile(shape, bucket, candidates, jobs)
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


# ----------------------------------------------------------------------------------
# Decode
# ----------------------------------------------------------------------------------


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="the quick sweep's points")
    parser.add_argument(
        "--kv-dtypes",
        nargs="+",
        default=["bf16", "fp8"],
        choices=["bf16", "fp8"],
        help="tune only the keys with these KV-cache dtypes",
    )
    parser.add_argument(
        "--finalists",
        type=int,
        default=6,
        help="time every config on each key's heaviest point, then this many of the "
        "fastest (and the key's current config) on all its points; 0 = every "
        "config on every point",
    )
    parser.add_argument(
        "--results-dir", required=True, help="where paged_decode_<gpu>.json goes"
    )
    parser.add_argument(
        "--commit",
        default=os.environ.get("BENCH_COMMIT"),
        help="commit of the kernels, recorded in the provenance",
    )


def _time_config(bk, config, points, inputs, checked) -> float:
    """Microseconds of ``config`` summed over ``points``, each output checked
    against its reference first (ValueError when wrong)."""
    total = 0.0
    for s, inp, ref in zip(points, inputs, checked):
        runner = bk.caller_ours(s, inp, decode_config=config)
        runner.run(0)
        # A config must be right before it may be fast.
        err = bk.max_abs_err(runner.output, ref)
        if not err <= bk.MAX_ABS_ERR:
            raise ValueError(f"max abs error {err:.3g} on {s}")
        total += bk.time_us(runner, inp.num_sets)[0]
    return round(total, 2)


def retune_decode(
    bk, shapes: list, *, finalists: int, write=None, provenance=None
) -> dict:
    """Time the valid DecodeConfigs on the decode points of each problem key and
    return the table (JSON dict) with the fastest correct config per key.

    ``bk`` is the ``bench_kernels`` module (inputs, reference, timing, our caller).
    Two rounds per key: every config on the key's heaviest point (most K/V bytes),
    then the ``finalists`` fastest of those on every point of the key (0: every
    config on every point). The config the GPU's shipped table (or the heuristic)
    gives the key is always a finalist, as ``previous``, and is timed first (a tie
    keeps it); every timing goes into the table's ``records``. ``write(table)`` runs
    after each key, so a run cut short keeps its finished keys."""
    groups: dict[tuple, tuple] = {}
    for s in shapes:
        if s.kernel != "decode":
            continue
        splits = bk.ops.choose_decode_splits(
            num_seqs=s.batch,
            num_kv_heads=s.num_kv_heads,
            num_sms=torch.cuda.get_device_properties(0).multi_processor_count,
            wave=bk.ops.decode_wave_rule(
                kv_dtype=getattr(torch, s.kv_dtype), device=torch.device("cuda")
            ),
        )
        fields = dict(
            head_size=s.head_size,
            q_dtype=getattr(torch, s.dtype),
            kv_dtype=getattr(torch, s.kv_dtype),
            group=s.num_q_heads // s.num_kv_heads,
            block_size=s.block_size,
            split=splits > 1,
        )
        groups.setdefault(dc.DECODE_TABLE.key(**fields), (fields, []))[1].append(s)
    table = {
        "provenance": {
            "gpu": torch.cuda.get_device_name(),
            "method": "do_bench_cudagraph median, summed over the decode points of "
            "the key (bench_kernels.py sweep)",
            **(provenance or {}),
        },
        "configs": [],
        "records": [],
    }
    names = list(dc.DECODE_CONFIG_SPACE)
    for key, (fields, points) in groups.items():
        inputs = [bk.build_inputs(s, "cuda", rotate=True) for s in points]
        checked = [bk.reference_rows(s, inp) for s, inp in zip(points, inputs)]
        # What a launch on this GPU uses now (its table, a stand-in's, or the
        # heuristic): device_gpu_name is the launchers' own choice of table.
        previous = dc.DECODE_TABLE.lookup(
            gpu_name=device_gpu_name(torch.device("cuda")), **fields
        )
        space = [
            dc.DecodeConfig(**dict(zip(names, values)))
            for values in itertools.product(*dc.DECODE_CONFIG_SPACE.values())
        ]
        space = [
            c
            for c in [previous] + [c for c in space if c != previous]
            if dc.is_valid_config(c, head_size=key[0], kv_dtype=fields["kv_dtype"])
        ]
        kept = [c for c in space if c == previous]  # always a finalist
        heaviest = max(
            range(len(points)), key=lambda i: points[i].batch * points[i].context
        )
        screened = {}  # config -> us on the heaviest point, None if it failed
        if finalists and len(space) > finalists + len(kept):
            one = ([points[heaviest]], [inputs[heaviest]], [checked[heaviest]])
            for cfg in space:
                try:
                    screened[cfg] = _time_config(bk, cfg, *one)
                except Exception as exc:  # e.g. out of resources, or a wrong result
                    screened[cfg] = None
                    print(f"  {cfg}: failed ({type(exc).__name__}: {exc})"[:200])
            ranked = sorted(
                (c for c in space if c not in kept and screened[c] is not None),
                key=screened.get,
            )
            space = kept + ranked[:finalists]
        timed = {}  # config -> us summed over the key's points, None if it failed
        for cfg in space:
            timed[cfg] = None
            try:
                timed[cfg] = _time_config(bk, cfg, points, inputs, checked)
            except Exception as exc:  # e.g. out of resources, or a wrong result
                print(f"  {cfg}: failed ({type(exc).__name__}: {exc})"[:200])
        done = {c: us for c, us in timed.items() if us is not None}
        if done:
            # min keeps the first of equals: the previous config, timed first.
            cfg = min(done, key=done.get)
            print(
                f"retune {key}: {cfg} ({done[cfg]:.1f} us summed; "
                f"previous {previous}: {timed.get(previous)} us)"
            )
            entry = dc.DECODE_TABLE.entry(key, cfg)
            table["configs"].append(entry)
            table["records"].append(
                {
                    "entry": entry,
                    "previous": asdict(previous),
                    "points": [str(s) for s in points],
                    "timings": [_timing(c, us, "us_summed") for c, us in timed.items()],
                    # Round one (when there was one): every config on one point.
                    "screen_point": str(points[heaviest]) if screened else None,
                    "screen": [_timing(c, us, "us") for c, us in screened.items()],
                }
            )
            if write is not None:
                write(table)
        del inputs
        torch.cuda.empty_cache()
    return table


def _timing(config, us, field: str) -> dict:
    if us is None:
        return {**asdict(config), "failed": True}
    return {**asdict(config), field: us}


def tune_decode(args: argparse.Namespace) -> None:
    """Retune the decode keys of bench_kernels.py's sweep and write the table."""
    from benchmarks.kernels import bench_kernels as bk

    bk.import_modules(None)
    shapes = [
        s
        for s in bk.sweep(argparse.Namespace(quick=args.quick, tiny=False))
        if s.kernel == "decode"
        and ("fp8" if s.kv_dtype.startswith("float8") else "bf16") in args.kv_dtypes
    ]
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / dc.DECODE_TABLE.path(torch.cuda.get_device_name()).name

    def write(table):
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {path} ({len(table['configs'])} keys)", flush=True)

    provenance = _provenance(
        args, torch.cuda.get_device_name(), method="", earlier=None
    )
    del provenance["method"]
    retune_decode(
        bk, shapes, finalists=args.finalists, write=write, provenance=provenance
    )
    print(
        f"merge it into the shipped tables: python3 {Path(__file__).parent}/"
        f"merge_tuning.py {path}"
    )


# ----------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--kernel", choices=["prefill", "decode"], required=True)
    known, rest = first.parse_known_args(argv)
    parser = argparse.ArgumentParser(
        prog="tune_attention.py --kernel " + known.kernel,
        description=__doc__.split("\n")[0],
    )
    if known.kernel == "prefill":
        add_prefill_arguments(parser)
        args = parser.parse_args(rest)
        if args.held_out and not args.record:
            parser.error("--held-out writes its records to --record FILE")
        if args.held_out:
            run_held_out(args, HELD_OUT_SETS[args.held_out_set])
        else:
            tune_prefill(args)
    else:
        add_decode_arguments(parser)
        tune_decode(parser.parse_args(rest))


if __name__ == "__main__":
    main()
