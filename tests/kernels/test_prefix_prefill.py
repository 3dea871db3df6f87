# SPDX-License-Identifier: Apache-2.0
"""prefix_prefill_attention against ref_paged_attention.

CPU (Triton interpreter): ``CASES`` samples the feature matrix, each head size,
GQA ratio, page size, dtype and feature at least once, on batches that mix
single-token rows, pure prefills (empty context), prefix hits and chunked-prefill
rows. GPU with ``GPU_FULL=1``: the ``full_matrix`` tests add the cross product,
128k contexts and a cache whose block offsets pass 2**31 elements.
"""

import dataclasses
import functools
import math
import random
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from tests.kernels.conftest import (
    BLOCK_SIZES,
    DEVICE,
    FP8_QK_TOLERANCE,
    GQA_GROUPS,
    HEAD_SIZES,
    INTERPRET,
    ON_GPU,
    TOLERANCES,
    assert_close,
    fp8_skip_reason,
    make_paged_batch,
    put_query_on_fp8_grid,
)
from vllm.attention.ops import prefix_prefill
from vllm.attention.ops.paged_cache_write import write_to_paged_cache
from vllm.attention.ops.prefix_prefill import (
    choose_prefill_splits,
    prefix_prefill_attention,
    program_coords,
)
from vllm.attention.ops.reference import ref_paged_attention
from vllm.attention.ops.triton_attention_common import (
    FP8_DTYPES,
    merge_splits_kernel,
    paged_row_offsets,
)
from vllm.attention.ops.tuning.prefill_configs import PREFILL_TABLE, PrefillConfig
from vllm.attention.ops.tuning.tables import device_gpu_name

# (query_len, kv_len) rows of one batch: a single-token row with context, a pure
# prefill (empty context), a prefix hit, and a chunked-prefill row whose query spans
# several query blocks of the small CPU tiles.
MIXED_SEQS = [(1, 9), (4, 4), (3, 21), (19, 37)]
# Small tiles: cheap in the interpreter, and on a GPU they exercise the mma.sync
# (non-wgmma) path; the production configs run in "default-config-g4" and in the
# full-matrix tests (config=None: tuning table / heuristic).
SMALL = PrefillConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)


def _case(name, **overrides):
    base = {
        "seqs": MIXED_SEQS,
        "num_q_heads": 2,
        "num_kv_heads": 2,
        "head_size": 64,
        "block_size": 16,
        "q_dtype": torch.bfloat16,
        "cache_dtype": None,
        "config": SMALL,
        "sliding_window": None,
        "alibi": False,
        "soft_cap": None,
        "sinks": False,
        "q_on_fp8_grid": False,
        "num_splits": None,  # KV splits; None: unsplit (no max_seq_len given)
        "causal": True,
        "tolerance": None,  # (dtype, atol, rtol); default TOLERANCES[q_dtype]
    }
    base.update(overrides)
    return pytest.param(base, id=name)


# Every optional feature at once on an fp8 cache (with pointer loads and with TMA).
ALL_FEATURES_FP8 = {
    "cache_dtype": torch.float8_e4m3fn,
    "num_q_heads": 8,
    "sliding_window": 7,
    "alibi": True,
    "soft_cap": 2.0,
    "sinks": True,
}

