# SPDX-License-Identifier: Apache-2.0
"""Kernel microbenchmark: our paged attention vs FlashAttention-3 and stock Triton.

Every implementation is a *caller* ``caller(shape, inputs) -> Runner``: setup (layout
conversion, workspaces) happens in the caller, ``Runner.run(i)`` only launches on
input set ``i``. Each point is checked against ``ref_paged_attention`` (max abs
error recorded per implementation), then timed.

Units and formulas (per call):
  decode  GB/s     bytes = sum_s seq_len_s * num_kv_heads * head_size * 2 (K and V)
                           * kv_bytes_per_element
                           + 2 * num_seqs * num_q_heads * head_size * q_bytes (q, out)
  prefill TFLOP/s  flops = 4 * head_size * num_q_heads * sum_s sum_i visible(s, i),
                   visible(s, i) = context_s + i + 1 for query token i (causal:
                   the cached prefix plus the query tokens up to itself), i.e.
                   sum_i = q_len * context + q_len * (q_len + 1) / 2 with
                   context = seq_len - q_len. (2 FLOPs per MAC, QK^T and PV.)

Timing: CUDA graphs (``triton.testing.do_bench_cudagraph``, median) of one pass over
``num_sets`` input sets; for decode the sets are distinct KV pages whose total size
exceeds twice the 50 MB L2, so no call finds its KV in L2. Falls back to
``triton.testing.do_bench`` (median) if a caller cannot be captured.

Imports (ours and stock side by side): stock vLLM (a supported release) is put
first on sys.path from ``--stock-site`` and imported as ``vllm``; then the
checkout's ``vllm/`` folder is inserted at the FRONT of ``vllm.__path__``.
``vllm.attention.ops.*`` (ours) therefore loads from the checkout, while
``vllm.v1...`` and ``vllm.vllm_flash_attn`` (regular packages of stock) load from
stock. The JSON records the file of every module used. ``--stock-site`` is required
when a stock caller (``fa3``, ``stock_triton``) is requested; ``--callers ours`` runs
without it. A GPU is required (the CPU interpreter runs the kernel tests, not this).

``--matrix full``: the kernel matrix against FA3 (``MATRIX_*`` data: groups, head
sizes, pages, KV dtypes, lengths, window / soft-cap), pruned by ``--kernels``,
``--groups``, ``--head-sizes``, ``--block-sizes``, ``--kv-dtypes``, capped by
``--max-points``; each point's record is written to ``--out`` as it finishes and a
rerun skips the finished ones. ``--summarize FILE...`` prints the worst and median
ratios to FA3 per kernel, head size and group as Markdown (no GPU); ``--list``
prints the selected points (no GPU).

Tuning tables are written by ``tune_attention.py`` in this folder, which reuses this
file's inputs, reference check and timing.
"""

import argparse
import datetime
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import triton
import triton.testing

REPO = Path(__file__).resolve().parents[2]
MAX_SETS = 64
# L2 cache of an H100 / H200: decode points rotate more K/V than twice this through
# each timed pass so that no call finds its K/V in L2.
H200_L2_BYTES = 50 * 2**20
# Dense bf16 tensor-core peak of an H200 (and H100 SXM), TFLOP/s, for the
# efficiency figures of the results.
H200_BF16_DENSE_PEAK_TFLOPS = 989.0

# ----------------------------------------------------------------------------------
# The sweep, as data
# ----------------------------------------------------------------------------------

# name -> (num_q_heads, num_kv_heads, head_size) per GPU.
MODELS = {
    "llama-3.1-8b": (32, 8, 128),
    "llama-3.1-70b-tp2": (32, 4, 128),  # 64 q / 8 kv heads split over 2 GPUs
}
# (batch, context): context = KV length of every sequence.
DECODE_POINTS = [
    (1, 1024), (1, 8192), (1, 32768), (1, 131072),
    (4, 8192), (16, 4096), (16, 32768),
    (64, 1024), (64, 8192), (256, 2048),
]  # fmt: skip
# (batch, query_len, context): context = full KV length incl. the query tokens.
PREFILL_POINTS = [
    (1, 512, 512), (1, 2048, 2048), (1, 8192, 8192), (4, 4096, 4096),
    (1, 1024, 16384), (16, 512, 2048),
]  # fmt: skip
BLOCK_SIZES = (16, 64)  # 16: stock vLLM's default page; 64: ours preferred
FP8_DECODE_POINTS = [(1, 32768), (16, 4096), (64, 8192), (256, 2048)]  # 8B, page 64
FP8_PREFILL_POINTS = [
    (1, 2048, 2048),
    (1, 8192, 8192),
    (4, 4096, 4096),
    (1, 1024, 16384),
]

QUICK = {
    "decode": [("llama-3.1-8b", 16, b, c) for b, c in [(1, 8192), (64, 2048)]]
    + [("llama-3.1-8b", 64, 1, 131072)],
    "prefill": [
        ("llama-3.1-8b", 16, 1, 2048, 2048),
        ("llama-3.1-8b", 64, 1, 512, 8192),
    ],
    "fp8": [("llama-3.1-8b", 64, 64, 8192)],
}
# --native: the layers our kernels took over from stock's Triton backend (which
# served them before), timed against it (and FA3 where FA3 takes them): an odd
# head size (open_llama_3b: 32 heads of 100), ALiBi-sqrt on Llama-3.1-8B heads,
# Whisper-large-v3's cross-attention (20 heads of 64; a 4-token decoder prompt
# over the 1500 encoder keys, non-causal), BERT-large's encoder self-attention (16
# heads of 64, 64 requests of 512 tokens, no cache: stock runs its
# context_attention_fwd, FA3 its varlen call without pages), fp8_e5m2 caches and
# gpt-oss's sinks (64 heads of 64 over 8 KV heads, with and without its window of
# 128); pages of 64.
NATIVE_POINTS = [
    # (kernel, model, batch, query_len, kv_len, heads, extra Shape fields)
    ("prefill", "open-llama-3b", 1, 2048, 2048, (32, 32, 100), {}),
    ("prefill", "open-llama-3b", 1, 2048, 10240, (32, 32, 100), {}),
    ("decode", "open-llama-3b", 64, 1, 2048, (32, 32, 100), {}),
    ("prefill", "llama-3.1-8b-alibi-sqrt", 1, 2048, 2048, (32, 8, 128),
     {"alibi": "sqrt"}),
    ("decode", "llama-3.1-8b-alibi-sqrt", 64, 1, 8192, (32, 8, 128),
     {"alibi": "sqrt"}),
    ("prefill", "whisper-large-v3-cross", 64, 4, 1500, (20, 20, 64),
     {"causal": False}),
    ("prefill", "bert-large-encoder", 64, 512, 512, (16, 16, 64),
     {"causal": False, "kv_from_step": True}),
    ("prefill", "llama-3.1-8b", 1, 2048, 2048, (32, 8, 128),
     {"kv_dtype": "float8_e5m2"}),
    ("decode", "llama-3.1-8b", 64, 1, 8192, (32, 8, 128),
     {"kv_dtype": "float8_e5m2"}),
    # gpt-oss-20b: sinks on every layer, a window of 128 on every other one.
    ("prefill", "gpt-oss-20b", 1, 2048, 2048, (64, 8, 64), {"sinks": True}),
    ("prefill", "gpt-oss-20b", 1, 8192, 8192, (64, 8, 64), {"sinks": True}),
    ("prefill", "gpt-oss-20b", 1, 2048, 18432, (64, 8, 64), {"sinks": True}),
    ("prefill", "gpt-oss-20b-window", 1, 8192, 8192, (64, 8, 64),
     {"sinks": True, "window": 128}),
    ("decode", "gpt-oss-20b", 64, 1, 8192, (64, 8, 64), {"sinks": True}),
]  # fmt: skip
NATIVE_BLOCK_SIZE = 64

# A seconds-long GPU smoke run (--tiny).
TINY = {
    "decode": [(2, 40, (4, 2, 64), 16), (3, 70, (4, 1, 64), 32)],
    "prefill": [(2, 8, 24, (4, 2, 64), 16)],
}


# ----------------------------------------------------------------------------------
# The kernel matrix against FA3 (--matrix full), as data
# ----------------------------------------------------------------------------------
# Every axis is crossed with the others only where it changes what the kernels do;
# the points are: CORE lengths for every (group, head size, page, KV dtype), the
# full length SWEEPS for the (group, head size) pairs of the end-to-end models, and
# the FEATURE points (sliding window, soft-cap) of the models that use them. Points
# shared by two parts are measured once. Prune with --kernels, --groups,
# --head-sizes, --block-sizes, --kv-dtypes and --max-points; --list prints them.

