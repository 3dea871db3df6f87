# SPDX-License-Identifier: Apache-2.0
"""Launch configurations of the prefix-prefill kernel: table lookup + heuristic.

A configuration is ``(block_m, block_n, num_warps, num_stages, use_tma, fp8_qk,
longest_first, split_head, gluon)``. It is chosen
per *problem key*, the properties that change which tiles are fast:

    head_size, q_dtype, kv_dtype, group (q heads per KV head), block_size,
    max_query_len bucket (QUERY_LEN_BUCKETS)

and never by strides or batch composition, so one launch shape is used for all
batches of a model (good for CUDA graphs). Tables are JSON files in this folder,
one per GPU name (``prefix_prefill_<gpu>.json``, see README.md); a key missing from
the table falls back to ``heuristic_prefill_config``. ``PREFILL_CONFIG_SPACE`` is
the sweep of ``benchmarks/kernels/tune_attention.py --kernel prefill``, filtered by
``is_valid_config``.

This module only declares the kind (``PREFILL_TABLE``); reading, caching and the
lookup-else-heuristic are the shared loader's (``PREFILL_TABLE.lookup``, tables.py).
Nothing is read at import time: the first lookup for a GPU loads its file once.
"""

import functools
from dataclasses import dataclass, replace

from vllm.attention.ops.hardware import HOPPER_SMEM_BYTES_PER_PROGRAM
from vllm.attention.ops.triton_attention_common import (
    TMA_ROW_ALIGN_BYTES,
    head_split,
)
from vllm.attention.ops.triton_attention_common import head_pad as head_pad_of
from vllm.attention.ops.tuning.tables import (
    COMMON_KEY_FIELDS,
    TuningTable,
    dtype_name,
    next_power_of_2,
)

# Upper bounds of the max_query_len buckets; longer queries use the last bucket.
# Short buckets separate spec-decode verification (a few tokens) from chunked
# prefill (hundreds to thousands of tokens), which want different tiles.
QUERY_LEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384)

# Head sizes whose heuristic tile carries the head in two unpadded column tiles
# (``split_head``): timed on an H200 against the padded tile at every head-96 point
# of the kernel matrix (pages of 64, groups 1/4/7), 1.12-1.38x faster
# (benchmarks/results/kernels/2026-12-03-prefill-split-head-ab.json). 80, 160 and
# 192 also split but are untimed.
SPLIT_HEAD_SIZES = (96,)

# What the Hopper kernel in Gluon (``prefix_prefill_hopper.py``) takes: consumer
# warpgroups of 64 rows (``GLUON_WG_ROWS``) on 4 warps each, two (128 rows) or, at
# the head sizes of ``GLUON_THREE_WG_HEAD_SIZES`` on 16-bit caches, three (192 rows:
# FlashAttention-3's tile for head 64, whose accumulator and score tile fit the 160
# registers three consumers get; an fp8 cache's builds spill); the kernel adds the
# warpgroups past the first and its load warp.
# K/V tiles of 64 or 128 keys in a ring of at least 2 stages, head sizes whose
# tiles are whole wgmma operands (96 in 128 columns, zero-padded, or with
# ``split_head`` on a 16-bit cache in two unpadded column tiles of 64 and 32:
# ``GLUON_SPLIT_HEAD_SIZES``, 1.08-1.11x the padded tiles on an H200). One rule,
# read by the sweep's validity filter (``is_valid_config``) and by the launch plan
# (``prefix_prefill.hopper_kernel_refusal``).
GLUON_WG_ROWS = 64
GLUON_BLOCK_MS = (128, 192)
GLUON_NUM_WARPS = 4
GLUON_BLOCK_NS = (64, 128)
GLUON_MIN_STAGES = 2
GLUON_HEAD_SIZES = (64, 96, 128, 256)
GLUON_SPLIT_HEAD_SIZES = (96,)
GLUON_THREE_WG_HEAD_SIZES = (64,)
# Registers a thread (setmaxnreg) of the Hopper kernel's worker partitions, by its
# number of consumer warpgroups and whether the cache is fp8: (each consumer past
# the first, the load warp; with an fp8 cache also its converter, two warps in the
# load warp's warpgroup, which share one count). 65,536 a program; Triton gives the
# first consumer what the workers leave (multiples of 8): the second 240, the first
# 232, beside a load warp of 32 (FlashAttention-3's split for two); the others 160,
# the first 168, beside 24; with an fp8 cache's converter 232 each beside 40.
GLUON_WORKER_REGISTERS = {(2, False): (240, 32), (3, False): (160, 24),
                          (2, True): (232, 40)}  # fmt: skip