CASES = [
    _case("base-bf16-d64-mha-bs16"),
    _case(
        "fp16-d128-g2-bs32",
        q_dtype=torch.float16,
        head_size=128,
        num_q_heads=4,
        block_size=32,
    ),
    # BLOCK_N < page: a tile is part of one page.
    _case(
        "d80-g4-bs64-tile-in-page",
        head_size=80,
        num_q_heads=4,
        num_kv_heads=1,
        block_size=64,
    ),
    # GQA 7: 32-row tiles start and end inside tokens (no padding rows).
    _case(
        "d96-g7-bs128",
        head_size=96,
        num_q_heads=14,
        num_kv_heads=2,
        block_size=128,
        config=PrefillConfig(32, 32, 4, 1),
    ),
    # BLOCK_N = 4 pages: a tile spans pages.
    _case(
        "d112-g8-bs16-tile-spans-pages",
        head_size=112,
        num_q_heads=8,
        num_kv_heads=1,
        config=PrefillConfig(32, 64, 4, 1),
    ),
    # Group 16 > BLOCK_M 16 / ... : one token per program.
    _case(
        "d192-g16-one-token-per-block", head_size=192, num_q_heads=16, num_kv_heads=1
    ),
    _case("d256-g2-fp16", head_size=256, num_q_heads=4, q_dtype=torch.float16),
    # Smallest head size the public function accepts (tl.dot needs K >= 16).
    _case("d16-smallest-head", head_size=16, num_q_heads=4),
    # Window smaller than the queries and the tile: left edge, skipped tiles.
    _case("window-5", sliding_window=5, seqs=[(3, 40), (20, 20), (1, 33)]),
    _case("window-1", sliding_window=1, seqs=[(6, 30), (2, 2)]),
    # BLOCK_Q (64 tokens) > BLOCK_N: late rows meet whole tiles outside their
    # window before their first visible key (the softmax must not produce NaN).
    _case(
        "window-4-qblock-wider-than-tile",
        sliding_window=4,
        seqs=[(50, 50), (45, 70)],
        num_kv_heads=1,
        num_q_heads=1,
        config=PrefillConfig(64, 16, 4, 1),
    ),
    _case("window-larger-than-seq", sliding_window=64),
    _case("alibi-g2", alibi=True, num_q_heads=4),
    _case("softcap", soft_cap=1.5),
    _case("sinks-g2", sinks=True, num_q_heads=4),
    _case("fp8-e4m3fn-fp16", cache_dtype=torch.float8_e4m3fn, q_dtype=torch.float16),
    _case("fp8-e4m3fnuz", cache_dtype=torch.float8_e4m3fnuz),
    _case("fp8-e5m2", cache_dtype=torch.float8_e5m2, sliding_window=40),
    _case("all-features-fp8-g4", **ALL_FEATURES_FP8, seqs=[(5, 29), (1, 1), (12, 12)]),
    # Pure prefills; a sequence with no query tokens this step (its programs exit).
    _case("empty-context-and-empty-query", seqs=[(5, 5), (0, 9), (17, 17), (1, 1)]),
    _case("single-token-rows-only", seqs=[(1, 1), (1, 35), (1, 16)]),
    # The table/heuristic config (64-row tiles) as used in production.
    _case("default-config-g4", num_q_heads=8, config=None),
    # K/V tiles through TMA descriptors (emulated by the interpreter): the tile is
    # half a page; rows past a sequence's end are NaN in the cache and must not leak.
    _case(
        "tma-d64-g2-bs32",
        num_q_heads=4,
        block_size=32,
        config=PrefillConfig(16, 16, 4, 1, use_tma=True),
    ),
    _case(
        "tma-fp8-all-features-g4",
        **ALL_FEATURES_FP8,
        seqs=[(5, 29), (1, 1), (12, 12), (19, 50)],
        config=PrefillConfig(16, 16, 4, 1, use_tma=True),
    ),
    # fp8_qk (q.k on fp8 tensor cores): queries already on the e4m3 grid with the
    # same largest magnitude in every row, so the kernel's quantisation is exact and
    # the bf16 tolerance applies (a wrong or missing query scale fails it).
    _case(
        "fp8-qk-exact-d64-fnuz",
        cache_dtype=torch.float8_e4m3fnuz,
        num_q_heads=4,
        seqs=[(5, 29), (1, 1), (20, 47)],
        config=PrefillConfig(16, 16, 4, 1, fp8_qk=True),
        q_on_fp8_grid=True,
    ),
    _case(
        "fp8-qk-exact-tma",
        cache_dtype=torch.float8_e4m3fn,
        num_q_heads=4,
        seqs=[(5, 29), (19, 50)],
        config=PrefillConfig(16, 16, 4, 1, use_tma=True, fp8_qk=True),
        q_on_fp8_grid=True,
    ),
    # fp8_qk on ordinary queries: FP8_QK_TOLERANCE.
    _case(
        "fp8-qk-all-features-g4",
        **ALL_FEATURES_FP8,
        seqs=[(5, 29), (1, 1), (12, 12), (40, 90)],
        config=PrefillConfig(16, 16, 4, 1, fp8_qk=True),
        tolerance=FP8_QK_TOLERANCE,
    ),
    # use_tma where TMA cannot apply (the tile spans pages): the pointer loads run
    # instead.
    _case(
        "tma-requested-tile-spans-pages",
        config=PrefillConfig(32, 32, 4, 1, use_tma=True),
    ),
    # TMA with a head size below its power of two: boxes of 128 columns over rows
    # of 80, the columns past the row read as zeros (not the next row's keys).
    _case("tma-d80", head_size=80, config=PrefillConfig(16, 16, 4, 1, True)),
    # Groups that are not powers of two, packed without padding: tiles of 16 or
    # 64 rows hold a fraction of a token's heads at both ends; with a cached
    # prefix, a window narrower than a tile's token span, TMA and sinks.
    _case(
        "g3-tiles-split-tokens-window-prefix",
        num_q_heads=6,
        num_kv_heads=2,
        sliding_window=6,
        sinks=True,
        seqs=[(23, 40), (1, 9), (11, 11)],
        config=PrefillConfig(16, 16, 4, 1),
    ),
    _case(
        "g5-tma-chunked-prefill",
        num_q_heads=10,
        num_kv_heads=2,
        block_size=32,
        seqs=[(29, 75), (2, 2), (13, 13)],
        config=PrefillConfig(64, 16, 4, 1, use_tma=True),
    ),
    _case(
        "g6-alibi-softcap",
        num_q_heads=6,
        num_kv_heads=1,
        alibi=True,
        soft_cap=2.0,
        seqs=[(17, 30), (9, 9)],
        config=PrefillConfig(16, 32, 4, 1),
    ),
    _case(
        "g12-tile-smaller-than-a-token",
        num_q_heads=24,
        num_kv_heads=2,
        seqs=[(5, 21), (1, 1), (7, 7)],
        config=PrefillConfig(16, 16, 4, 1),
    ),
    # 256 rows over two warpgroups (8 warps): 64 tokens x group 4 per program, the
    # diagonal inside a program's rows, short and long sequences, a prefix.
    _case(
        "block-m-256-g4",
        num_q_heads=8,
        num_kv_heads=2,
        block_size=64,
        seqs=[(130, 150), (1, 9), (64, 64)],
        config=PrefillConfig(256, 32, 8, 1, use_tma=True),
    ),
    # Split-KV: each program's key tiles in contiguous shares, merged after.
    _case("split-kv-3", num_splits=3, seqs=[(1, 40), (5, 70), (19, 37), (2, 2)]),
    # More splits than tiles: empty splits (lse -inf) must not disturb the merge;
    # the sink is added once, by the merge.
    _case("split-kv-16-more-than-tiles", num_splits=16, sinks=True),
    _case(
        "split-kv-all-features-fp8-window",
        **ALL_FEATURES_FP8,
        num_splits=5,
        seqs=[(3, 60), (20, 20), (1, 33), (9, 80)],
    ),
    # split_head: the head in two exact column tiles (96 = 64 + 32, 80 = 64 + 16,
    # 192 = 128 + 64); pointer loads within a page and across pages, TMA, every
    # feature on fp8, fp8 q.k (one query scale over both tiles), split-KV; and
    # head sizes it does not apply to (128, 112: one padded tile, as without it).
    _case(
        "split-head-d96-g2",
        head_size=96,
        num_q_heads=4,
        config=PrefillConfig(16, 16, 4, 1, split_head=True),
    ),
    _case(
        "split-head-d80-g4-tile-spans-pages",
        head_size=80,
        num_q_heads=4,
        num_kv_heads=1,
        config=PrefillConfig(16, 32, 4, 1, split_head=True),
    ),
    _case(
        "split-head-tma-d96-g7",
        head_size=96,
        num_q_heads=14,
        num_kv_heads=2,
        block_size=32,
        seqs=[(5, 29), (1, 1), (19, 50)],
        config=PrefillConfig(32, 16, 4, 1, use_tma=True, split_head=True),
    ),
    _case(
        "split-head-tma-d192-g2",
        head_size=192,
        num_q_heads=4,
        seqs=[(3, 40), (20, 20)],
        config=PrefillConfig(16, 16, 4, 1, use_tma=True, split_head=True),
    ),
    _case(
        "split-head-all-features-fp8-d80",
        **ALL_FEATURES_FP8,
        head_size=80,
        seqs=[(5, 29), (1, 1), (12, 12)],
        config=PrefillConfig(16, 16, 4, 1, use_tma=True, split_head=True),
    ),
    _case(
        "split-head-fp8-qk-all-features-d96",
        **ALL_FEATURES_FP8,
        head_size=96,
        seqs=[(5, 29), (1, 1), (40, 90)],
        config=PrefillConfig(16, 16, 4, 1, fp8_qk=True, split_head=True),
        tolerance=FP8_QK_TOLERANCE,
    ),
    _case(
        "split-head-split-kv-3-sinks-d96",
        head_size=96,
        num_q_heads=4,
        sinks=True,
        num_splits=3,
        seqs=[(1, 40), (5, 70), (2, 2)],
        config=PrefillConfig(16, 16, 4, 1, use_tma=True, split_head=True),
    ),
    # The production tile (128 x 64, 4 warps, 2 stages, TMA; wgmma on a GPU).
    _case(
        "split-head-production-tile-d96-g1",
        head_size=96,
        num_q_heads=2,
        block_size=64,
        seqs=[(150, 300), (1, 1), (64, 64)],
        config=PrefillConfig(128, 64, 4, 2, use_tma=True, split_head=True),
    ),
    _case(
        "split-head-not-applicable-d112",
        head_size=112,
        num_q_heads=4,
        config=PrefillConfig(16, 16, 4, 1, split_head=True),
    ),
    # Non-causal (cross-attention over a cached encoder, bidirectional drafting):
    # every query sees all keys of its sequence, also where the query is longer
    # than the keys (a decoder prompt over a short encoder output) or there are
    # no keys at all (zeros).
    _case(
        "non-causal-mixed",
        causal=False,
        num_q_heads=4,
        seqs=[(1, 9), (4, 4), (3, 21), (19, 37), (6, 3), (2, 0)],
    ),
    _case(
        "non-causal-split-kv-3-sinks-g4",
        causal=False,
        num_q_heads=8,
        num_kv_heads=2,
        sinks=True,
        num_splits=3,
        seqs=[(1, 40), (5, 70), (19, 37), (2, 2)],
    ),
    _case(
        "non-causal-fp8-softcap-sinks-tma",
        causal=False,
        cache_dtype=torch.float8_e4m3fn,
        num_q_heads=8,
        soft_cap=2.0,
        sinks=True,
        seqs=[(5, 29), (1, 1), (12, 12), (19, 50)],
        config=PrefillConfig(16, 16, 4, 1, use_tma=True),
    ),
    _case(
        "non-causal-split-head-d96-g7",
        causal=False,
        head_size=96,
        num_q_heads=14,
        num_kv_heads=2,
        block_size=32,
        seqs=[(30, 5), (1, 1), (19, 50)],
        config=PrefillConfig(32, 16, 4, 1, use_tma=True, split_head=True),
    ),
    # Non-causal with a sliding window (encoder-only models such as EmbeddingGemma):
    # a query sees the keys less than W away on either side; windows narrower and
    # wider than a tile, rows near both ends of their sequence, a query longer than
    # its keys.
    _case(
        "non-causal-window-mixed",
        causal=False,
        sliding_window=5,
        num_q_heads=4,
        seqs=[(1, 9), (4, 4), (3, 21), (19, 37), (40, 40), (6, 3)],
    ),
    _case(
        "non-causal-window-wide-split-kv-3-sinks-g4",
        causal=False,
        sliding_window=23,
        num_q_heads=8,
        num_kv_heads=2,
        sinks=True,
        num_splits=3,
        seqs=[(1, 40), (5, 70), (60, 60), (2, 2)],
    ),
    _case(
        "non-causal-window-fp8-softcap-tma-split-head-d96",
        causal=False,
        sliding_window=9,
        cache_dtype=torch.float8_e4m3fn,
        head_size=96,
        num_q_heads=8,
        soft_cap=2.0,
        block_size=32,
        seqs=[(33, 33), (1, 1), (12, 50)],
        config=PrefillConfig(32, 16, 4, 1, use_tma=True, split_head=True),
    ),
]


def _run(
    case,
    batch,
    output,
    *,
    seq_start=0,
    num_seqs=None,
    alibi_slopes=None,
    sinks=None,
    softmax_scale,
):
    prefix_prefill_attention(
        query=batch.query,
        key_cache=batch.key_cache,
        value_cache=batch.value_cache,
        output=output,
        block_table=batch.block_table,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        max_query_len=batch.max_query_len,
        softmax_scale=softmax_scale,
        seq_start=seq_start,
        num_seqs=num_seqs,
        k_scale=batch.k_scale,
        v_scale=batch.v_scale,
        sliding_window=case["sliding_window"],
        alibi_slopes=alibi_slopes,
        logits_soft_cap=case["soft_cap"],
        sinks=sinks,
        causal=case.get("causal", True),
        config=case["config"],
        num_splits=case.get("num_splits"),
    )