# Every integer group 1-8 (Phi-3 1, Gemma-2 2, Llama-3.1-8B / Mistral 4, Qwen2.5-14B
# 5, Qwen2.5-7B 7, Llama-3.1-70B 8) and 12, 16: groups that do not divide the packed
# tile, and ones larger than the 8 rows of an MMA slice.
MATRIX_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
# Powers of two and the padded ones (80, 96, 112, 192 run with a padded head tile);
# 96 is Phi-3's, 256 Gemma-2's, 128 everyone else's.
MATRIX_HEAD_SIZES = (64, 80, 96, 112, 128, 192, 256)
# 16: stock vLLM's default page; 64: ours preferred; 128 (prefill only, the only
# kernel whose tuning table has it): a page longer than any KV tile.
MATRIX_BLOCK_SIZES = {"prefill": (16, 64, 128), "decode": (16, 64)}
# Eight KV heads (Llama-3.1-8B, and tune_attention's batches): q heads = 8 * group.
# The KV-head count only widens the grid; the group changes the packed tiles.
MATRIX_KV_HEADS = 8
MATRIX_KV_DTYPES = ("bfloat16", "float8_e4m3fn")
# fp8 changes the K/V loads and the dot inputs, not the paging: its CORE points
# run on page 64 only (its SWEEP and FEATURE points on every page size).
MATRIX_FP8_CORE_BLOCK_SIZES = (64,)
CHUNK = 2048  # chunked prefill: one 2k chunk after a cached prefix
# (batch, query_len, kv_len), kv_len = cached prefix + query_len.
MATRIX_PREFILL_FRESH = [(1, 512, 512), (1, 2048, 2048), (1, 8192, 8192),
                        (1, 32768, 32768)]  # fmt: skip
MATRIX_PREFILL_CHUNKED = [(1, CHUNK, cached + CHUNK) for cached in (8192, 16384, 32768)]
# What `vllm serve` makes of a long prompt on an H100 or H200: chunks of its default
# token budget (8192 on GPUs of 70 GiB or more; vLLM's `get_batch_defaults`), each
# over the part already cached. The first chunk is MATRIX_PREFILL_FRESH's 8k
# prefill; these are the later ones, of the end-to-end 10k prompt and of a 32k one,
# on the fork's page size (64).
SERVING_TOKEN_BUDGET = 8192
SERVING_PROMPTS = (10000, 32768)
SERVING_BLOCK_SIZE = 64


def later_chunks(prompt: int, budget: int) -> list[tuple[int, int, int]]:
    """``(batch, query_len, kv_len)`` of each chunk of a ``prompt``-token prefill
    after the first, the budget's tokens at a time."""
    return [
        (1, min(budget, prompt - done), min(prompt, done + budget))
        for done in range(budget, prompt, budget)
    ]


MATRIX_PREFILL_SERVING = [
    chunk for prompt in SERVING_PROMPTS
    for chunk in later_chunks(prompt, SERVING_TOKEN_BUDGET)
]  # fmt: skip


def serving_steps(prompt: int, budget: int, steps: int) -> list[list[tuple[int, int]]]:
    """The prefill batches ``(query_len, kv_len)`` per sequence of the first
    ``steps`` steps that hold two or more sequences, when prompts of ``prompt``
    tokens queue for a token budget of ``budget``: each step continues the oldest
    unfinished prompt and fills the rest of the budget from the next ones, as
    vLLM's scheduler chunks waiting prompts (decodes left out)."""
    found, done = [], [0]
    while len(found) < steps:
        left, batch, i = budget, [], 0
        while left:
            if i == len(done):
                done.append(0)
            take = min(left, prompt - done[i])
            if take:
                done[i] += take
                batch.append((take, done[i]))
                left -= take
            i += 1
        if len(batch) > 1:
            found.append(batch)
    return found


# The 10k workload's mixed steps: a prompt's last chunk over its cached part beside
# the next prompt's first (1808 over 8192 beside 6384, then 3616 over 6384 beside
# 4576, ...): one launch, sequences of very different key counts.
MATRIX_SERVING_STEPS = serving_steps(SERVING_PROMPTS[0], SERVING_TOKEN_BUDGET, 4)
# (batch, kv_len): batch 1-256, contexts 1k-32k; at most 2M cached tokens per point
# (17 GB at head 256, group 16, bf16; the FA3/stock copy doubles it).
MATRIX_DECODE = [(1, 1024), (1, 8192), (1, 32768), (4, 32768), (16, 4096),
                 (16, 32768), (64, 8192), (256, 1024), (256, 8192)]  # fmt: skip
# Lengths every (group, head size, page, KV dtype) runs: a long fresh prefill, a
# chunk after a long prefix, one long decode and a large decode batch.
MATRIX_CORE = {
    "prefill": [(1, 8192, 8192), (1, CHUNK, 16384 + CHUNK)],
    "decode": [(1, 32768), (64, 8192)],
}
# (group, head size) of the end-to-end models: every length of the sweep (the
# serving chunks on SERVING_BLOCK_SIZE).
MATRIX_SWEEP_SHAPES = [(1, 96), (2, 256), (4, 128), (5, 128), (7, 128), (8, 128)]
# (group, head size, window, soft-cap), as the models use them; FA3 takes both
# (window_size=(W - 1, 0), softcap). Gemma-2 alternates window+cap / cap-only.
MATRIX_FEATURES = [
    (4, 128, 4096, None),  # Mistral-7B-v0.1
    (2, 256, 4096, 50.0),  # Gemma-2-9B, local layers
    (2, 256, None, 50.0),  # Gemma-2-9B, global layers
    (1, 96, 2047, None),  # Phi-3-mini-4k
]
MATRIX_FEATURE_LENGTHS = {
    "prefill": [(1, 8192, 8192), (1, 32768, 32768), (1, CHUNK, 16384 + CHUNK),
                (1, CHUNK, 32768 + CHUNK)],
    "decode": [(1, 32768), (64, 8192), (256, 8192)],
}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    kernel: str  # "decode" | "prefill"
    model: str
    batch: int
    query_len: int
    context: int  # KV length of every sequence, query tokens included
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    window: int | None = None  # sliding window W: key j visible iff pos - j < W
    softcap: float | None = None  # logits soft-cap c: s -> c * tanh(s / c)
    alibi: str | None = None  # "linear" or "sqrt" (ALiBi-sqrt), slopes alibi_slopes()
    causal: bool = True  # False: every query sees all keys (cross-attention)
    sinks: bool = False  # one extra logit per query head (gpt-oss), sink_logits()
    # Encoder self-attention: no cache, the keys are the step's own K/V rows (ours
    # reads them as one-key pages, block_size 1; query_len == context).
    kv_from_step: bool = False
    # A prefill batch of sequences of different lengths, "q/kv+q/kv+..." (a step of
    # chunked serving: ``serving_steps``); batch, query_len and context are then
    # its count and largest lengths, which the launches take as their maxima.
    seqs: str | None = None


def seq_lengths(s: Shape) -> list[tuple[int, int]]:
    """``(query_len, kv_len)`` of each sequence of ``s``."""
    if s.seqs is None:
        return [(s.query_len, s.context)] * s.batch
    return [tuple(map(int, seq.split("/"))) for seq in s.seqs.split("+")]


def mixed_fields(seqs: list[tuple[int, int]]) -> dict:
    """The Shape fields of a batch of sequences of these ``(query_len, kv_len)``."""
    return dict(
        batch=len(seqs),
        query_len=max(q for q, _ in seqs),
        context=max(kv for _, kv in seqs),
        seqs="+".join(f"{q}/{kv}" for q, kv in seqs),
    )


# Page sizes of --decode-batches (vLLM's default on CUDA, and the H200 tables' 64).
DECODE_BATCH_PAGES = (16, 64)


def sweep(args) -> list[Shape]:
    shapes = []
    if args.tiny:
        for batch, ctx, (hq, hk, d), bs in TINY["decode"]:
            shapes.append(Shape("decode", "tiny", batch, 1, ctx, hq, hk, d, bs))
        for batch, q, ctx, (hq, hk, d), bs in TINY["prefill"]:
            shapes.append(Shape("prefill", "tiny", batch, q, ctx, hq, hk, d, bs))
        return shapes
    if args.native:
        return [
            Shape(kernel, model, b, q, ctx, *heads,
                  1 if extra.get("kv_from_step") else NATIVE_BLOCK_SIZE, **extra)
            for kernel, model, b, q, ctx, heads, extra in NATIVE_POINTS
        ]  # fmt: skip
    if args.decode_batches:
        # One decode context over many batch sizes: how the grid meets the SMs
        # (wave quantisation) shows as a saw-tooth in time per sequence.
        heads, ctx = MODELS["llama-3.1-8b"], args.decode_context
        return [
            Shape("decode", "llama-3.1-8b", b, 1, ctx, *heads, bs, kv_dtype=kv)
            for kv in ("bfloat16", "float8_e4m3fn")
            for bs in DECODE_BATCH_PAGES
            for b in args.decode_batches
        ]
    if args.quick:
        for m, bs, b, c in QUICK["decode"]:
            shapes.append(Shape("decode", m, b, 1, c, *MODELS[m], bs))
        for m, bs, b, q, c in QUICK["prefill"]:
            shapes.append(Shape("prefill", m, b, q, c, *MODELS[m], bs))
        for m, bs, b, c in QUICK["fp8"]:
            shapes.append(
                Shape("decode", m, b, 1, c, *MODELS[m], bs, kv_dtype="float8_e4m3fn")
            )
        return shapes
    for m, heads in MODELS.items():
        for bs in BLOCK_SIZES:
            for b, c in DECODE_POINTS:
                shapes.append(Shape("decode", m, b, 1, c, *heads, bs))
            for b, q, c in PREFILL_POINTS:
                shapes.append(Shape("prefill", m, b, q, c, *heads, bs))
    heads = MODELS["llama-3.1-8b"]
    for b, c in FP8_DECODE_POINTS:
        shapes.append(
            Shape("decode", "llama-3.1-8b", b, 1, c, *heads, 64,
                  kv_dtype="float8_e4m3fn")
        )  # fmt: skip
    for b, q, c in FP8_PREFILL_POINTS:
        shapes.append(
            Shape("prefill", "llama-3.1-8b", b, q, c, *heads, 64,
                  kv_dtype="float8_e4m3fn")
        )  # fmt: skip
    return shapes