# The sweep of a tuning run (candidates violating `is_valid_config` are skipped).
PREFILL_CONFIG_SPACE = {
    # 256 rows need 8 warps: two warpgroups of 128 rows sharing each K/V tile.
    "block_m": (64, 128, 256),
    "block_n": (32, 64, 128),
    "num_warps": (4, 8),
    "num_stages": (1, 2, 3, 4),
    "use_tma": (False, True),
    # fp8 caches only: q.k on fp8 tensor cores (sweep it with --fp8-qk 0 1).
    "fp8_qk": (False,),
    # Program order: longest first across heads, or head-major (--longest-first 0 1).
    "longest_first": (True,),
    # Head sizes that are two powers of two (96 = 64 + 32) in two unpadded column
    # tiles instead of one padded one (--split-head 0 1).
    "split_head": (False,),
    # The Hopper kernel in Gluon where it applies (--gluon 0 1; 128 x 64 and
    # 128 x 128 tiles on 4 warps only).
    "gluon": (False,),
    # With gluon: the softmax overlapping its warpgroup's own p.v (--overlap-pv 0 1).
    "overlap_pv": (False,),
}


@dataclass(frozen=True)
class PrefillConfig:
    """Tiles and launch knobs of one prefix-prefill launch.

    block_m: rows of the packed query tile: (token, head) pairs of one KV head's
        group, token-major, no padding rows (a tile may split a token's heads).
    block_n: keys per KV tile (independent of the page size; when it divides the
        page size, a tile reads one block-table entry instead of one per key).
    use_tma: load K/V tiles through TMA descriptors. Honoured only where it can
        be (NVIDIA sm_90+, block_n dividing the page size);
        elsewhere the pointer loads run instead, with the same result.
    fp8_qk: fp8 caches only: quantise the query tile to the cache's fp8 format
        (one scale per program, its largest magnitude mapped to the format's
        maximum) and run q.k on fp8 tensor cores, K straight from the cache with
        no conversion; p.v stays in fp16. It adds the query's e4m3 rounding to
        the key's (FlashAttention-3 in vLLM quantises q too, with a fixed scale).
        Ignored for 16-bit caches.
    longest_first: the order programs start in (``prefix_prefill.program_coords``):
        the longest row tiles of every head and sequence first (LPT order: a short
        last wave; 1.42x on an 8k prefill of group 1 on an H200), or head-major,
        where the programs running at once share one head's K/V (what the group-8
        class keeps: 3% faster there on an 8k prefill).
    split_head: a head size that is the sum of two powers of two of at least 16
        (``head_split``: 80, 96, 160, 192) in two column tiles of those widths
        instead of one tile padded to the next power of two: q.k is two dots
        into one score tile, p.v two dots into two accumulators, and K/V are two
        loads (two TMA boxes). For head size 96 the dots do 3/4 of the padded
        tile's multiply-adds and the accumulator is 96 columns instead of 128.
        Only where ``head_split`` applies; with ``gluon``, only where the Hopper
        kernel splits the head (``gluon_split_head_refusal``: head size 96 on a
        16-bit cache).
    gluon: run the launch in the Hopper kernel written in Gluon
        (``prefix_prefill_hopper.py``) with these tiles: a load warp fills a ring
        of ``num_stages`` TMA slots, and consumer warpgroups of 64 rows each
        (``block_m`` 128: two, 192: three, at head size 64 on a 16-bit cache;
        ``num_warps`` 4 are one consumer's warps, the kernel adds the others)
        issue their products in turns, so that one's softmax runs while
        another's q.k and p.v occupy the tensor cores
        (FlashAttention-3's ping-pong); within a warpgroup, p.v of one key tile
        overlaps the softmax of the next with ``overlap_pv``. Honoured where
        that kernel applies (``hopper_kernel_refusal``: sm_90, a 16-bit cache of
        the query's dtype or an e4m3 one with ``fp8_qk``, head size 64, 96, 128
        or 256, causal, no ALiBi, no KV split); elsewhere the portable kernel
        runs the same config, with the same result. The launch plan
        (``prefix_prefill.plan_prefill``) chooses the kernel first and then the
        split count for that kernel.
    overlap_pv: with ``gluon`` only: within a consumer warpgroup, the softmax of
        a key tile runs while p.v of the previous one is in flight (K's slot is
        released after the softmax, behind a branch that keeps the sm_90 build's
        wait for p.v after it). Without it, ptxas waits for p.v before the
        softmax and the overlap is between warpgroups only. Faster at head 64
        (H100: 1.06x at 8k prefills, groups 4 and 8), not at 96-256.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False
    fp8_qk: bool = False
    longest_first: bool = True
    split_head: bool = False
    gluon: bool = False
    overlap_pv: bool = False


def query_len_bucket(max_query_len: int) -> int:
    """The bucket (upper bound) a host-side max query length falls in."""
    for bound in QUERY_LEN_BUCKETS:
        if max_query_len <= bound:
            return bound
    return QUERY_LEN_BUCKETS[-1]


def shared_memory_estimate(config: PrefillConfig, *, head_size: int, kv_dtype) -> int:
    """Bytes of shared memory a program of ``config`` takes: the q tile and a K and
    a V tile per pipeline stage (the portable kernel's upcast copies not counted),
    and on the Hopper kernel with an fp8 cache a ring of fp16 V tiles as deep."""
    head_pad = head_pad_of(head_size)
    kv_bytes = 1 if dtype_name(kv_dtype) == "fp8" else 2
    total = config.block_m * head_pad * 2 + config.num_stages * (
        2 * config.block_n * head_pad * kv_bytes
    )
    if config.gluon and kv_bytes == 1:  # the converter's ring of fp16 V tiles
        total += config.num_stages * config.block_n * head_pad * 2
    return total


def is_valid_config(config: PrefillConfig, *, head_size: int, kv_dtype) -> bool:
    """Cheap filter for a sweep: wgmma-friendly shapes that fit shared memory."""
    smem = shared_memory_estimate(config, head_size=head_size, kv_dtype=kv_dtype)
    return (
        config.block_m % 64 == 0
        and config.num_warps % 4 == 0
        # at most 128 rows per warpgroup (4 warps): its fp32 accumulator alone
        # takes block_m / warpgroups * head_pad / 128 registers per thread (the
        # Hopper kernel's warpgroups are its own: ``gluon_config_refusal``)
        and (config.gluon or config.block_m // (config.num_warps // 4) <= 128)
        and config.block_n >= 16
        and smem <= HOPPER_SMEM_BYTES_PER_PROGRAM
        and not (config.num_warps == 8 and config.block_m * config.block_n < 64 * 64)
        and not (config.fp8_qk and dtype_name(kv_dtype) != "fp8")
        and not (config.split_head and head_split(head_size) is None)
        and not (config.overlap_pv and not config.gluon)
        and not (
            config.gluon
            and gluon_entry_refusal(config, kv_dtype, head_size) is not None
        )
    )


def gluon_config_refusal(config: PrefillConfig, head_size: int, kv_dtype) -> str | None:
    """Why the Hopper kernel cannot run ``config``'s tiles at ``head_size`` on a
    ``kv_dtype`` cache (None: it can)."""
    if config.block_m not in GLUON_BLOCK_MS or config.num_warps != GLUON_NUM_WARPS:
        return (
            f"the Hopper kernel takes {' or '.join(map(str, GLUON_BLOCK_MS))} rows "
            f"on {GLUON_NUM_WARPS} warps (consumer warpgroups of {GLUON_WG_ROWS} "
            f"rows; it adds its own warps), not {config.block_m} on "
            f"{config.num_warps}"
        )
    if config.block_m // GLUON_WG_ROWS == 3 and (
        head_size not in GLUON_THREE_WG_HEAD_SIZES or dtype_name(kv_dtype) == "fp8"
    ):
        return (
            f"three consumer warpgroups ({config.block_m} rows) fit their registers "
            f"at head sizes {GLUON_THREE_WG_HEAD_SIZES} on 16-bit caches only, not "
            f"head size {head_size} on a {dtype_name(kv_dtype)} cache: take 128 rows"
        )
    if config.num_stages < GLUON_MIN_STAGES:
        return f"the key loop needs at least {GLUON_MIN_STAGES} stages"
    if config.block_n not in GLUON_BLOCK_NS:
        return (
            f"{config.block_n}-key tiles: the Hopper kernel takes tiles of "
            f"{' or '.join(map(str, GLUON_BLOCK_NS))} keys"
        )
    return None


def gluon_split_head_refusal(head_size: int, kv_dtype) -> str | None:
    """Why the Hopper kernel cannot carry a head of ``head_size`` on a
    ``kv_dtype`` cache in two unpadded column tiles (``split_head``; None: it
    can): it splits 16-bit caches only (its fp8 path converts V into one fp16
    copy per consumer, of the padded width) and only the head sizes of
    ``GLUON_SPLIT_HEAD_SIZES`` (96 = 64 + 32)."""
    if dtype_name(kv_dtype) == "fp8":
        return (
            "the Hopper kernel splits the head (split_head) for 16-bit caches "
            "only, not an fp8 one: unset split_head"
        )
    if head_size not in GLUON_SPLIT_HEAD_SIZES:
        return (
            f"the Hopper kernel splits head sizes {GLUON_SPLIT_HEAD_SIZES} "
            f"(split_head), not {head_size} ({head_split(head_size) or 'no split'})"
        )
    return None


def gluon_entry_refusal(config: PrefillConfig, kv_dtype, head_size: int) -> str | None:
    """Why ``config`` cannot name a launch of the Hopper kernel on a ``kv_dtype``
    cache at ``head_size`` (None: it can): its tiles (``gluon_config_refusal``),
    or fields that kernel does not have. It always loads K/V by TMA (a tile of
    more keys than a page as several boxes) and starts the longest programs
    first, splits the head only where ``gluon_split_head_refusal`` allows, and on
    an fp8 cache runs q.k on fp8 tensor cores; a launch it does not take runs the
    portable kernel with the key's heuristic config
    (``prefix_prefill.portable_config``), not with these fields."""
    refusal = gluon_config_refusal(config, head_size, kv_dtype)
    if refusal is not None:
        return refusal
    if not (config.use_tma and config.longest_first):
        return (
            "the Hopper kernel loads K/V by TMA and starts longest first: set "
            "use_tma and longest_first"
        )
    if config.split_head:
        refusal = gluon_split_head_refusal(head_size, kv_dtype)
        if refusal is not None:
            return refusal
    if dtype_name(kv_dtype) == "fp8" and not config.fp8_qk:
        return (
            "the Hopper kernel never takes an fp8 cache without fp8_qk (its q.k "
            "runs on fp8 tensor cores)"
        )
    return None


def heuristic_prefill_config(
    *,
    head_size: int,
    group: int,
    block_size: int,
    max_query_len: int,
    kv_dtype=None,
    is_hip: bool = False,
) -> PrefillConfig:
    """Fallback when the table has no entry: the tiles that timed sweeps on an H200
    chose, by head size and by how K/V tiles are loaded (the tuning records of the
    table and of the held-out shapes, ``benchmarks/results/tuning/``).

    NVIDIA: 128 query rows per program when the bucket's rows (query length x the
    group's class) fill them, else 64; then
      * head size up to 64: 128 keys per tile, 4 warps, 2 stages, pointer loads;
      * head size up to 128 whose 64-key tiles cannot be TMA page slices (pages
        smaller than 64), when the rows fill them: 256 x 64 tiles, 8 warps (two
        warpgroups of 128 rows share each K/V tile), 3 stages;
      * otherwise 64 keys per tile with TMA where the launch allows it (a head
        size below its power of two included: 80, 96 and 112 load padded boxes), one
        warpgroup (4 warps) up to head size 128 and two beyond (a warpgroup holds
        at most a 128 x 128 fp32 accumulator), 2 stages; head sizes in
        ``SPLIT_HEAD_SIZES`` (96) in two unpadded column tiles (``split_head``);
      * but a head whose cache rows are not a multiple of 16 bytes (``kv_dtype``'s
        bytes per element; 16-bit when None), which TMA cannot read and whose
        pointer loads carry no 16-byte alignment, up to head size 128: 128 x 64
        tiles in two warpgroups (8 warps), 2 stages, the tile its sm_90 builds
        keep free of register spills (100, 36, 20, 33 and fp8 100; one warpgroup
        spills 144-1160 bytes).
    Never ``fp8_qk``: it rounds the query to fp8, a trade only a tuned entry makes.
    ``block_m`` is a multiple of 64 and ``num_warps`` of 4, so both ``tl.dot``
    lower to wgmma on Hopper.
    AMD: 64x32 tiles, 4 warps, 1 stage (the stream pipeliner's best default).
    """
    head_pad = head_pad_of(head_size)
    rows = query_len_bucket(max_query_len) * next_power_of_2(group)
    if is_hip:
        return PrefillConfig(block_m=64, block_n=32, num_warps=4, num_stages=1)
    block_m = 128 if rows >= 128 else 64
    row_bytes = head_size * (1 if dtype_name(kv_dtype) == "fp8" else 2)
    if row_bytes % TMA_ROW_ALIGN_BYTES and head_pad <= 128:
        return PrefillConfig(block_m=128, block_n=64, num_warps=8, num_stages=2)
    if head_pad <= 64:
        return PrefillConfig(block_m=block_m, block_n=128, num_warps=4, num_stages=2)
    tma_slices = block_size % 64 == 0
    if head_pad <= 128 and not tma_slices and rows >= 256:
        return PrefillConfig(block_m=256, block_n=64, num_warps=8, num_stages=3)
    return PrefillConfig(
        block_m=block_m,
        block_n=64,
        num_warps=4 if head_pad <= 128 else 8,
        num_stages=2,
        use_tma=True,
        split_head=head_size in SPLIT_HEAD_SIZES,
    )


@functools.lru_cache(maxsize=256)
def fit_shared_memory(
    config: PrefillConfig, *, head_size: int, kv_dtype, limit: int
) -> PrefillConfig:
    """``config``, made to fit a GPU with ``limit`` bytes of shared memory per
    program (an Ampere or Ada GPU has less than the Hopper the tiles were chosen
    on), by ``shared_memory_estimate``: fewer pipeline stages first, then fewer
    keys per tile, then fewer rows (and, up to head size 128, half the warps, at
    least 4). Unchanged when it fits, as every heuristic and H200 config does on
    Hopper."""
    head_pad = head_pad_of(head_size)
    while (
        shared_memory_estimate(config, head_size=head_size, kv_dtype=kv_dtype) > limit
    ):
        if config.num_stages > 1:
            config = replace(config, num_stages=config.num_stages - 1)
        elif config.block_n > 16:
            config = replace(config, block_n=config.block_n // 2)
        elif config.block_m > 64:
            warps = (
                config.num_warps if head_pad > 128 else max(4, config.num_warps // 2)
            )
            config = replace(config, block_m=config.block_m // 2, num_warps=warps)
        else:
            break  # the smallest tiles: left to the compiler to report
    return config


def tile_refusal(config: PrefillConfig) -> str | None:
    """Why no kernel takes ``config``'s tiles (None: they are powers of two of at
    least 16, what ``tl.dot`` and the row/key tiling need, or rows of whole
    consumer warpgroups of the Hopper kernel: ``GLUON_BLOCK_MS``)."""
    tiles = (config.block_m, config.block_n)
    checked = tiles
    if config.gluon and config.block_m in GLUON_BLOCK_MS:
        checked = (config.block_n,)  # the rows are whole warpgroups
    if any(n < 16 or n & (n - 1) for n in checked):
        return f"tiles must be powers of two >= 16, got {tiles}"
    return None


def entry_refusal(fields: dict, config: PrefillConfig) -> str | None:
    """Why a table entry cannot be what its key's launches run (None: it can): a
    field the kernel that runs them would ignore, or tiles no kernel takes. A
    ``gluon`` entry names the Hopper kernel's launch only (``gluon_entry_refusal``);
    the key's launches that kernel does not take (ALiBi, non-causal, a KV split)
    run the portable kernel with the key's heuristic config."""
    head_size, kv_dtype = fields["head_size"], fields["kv_dtype"]
    refusal = tile_refusal(config)
    if refusal is not None:
        return refusal
    if config.gluon:
        refusal = gluon_entry_refusal(config, kv_dtype, head_size)
        if refusal is not None:
            return f"gluon is set but {refusal}"
        cache_ok = kv_dtype in (fields["q_dtype"], "fp8")
        if head_size not in GLUON_HEAD_SIZES or not cache_ok:
            return (
                "gluon is set for a key the Hopper kernel never takes (head sizes "
                f"{GLUON_HEAD_SIZES}, a 16-bit cache of the query's dtype or an "
                "fp8 one with fp8_qk)"
            )
    if config.overlap_pv and not config.gluon:
        return "overlap_pv is set without gluon: only the Hopper kernel has it"
    if config.fp8_qk and kv_dtype != "fp8":
        return "fp8_qk is set for a 16-bit cache, where it does nothing"
    if config.split_head and head_split(head_size) is None:
        return f"split_head is set for head size {head_size}, which does not split"
    if config.use_tma and not config.gluon and fields["block_size"] % config.block_n:
        return (
            f"use_tma is set but {config.block_n}-key tiles are not slices of "
            f"{fields['block_size']}-key pages, where TMA does not apply"
        )
    return None


def group_class(group: int) -> int:
    """The group a prefill key holds: the next power of two. A program of groups
    5-7 does group 8's work (the same ``block_m``-row tiles, K/V loads and
    compiled shape; only the number of row tiles differs, the rows are packed
    without padding) and 3 does 4's: they share its tuned entries."""
    return next_power_of_2(int(group))


PREFILL_TABLE = TuningTable(
    kind="prefix_prefill",
    config_cls=PrefillConfig,
    key_fields={
        **COMMON_KEY_FIELDS,
        "group": group_class,
        "max_query_len": query_len_bucket,
    },
    heuristic=heuristic_prefill_config,
    heuristic_fields=("head_size", "group", "block_size", "max_query_len", "kv_dtype"),
    entry_refusal=entry_refusal,
)