def _check_case(case, seed=0):
    if case["cache_dtype"] is not None:
        reason = fp8_skip_reason(case["cache_dtype"])
        if reason:
            pytest.skip(reason)
    batch = make_paged_batch(
        seqs=case["seqs"],
        num_q_heads=case["num_q_heads"],
        num_kv_heads=case["num_kv_heads"],
        head_size=case["head_size"],
        block_size=case["block_size"],
        q_dtype=case["q_dtype"],
        cache_dtype=case["cache_dtype"],
        seed=seed,
    )
    if case.get("q_on_fp8_grid"):
        put_query_on_fp8_grid(batch, case["cache_dtype"], case["head_size"])
    gen = torch.Generator().manual_seed(seed + 1)
    heads = case["num_q_heads"]
    alibi_slopes = sinks = None
    if case["alibi"]:
        # Strong enough to change the result visibly over tens of keys.
        alibi_slopes = (torch.rand(heads, generator=gen) * 0.5).to(DEVICE)
    if case["sinks"]:
        sinks = (torch.randn(heads, generator=gen) * 2).to(DEVICE)
    scale = 1.0 / math.sqrt(case["head_size"])
    output = torch.full_like(batch.query, float("nan"))
    _run(
        case, batch, output, alibi_slopes=alibi_slopes, sinks=sinks, softmax_scale=scale
    )
    expected = ref_paged_attention(
        softmax_scale=scale,
        sliding_window=case["sliding_window"],
        alibi_slopes=alibi_slopes,
        logits_soft_cap=case["soft_cap"],
        sinks=sinks,
        causal=case.get("causal", True),
        **batch.ref_kwargs(),
    )
    dtype, atol, rtol = case.get("tolerance") or _default_tolerance(case, batch)
    assert_close(output, expected, dtype=dtype, atol=atol, rtol=rtol)


def _default_tolerance(case, batch):
    """The query dtype's tolerance; FP8_QK_TOLERANCE when the launch quantises the
    query (an fp8 cache with an fp8_qk config: given, or the table's entry when
    ``config`` is None, as in the GPU full-matrix cases)."""
    config = case["config"]
    if config is None:
        config = PREFILL_TABLE.lookup(
            gpu_name=device_gpu_name(batch.query.device),
            head_size=case["head_size"],
            q_dtype=case["q_dtype"],
            kv_dtype=batch.key_cache.dtype,
            group=case["num_q_heads"] // case["num_kv_heads"],
            block_size=case["block_size"],
            max_query_len=batch.max_query_len,
            is_hip=torch.version.hip is not None,
        )
    if config.fp8_qk and batch.key_cache.dtype in FP8_DTYPES:
        return FP8_QK_TOLERANCE
    return TOLERANCES[case["q_dtype"]]


@pytest.mark.parametrize("case", CASES)
def test_prefix_prefill_matches_reference(case):
    _check_case(case)


def _random_case(seed):
    """A reproducible random draw over shapes, tiles, lengths and features: covers
    tile-boundary combinations (window edges, diagonal tiles, short rows) that the
    hand-written cases do not enumerate."""
    rng = random.Random(seed)
    group = rng.choice(GQA_GROUPS)
    head_size = rng.choice(HEAD_SIZES)
    seqs = []
    for _ in range(rng.randint(1, 4)):
        q_len = rng.choice([1, rng.randint(2, 12), rng.randint(13, 40)])
        seqs.append((q_len, q_len + rng.choice([0, rng.randint(1, 70)])))
    return {
        "seqs": seqs,
        "num_q_heads": group,
        "num_kv_heads": 1,
        "head_size": head_size,
        "block_size": rng.choice(BLOCK_SIZES[:2]),
        "q_dtype": rng.choice([torch.bfloat16, torch.float16]),
        "cache_dtype": rng.choice([None, None, torch.float8_e4m3fn]),
        "config": PrefillConfig(
            rng.choice([16, 32, 64]), rng.choice([16, 32]), 4, 1, rng.random() < 0.5
        ),
        "sliding_window": rng.choice([None, rng.randint(1, 30)]),
        "alibi": rng.random() < 0.3,
        "soft_cap": rng.choice([None, 5.0]),
        "sinks": rng.random() < 0.3,
        "num_splits": rng.choice([None, None, 2, 3, 7]),
        "causal": rng.random() < 0.6,  # non-causal drops ALiBi
    }


def test_non_causal_rows_see_the_keys_after_them():
    """The same prefill, causal and not: each matches its reference, and they
    differ (a kernel that ignored the flag would pass one case only)."""
    case = dict(CASES[0].values[0], num_q_heads=4, seqs=[(9, 9), (5, 30)])
    shape = ("seqs", "num_q_heads", "num_kv_heads", "head_size", "block_size",
             "q_dtype")  # fmt: skip
    batch = make_paged_batch(**{k: case[k] for k in shape})
    outputs = {}
    for causal in (True, False):
        output = torch.full_like(batch.query, float("nan"))
        _run({**case, "causal": causal}, batch, output, softmax_scale=0.125)
        expected = ref_paged_attention(
            softmax_scale=0.125, causal=causal, **batch.ref_kwargs()
        )
        _, atol, rtol = TOLERANCES[torch.bfloat16]
        assert_close(output, expected, dtype=torch.bfloat16, atol=atol, rtol=rtol)
        outputs[causal] = output.float()
    # Every row but the last of each sequence sees more keys without the mask.
    assert (outputs[True][:8] - outputs[False][:8]).abs().amax(dim=(1, 2)).min() > 0
    last_rows = [8, 13]  # the last token of each sequence sees every key either way
    torch.testing.assert_close(
        outputs[True][last_rows], outputs[False][last_rows], atol=1e-2, rtol=0
    )


@pytest.mark.parametrize("seed", range(8))
def test_random_batches(seed):
    case = _random_case(seed)
    if not case["causal"]:
        case.update(alibi=False)
    _check_case(case, seed=seed)


def test_head_pad_is_the_power_of_two_of_at_least_16():
    """``head_pad`` (plain integer arithmetic, called per launch) agrees with
    Triton's ``next_power_of_2`` rule for every head size a cache can have."""
    from vllm.attention.ops.triton_attention_common import head_pad

    for head_size in range(1, 1025):
        assert head_pad(head_size) == max(16, triton.next_power_of_2(head_size))
    assert [head_pad(n) for n in (1, 16, 17, 80, 96, 128, 129, 256)] == [
        16, 16, 32, 128, 128, 128, 256, 256,
    ]  # fmt: skip


@pytest.mark.parametrize("num_splits", [None, 4])
def test_sequence_range_leaves_other_rows_untouched(num_splits):
    """Decodes first, then prefills: a launch over [seq_start, seq_start + n) writes
    exactly those sequences' rows (split: the merge too)."""
    seqs = [(1, 12), (1, 3), (6, 20), (4, 4), (9, 9)]
    batch = make_paged_batch(
        seqs=seqs, num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16
    )
    case = {**CASES[0].values[0], "num_splits": num_splits}
    sentinel = 7.0
    output = torch.full_like(batch.query, sentinel)
    _run(case, batch, output, seq_start=2, num_seqs=2, softmax_scale=0.125)
    expected = ref_paged_attention(softmax_scale=0.125, **batch.ref_kwargs())
    starts = batch.query_start_loc.tolist()
    done = slice(starts[2], starts[4])
    assert_close(
        output[done],
        expected[done],
        dtype=torch.bfloat16,
        atol=TOLERANCES[torch.bfloat16][1],
        rtol=TOLERANCES[torch.bfloat16][2],
    )
    untouched = torch.ones(output.shape[0], dtype=torch.bool)
    untouched[done] = False
    assert (output[untouched] == sentinel).all(), "rows outside the range were written"