def _matrix_shape(kernel, group, head, block, kv_dtype, length, window=None, cap=None):
    """``length``: (batch, q_len, kv_len) of a prefill, (batch, kv_len) of a
    decode, or a list of (q_len, kv_len), one per sequence (a mixed prefill)."""
    if isinstance(length, list):
        lengths = mixed_fields(length)
    elif kernel == "prefill":
        lengths = dict(zip(("batch", "query_len", "context"), length))
    else:
        lengths = dict(batch=length[0], query_len=1, context=length[1])
    name = f"g{group}-d{head}" + (f"-w{window}" if window else "")
    name += f"-cap{cap:g}" if cap else ""
    return Shape(kernel=kernel, model=name, num_q_heads=group * MATRIX_KV_HEADS,
                 num_kv_heads=MATRIX_KV_HEADS, head_size=head, block_size=block,
                 kv_dtype=kv_dtype, window=window, softcap=cap,
                 **lengths)  # fmt: skip


def matrix_shapes(
    kernels=("prefill", "decode"),
    groups=MATRIX_GROUPS,
    head_sizes=MATRIX_HEAD_SIZES,
    block_sizes=None,
    kv_dtypes=MATRIX_KV_DTYPES,
) -> list[Shape]:
    """The --matrix full points (CORE, SWEEP, FEATURE parts; duplicates dropped),
    restricted to the given kernels, groups, head sizes, page sizes, KV dtypes."""
    shapes: dict[tuple, Shape] = {}

    def add(kernel, group, head, block, kv, length, window=None, cap=None):
        s = _matrix_shape(kernel, group, head, block, kv, length, window, cap)
        keep = (
            group in groups
            and head in head_sizes
            and kv in kv_dtypes
            and (block_sizes is None or block in block_sizes)
        )
        if keep:
            shapes.setdefault(shape_key(s), s)

    sweeps = {
        "prefill": MATRIX_PREFILL_FRESH + MATRIX_PREFILL_CHUNKED,
        "decode": MATRIX_DECODE,
    }
    for kernel in ("prefill", "decode"):
        if kernel not in kernels:
            continue
        blocks = MATRIX_BLOCK_SIZES[kernel]
        for group, head, kv in itertools.product(
            MATRIX_GROUPS, MATRIX_HEAD_SIZES, MATRIX_KV_DTYPES
        ):
            fp8 = kv.startswith("float8")
            for block in MATRIX_FP8_CORE_BLOCK_SIZES if fp8 else blocks:
                for length in MATRIX_CORE[kernel]:
                    add(kernel, group, head, block, kv, length)
        for (group, head), kv, block in itertools.product(
            MATRIX_SWEEP_SHAPES, MATRIX_KV_DTYPES, blocks
        ):
            for length in sweeps[kernel]:
                add(kernel, group, head, block, kv, length)
            if kernel == "prefill" and block == SERVING_BLOCK_SIZE:
                for length in MATRIX_PREFILL_SERVING:
                    add(kernel, group, head, block, kv, length)
                for step in MATRIX_SERVING_STEPS:
                    add(kernel, group, head, block, kv, step)
        for (group, head, window, cap), kv, block in itertools.product(
            MATRIX_FEATURES, MATRIX_KV_DTYPES, blocks
        ):
            for length in MATRIX_FEATURE_LENGTHS[kernel]:
                add(kernel, group, head, block, kv, length, window, cap)
    return list(shapes.values())


# The fields that name a point of the matrix (a record's, a Shape's alike).
KEY_FIELDS = (
    "kernel", "dtype", "kv_cache_dtype", "group", "head_size", "block_size",
    "q_len", "kv_len", "batch", "seqs", "window", "softcap",
)  # fmt: skip


def shape_key(s: Shape) -> tuple:
    return (s.kernel, s.dtype, s.kv_dtype, s.num_q_heads // s.num_kv_heads,
            s.head_size, s.block_size, s.query_len, s.context, s.batch, s.seqs,
            s.window, None if s.softcap is None else float(s.softcap))  # fmt: skip


def record_key(r: dict) -> tuple:
    key = tuple(r.get(f) for f in KEY_FIELDS)
    return key[:-1] + (None if key[-1] is None else float(key[-1]),)


# ----------------------------------------------------------------------------------
# Work formulas
# ----------------------------------------------------------------------------------


def _elem_bytes(dtype_name: str) -> int:
    return 1 if dtype_name.startswith("float8") else 2


def _sum_min(first: int, last: int, cap: int | None) -> int:
    """sum of min(n, cap) for n = first..last (cap None: no cap)."""
    if cap is None or last <= cap:
        return (first + last) * (last - first + 1) // 2
    if first > cap:
        return cap * (last - first + 1)
    return (first + cap) * (cap - first + 1) // 2 + cap * (last - cap)


def decode_bytes(s: Shape) -> float:
    keys = s.context if s.window is None else min(s.context, s.window)
    kv = s.batch * keys * s.num_kv_heads * s.head_size * 2 * _elem_bytes(s.kv_dtype)
    q_and_out = 2 * s.batch * s.num_q_heads * s.head_size * _elem_bytes(s.dtype)
    return float(kv + q_and_out)


def prefill_flops(s: Shape) -> float:
    """Causally visible (query, key) pairs (at most W per query with a window W);
    every pair when not causal; summed over the sequences."""
    visible = 0
    for query_len, context in seq_lengths(s):
        if s.causal:
            visible += _sum_min(context - query_len + 1, context, s.window)
        else:
            visible += query_len * context
    return 4.0 * s.head_size * s.num_q_heads * visible


def throughput(s: Shape, us: float | None) -> float | None:
    if us is None:
        return None
    if s.kernel == "decode":
        return decode_bytes(s) / (us * 1e-6) / 1e9  # GB/s
    return prefill_flops(s) / (us * 1e-6) / 1e12  # TFLOP/s


# ----------------------------------------------------------------------------------
# Inputs (built once per shape, shared by all callers)
# ----------------------------------------------------------------------------------


@dataclass
class Inputs:
    query: torch.Tensor  # [tokens, Hq, d]
    kv_cache: torch.Tensor  # [blocks, 2, Hkv, bs, d] (ours)
    block_tables: list  # num_sets x [batch, pages_per_seq] int32
    seq_lens: torch.Tensor  # [batch] int32
    query_start_loc: torch.Tensor  # [batch + 1] int32
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    softmax_scale: float
    _nhd: tuple | None = field(default=None, repr=False)

    @property
    def num_sets(self) -> int:
        return len(self.block_tables)

    def nhd_caches(self):
        """K and V as [blocks, bs, Hkv, d] (FA3 / stock vLLM layout), built once."""
        if self._nhd is None:
            k = self.kv_cache[:, 0].permute(0, 2, 1, 3).contiguous()
            v = self.kv_cache[:, 1].permute(0, 2, 1, 3).contiguous()
            self._nhd = (k, v)
        return self._nhd