def test_write_then_attend():
    """The production order: write the new tokens with write_to_paged_cache, then
    run prefix_prefill over the cache (context pages were written earlier)."""
    seqs = [(5, 21), (3, 3)]
    batch = make_paged_batch(
        seqs=seqs, num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16
    )
    gen = torch.Generator().manual_seed(3)
    new_k = torch.randn((8, 2, 64), generator=gen).to(torch.bfloat16).to(DEVICE)
    new_v = torch.randn((8, 2, 64), generator=gen).to(torch.bfloat16).to(DEVICE)
    slots = []
    for s, (q_len, kv_len) in enumerate(seqs):
        for pos in range(kv_len - q_len, kv_len):
            slots.append(int(batch.block_table[s, pos // 16]) * 16 + pos % 16)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    write_to_paged_cache(
        key=new_k,
        value=new_v,
        key_cache=batch.key_cache,
        value_cache=batch.value_cache,
        slot_mapping=slot_mapping,
    )
    case = CASES[0].values[0]
    output = torch.empty_like(batch.query)
    _run(case, batch, output, softmax_scale=0.125)
    expected = ref_paged_attention(softmax_scale=0.125, **batch.ref_kwargs())
    # The reference reads the same cache: check the write landed where it reads.
    flat_k = batch.key_cache.permute(0, 2, 1, 3).reshape(-1, 2, 64)
    assert torch.equal(flat_k[slot_mapping], new_k)
    assert_close(
        output,
        expected,
        dtype=torch.bfloat16,
        atol=TOLERANCES[torch.bfloat16][1],
        rtol=TOLERANCES[torch.bfloat16][2],
    )


@triton.jit
def _row_offsets_kernel(
    block_table_ptr,
    key_pos_ptr,
    out_ptr,
    stride_block,
    stride_slot,
    N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    idx = tl.arange(0, N)
    key_pos = tl.load(key_pos_ptr + idx)
    offsets = paged_row_offsets(
        block_table_ptr,
        key_pos,
        key_pos >= 0,
        stride_block,
        stride_slot,
        BLOCK_SIZE=BLOCK_SIZE,
        MASK_KEYS=True,
    )
    tl.store(out_ptr + idx, offsets)


@pytest.mark.parametrize(
    "head_size, block_size, block_n, use_tma, tile_in_page, expect_tma",
    [
        (128, 64, 64, True, True, True),
        (128, 64, 32, True, True, True),
        (128, 16, 64, True, False, False),  # tile spans 4 pages
        (80, 64, 64, True, True, True),  # boxes of 128 columns
        (128, 64, 64, False, True, False),
    ],
)
def test_launch_chooses_tile_addressing(
    head_size, block_size, block_n, use_tma, tile_in_page, expect_tma
):
    """One block-table read per tile when the tile lies in a page; TMA only where
    the config asks for it and it can apply (and descriptors only then)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tests.kernels.hopper_compile import prefill_launches

    batch = make_paged_batch(
        seqs=[(3, 70)],
        num_q_heads=4,
        num_kv_heads=2,
        head_size=head_size,
        block_size=block_size,
    )
    args = _args(batch, config=PrefillConfig(64, block_n, 4, 2, use_tma))
    ((_, _, kwargs),) = prefill_launches(**args)
    assert kwargs["TILE_IN_PAGE"] is tile_in_page
    assert kwargs["USE_TMA"] is expect_tma
    if expect_tma:
        desc = kwargs["k_desc"]
        assert isinstance(desc, TensorDescriptor)
        assert list(desc.block_shape) == [block_n, triton.next_power_of_2(head_size)]
        assert list(desc.shape[1:]) == [head_size]
        # Row r of the descriptor is element r * head_size of the cache view.
        assert desc.base.data_ptr() == batch.key_cache.data_ptr()
        assert desc.shape[0] * head_size <= batch.key_cache.untyped_storage().nbytes()
    else:
        assert kwargs["k_desc"] is None and kwargs["v_desc"] is None


def test_page_offsets_are_int64():
    """Block offsets past 2**31 elements (a 128k-context cache with many blocks)
    must not wrap; checked on the address helper alone, so no 4 GiB cache is
    needed on the CPU (the GPU test below reads such a cache for real)."""
    block_size, stride_slot = 16, 128
    stride_block = 2 * 8 * block_size * stride_slot  # 2 * kv_heads * bs * d
    block_table = torch.tensor(
        [3, 70_000, 1_000_000, 0], dtype=torch.int32, device=DEVICE
    )
    key_pos = torch.tensor(
        [0, 17, 40, 63, 5, 31, 47, 50, 1, 2, 3, 4, 6, 7, 8, 9],
        dtype=torch.int32,
        device=DEVICE,
    )
    out = torch.empty(16, dtype=torch.int64, device=DEVICE)
    _row_offsets_kernel[(1,)](
        block_table,
        key_pos,
        out,
        stride_block,
        stride_slot,
        N=16,
        BLOCK_SIZE=block_size,
    )
    pages = block_table.long()[key_pos.long() // block_size]
    expected = pages * stride_block + (key_pos.long() % block_size) * stride_slot
    assert expected.max() > 2**31
    assert torch.equal(out, expected)


def test_compiles_for_hopper_with_wgmma():
    """The interpreter accepts code the GPU compiler rejects and says nothing about
    the generated code: compile production configs for sm_90 ahead of time (no GPU
    needed) and require wgmma (tl.dot on 64-row tiles, 4-warp multiples) and
    cp.async pipelining of the paged K/V loads; also the cache write, and one
    MI300 (gfx942, fp8 e4m3fnuz) build that must use MFMA."""
    pytest.importorskip("triton.backends.nvidia")
    from tests.kernels.hopper_compile import run_compile_module

    # A guard, not a speed check: the cold build of every case takes about ten
    # minutes on two CPU cores.
    result = run_compile_module(Path(__file__).with_name("hopper_compile.py"), 1800)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]


def _args(batch, **overrides):
    args = {
        "query": batch.query,
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "output": torch.empty_like(batch.query),
        "block_table": batch.block_table,
        "query_start_loc": batch.query_start_loc,
        "seq_lens": batch.seq_lens,
        "max_query_len": batch.max_query_len,
        "softmax_scale": 0.1,
        "k_scale": batch.k_scale,
        "v_scale": batch.v_scale,
    }
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            lambda b: {"query": b.query.float(), "output": b.query.float()},
            "query dtype",
        ),
        (
            lambda b: {
                "key_cache": b.key_cache.half(),
                "value_cache": b.value_cache.half(),
            },
            "must equal the query dtype",
        ),
        (
            lambda b: {
                "key_cache": b.key_cache.to(torch.float8_e4m3fn),
                "value_cache": b.value_cache.to(torch.float8_e4m3fn),
            },
            "needs k_scale",
        ),
        (lambda b: {"sliding_window": 0}, "sliding_window"),
        (lambda b: {"softmax_scale": 0.0}, "softmax_scale"),
        (lambda b: {"seq_lens": b.seq_lens.long()}, "seq_lens"),
        (lambda b: {"alibi_slopes": torch.ones(3, device=DEVICE)}, "alibi_slopes"),
        (lambda b: {"num_seqs": 9}, "sequence range"),
    ],
    ids=[
        "fp32-query",
        "cache-dtype-mismatch",
        "fp8-without-scale",
        "window-0",
        "scale-0",
        "int64-seq-lens",
        "alibi-shape",
        "seq-range",
    ],
)
def test_rejects_unsupported_inputs(overrides, match):
    batch = make_paged_batch(
        seqs=[(2, 5)], num_q_heads=2, num_kv_heads=1, head_size=64, block_size=16
    )
    with pytest.raises(ValueError, match=match):
        prefix_prefill_attention(**_args(batch, **overrides(batch)))


def test_rejects_split_workspace_beyond_32_bit_offsets(monkeypatch):
    """The kernel addresses the split workspace with 32-bit offsets: a launch whose
    workspace has more elements than the bound is refused before anything runs, one
    at the bound runs."""
    batch = make_paged_batch(
        seqs=[(2, 5)], num_q_heads=2, num_kv_heads=1, head_size=64, block_size=16
    )
    elements = math.prod(
        prefix_prefill.split_workspace_shape(
            num_seqs=1, max_query_len=2, num_tokens=2, num_q_heads=2, head_size=64,
            num_splits=2,
        )
    )  # fmt: skip
    monkeypatch.setattr(prefix_prefill, "_MAX_WORKSPACE_ELEMENTS", elements - 1)
    with pytest.raises(ValueError, match="32-bit offsets"):
        prefix_prefill_attention(**_args(batch, num_splits=2))
    monkeypatch.setattr(prefix_prefill, "_MAX_WORKSPACE_ELEMENTS", elements)
    prefix_prefill_attention(**_args(batch, num_splits=2))


def test_rejects_head_size_above_256():
    query = torch.zeros((2, 1, 512), dtype=torch.bfloat16, device=DEVICE)
    cache = torch.zeros((2, 1, 16, 512), dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="head size 512"):
        prefix_prefill_attention(
            query=query,
            key_cache=cache,
            value_cache=cache,
            output=torch.empty_like(query),
            block_table=torch.zeros((1, 1), dtype=torch.int32, device=DEVICE),
            query_start_loc=torch.tensor([0, 2], dtype=torch.int32, device=DEVICE),
            seq_lens=torch.tensor([2], dtype=torch.int32, device=DEVICE),
            max_query_len=2,
            softmax_scale=0.1,
        )


# ---------------------------------------------------------------------------------
# GPU cross product (GPU_FULL=1)
# ---------------------------------------------------------------------------------

GPU_SEQS = [(1, 700), (128, 128), (37, 1000), (300, 2100), (1, 1), (64, 64 + 513)]


@pytest.mark.full_matrix
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("group", GQA_GROUPS)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_full_shapes(head_size, group, block_size):
    _check_case(
        CASES[0].values[0]
        | {
            "seqs": GPU_SEQS,
            "head_size": head_size,
            "num_q_heads": 2 * group,
            "num_kv_heads": 2,
            "block_size": block_size,
            "config": None,
        }
    )


@pytest.mark.full_matrix
@pytest.mark.parametrize(
    "feature", ["none", "window", "alibi", "softcap", "sinks", "all"]
)
@pytest.mark.parametrize(
    "cache_dtype", [None, torch.float8_e4m3fn, torch.float8_e4m3fnuz]
)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_full_features(q_dtype, cache_dtype, feature):
    on = {
        "window": {"sliding_window": 256},
        "alibi": {"alibi": True},
        "softcap": {"soft_cap": 2.0},
        "sinks": {"sinks": True},
        "all": {"sliding_window": 200, "alibi": True, "soft_cap": 3.0, "sinks": True},
    }.get(feature, {})
    _check_case(
        CASES[0].values[0]
        | {
            "seqs": GPU_SEQS,
            "head_size": 128,
            "num_q_heads": 16,
            "num_kv_heads": 4,
            "block_size": 64,
            "q_dtype": q_dtype,
            "cache_dtype": cache_dtype,
            "config": None,
        }
        | on
    )


@pytest.mark.full_matrix
@pytest.mark.parametrize(
    "extra",
    [{}, {"sliding_window": 4096}, {"cache_dtype": torch.float8_e4m3fn}],
    ids=["full", "window", "fp8"],
)
def test_long_context_128k(extra):
    """Chunked prefill of a 128k context (one KV head keeps the reference's
    [heads, q, k] score matrix at a few GiB)."""
    _check_case(
        CASES[0].values[0]
        | {
            "seqs": [(512, 131072), (1, 65536), (300, 300)],
            "head_size": 128,
            "num_q_heads": 8,
            "num_kv_heads": 1,
            "block_size": 64,
            "config": None,
        }
        | extra
    )


@pytest.mark.full_matrix
def test_block_offsets_past_int32():
    """Pages at block ids whose element offset exceeds 2**31 (a ~4.3 GiB cache)."""
    assert ON_GPU and not INTERPRET
    batch = make_paged_batch(
        seqs=[(40, 300), (7, 7)],
        num_q_heads=4,
        num_kv_heads=1,
        head_size=128,
        block_size=16,
    )
    stride = batch.kv_cache.stride(0)
    shift = 2**31 // stride + 1
    big = torch.empty(
        (shift + batch.kv_cache.shape[0],) + batch.kv_cache.shape[1:],
        dtype=batch.kv_cache.dtype,
        device=DEVICE,
    )
    big[shift:] = batch.kv_cache
    batch.kv_cache = big
    batch.key_cache, batch.value_cache = big[:, 0], big[:, 1]
    batch.block_table = batch.block_table + shift
    case = CASES[0].values[0] | {"config": None}
    output = torch.empty_like(batch.query)
    _run(case, batch, output, softmax_scale=0.1)
    expected = ref_paged_attention(softmax_scale=0.1, **batch.ref_kwargs())
    assert_close(
        output,
        expected,
        dtype=torch.bfloat16,
        atol=TOLERANCES[torch.bfloat16][1],
        rtol=TOLERANCES[torch.bfloat16][2],
    )


def _launch_of_group(group, config):
    from tests.kernels.hopper_compile import prefill_launch

    _, grid, kwargs = prefill_launch(
        128, group, 64, torch.bfloat16, 4096, config.use_tma, config
    )
    plain = (int, float, bool, str, type(None))
    return grid, {k: v for k, v in kwargs.items() if isinstance(v, plain)}


@pytest.mark.parametrize(
    "cache_dtype,fp8_qk",
    [
        (torch.float8_e4m3fn, True),
        (torch.float8_e4m3fnuz, True),
        # e5m2 keeps 2 mantissa bits: a config's fp8_qk never rounds the query to it
        (torch.float8_e5m2, False),
        (torch.bfloat16, False),
    ],
)
def test_fp8_qk_runs_only_on_e4m3_caches(cache_dtype, fp8_qk):
    from tests.kernels.hopper_compile import prefill_launch

    config = PrefillConfig(64, 32, 4, 1, fp8_qk=cache_dtype != torch.bfloat16)
    _, _, kwargs = prefill_launch(128, 4, 64, cache_dtype, 4096, False, config)
    assert kwargs["FP8_QK"] is fp8_qk


@pytest.mark.parametrize("group,padded", [(5, 8), (6, 8), (7, 8), (3, 4)])
def test_a_group_launches_its_padded_groups_tiles_without_padding_rows(group, padded):
    """Why the table keys the padded group: a program of group 5-7 does group 8's
    work (the same tiles, loads and compile-time shape; only the group size and
    the query/output token strides differ), and the grid holds exactly the group's
    rows: 7 heads take 7/8 of group 8's row tiles, none of them padding."""
    from vllm.attention.ops.tuning.prefill_configs import group_class

    assert group_class(group) == padded and group_class(padded) == padded
    config = PrefillConfig(128, 64, 4, 2, use_tma=True)
    grid, ours = _launch_of_group(group, config)
    grid_padded, theirs = _launch_of_group(padded, config)
    # prefill_launch: 4 sequences, 2 KV heads (one program per row tile of each)
    assert grid == (-(-4096 * group // 128) * 4 * 2,)
    assert grid_padded == (4096 * padded // 128 * 4 * 2,)
    differ = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    assert differ == {"GROUP_SIZE", "STRIDE_Q_TOKEN", "STRIDE_O_TOKEN"}


def test_group_7_takes_group_8s_h200_entry_and_is_correct():
    """The H200 table's group-8 entries serve group 7 (and the heuristic no
    longer does); that entry's tiles (TMA, 4 warps) give the reference result for
    group 7 in the interpreter."""
    fields = {
        "head_size": 128,
        "q_dtype": torch.bfloat16,
        "kv_dtype": torch.bfloat16,
        "block_size": 64,
        "max_query_len": 4096,
    }
    table = PREFILL_TABLE.load("NVIDIA H200")
    for group in (5, 6, 7):
        key = PREFILL_TABLE.key(group=group, **fields)
        assert key == PREFILL_TABLE.key(group=8, **fields) and key in table
        picked = PREFILL_TABLE.lookup(gpu_name="NVIDIA H200", group=group, **fields)
        assert picked == table[key]
    assert picked.use_tma and picked.block_m == 128
    case = _case(
        "h200-entry-g7",
        num_q_heads=7,
        num_kv_heads=1,
        head_size=128,
        block_size=64,
        seqs=[(9, 70), (1, 5), (20, 20)],
        config=picked,
    ).values[0]
    _check_case(case)


def test_a_table_with_two_entries_of_one_class_is_refused(tmp_path, monkeypatch):
    """Entries for groups 7 and 8 would be one key: the loader names both."""
    import json

    from vllm.attention.ops.tuning import tables

    fields = {
        "head_size": 128,
        "q_dtype": "bfloat16",
        "kv_dtype": "bfloat16",
        "block_size": 64,
        "max_query_len": 4096,
    }
    config = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    entries = [{**fields, "group": g, "config": config} for g in (8, 7)]
    (tmp_path / "prefix_prefill_Test_GPU.json").write_text(
        json.dumps({"provenance": {"gpu": "Test GPU"}, "configs": entries})
    )
    monkeypatch.setattr(tables, "TUNING_DIR", tmp_path)
    tables.clear_caches()
    try:
        with pytest.raises(ValueError, match="entries 0 and 1 have the same key"):
            PREFILL_TABLE.load("Test GPU")
    finally:
        tables.clear_caches()


def test_fp16_queries_take_the_bf16_entry_their_table_lacks(tmp_path, monkeypatch):
    """A key of fp16 queries without its own entry takes the bf16 key's (its fp16
    cache follows the query, an fp8 cache stays); its own entry wins; bf16 never
    takes an fp16 entry, and a key in neither takes the heuristic."""
    import json

    from vllm.attention.ops.tuning import tables
    from vllm.attention.ops.tuning.prefill_configs import heuristic_prefill_config

    fields = {"head_size": 128, "group": 4, "block_size": 64, "max_query_len": 4096}
    tile = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 2,
            "use_tma": True}  # fmt: skip
    bf16 = {**tile, "num_stages": 3}
    fp8 = {**tile, "fp8_qk": True}
    own = {**tile, "block_n": 32}
    entries = [
        {**fields, "q_dtype": "bfloat16", "kv_dtype": "bfloat16", "config": bf16},
        {**fields, "q_dtype": "bfloat16", "kv_dtype": "fp8", "config": fp8},
        {**fields, "q_dtype": "float16", "kv_dtype": "float16",
         "max_query_len": 16384, "config": own},
        {**fields, "q_dtype": "float16", "kv_dtype": "float16",
         "head_size": 64, "config": tile},
    ]  # fmt: skip
    (tmp_path / "prefix_prefill_Test_GPU.json").write_text(
        json.dumps({"provenance": {"gpu": "Test GPU"}, "configs": entries})
    )
    monkeypatch.setattr(tables, "TUNING_DIR", tmp_path)
    tables.clear_caches()

    def lookup(q, kv, **changes):
        key = {**fields, "q_dtype": q, "kv_dtype": kv, **changes}
        return PREFILL_TABLE.lookup(gpu_name="Test GPU", **key)

    try:
        assert lookup(torch.float16, torch.float16) == PrefillConfig(**bf16)
        assert lookup(torch.float16, torch.float8_e4m3fn) == PrefillConfig(**fp8)
        assert lookup(torch.float16, torch.float16, max_query_len=9000) == (
            PrefillConfig(**own)
        )

        def heuristic(**changes):
            key = {**fields, "kv_dtype": "bfloat16", **changes}
            return heuristic_prefill_config(**key, is_hip=False)

        # bf16 does not borrow fp16's entry; a key in neither dtype takes the
        # heuristic (the entries above differ from it).
        assert lookup(torch.bfloat16, torch.bfloat16, head_size=64) == heuristic(
            head_size=64
        )
        assert heuristic(head_size=64) != PrefillConfig(**tile)
        assert lookup(torch.float16, torch.float16, group=1) == heuristic(group=1)
        assert heuristic(group=1) not in (PrefillConfig(**bf16), PrefillConfig(**own))
    finally:
        tables.clear_caches()


@pytest.mark.parametrize(
    "key, config, match",
    [
        ({}, {"block_m": 64, "num_warps": 4, "gluon": True}, "128 or 192 rows on 4"),
        ({"head_size": 80}, {"gluon": True, "use_tma": True}, "never takes"),
        ({"kv_dtype": "fp8"}, {"gluon": True, "use_tma": True}, "never takes"),
        ({}, {"gluon": True}, "loads K/V by TMA"),
        ({}, {"gluon": True, "use_tma": True, "longest_first": False}, "longest"),
        ({}, {"fp8_qk": True}, "16-bit cache"),
        ({}, {"split_head": True}, "does not split"),
        ({"block_size": 32}, {"use_tma": True}, "not slices of 32-key pages"),
        ({}, {"use_tma": True, "block_n": 128}, "not slices of 64-key pages"),
        ({}, {"block_n": 48}, "powers of two"),
        # 192 rows: three consumer warpgroups of the Gluon kernel, at head 64.
        ({}, {"block_m": 192}, "powers of two"),
        ({"head_size": 64}, {"block_m": 192, "gluon": True, "use_tma": True}, None),
        ({}, {"block_m": 192, "gluon": True, "use_tma": True}, "head size 128"),
        # The softmax overlapping its warpgroup's own p.v: the Gluon kernel's.
        ({}, {"overlap_pv": True}, "without gluon"),
        (
            {"head_size": 64},
            {"block_m": 192, "gluon": True, "use_tma": True, "overlap_pv": True},
            None,
        ),
        ({}, {}, None),  # the controls: what the H200 table ships
        ({}, {"gluon": True, "use_tma": True}, None),
        # The Gluon kernel loads a tile of more keys than a page as page boxes.
        ({}, {"gluon": True, "use_tma": True, "block_n": 128, "num_stages": 2}, None),
        ({"head_size": 96}, {"split_head": True, "use_tma": True}, None),
        # The Gluon kernel splits head 96 on 16-bit caches only.
        ({"head_size": 96}, {"gluon": True, "use_tma": True, "split_head": True}, None),
        (
            {"head_size": 96, "kv_dtype": "fp8"},
            {"gluon": True, "use_tma": True, "split_head": True, "fp8_qk": True},
            "16-bit caches only",
        ),
        ({}, {"gluon": True, "use_tma": True, "split_head": True}, "not 128"),
    ],
)
def test_a_table_entry_a_kernel_would_ignore_is_refused(
    tmp_path, monkeypatch, key, config, match
):
    """A field the kernel that runs a key's launches would ignore is refused when
    the table loads, naming the file and the entry. A ``gluon`` entry names the
    Hopper kernel's launch: TMA loads and longest first, as that kernel runs
    (its key's other launches run the portable kernel's heuristic config)."""
    import json

    from vllm.attention.ops.tuning import tables

    fields = {
        "head_size": 128, "q_dtype": "bfloat16", "kv_dtype": "bfloat16",
        "group": 4, "block_size": 64, "max_query_len": 4096, **key,
    }  # fmt: skip
    config = {
        "block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3, **config
    }  # fmt: skip
    (tmp_path / "prefix_prefill_Test_GPU.json").write_text(
        json.dumps({"provenance": {}, "configs": [{**fields, "config": config}]})
    )
    monkeypatch.setattr(tables, "TUNING_DIR", tmp_path)
    tables.clear_caches()
    try:
        if match is None:
            assert len(PREFILL_TABLE.load("Test GPU")) == 1
        else:
            with pytest.raises(ValueError, match=match) as error:
                PREFILL_TABLE.load("Test GPU")
            assert "prefix_prefill_Test_GPU.json: entry 0" in str(error.value)
    finally:
        tables.clear_caches()


def test_valid_configs_keep_at_most_128_rows_per_warpgroup():
    """256-row tiles are candidates with two warpgroups (8 warps) only: one
    warpgroup's fp32 accumulator for 256 rows would not fit its registers."""
    from vllm.attention.ops.tuning.prefill_configs import is_valid_config

    def valid(block_m, num_warps):
        config = PrefillConfig(block_m, 64, num_warps, 2, use_tma=True)
        return is_valid_config(config, head_size=128, kv_dtype=torch.bfloat16)

    assert valid(256, 8) and valid(128, 4) and valid(128, 8) and valid(64, 4)
    assert not valid(256, 4)


def test_shipped_prefill_tables_hold_valid_configs_for_their_keys():
    """Every committed prefill table parses, and each entry passes the sweep's own
    filter for its key (a merged record cannot bring in a tile that overflows
    shared memory or a warpgroup's registers, or fp8_qk on a 16-bit cache)."""
    import json

    from vllm.attention.ops.tuning import tables
    from vllm.attention.ops.tuning.prefill_configs import (
        PREFILL_TABLE,
        is_valid_config,
    )

    paths = sorted(tables.TUNING_DIR.glob("prefix_prefill_*.json"))
    assert paths
    for path in paths:
        gpu = json.loads(path.read_text())["provenance"]["gpu"]
        table = PREFILL_TABLE.load(gpu)
        assert table, path.name
        for key, config in table.items():
            fields = dict(zip(PREFILL_TABLE.key_fields, key))
            kv = {"fp8": torch.float8_e4m3fn}.get(fields["kv_dtype"], torch.bfloat16)
            valid = is_valid_config(config, head_size=fields["head_size"], kv_dtype=kv)
            assert valid, (path.name, key, config)


def test_nvidia_gpu_excludes_rocm_and_interpreter(monkeypatch):
    """Inline PTX (decode's early_convert) and TMA apply on NVIDIA GPUs, never on
    ROCm or in the interpreter."""
    from vllm.attention.ops.hardware import nvidia_gpu

    monkeypatch.setattr(torch.version, "hip", None)
    assert nvidia_gpu(torch.device("cuda", 0))
    assert not nvidia_gpu(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", "7.0")
    assert not nvidia_gpu(torch.device("cuda", 0))


@triton.jit
def _program_coords_kernel(
    out_ptr,
    num_seqs,
    num_splits,
    NUM_KV_HEADS: tl.constexpr,
    LONGEST_FIRST: tl.constexpr,
):
    row_tile, seq, kv_head, split = program_coords(
        num_seqs, num_splits, NUM_KV_HEADS=NUM_KV_HEADS, LONGEST_FIRST=LONGEST_FIRST
    )
    pid = tl.program_id(0)
    tl.store(out_ptr + 4 * pid, row_tile)
    tl.store(out_ptr + 4 * pid + 1, seq)
    tl.store(out_ptr + 4 * pid + 2, kv_head)
    tl.store(out_ptr + 4 * pid + 3, split)


@pytest.mark.parametrize("longest_first", [True, False])
@pytest.mark.parametrize(
    "row_tiles,num_seqs,num_kv_heads,num_splits",
    [(5, 3, 2, 1), (4, 1, 8, 1), (3, 2, 2, 3)],
)
def test_program_order(row_tiles, num_seqs, num_kv_heads, num_splits, longest_first):
    """GPUs start programs in grid order. Every (row tile, sequence, KV head, KV
    split) gets exactly one program, and each config order holds: longest first
    (the row tile, whose work grows with its index, never grows along the grid, so
    the last row tiles of all heads, splits and sequences start before any shorter
    one), or head-major (one head's programs together, each sequence's longest tile
    first)."""
    programs = row_tiles * num_seqs * num_kv_heads * num_splits
    out = torch.full((programs, 4), -1, dtype=torch.int32, device=DEVICE)
    _program_coords_kernel[(programs,)](
        out,
        num_seqs,
        num_splits,
        NUM_KV_HEADS=num_kv_heads,
        LONGEST_FIRST=longest_first,
    )
    coords = [tuple(row) for row in out.cpu().tolist()]
    assert sorted(coords) == [
        (t, s, h, k)
        for t in range(row_tiles)
        for s in range(num_seqs)
        for h in range(num_kv_heads)
        for k in range(num_splits)
    ]
    if longest_first:
        tiles = [c[0] for c in coords]
        assert tiles == sorted(tiles, reverse=True)
        first = coords[: num_seqs * num_kv_heads * num_splits]
        assert {c[0] for c in first} == {row_tiles - 1}
    else:
        assert coords == sorted(coords, key=lambda c: (c[2], c[3], c[1], -c[0]))


@pytest.mark.parametrize(
    "programs, num_warps, max_seq_len, splits",
    [
        # 132 SMs: 1056 warp slots; split when the launch fills at most 528, into
        # as many splits as one wave of resident programs holds (rounded down).
        (128, 4, 18_432, 2),  # a 2k chunk over 16k, group 1, 128-row tiles: 264 / 128
        (100, 4, 100_000, 2),  # 264 / 100: 3 would start a second, partial wave
        (66, 4, 100_000, 4),  # 264 / 66: four splits fill one wave exactly
        (64, 8, 34_816, 2),  # 256-row 8-warp tiles: 132 resident / 64
        (128, 8, 34_816, 1),  # 8-warp programs on every SM: no split
        (256, 4, 34_816, 1),  # group 2: two 4-warp programs per SM already
        (132, 4, 100_000, 2),  # exactly half the slots
        (133, 4, 100_000, 1),  # one program over half
        (8, 4, 100_000, 16),  # spec-decode verification, 8 KV heads: capped
        (8, 4, 6_000, 2),  # short sequences: one split per 2048 keys
        (8, 4, 2_047, 1),  # under 2048 keys: never split
    ],
)
def test_split_count_rule(programs, num_warps, max_seq_len, splits):
    assert (
        choose_prefill_splits(
            programs=programs,
            num_warps=num_warps,
            max_seq_len=max_seq_len,
            num_sms=132,
        )  # fmt: skip
        == splits
    )


def _plan(config, *, num_kv_heads=8, group=1, window=None, head_size=128,
          max_query_len=2048, num_seqs=1, max_seq_len=34_816, device=None,
          **layer):  # fmt: skip
    """The plan of a launch of ``num_seqs`` sequences (on ``device``, default the
    CPU, which pretends to be an H200 with 132 SMs)."""
    layer = prefix_prefill.PrefillLayer(
        head_size=head_size, num_q_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads, q_dtype=torch.bfloat16,
        kv_dtype=torch.bfloat16, block_size=64, pages_are_rows=True,
        sliding_window=window, **layer,
    )  # fmt: skip
    return prefix_prefill.plan_prefill(
        layer=layer, device=device or torch.device("cpu"), seq_start=0,
        num_seqs=num_seqs, num_tokens=num_seqs * max_query_len,
        max_query_len=max_query_len, max_seq_len=max_seq_len, config=config,
    )  # fmt: skip


@pytest.mark.parametrize(
    "window, splits",
    [
        (None, 2),  # a 2k chunk over 32k at 8 KV heads, group 1: 128 programs
        (8192, 2),  # a window wider than the 4k it would have to fall under
        (3000, 1),  # window + block_m < 2 * SPLIT_MIN_KEYS: at most one split
        (16, 1),  # a program sees 16 + block_m keys: never split
    ],
)
def test_auto_split_count_is_bounded_by_the_window(window, splits):
    config = PrefillConfig(block_m=128, block_n=64, num_warps=4, num_stages=2)
    assert _plan(config, window=window).num_splits == splits
    assert _plan(config, window=window, max_seq_len=None).num_splits == 1


@pytest.fixture
def on_hopper(monkeypatch):
    """Plans made as on an sm_90 GPU (the device check answers yes)."""
    monkeypatch.setattr(prefix_prefill, "is_hopper", lambda device: True)


def test_a_gluon_program_counts_as_a_whole_sm(on_hopper):
    """The 2k chunk over 32k of group 1 that splits in two with the portable
    kernel's 4-warp tile fills the SMs once with Gluon programs (one per SM): no
    split, so the Gluon kernel runs it. Half as many programs still split, and a
    split launch runs in the portable kernel (the Gluon kernel takes none)."""
    ws = PrefillConfig(128, 128, 4, 2, use_tma=True, gluon=True)
    plan = _plan(ws)
    assert (plan.kernel, plan.num_splits, plan.config) == ("gluon", 1, ws)
    plan = _plan(dataclasses.replace(ws, block_n=64, gluon=False))
    assert (plan.kernel, plan.num_splits) == ("triton", 2)
    plan = _plan(ws, num_kv_heads=4)
    assert (plan.kernel, plan.num_splits) == ("triton", 2)
    # Not the Gluon tiles on 4 warps with pointer loads: the key's heuristic.
    assert plan.config == PrefillConfig(128, 64, 4, 2, use_tma=True)
    assert plan.programs == 16 * 4


@pytest.mark.parametrize(
    "feature",
    [{"alibi": True}, {"causal": False}],
    ids=["alibi", "non_causal"],
)
def test_the_kernel_is_chosen_before_its_split_count(monkeypatch, feature):
    """A layer the Gluon kernel does not take runs in the portable kernel under
    the portable kernel's split decision, not under one made for Gluon programs:
    the same launch that stays whole in the Gluon kernel (sinks included) splits
    here."""
    ws = PrefillConfig(128, 64, 4, 3, use_tma=True, gluon=True)
    monkeypatch.setattr(prefix_prefill, "is_hopper", lambda device: True)
    assert _plan(ws).kernel == "gluon"
    with_sinks = _plan(ws, sinks=True)
    assert (with_sinks.kernel, with_sinks.num_splits) == ("gluon", 1)
    plan = _plan(ws, **feature)
    assert (plan.kernel, plan.num_splits) == ("triton", 2)
    assert plan.config == PrefillConfig(128, 64, 4, 2, use_tma=True)
    monkeypatch.setattr(prefix_prefill, "is_hopper", lambda device: False)
    off_hopper = _plan(ws)
    assert (off_hopper.kernel, off_hopper.num_splits) == ("triton", 2)


def test_an_automatic_split_fits_the_callers_workspace():
    """A plan views the split workspace in the caller's buffer
    (``split_workspace_bound`` holds every automatic split of valid configs) and
    lowers an automatic count to what a smaller buffer holds; an explicit count
    that does not fit is refused."""
    config = PrefillConfig(block_m=128, block_n=64, num_warps=4, num_stages=2)
    layer = prefix_prefill.PrefillLayer(
        head_size=128, num_q_heads=8, num_kv_heads=8, q_dtype=torch.bfloat16,
        kv_dtype=torch.bfloat16, block_size=64, pages_are_rows=True,
    )  # fmt: skip
    launch = dict(
        layer=layer, device=torch.device("cpu"), seq_start=0, num_seqs=1,
        num_tokens=2048, max_query_len=2048, max_seq_len=34_816, config=config,
    )  # fmt: skip
    bound = prefix_prefill.split_workspace_bound(head_size=128, num_sms=132)
    buffer = torch.empty(bound)
    plan = prefix_prefill.plan_prefill(**launch, workspace=buffer)
    assert plan.num_splits == 2
    assert plan.workspace.data_ptr() == buffer.data_ptr()
    assert plan.workspace.shape == (2048, 8, 2, 129)
    one_split = 2048 * 8 * 129
    plan = prefix_prefill.plan_prefill(**launch, workspace=buffer[: 2 * one_split - 1])
    assert (plan.num_splits, plan.workspace) == (1, None)
    with pytest.raises(ValueError, match="the buffer holds"):
        prefix_prefill.plan_prefill(
            **launch, num_splits=2, workspace=buffer[: 2 * one_split - 1]
        )


def test_split_workspace_bound_holds_every_automatic_split():
    """Over random launches of the configs the tables and heuristic can give
    (at most 32 rows per warp), every automatic split's workspace fits the
    bound, so the builder's one buffer never lowers a split count."""
    rng = random.Random(1)
    splits_seen = 0
    for _ in range(400):
        block_m, num_warps = rng.choice([(64, 4), (128, 4), (128, 8), (256, 8)])
        config = PrefillConfig(block_m, 64, num_warps, 2)
        group = rng.choice([1, 2, 4, 5, 7, 8])
        num_kv_heads = rng.choice([1, 2, 4, 8])
        head_size = rng.choice([64, 96, 128, 256])
        max_query_len = rng.choice([2, 17, 100, 700, 2048, 5000])
        num_seqs = rng.choice([1, 2, 3, 8])
        plan = _plan(
            config, num_kv_heads=num_kv_heads, group=group, head_size=head_size,
            max_query_len=max_query_len, num_seqs=num_seqs, max_seq_len=131_072,
        )  # fmt: skip
        if plan.num_splits > 1:
            splits_seen += 1
            bound = prefix_prefill.split_workspace_bound(
                head_size=head_size, num_sms=132
            )
            assert plan.workspace.numel() <= bound, plan
    assert splits_seen > 50


def test_split_decision_is_decided_by_the_smallest_launch():
    """Whether a launch splits (``SPLIT_KV``, a compiled variant) only grows with
    fewer programs and more keys: a launch of a bucket splits only if one sequence
    with the bucket's shortest query over ``max_model_len`` keys does. The backend
    warms each bucket's split variant with that launch (``warm_up_plan``), so this
    is what keeps serving from compiling it."""
    rng = random.Random(0)
    buckets = [(2, 16), (17, 64), (65, 256), (257, 1024), (1025, 4096)]
    seen = {True: 0, False: 0}
    for _ in range(300):
        group = rng.choice([1, 2, 4, 5, 7, 8, 16])
        num_kv_heads = rng.choice([1, 2, 4, 8])
        window = rng.choice([None, None, 512, 4096])
        block_m, num_warps = rng.choice([(64, 4), (128, 4), (128, 8), (256, 8)])
        max_model_len = rng.choice([2048, 8192, 32768, 131072])
        shortest, longest = rng.choice(buckets)
        splits = functools.partial(
            _plan, PrefillConfig(block_m, 64, num_warps, 2), group=group,
            num_kv_heads=num_kv_heads, window=window,
        )  # fmt: skip

        warm = (
            splits(max_query_len=shortest, num_seqs=1, max_seq_len=max_model_len)
        ).num_splits > 1
        seen[warm] += 1
        for _ in range(20):  # launches of the bucket, often near its smallest
            query = rng.choice([shortest, rng.randint(shortest, longest)])
            num_seqs = rng.choice([1, rng.randint(1, 64)])
            max_seq_len = rng.choice([max_model_len, rng.randint(1, max_model_len)])
            max_seq_len = max(query, max_seq_len)
            got = splits(
                max_query_len=query, num_seqs=num_seqs, max_seq_len=max_seq_len
            ).num_splits
            assert warm or got == 1
    assert min(seen.values()) > 30, seen  # both outcomes drawn


def test_split_launch_chosen_from_max_seq_len_matches_reference():
    """With ``max_seq_len`` and no ``num_splits``, a launch of few programs over a
    long context splits (two launches: the kernel and the merge) and is correct."""
    batch = make_paged_batch(
        seqs=[(3, 4200), (1, 1200)], num_q_heads=4, num_kv_heads=2, head_size=64,
        block_size=16,
    )  # fmt: skip
    output = torch.full_like(batch.query, float("nan"))
    launched = []
    real = prefix_prefill._launches

    def spy(plan, inputs):
        launches = real(plan, inputs)
        launched.append([k for k, _, _ in launches])
        return launches

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prefix_prefill, "_launches", spy)
        prefix_prefill_attention(
            query=batch.query, key_cache=batch.key_cache,
            value_cache=batch.value_cache, output=output,
            block_table=batch.block_table, query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens, max_query_len=batch.max_query_len,
            softmax_scale=0.125, config=SMALL, max_seq_len=4200,
        )  # fmt: skip
    assert launched == [[prefix_prefill._prefix_prefill_kernel, merge_splits_kernel]]
    expected = ref_paged_attention(softmax_scale=0.125, **batch.ref_kwargs())
    dtype, atol, rtol = TOLERANCES[torch.bfloat16]
    assert_close(output, expected, dtype=dtype, atol=atol, rtol=rtol)


def test_picked_configs_fit_the_gpus_shared_memory():
    """Hopper keeps every heuristic config and every H200 table entry unchanged; a
    GPU with less shared memory per program (A100: 163 KiB, Ada: 99 KiB) gets a
    config within its limit that still has wgmma-sized tiles (rows a multiple of
    64, whole warpgroups of at most 128 rows; the Gluon kernel's consumers take 64
    rows each, three for its 192-row tiles)."""
    from vllm.attention.ops.hardware import HOPPER_SMEM_BYTES_PER_PROGRAM
    from vllm.attention.ops.tuning.prefill_configs import (
        GLUON_BLOCK_MS,
        GLUON_WG_ROWS,
        QUERY_LEN_BUCKETS,
        fit_shared_memory,
        heuristic_prefill_config,
        shared_memory_estimate,
    )

    picked = []
    for head_size in HEAD_SIZES:
        for group in (1, 4, 8, 16):
            for block_size in (16, 64, 128):
                for bucket in QUERY_LEN_BUCKETS:
                    config = heuristic_prefill_config(
                        head_size=head_size,
                        group=group,
                        block_size=block_size,
                        max_query_len=bucket,
                    )
                    for kv in (torch.bfloat16, torch.float8_e4m3fn):
                        picked.append((config, head_size, kv))
    for key, config in PREFILL_TABLE.load("NVIDIA H200").items():
        fields = dict(zip(PREFILL_TABLE.key_fields, key))
        picked.append((config, fields["head_size"], fields["kv_dtype"]))
    shrunk = 0
    for config, head_size, kv in picked:
        fit = {"head_size": head_size, "kv_dtype": kv}
        limit = HOPPER_SMEM_BYTES_PER_PROGRAM
        assert fit_shared_memory(config, **fit, limit=limit) == config
        for limit in (163 * 1024, 99 * 1024):
            small = fit_shared_memory(config, **fit, limit=limit)
            assert shared_memory_estimate(small, **fit) <= limit, (config, limit)
            assert small.block_m % 64 == 0 and small.num_warps % 4 == 0
            gluon = small.gluon and small.block_m in GLUON_BLOCK_MS
            rows_per_warpgroup = (
                GLUON_WG_ROWS if gluon else small.block_m // (small.num_warps // 4)
            )
            assert rows_per_warpgroup <= 128
            shrunk += small != config
    assert shrunk > 0  # some Hopper tiles do not fit the smaller GPUs as they are


@pytest.mark.parametrize(
    "head_size, cache_dtype, tma",
    [
        (96, torch.bfloat16, True),  # 192-byte rows
        (24, torch.bfloat16, True),  # 48-byte rows
        (100, torch.bfloat16, False),  # 200-byte rows
        (36, torch.bfloat16, False),
        (48, torch.float8_e4m3fn, True),  # 48-byte rows
        (24, torch.float8_e4m3fn, False),  # 24-byte rows
    ],
)
def test_tma_only_for_rows_a_tensor_map_addresses(head_size, cache_dtype, tma):
    """Any head size runs, but K/V go through TMA descriptors only where a row's
    bytes are a multiple of 16 (a tensor map's stride rule); other head sizes load
    through pointers under the same TMA config."""
    from tests.kernels.hopper_compile import prefill_launch

    config = PrefillConfig(block_m=64, block_n=64, num_warps=4, num_stages=2)
    _, _, kwargs = prefill_launch(
        head_size, 4, 64, cache_dtype, 256, use_tma=True, config=config
    )
    assert (kwargs["k_desc"] is not None) == tma
    assert (kwargs["v_desc"] is not None) == tma
    assert kwargs["USE_TMA"] == tma