def build_inputs(s: Shape, device: str, rotate: bool) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(0)
    pages = math.ceil(s.context / s.block_size)
    set_bytes = decode_bytes(s) if s.kernel == "decode" else 0
    num_sets = 1
    if rotate and s.kernel == "decode":
        num_sets = max(1, min(MAX_SETS, math.ceil(2 * H200_L2_BYTES / set_bytes)))
    num_blocks = num_sets * s.batch * pages
    q_dtype = getattr(torch, s.dtype)
    kv_dtype = getattr(torch, s.kv_dtype)
    shape = (num_blocks, 2, s.num_kv_heads, s.block_size, s.head_size)
    kv_cache = torch.empty(shape, dtype=kv_dtype, device=device)
    k_scale = v_scale = None
    if kv_dtype.itemsize == 1:
        k_scale = torch.tensor([0.03], device=device)
        v_scale = torch.tensor([0.02], device=device)
    chunk = max(1, (1 << 28) // math.prod(shape[1:]))  # ~256M elements at a time
    for start in range(0, num_blocks, chunk):
        part = torch.randn(
            (min(chunk, num_blocks - start), *shape[1:]), device=device, generator=gen
        )
        if k_scale is not None:
            part[:, 0] /= k_scale
            part[:, 1] /= v_scale
        kv_cache[start : start + part.shape[0]] = part.to(kv_dtype)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    if s.kv_from_step:  # the step's rows in order: request r's keys follow its start
        perm = torch.arange(num_blocks, device=device, dtype=torch.int32)
    tables = list(perm.view(num_sets, s.batch, pages).unbind(0))
    lengths = seq_lengths(s)
    starts = [0, *itertools.accumulate(q for q, _ in lengths)]
    tokens = starts[-1]
    query = torch.randn(
        (tokens, s.num_q_heads, s.head_size), device=device, generator=gen
    ).to(q_dtype)
    return Inputs(
        query=query,
        kv_cache=kv_cache,
        block_tables=[t.contiguous() for t in tables],
        seq_lens=torch.tensor(
            [kv for _, kv in lengths], dtype=torch.int32, device=device
        ),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        k_scale=k_scale,
        v_scale=v_scale,
        softmax_scale=1.0 / math.sqrt(s.head_size),
    )


# ----------------------------------------------------------------------------------
# Callers: caller(shape, inputs) -> Runner; run(i) launches on input set i.
# ----------------------------------------------------------------------------------


@dataclass
class Runner:
    run: Callable[[int], None]
    output: torch.Tensor
    note: str = ""


class Skip(Exception):
    """A caller that cannot run this point; the message says why."""


def caller_ours(
    s: Shape,
    inp: Inputs,
    *,
    decode_config=None,
    decode_max_splits=None,
    decode_programs_per_sm=None,
    decode_wave_fields=None,
    decode_num_splits=None,
    decode_config_fields=None,
    prefill_num_splits=None,
    prefill_config_fields=None,
) -> Runner:
    """Our kernels; ``decode_config`` overrides the decode tuning table (the decode
    tuner's candidates), ``decode_max_splits`` the split cap, ``decode_num_splits``
    forces a split count instead of ``choose_decode_splits``',
    ``decode_wave_fields`` (a dict) replaces fields of its ``WaveRule``, and
    ``decode_config_fields`` (a dict) replaces fields of the config the launch
    would pick (``config_for``: its table entry or the heuristic). Prefill gets the
    sequences' KV length as ``max_seq_len``, as in the backend, so it splits its keys
    where ``choose_decode_splits`` says; ``prefill_num_splits`` forces a count, and
    ``prefill_config_fields`` (a dict) replaces fields of the config the launch
    would pick (its table entry or the heuristic)."""
    out = torch.empty_like(inp.query)
    key_cache, value_cache = inp.kv_cache[:, 0], inp.kv_cache[:, 1]
    slopes = alibi_slopes(s, inp.query.device)
    sinks = sink_logits(s, inp.query.device)
    if s.kernel == "decode":
        if decode_programs_per_sm is None:  # the backend's rule
            wave = ops.decode_wave_rule(
                kv_dtype=key_cache.dtype, device=inp.query.device
            )
        elif decode_programs_per_sm:
            wave = ops.WaveRule(programs_per_sm=decode_programs_per_sm)
        else:
            wave = None
        if decode_wave_fields:
            if wave is None:
                raise Skip("--decode-wave-rule: this launch has no WaveRule to "
                           "change; give --decode-programs-per-sm N")  # fmt: skip
            wave = replace(wave, **decode_wave_fields)
        splits = decode_num_splits or ops.choose_decode_splits(
            num_seqs=s.batch,
            num_kv_heads=s.num_kv_heads,
            num_sms=ops.hardware.num_sms(inp.query.device),
            max_splits=decode_max_splits or ops.MAX_DECODE_SPLITS,
            wave=wave,
        )
        workspace = torch.empty(
            ops.decode_workspace_shape(
                max_num_seqs=s.batch,
                num_q_heads=s.num_q_heads,
                head_size=s.head_size,
                num_splits=splits,
            ),
            dtype=ops.WORKSPACE_DTYPE,
            device=inp.query.device,
        )

        note = f"splits={splits} ({'forced' if decode_num_splits else 'auto'})"
        if decode_config_fields:
            picked = decode_config or ops.config_for(
                ops.AttentionInputs(
                    query=inp.query, key_cache=key_cache, value_cache=value_cache,
                    output=out, block_table=inp.block_tables[0],
                    seq_lens=inp.seq_lens, softmax_scale=inp.softmax_scale,
                ),
                splits,
            )  # fmt: skip
            decode_config = replace(picked, **decode_config_fields)
            note += f"; config {decode_config}"

        def run(i):
            ops.paged_decode_attention(
                query=inp.query,
                key_cache=key_cache,
                value_cache=value_cache,
                output=out,
                block_table=inp.block_tables[i],
                seq_lens=inp.seq_lens,
                softmax_scale=inp.softmax_scale,
                k_scale=inp.k_scale,
                v_scale=inp.v_scale,
                num_splits=splits,
                workspace=workspace,
                config=decode_config,
                sliding_window=s.window,
                logits_soft_cap=s.softcap,
                alibi_slopes=slopes,
                alibi_sqrt=s.alibi == "sqrt",
                sinks=sinks,
            )

        return Runner(run, out, note=note)

    pp = ops.prefix_prefill
    features = {"sliding_window": s.window, "logits_soft_cap": s.softcap,
                "alibi_slopes": slopes, "causal": s.causal,
                "sinks": sinks}  # fmt: skip
    layer = pp.PrefillLayer.of(query=inp.query, key_cache=key_cache, **features)
    config = None
    if prefill_config_fields:
        config = pp.layer_config(layer, inp.query.device, s.query_len)
        config = replace(config, **prefill_config_fields)
    # Planned once, as the backend's builder plans a batch (config, kernel, split
    # count, a workspace view of a buffer allocated once); each timed call only
    # launches, as a layer's forward does.
    plan = pp.plan_prefill(
        layer=layer,
        device=inp.query.device,
        seq_start=0,
        num_seqs=s.batch,
        num_tokens=inp.query.shape[0],
        max_query_len=s.query_len,
        max_seq_len=s.context,
        config=config,  # None: the table entry or heuristic
        num_splits=prefill_num_splits,
        # The builder's buffer for automatic splits; a forced count gets its own.
        workspace=None
        if prefill_num_splits
        else torch.empty(
            pp.split_workspace_bound(
                head_size=s.head_size, num_sms=ops.hardware.num_sms(inp.query.device)
            ),
            device=inp.query.device,
        ),
    )

    inputs = [
        pp.AttentionInputs(
            query=inp.query,
            key_cache=key_cache,
            value_cache=value_cache,
            output=out,
            block_table=block_table,
            query_start_loc=inp.query_start_loc,
            seq_lens=inp.seq_lens,
            softmax_scale=inp.softmax_scale,
            k_scale=inp.k_scale,
            v_scale=inp.v_scale,
            alibi_sqrt=s.alibi == "sqrt",
            **features,
        )
        for block_table in inp.block_tables
    ]

    def run(i):
        pp.launch_prefix_prefill(plan, inputs[i])

    mode = "auto" if prefill_num_splits is None else "forced"
    note = f"prefill_splits={plan.num_splits} ({mode}); kernel {plan.kernel}"
    if prefill_config_fields:
        note += f"; config {plan.config}"
    return Runner(run, out, note=note)


def stock_window(s: Shape) -> tuple[int, int]:
    """(left, right) of FA3 / stock vLLM: W keys visible = the query's own and the
    W - 1 before it; (-1, -1) is no window."""
    return (-1, -1) if s.window is None else (s.window - 1, 0)


def alibi_slopes(s: Shape, device) -> torch.Tensor | None:
    """ALiBi slopes of the shape's query heads (the usual geometric series,
    ``2 ** (-8 (h + 1) / num_q_heads)``), or None without ALiBi."""
    if s.alibi is None:
        return None
    heads = torch.arange(1, s.num_q_heads + 1, dtype=torch.float32, device=device)
    return torch.exp2(-8.0 * heads / s.num_q_heads)


def sink_logits(s: Shape, device) -> torch.Tensor | None:
    """bf16 sink logits of the shape's query heads, spread over [-2, 2] (the scale
    of the scores), or None without sinks. bf16 as vLLM holds them (the model's
    dtype) and as FA3 takes them (it rejects any other ``s_aux`` dtype); every
    caller and the reference read the same values."""
    if not s.sinks:
        return None
    return torch.linspace(-2.0, 2.0, s.num_q_heads, device=device).to(torch.bfloat16)


def step_kv(inp: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[tokens, kv_heads, head_size]`` of a ``kv_from_step`` point (its
    cache holds one-key pages in token order)."""
    return inp.kv_cache[:, 0, :, 0], inp.kv_cache[:, 1, :, 0]


def caller_fa3(s: Shape, inp: Inputs) -> Runner:
    if stock.flash_attn_varlen_func is None:
        raise Skip(stock.fa3_reason)
    if s.kv_from_step:  # as vLLM's FlashAttention backend runs encoder layers
        k, v = step_kv(inp)
        out = torch.empty_like(inp.query)

        def run_varlen(i):
            stock.flash_attn_varlen_func(
                q=inp.query, k=k, v=v, out=out,
                cu_seqlens_q=inp.query_start_loc, cu_seqlens_k=inp.query_start_loc,
                max_seqlen_q=s.query_len, max_seqlen_k=s.context,
                softmax_scale=inp.softmax_scale, causal=False, fa_version=3,
            )  # fmt: skip

        return Runner(run_varlen, out, note="no pages (encoder)")
    if s.alibi is not None:
        raise Skip("FA3 has no ALiBi")
    if s.kv_dtype == "float8_e5m2":
        raise Skip("FA3 reads e4m3 fp8 caches only")
    if s.head_size % 8:
        raise Skip("FA3 takes head sizes in multiples of 8")
    k, v = inp.nhd_caches()
    q, descales = inp.query, {}
    if inp.k_scale is not None:
        # As vLLM's FlashAttention backend with an fp8 cache: the attention layer
        # hands FA3 a query quantised to the cache's format (here once, outside the
        # timing, with a per-tensor scale from its largest value), and per-(sequence,
        # KV head) descales of q, K and V.
        fp8 = k.dtype
        q_scale = (inp.query.float().abs().amax() / torch.finfo(fp8).max).reshape(1)
        q = (inp.query.float() / q_scale).to(fp8)
        shape = (s.batch, s.num_kv_heads)
        descales = {
            "q_descale": q_scale.expand(shape),
            "k_descale": inp.k_scale.expand(shape),
            "v_descale": inp.v_scale.expand(shape),
        }
    out = torch.empty_like(inp.query)
    # FA3's sinks argument, passed only with sinks (as vLLM's FlashAttention backend).
    sinks = {} if not s.sinks else {"s_aux": sink_logits(s, inp.query.device)}

    def run(i):
        stock.flash_attn_varlen_func(
            q=q,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=inp.query_start_loc,
            max_seqlen_q=s.query_len,
            seqused_k=inp.seq_lens,
            max_seqlen_k=s.context,
            softmax_scale=inp.softmax_scale,
            causal=s.causal,
            block_table=inp.block_tables[i],
            window_size=stock_window(s),
            softcap=s.softcap or 0.0,
            fa_version=3,
            **descales,
            **sinks,
        )

    return Runner(run, out, note="num_splits=0 (FA3 heuristic)")


def caller_stock_triton(s: Shape, inp: Inputs) -> Runner:
    if stock.unified_attention is None:
        raise Skip(stock.triton_reason)
    if s.kv_from_step:  # as stock's Triton backend runs encoder layers
        k, v = step_kv(inp)
        out = torch.empty_like(inp.query)

        def run_encoder(i):
            stock.context_attention_fwd(
                q=inp.query, k=k, v=v, o=out, b_start_loc=inp.query_start_loc,
                b_seq_len=inp.seq_lens, max_input_len=s.query_len, is_causal=False,
                softmax_scale=inp.softmax_scale, sliding_window_q=-1,
                sliding_window_k=-1,
            )  # fmt: skip

        return Runner(run_encoder, out, note="context_attention_fwd (encoder)")
    k, v = inp.nhd_caches()
    if inp.k_scale is not None:
        k, v = k.view(getattr(torch, s.kv_dtype)), v.view(getattr(torch, s.kv_dtype))
    out = torch.empty_like(inp.query)
    descale = (s.batch, s.num_kv_heads)
    k_descale = inp.k_scale.expand(descale) if inp.k_scale is not None else None
    v_descale = inp.v_scale.expand(descale) if inp.v_scale is not None else None
    # As stock's TritonAttentionMetadataBuilder: 3D (split) decode below a batch
    # threshold, with 16 segments and buffers allocated once.
    threshold = stock.MIN_LAUNCH_GRID_SIZE_2D // s.num_kv_heads
    segments = stock.NUM_PAR_SOFTMAX_SEGMENTS
    dev = inp.query.device
    d_pad = 1 << (s.head_size - 1).bit_length()
    segm_out = torch.empty(
        (threshold, s.num_q_heads, segments, d_pad), dtype=torch.float32, device=dev
    )
    segm_max = torch.empty(
        (threshold, s.num_q_heads, segments), dtype=torch.float32, device=dev
    )
    segm_sum = torch.empty_like(segm_max)
    # Per-tensor fp8 must be requested explicitly (NONE would skip the scales).
    quant_mode = stock.KVQuantMode.NONE
    if inp.k_scale is not None:
        quant_mode = stock.KVQuantMode.FP8_PER_TENSOR

    slopes = alibi_slopes(s, inp.query.device)
    sinks = sink_logits(s, inp.query.device)

    def run(i):
        stock.unified_attention(
            q=inp.query,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=inp.query_start_loc,
            max_seqlen_q=s.query_len,
            seqused_k=inp.seq_lens,
            max_seqlen_k=s.context,
            softmax_scale=inp.softmax_scale,
            causal=s.causal,
            alibi_slopes=slopes,
            use_alibi_sqrt=s.alibi == "sqrt",
            window_size=stock_window(s),
            block_table=inp.block_tables[i],
            softcap=s.softcap or 0.0,
            q_descale=None,
            k_descale=k_descale,
            v_descale=v_descale,
            seq_threshold_3D=threshold,
            num_par_softmax_segments=segments,
            softmax_segm_output=segm_out,
            softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_sum,
            kv_quant_mode=quant_mode,
            sinks=sinks,
        )

    return Runner(run, out, note=f"3D below {threshold} seqs")


CALLERS = {"ours": caller_ours, "fa3": caller_fa3, "stock_triton": caller_stock_triton}
STOCK_CALLERS = ("fa3", "stock_triton")
# Largest |ours - reference| a point may show before the run warns (and the decode
# tuner rejects a config).
MAX_ABS_ERR = 0.05


# ----------------------------------------------------------------------------------
# Correctness and timing
# ----------------------------------------------------------------------------------


def reference_rows(s: Shape, inp: Inputs) -> list[tuple[slice, torch.Tensor]]:
    """fp32 reference for the checked rows of input set 0: all decode rows of up to
    8 sequences (first and last 4); for prefill the last <= 256 query rows of those
    sequences (same positions as in the full problem; keeps the fp32 reference's
    score matrix small)."""
    seqs = sorted({*range(min(4, s.batch)), *range(max(0, s.batch - 4), s.batch)})
    if s.kernel == "prefill":
        seqs = sorted({0, s.batch - 1})
    lengths = seq_lengths(s)
    checked = []
    for seq in seqs:
        end = sum(q for q, _ in lengths[: seq + 1])
        rows = min(lengths[seq][0], 256)
        ref = ops.ref_paged_attention(
            query=inp.query[end - rows : end],
            key_cache=inp.kv_cache[:, 0],
            value_cache=inp.kv_cache[:, 1],
            block_table=inp.block_tables[0][seq : seq + 1],
            query_start_loc=torch.tensor([0, rows], device=inp.query.device),
            seq_lens=inp.seq_lens[seq : seq + 1],
            softmax_scale=inp.softmax_scale,
            k_scale=None if inp.k_scale is None else inp.k_scale.item(),
            v_scale=None if inp.v_scale is None else inp.v_scale.item(),
            sliding_window=s.window,
            logits_soft_cap=s.softcap,
            alibi_slopes=alibi_slopes(s, inp.query.device),
            alibi_sqrt=s.alibi == "sqrt",
            sinks=sink_logits(s, inp.query.device),
            causal=s.causal,
        )
        checked.append((slice(end - rows, end), ref))
    return checked


def max_abs_err(out: torch.Tensor, checked) -> float:
    """Largest |out - ref| over the checked rows (inf if any is NaN)."""
    worst = 0.0
    for rows, ref in checked:
        err = (out[rows].float() - ref).abs().max().item()
        worst = max(worst, err if math.isfinite(err) else math.inf)
    return worst


def rms_err(out: torch.Tensor, checked) -> float:
    """Root mean square of out - ref over the checked rows: beside the largest
    error, which one unlucky row decides, the error of a typical output."""
    total, count = 0.0, 0
    for rows, ref in checked:
        diff = out[rows].float() - ref
        total += diff.square().sum().item()
        count += diff.numel()
    return math.sqrt(total / count) if count else 0.0


def time_us(runner: Runner, num_sets: int) -> tuple[float, str]:
    """Median microseconds of one call (averaged over a pass over all sets)."""

    def all_sets():
        for i in range(num_sets):
            runner.run(i)

    all_sets()
    torch.cuda.synchronize()
    try:
        ms = triton.testing.do_bench_cudagraph(all_sets, rep=100, return_mode="median")
        method = "cuda_graph"
    except Exception as exc:  # any capture failure: fall back
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(all_sets, warmup=25, rep=100, return_mode="median")
        method = f"do_bench (graph capture failed: {type(exc).__name__})"
    return ms * 1e3 / num_sets, method


def measure_point(s: Shape, args) -> dict:
    inp = build_inputs(s, "cuda", rotate=True)
    record = {**asdict(s), "num_sets": inp.num_sets}
    record["unit"] = "GB/s" if s.kernel == "decode" else "TFLOP/s"
    record["work"] = decode_bytes(s) if s.kernel == "decode" else prefill_flops(s)
    record["max_abs_err"], record["rms_err"] = {}, {}
    record["time_us"], record["notes"] = {}, {}
    checked = None  # reference rows, computed once per point
    for name, caller in CALLERS.items():
        try:
            if name not in args.callers:
                raise Skip("not in --callers")
            if name == "ours":
                runner = caller(
                    s,
                    inp,
                    decode_max_splits=args.decode_max_splits,
                    decode_programs_per_sm=args.decode_programs_per_sm,
                    decode_wave_fields=args.decode_wave_rule,
                    decode_num_splits=args.decode_num_splits,
                    decode_config_fields=args.decode_config,
                    prefill_num_splits=args.prefill_num_splits,
                    prefill_config_fields=args.prefill_config,
                )
            else:
                runner = caller(s, inp)
            runner.run(0)
            torch.cuda.synchronize()
            if checked is None:
                checked = reference_rows(s, inp)
            record["max_abs_err"][name] = max_abs_err(runner.output, checked)
            record["rms_err"][name] = rms_err(runner.output, checked)
            us, method = time_us(runner, inp.num_sets)
            record["time_us"][name] = us
            record["notes"][name] = f"{runner.note}; {method}".strip("; ")
        except Skip as why:
            record["time_us"][name] = None
            record["notes"][name] = f"skipped: {why}"
        except Exception as exc:  # keep the sweep going; recorded
            record["time_us"][name] = None
            record["notes"][name] = f"failed: {type(exc).__name__}: {exc}"[:300]
        record[name] = throughput(s, record["time_us"].get(name))
    for other in ("fa3", "stock_triton"):
        a, b = record.get("ours"), record.get(other)
        record[f"ratio_vs_{other}"] = a / b if a and b else None
    _flat_fields(s, record)
    del inp
    torch.cuda.empty_cache()
    return record


def _flat_fields(s: Shape, record: dict) -> None:
    """The matrix's flat names of a point and its results: KEY_FIELDS,
    <caller>_us, tflops (prefill) or gbps (decode) of ours, and for every missing
    time or ratio the reason (``<field>_reason``)."""
    record.update(
        kv_cache_dtype=s.kv_dtype,
        group=s.num_q_heads // s.num_kv_heads,
        q_len=s.query_len,
        kv_len=s.context,
        seqs=s.seqs,
    )
    for name in CALLERS:
        us = record["time_us"].get(name)
        record[f"{name}_us"] = us
        if us is None:
            record[f"{name}_us_reason"] = record["notes"].get(name, "not run")
    record["tflops" if s.kernel == "prefill" else "gbps"] = record.get("ours")
    for other in STOCK_CALLERS:
        if record.get(f"ratio_vs_{other}") is None:
            missing = [c for c in ("ours", other) if record.get(f"{c}_us") is None]
            record[f"ratio_vs_{other}_reason"] = (
                "; ".join(f"{c}: {record['notes'].get(c, 'not run')}" for c in missing)
                or "no throughput"
            )


def failed_point_record(s: Shape, exc: BaseException) -> dict:
    """Record of a point whose inputs could not even be built (e.g. out of memory):
    every caller failed, with the reason."""
    why = f"failed: {type(exc).__name__}: {exc}"[:300]
    record = {**asdict(s), "num_sets": None, "max_abs_err": {}}
    record["unit"] = "GB/s" if s.kernel == "decode" else "TFLOP/s"
    record["time_us"] = dict.fromkeys(CALLERS)
    record["notes"] = dict.fromkeys(CALLERS, why)
    for name in CALLERS:
        record[name] = None
    record["ratio_vs_fa3"] = record["ratio_vs_stock_triton"] = None
    _flat_fields(s, record)
    return record


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of a 4 GB buffer; bytes counted = read + written."""
    n = 4 * 2**30 // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * 4 * 2**30 / (ms * 1e-3) / 1e9


# ----------------------------------------------------------------------------------
# Imports, environment, output
# ----------------------------------------------------------------------------------


class _Namespace:
    pass


ops = _Namespace()  # our kernels + reference
stock = _Namespace()  # stock vLLM callables (None when unavailable, with a reason)


def _import_stock(files: dict) -> None:
    """FA3 and stock vLLM's Triton kernel, from the stock install (when found)."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func, is_fa_version_supported

        if is_fa_version_supported(3):
            stock.flash_attn_varlen_func = flash_attn_varlen_func
            files["fa3"] = sys.modules[flash_attn_varlen_func.__module__].__file__
        else:
            stock.fa3_reason = "FA3 not supported on this GPU/build"
    except Exception as exc:  # no FA3 is a skip, not an error
        stock.fa3_reason = f"import failed: {type(exc).__name__}: {exc}"[:200]
    try:
        from vllm.v1.attention.backends import triton_attn
        from vllm.v1.attention.ops.triton_prefill_attention import (
            context_attention_fwd,
        )
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        from vllm.v1.kv_cache_interface import KVQuantMode

        stock.unified_attention = unified_attention
        stock.context_attention_fwd = context_attention_fwd
        stock.KVQuantMode = KVQuantMode
        stock.MIN_LAUNCH_GRID_SIZE_2D = triton_attn.MIN_LAUNCH_GRID_SIZE_2D
        stock.NUM_PAR_SOFTMAX_SEGMENTS = triton_attn.NUM_PAR_SOFTMAX_SEGMENTS
        files["stock_triton"] = sys.modules[unified_attention.__module__].__file__
    except Exception as exc:  # no stock kernel is a skip
        stock.triton_reason = f"import failed: {type(exc).__name__}: {exc}"[:200]
    for name, reason in (
        ("fa3", stock.fa3_reason),
        ("stock_triton", stock.triton_reason),
    ):
        if name not in files:
            print(f"note: {name} skipped: {reason}")


def import_modules(stock_site: str | None) -> dict:
    """Import stock (from ``stock_site``, when given), then ours (from the checkout);
    return the file each module came from. Stock modules are imported first, before
    the checkout joins ``vllm.__path__``, so no file of the checkout can shadow them.
    Call it before anything imports ``vllm``."""
    stock.fa3_reason = stock.triton_reason = "no --stock-site given"
    stock.flash_attn_varlen_func = stock.unified_attention = None
    files = {}
    sys.path.insert(0, str(REPO))  # benchmarks.harness; the checkout's vllm/
    if stock_site is not None:
        sys.path.insert(0, stock_site)
    import vllm

    files["vllm"] = getattr(vllm, "__file__", None)
    site = os.path.realpath(stock_site) if stock_site is not None else None
    if site is not None and not os.path.realpath(torch.__file__).startswith(site):
        # torch (imported above) is not the stock install's: its Triton is what
        # runs every kernel here, and stock's compiled extensions built for its
        # own torch may not load (torchvision's ops, which stock's Triton
        # backend imports).
        print(
            f"note: torch {torch.__version__} and Triton {triton.__version__} come "
            f"from {os.path.dirname(os.path.dirname(torch.__file__))}, not from "
            f"--stock-site {stock_site}: the kernels run on them. To time the "
            f"stock install's stack, run with PYTHONPATH={stock_site}."
        )
    if stock_site is not None and files["vllm"]:  # stock vLLM (a regular package)
        _import_stock(files)
        vllm.__path__.insert(0, str(REPO / "vllm"))
    elif stock_site is not None:
        stock.fa3_reason = stock.triton_reason = (
            f"stock vLLM not found at --stock-site {stock_site}"
        )
    return {**files, **import_ours()}


def import_ours() -> dict:
    """Put our kernels and the reference on ``ops`` (from whatever ``vllm`` resolves
    to: the checkout, once ``import_modules`` joined it); return their files."""
    from vllm.attention.ops import hardware, prefix_prefill
    from vllm.attention.ops import triton_paged_decode_attention_2d as dec
    from vllm.attention.ops.prefix_prefill import prefix_prefill_attention
    from vllm.attention.ops.reference import ref_paged_attention

    for name in ("choose_decode_splits", "decode_workspace_shape", "WORKSPACE_DTYPE",
                 "paged_decode_attention", "MAX_DECODE_SPLITS",
                 "decode_wave_rule", "WaveRule", "config_for", "AttentionInputs",
                 "DecodeConfig"):  # fmt: skip
        setattr(ops, name, getattr(dec, name))
    ops.hardware = hardware
    ops.prefix_prefill_attention = prefix_prefill_attention
    ops.prefix_prefill = prefix_prefill
    ops.ref_paged_attention = ref_paged_attention
    return {
        "ours_decode": dec.__file__,
        "ours_prefill": sys.modules[prefix_prefill_attention.__module__].__file__,
    }


def environment(args, files) -> dict:
    import vllm
    from benchmarks.harness import git_commit, gpu_info

    return {
        # As given (--commit, else $BENCH_COMMIT); else this checkout's HEAD,
        # "-dirty" with uncommitted changes.
        "commit": args.commit or git_commit(),
        "gpu": torch.cuda.get_device_name(),
        "driver": gpu_info()["driver"],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm": getattr(vllm, "__version__", None),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "stock_vllm": getattr(vllm, "__version__", None),
            "cuda": torch.version.cuda,
        },
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "modules": files,
    }


def print_table(records: list[dict]) -> None:
    head = (
        f"{'kernel':7} {'model':18} {'bs':>3} {'batch':>5} {'q':>5} {'ctx':>6} "
        f"{'kv':5} {'unit':7} {'ours':>8} {'fa3':>8} {'stock':>8} "
        f"{'/fa3':>5} {'/stock':>6} {'err':>8}"
    )
    print(head)
    print("-" * len(head))

    def f(x, w, p=1):
        return f"{x:>{w}.{p}f}" if isinstance(x, float) else f"{'-':>{w}}"

    for r in records:
        err = r["max_abs_err"].get("ours")
        print(
            f"{r['kernel']:7} {r['model'][:18]:18} {r['block_size']:>3} "
            f"{r['batch']:>5} {r['query_len']:>5} {r['context']:>6} "
            f"{'fp8' if 'float8' in r['kv_dtype'] else 'bf16':5} {r['unit']:7} "
            f"{f(r.get('ours'), 8)} {f(r.get('fa3'), 8)} "
            f"{f(r.get('stock_triton'), 8)} {f(r['ratio_vs_fa3'], 5, 2)} "
            f"{f(r['ratio_vs_stock_triton'], 6, 2)} {f(err, 8, 4)}"
        )


# ----------------------------------------------------------------------------------
# The matrix: resumable run, summary
# ----------------------------------------------------------------------------------


def point_done(record: dict) -> bool:
    """A finished point: no caller failed (a skip is final, a failure is retried)."""
    return not any(
        str(note).startswith("failed") for note in record.get("notes", {}).values()
    )


def load_matrix(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def write_json_atomic(path: Path, body: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    os.replace(tmp, path)


def run_matrix(shapes: list[Shape], args, path: Path, header: dict, measure) -> int:
    """Measure the points of ``shapes`` not yet finished in ``path`` (at most
    ``args.max_points``), rewriting the file after each, and return how many were
    measured. ``header`` holds the file-level fields (commit, gpu, ...) of this run;
    a file of another commit or GPU is refused (its points are not comparable).
    ``measure(shape, args) -> record``."""
    body = load_matrix(path)
    if body is None:
        body = {**header, "runs": [], "records": []}
    else:
        for field in ("commit", "gpu"):
            if body.get(field) != header.get(field):
                sys.exit(
                    f"{path} holds {field} {body.get(field)!r}, this run is "
                    f"{header.get(field)!r}: pass another --out to start a new file"
                )
    body["runs"].append(
        {k: header.get(k) for k in ("command", "date", "driver", "versions")}
    )
    index = {record_key(r): i for i, r in enumerate(body["records"])}
    done = {k for k, i in index.items() if point_done(body["records"][i])}
    todo = [s for s in shapes if shape_key(s) not in done]
    print(
        f"{path}: {len(shapes)} points selected, {len(shapes) - len(todo)} already "
        f"done, {len(todo)} to measure"
        + (f" (at most {args.max_points} now)" if args.max_points else "")
    )
    if args.max_points:
        todo = todo[: args.max_points]
    start = time.time()
    write_json_atomic(path, body)
    for n, s in enumerate(todo):
        try:
            record = measure(s, args)
        except Exception as exc:  # e.g. the inputs do not fit: recorded, retried
            record = failed_point_record(s, exc)
        key = shape_key(s)
        if key in index:
            body["records"][index[key]] = record
        else:
            index[key] = len(body["records"])
            body["records"].append(record)
        write_json_atomic(path, body)
        cells = ", ".join(
            f"{c}={record[f'{c}_us']:.1f}us"
            if record[f"{c}_us"] is not None
            else f"{c}: {record['notes'][c]}"[:80]
            for c in CALLERS
        )
        print(
            f"[{n + 1}/{len(todo)} {time.time() - start:.0f}s] {s.kernel} {s.model} "
            f"{s.kv_dtype} bs={s.block_size} batch={s.batch} q={s.query_len} "
            f"kv={s.context}{f' seqs={s.seqs}' if s.seqs else ''}: {cells}",
            flush=True,
        )
        if not sticky_device_ok():
            sys.exit(f"the device is in an error state; rerun to resume ({path})")
    return len(todo)


def sticky_device_ok() -> bool:
    """False when the CUDA context is broken (every later point would fail)."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


def _ratio_stats(rows: list[dict], field: str) -> dict:
    rated = [r for r in rows if r.get(field) is not None]
    values = [r[field] for r in rated]
    worst = min(rated, key=lambda r: r[field]) if rated else None
    return {
        "points": len(rows),
        "missing": len(rows) - len(values),
        "worst": min(values) if values else None,
        "median": statistics.median(values) if values else None,
        "worst_point": worst and _point_name(worst),
    }


def _point_name(r: dict) -> str:
    kv = "fp8" if "float8" in str(r.get("kv_cache_dtype", r.get("kv_dtype"))) else ""
    extra = "".join(
        f" {label}{r[f]:g}" for f, label in (("window", "w"), ("softcap", "cap"))
        if r.get(f)
    )  # fmt: skip
    return (
        f"g{_group(r)} d{r['head_size']} bs{r['block_size']} b{r['batch']} "
        f"q{r.get('q_len', r.get('query_len'))} kv{r.get('kv_len', r.get('context'))}"
        f"{' ' + kv if kv else ''}{extra}"
    )


def _flat_key_fields(r: dict) -> dict:
    """KEY_FIELDS of a record, also of one written before the matrix's names."""
    return {
        **r,
        "group": _group(r),
        "kv_cache_dtype": r.get("kv_cache_dtype", r.get("kv_dtype")),
        "q_len": r.get("q_len", r.get("query_len")),
        "kv_len": r.get("kv_len", r.get("context")),
    }


def _group(r: dict) -> int:
    return r.get("group") or r["num_q_heads"] // r["num_kv_heads"]


SUMMARY_BY = {
    "kernel": lambda r: (r["kernel"],),
    "head_size": lambda r: (r["kernel"], r["head_size"]),
    "group": lambda r: (r["kernel"], _group(r)),
}


def summarize(records: list[dict], other: str = "fa3") -> dict[str, list[dict]]:
    """Worst (smallest) and median of ``ratio_vs_<other>`` (ours / other
    throughput: > 1 = ours faster) per kernel, per (kernel, head size) and per
    (kernel, group); points with no ratio are counted as ``missing``. A record of
    the same point in a later file replaces an earlier one."""
    latest = {}
    for r in records:
        latest[record_key(_flat_key_fields(r))] = r
    field = f"ratio_vs_{other}"
    out = {}
    for by, key_of in SUMMARY_BY.items():
        groups: dict[tuple, list] = {}
        for r in latest.values():
            groups.setdefault(key_of(r), []).append(r)
        out[by] = [
            {"kernel": k[0], by: k[-1], **_ratio_stats(rows, field)}
            for k, rows in sorted(groups.items())
        ]
    return out


def summary_markdown(records: list[dict]) -> str:
    """The summary as Markdown tables: vs FA3 per kernel / head size / group, then
    vs stock Triton per kernel."""

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    parts = []
    for other, bys in (("fa3", SUMMARY_BY), ("stock_triton", ("kernel",))):
        table = summarize(records, other)
        for by in bys:
            cols = ["kernel"] + ([by] if by != "kernel" else [])
            head = cols + ["points", "missing", "worst", "median", "worst point"]
            lines = [
                f"### ours / {other} by {by} (> 1: ours faster)",
                "",
                "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head),
            ]
            for row in table[by]:
                cells = [str(row[c]) for c in cols] + [
                    str(row["points"]),
                    str(row["missing"]),
                    fmt(row["worst"]),
                    fmt(row["median"]),
                    row["worst_point"] or "-",
                ]
                lines.append("| " + " | ".join(cells) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def in_query_dtype(s: Shape, dtype: str) -> Shape:
    """The point with queries of ``dtype``; a 16-bit cache takes it too (vLLM's
    ``auto`` cache dtype is the model's), an fp8 cache stays."""
    kv = s.kv_dtype if s.kv_dtype.startswith("float8") else dtype
    return replace(s, dtype=dtype, kv_dtype=kv)


def selected_shapes(args) -> list[Shape]:
    """The points of the chosen sweep (--matrix, --tiny, --quick or the default),
    pruned by --kernels, --kv-dtypes, --groups, --head-sizes, --block-sizes,
    --query-lens, in the query dtype of --dtype."""
    kv_names = {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}
    query_lens = args.query_lens
    if args.matrix:
        shapes = [
            s
            for s in matrix_shapes(
                kernels=args.kernels,
                groups=args.groups or MATRIX_GROUPS,
                head_sizes=args.head_sizes or MATRIX_HEAD_SIZES,
                block_sizes=args.block_sizes,
                kv_dtypes=[kv_names[k] for k in args.kv_dtypes],
            )
            if not query_lens or s.query_len in query_lens
        ]
    else:
        shapes = [
            s
            for s in sweep(args)
            if s.kernel in args.kernels
            and (not query_lens or s.query_len in query_lens)
            and ("fp8" if s.kv_dtype.startswith("float8") else "bf16") in args.kv_dtypes
            and (not args.groups or s.num_q_heads // s.num_kv_heads in args.groups)
            and (not args.head_sizes or s.head_size in args.head_sizes)
            and (not args.block_sizes or s.block_size in args.block_sizes)
        ]
    return [in_query_dtype(s, args.dtype) for s in shapes]


def config_field(item: str) -> tuple[str, int | bool]:
    """``FIELD=VALUE`` of ``--prefill-config`` / ``--decode-config``: an int, or a
    bool as true/false."""
    name, sep, value = item.partition("=")
    flags = {"true": True, "false": False}
    if not sep or not (value.lower() in flags or value.lstrip("-").isdigit()):
        raise argparse.ArgumentTypeError(
            f"{item!r}: expected FIELD=VALUE with an integer or true/false value "
            "(e.g. split_head=true or num_stages=3)"
        )
    if value.lower() in flags:
        return name, flags[value.lower()]
    return name, int(value)


def wave_field(item: str) -> tuple[str, int | bool | float]:
    """``FIELD=VALUE`` of ``--decode-wave-rule``: as ``config_field``, or a float
    (``program_overhead=0.15``)."""
    name, _, value = item.partition("=")
    try:
        return config_field(item)
    except argparse.ArgumentTypeError:
        try:
            return name, float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected FIELD=VALUE with a number or true/false value "
                "(e.g. max_splits=64 or program_overhead=0.15)"
            ) from None


def config_fields(pairs, config_cls, flag: str = "--prefill-config") -> dict:
    """``flag``'s pairs as fields of ``config_cls`` (bool fields from 0/1 too,
    float fields from ints too);
    ValueError names a name that is not a field."""
    kinds = {f.name: f.type for f in fields(config_cls)}
    unknown = sorted({name for name, _ in pairs} - set(kinds))
    if unknown:
        raise ValueError(f"{flag}: no field {unknown}; fields: {sorted(kinds)}")

    def typed(name, value):
        if kinds[name] in (bool, "bool"):
            return bool(value)
        return float(value) if kinds[name] in (float, "float") else int(value)

    return {name: typed(name, value) for name, value in pairs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~2 minute subset")
    p.add_argument(
        "--decode-batches",
        type=int,
        nargs="+",
        help="decode points of Llama-3.1-8B heads at these batch sizes and one "
        "context (--decode-context), bf16 and fp8, pages of 16 and 64 (prune with "
        "--kv-dtypes / --block-sizes)",
    )
    p.add_argument("--decode-context", type=int, default=1536)
    p.add_argument(
        "--native",
        action="store_true",
        help="the layers our kernels took over from stock's Triton backend "
        "(NATIVE_POINTS: head size 100, ALiBi-sqrt, cross-attention, fp8_e5m2, "
        "gpt-oss's sinks), "
        "against it and FA3 where FA3 takes them",
    )
    p.add_argument("--tiny", action="store_true", help="tiny shapes (smoke run)")
    p.add_argument(
        "--prefill-num-splits",
        type=int,
        default=None,
        help="KV splits of our prefill launches (default: chosen per launch; 1: "
        "never split), to measure split-KV against FA3 in the same run",
    )
    p.add_argument(
        "--prefill-config",
        nargs="+",
        type=config_field,
        default=[],
        metavar="FIELD=VALUE",
        help="replace these fields of our prefill launches' config (their table "
        "entry or the heuristic), e.g. split_head=1 num_stages=3; to measure a "
        "config option against FA3 in the same run",
    )
    p.add_argument(
        "--decode-max-splits",
        type=int,
        default=None,
        help="cap of choose_decode_splits for our decode (default: MAX_DECODE_SPLITS); "
        "to measure a different cap against FA3 in the same run",
    )
    p.add_argument(
        "--decode-config",
        nargs="+",
        type=config_field,
        default=[],
        metavar="FIELD=VALUE",
        help="replace these fields of our decode launches' config (their table "
        "entry or the heuristic), e.g. early_convert=1 block_n=32; to measure a "
        "config option against FA3 in the same run",
    )
    p.add_argument(
        "--decode-num-splits",
        type=int,
        default=None,
        help="KV splits of every decode launch of ours instead of "
        "choose_decode_splits' choice (1: never split; at most SPLIT_LIMIT), to "
        "measure split counts against FA3 in the same run",
    )
    p.add_argument(
        "--decode-programs-per-sm",
        type=int,
        default=None,
        help="our decode's split rule: the wave-aware rule over powers of two at "
        "this many resident programs per SM (choose_decode_splits with "
        "WaveRule(N); e.g. 4 for the bf16 sm_90 build, 3 for fp8), 0 for the rule "
        "without it; default: what the backend uses (decode_wave_rule: the tuning "
        "data's WaveRule where the wave-aware rule was measured faster, on sm_90)",
    )
    p.add_argument(
        "--decode-wave-rule",
        nargs="+",
        type=wave_field,
        default=[],
        metavar="FIELD=VALUE",
        help="replace these fields of our decode's WaveRule (the backend's, or "
        "--decode-programs-per-sm's), e.g. max_splits=64 or any_count=1 "
        "program_overhead=0.15; to measure a split rule against FA3 in the same run",
    )
    p.add_argument(
        "--kernels",
        nargs="+",
        default=["decode", "prefill"],
        choices=["decode", "prefill"],
        help="measure only these kernels' points",
    )
    p.add_argument(
        "--kv-dtypes",
        nargs="+",
        default=["bf16", "fp8"],
        choices=["bf16", "fp8"],
        help="measure only the points with these KV-cache dtypes",
    )
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float16"],
        help="query dtype of every point (a model's dtype); the 16-bit KV cache "
        "(--kv-dtypes bf16) takes it too",
    )
    p.add_argument(
        "--stock-site",
        default=None,
        help="folder holding a stock vLLM of a supported release (imported as vllm); "
        "required for the fa3 and stock_triton callers",
    )
    p.add_argument("--results-dir", default=str(REPO / "benchmarks/results/kernels"))
    p.add_argument(
        "--commit",
        help="commit id to record, as given (default: $BENCH_COMMIT, else git HEAD, "
        "-dirty with uncommitted changes)",
    )
    p.add_argument("--callers", nargs="+", default=list(CALLERS), choices=list(CALLERS))
    p.add_argument(
        "--matrix",
        choices=["full"],
        default=None,
        help="the kernel matrix against FA3 (MATRIX_* data): resumable, one file",
    )
    p.add_argument("--groups", type=int, nargs="+", help="only these q/KV groups")
    p.add_argument("--head-sizes", type=int, nargs="+", help="only these head sizes")
    p.add_argument(
        "--query-lens",
        type=int,
        nargs="+",
        help="only the points with these query lengths (e.g. 2048: the chunks)",
    )
    p.add_argument("--block-sizes", type=int, nargs="+", help="only these page sizes")
    p.add_argument(
        "--max-points",
        type=int,
        default=None,
        help="--matrix: measure at most N unfinished points now (rerun to go on)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="--matrix: the records file, resumed when it exists (default "
        "<results-dir>/matrix-<commit>.json)",
    )
    p.add_argument(
        "--list", action="store_true", help="print the selected points, no GPU"
    )
    p.add_argument(
        "--summarize",
        nargs="+",
        metavar="FILE",
        help="print the worst / median ratios of records files as Markdown (no GPU)",
    )
    args = p.parse_args()  # fmt: skip
    if args.summarize:
        records = []
        for name in args.summarize:
            records += json.loads(Path(name).read_text())["records"]
        print(summary_markdown(records), end="")
        return
    shapes = selected_shapes(args)
    if args.list:
        for s in shapes:
            fields = [f"{k}={v}" for k, v in zip(KEY_FIELDS, shape_key(s))]
            fields += [f"alibi={s.alibi}"] if s.alibi else []
            fields += [] if s.causal else ["causal=False"]
            fields += ["kv_from_step=True"] if s.kv_from_step else []
            fields += ["sinks=True"] if s.sinks else []
            print(" ".join(fields))
        print(f"{len(shapes)} points")
        return
    if args.decode_num_splits is not None:
        if args.decode_num_splits < 1:
            p.error("--decode-num-splits must be at least 1")
        ignored = [flag for flag, value in (
            ("--decode-max-splits", args.decode_max_splits),
            ("--decode-programs-per-sm", args.decode_programs_per_sm),
            ("--decode-wave-rule", args.decode_wave_rule or None),
        ) if value is not None]  # fmt: skip
        if ignored:
            p.error(f"--decode-num-splits forces the split count: {ignored} would "
                    "do nothing")  # fmt: skip
    stock_callers = [c for c in args.callers if c in STOCK_CALLERS]
    if stock_callers and args.stock_site is None:
        p.error(
            f"--stock-site DIR (a stock vLLM) is required for the callers "
            f"{stock_callers}; or pass --callers ours"
        )
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a GPU (the kernel tests run on the CPU)")
    files = import_modules(args.stock_site)
    try:
        args.prefill_config = config_fields(
            args.prefill_config, ops.prefix_prefill.PrefillConfig
        )
        args.decode_config = config_fields(
            args.decode_config, ops.DecodeConfig, "--decode-config"
        )
        args.decode_wave_rule = config_fields(
            args.decode_wave_rule, ops.WaveRule, "--decode-wave-rule"
        )
    except ValueError as e:
        p.error(str(e))
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    result = environment(args, files)
    result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    result["bf16_dense_peak_tflops"] = H200_BF16_DENSE_PEAK_TFLOPS
    if args.matrix:
        path = Path(args.out or out_dir / f"matrix-{result['commit']}.json")
        run_matrix(shapes, args, path, result, measure_point)
        print()
        print(summary_markdown(load_matrix(path)["records"]), end="")
        print(f"wrote {path} ({time.time() - start:.0f} s)")
        return
    result["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
    print(
        f"device-to-device copy: {result['copy_bandwidth_gbs']:.0f} GB/s "
        f"(read + write); bf16 dense peak {result['bf16_dense_peak_tflops']} TFLOP/s"
    )
    result["records"] = []
    for i, s in enumerate(shapes):
        record = measure_point(s, args)
        result["records"].append(record)
        cells = [
            f"{c}={record[c]:.3g}"
            if record[c] is not None
            else f"{c}: {record['notes'][c]}"
            for c in CALLERS
        ]
        print(
            f"[{i + 1}/{len(shapes)} {time.time() - start:.0f}s] {s.kernel} {s.model}"
            f" bs={s.block_size} batch={s.batch} q={s.query_len} ctx={s.context}"
            f"{f' seqs={s.seqs}' if s.seqs else ''}: " + ", ".join(cells)
        )
    result["wall_s"] = time.time() - start
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    suffix = "-tiny" if args.tiny else "-quick" if args.quick else ""
    suffix += "-decode-batches" if args.decode_batches else ""
    suffix += "-native" if args.native else ""
    # runs of a subset or another split cap in the same minute must not overwrite
    if sorted(set(args.kernels)) != ["decode", "prefill"]:
        suffix += "-" + "-".join(sorted(set(args.kernels)))
    if sorted(set(args.kv_dtypes)) != ["bf16", "fp8"]:
        suffix += "-" + "-".join(sorted(set(args.kv_dtypes)))
    if args.decode_max_splits is not None:
        suffix += f"-splits{args.decode_max_splits}"
    if args.decode_programs_per_sm is not None:
        suffix += f"-waves{args.decode_programs_per_sm}"
    if args.decode_num_splits is not None:
        suffix += f"-decode-splits{args.decode_num_splits}"
    if args.prefill_num_splits is not None:
        suffix += f"-prefill-splits{args.prefill_num_splits}"
    for name, value in {**args.prefill_config, **args.decode_config}.items():
        suffix += f"-{name}{int(value)}"
    for name, value in args.decode_wave_rule.items():
        suffix += f"-wave-{name}{value:g}"
    path = out_dir / f"{stamp}-{result['commit']}{suffix}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print()
    print_table(result["records"])
    bad = [
        (r["kernel"], r["batch"], r["context"], r["max_abs_err"])
        for r in result["records"]
        if any(e > MAX_ABS_ERR for e in r["max_abs_err"].values())
    ]
    if bad:
        print(f"WARNING: max_abs_err > {MAX_ABS_ERR} at {bad}")
    print(f"wrote {path} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
