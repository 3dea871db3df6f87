# SPDX-License-Identifier: Apache-2.0
"""Paged attention for sequences with more than one query token (prefix prefill).

Covers prefill, chunked prefill, prefix-cache hits and spec-decode verification
(it is also correct for query length 1). Every key and value is read from the paged
cache: the new tokens' K/V were written there before the call (see
``paged_cache_write.py``), so the cached context and the new tokens are one range
of keys ``[0, seq_len)`` and one loop.

Layouts (docs/design.md):
    query, output        [num_tokens, num_q_heads, head_size]      bf16 / fp16
    key/value_cache      [num_blocks, num_kv_heads, block_size, head_size]
                         bf16 / fp16 / fp8 (per-tensor k_scale, v_scale)
    block_table          [num_seqs_total, max_blocks_per_seq]       int32
    query_start_loc      [num_seqs_total + 1]                       int32
    seq_lens             [num_seqs_total]  KV length incl. new tokens, int32
Query token ``i`` of a sequence with ``q_len`` new tokens sits at position
``seq_len - q_len + i`` and sees key ``j`` iff ``j <= pos`` (and ``pos - j < W``
with a sliding window ``W``). Non-causal launches (constexpr ``CAUSAL`` off:
cross-attention over a cached encoder, encoder self-attention, bidirectional
drafting) place every row at the last key, ``pos = seq_len - 1``, so each sees all
``seq_len`` keys and the same code masks only keys past the sequence; with a
window the query at ``pos`` sees key ``j`` iff ``|pos - j| < W``, which is the
causal window ``2W - 1`` from a row placed ``W - 1`` keys past its token.

Algorithm. FlashAttention-2's online softmax (Dao, arXiv 2307.08691) with the
"Q-block" GQA packing of the Triton attention paper (Ringlein et al., "The Anatomy
of a Triton Attention Kernel", arXiv 2511.11581):

* The query rows of one KV head, token-major with the group's heads inside
  (row ``r``: token ``r // GROUP_SIZE``, head ``r % GROUP_SIZE`` of the group), are
  cut into tiles of ``BLOCK_M`` rows; one program handles one ``[BLOCK_M,
  HEAD_PAD]`` tile, so each K/V tile is loaded once for the whole group. No row is
  padding whatever the group (7 heads fill 7 rows per token, not 8); a tile may
  start and end inside a token. ``BLOCK_M`` is a multiple of 64 so that the two
  ``tl.dot`` per tile lower to Hopper wgmma.
* A 1D grid of ``row_tiles * num_seqs * num_kv_heads * num_splits`` programs
  (``num_splits``: split-KV, below; 1 otherwise), in the order
  the config's ``longest_first`` picks (``program_coords``): longest work first
  across every head and sequence, or head-major with each head's longest tiles
  first. Programs past the end of a shorter sequence's query exit at once.
* KV tiles of ``BLOCK_N`` keys are addressed through the block table: key by key
  (``paged_row_offsets``) when a tile may span pages, once per tile
  (``page_tile_offset``, constexpr ``TILE_IN_PAGE``) when ``BLOCK_N`` divides the
  page size. ``BLOCK_N`` is tuned independently of the page size. Offsets are
  int64. With ``use_tma`` in the config (NVIDIA sm_90+, tile inside a page) the
  page-slice tiles are loaded by TMA through host-side descriptors of the caches
  seen as ``[rows, head_size]`` matrices; a head size below ``HEAD_PAD`` (80, 96,
  112) loads ``[BLOCK_N, HEAD_PAD]`` boxes whose columns past the head size are
  outside the matrix, which TMA fills with zeros. With the config's
  ``split_head`` a head size that is two powers of two (``head_split``: 96 = 64 +
  32) is carried unpadded in two column tiles (``HEAD_LO``, ``HEAD_HI``): two
  loads (or boxes) per K/V tile, q.k as two dots into one score tile, p.v into
  two accumulators.
* The key range a program visits is ``[first, pos_hi]``: ``first`` skips whole
  tiles left of every row's sliding window. It is cut into tiles that need a mask
  (window edge, causal diagonal) and tiles fully visible to every row; the inner
  step ``_attend_kv_range`` is written once and called with a constexpr ``MASKED``
  stage for each part.
* Scores are fp32 in log2 units (log2(e) folded into the scale) so the softmax
  uses exp2; soft-cap, ALiBi, sinks and fp8 scales are constexpr-gated. With an fp8
  cache both dots run in fp16 whatever the query dtype (``query_for_cache``: one
  e4m3 -> fp16 conversion per element instead of two to reach bf16); with the
  config's ``fp8_qk`` the query tile is quantised to the cache's format once per
  program and q.k runs on fp8 tensor cores (``FP8_QK``), only V is converted.
* Strides (the same rule in the decode kernel): the query, output and cache strides
  are fixed for a model, so they are ``tl.constexpr`` (``STRIDE_*``) and Triton
  folds the address arithmetic; the block table's row stride is set by the model
  runner (max blocks per sequence) and stays a runtime argument so that it does not
  multiply the compiled variants.
* Split-KV: a launch of few programs over long contexts (``choose_prefill_splits``)
  cuts each program's key tiles into ``num_splits`` contiguous shares (a run-time
  argument; whether the launch splits at all is the constexpr ``SPLIT_KV``, so the
  unsplit kernel carries none of the split arithmetic); split programs write
  normalised partial outputs and their log-sum-exp to an fp32 workspace, and
  ``merge_splits_kernel`` (shared with decode) combines them and adds the sink
  once.
* Launch tiles come from a table keyed on (head size, dtypes, group, page size,
  bucketed max query length), with a heuristic fallback: see ``tuning/``. There is
  no autotuning and no host sync at launch (``max_query_len`` is a host int).
"""

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from vllm.attention.ops.hardware import (
    is_hopper,
    num_sms,
    shared_memory_per_program,
    tma_supported,
)
from vllm.attention.ops.triton_attention_common import (
    E4M3_DTYPES,
    TMA_ROW_ALIGN_BYTES,
    AttentionInputs,
    cache_descriptor,
    check_attention_inputs,
    finalize_output,
    fp8_max,
    head_pad,
    head_split,
    init_softmax_state,
    load_kv_tile,
    merge_launch,
    online_softmax_step,
    page_tile_offset,
    paged_row_offsets,
    quantize_fp8,
    query_for_cache,
    scores_and_scale,
    shared_kernel_args,
    softmax_rescale,
    split_log_sum_exp,
    to_dot_dtype,
)
from vllm.attention.ops.tuning.prefill_configs import (
    GLUON_HEAD_SIZES,
    PREFILL_TABLE,
    QUERY_LEN_BUCKETS,
    PrefillConfig,
    fit_shared_memory,
    gluon_config_refusal,
    gluon_split_head_refusal,
    heuristic_prefill_config,
    tile_refusal,
)
from vllm.attention.ops.tuning.tables import device_gpu_name

# Triton's limit on the 1st grid dimension.
_MAX_GRID_X = 2**31 - 1
# Elements of a split launch's workspace the kernel addresses with 32-bit offsets
# (automatic splits stay far below: see split_workspace_shape).
_MAX_WORKSPACE_ELEMENTS = 2**31 - 1

# Split-KV (choose_prefill_splits). An SM holds about this many warps of the kernel at
# its register use (two 4-warp programs or one 8-warp program); a launch whose
# programs fill at most half of these slots on every SM splits each program's keys
# into as many shares as one wave of programs holds ...
SPLIT_WARPS_PER_SM = 8
# ... in at most this many splits (the merge reads them in one tile) ...
MAX_PREFILL_SPLITS = 16
# ... each of at least this many keys a program sees (a split re-reads the query
# tile, writes [rows, head_size + 1] fp32 partials and takes the causal diagonal's
# whole cost into its last share; on an H200 two splits of 1024 keys were slower
# than none).
SPLIT_MIN_KEYS = 2048
# Query rows per warp of a config, at most (a warpgroup of 4 warps holds at most a
# 128-row tile: ``tuning.prefill_configs.is_valid_config``); bounds the split
# workspace (``split_workspace_bound``).
MAX_ROWS_PER_WARP = 32


@triton.jit
def program_coords(
    num_seqs, num_splits, NUM_KV_HEADS: tl.constexpr, LONGEST_FIRST: tl.constexpr
):
    """``(row_tile, seq, kv_head, split)`` of this program; ``seq`` counts from the
    launch's first sequence. The 1D grid holds ``row_tiles * num_seqs *
    NUM_KV_HEADS * num_splits`` programs, row tiles counted from the last (its rows
    sit latest and see the most keys), and GPUs start programs in grid order. A
    "lane" is one (KV head, KV split) pair.

    LONGEST_FIRST: the lane varies fastest (heads, then splits), then the sequence,
    then the row tile: programs start longest first across every head and sequence
    (LPT order), so the last wave is short. Otherwise head-major: the row tile
    varies fastest, then the sequence, then the lane (splits of one head, then the
    next head), so the programs running at once share one head's K/V; with few row
    tiles per head (groups 1-2) that order ends on a long tail of one head's
    tiles."""
    pid = tl.program_id(0)
    lanes = NUM_KV_HEADS * num_splits
    row_tiles = tl.num_programs(0) // (lanes * num_seqs)
    if LONGEST_FIRST:
        lane = pid % lanes
        rest = pid // lanes
        seq = rest % num_seqs
        row_tile = row_tiles - 1 - rest // num_seqs
        kv_head = lane % NUM_KV_HEADS
        split = lane // NUM_KV_HEADS
    else:
        row_tile = row_tiles - 1 - pid % row_tiles
        rest = pid // row_tiles
        seq = rest % num_seqs
        lane = rest // num_seqs
        kv_head = lane // num_splits
        split = lane % num_splits
    return row_tile, seq, kv_head, split


@triton.jit
def _attend_kv_range(
    state,  # (acc, acc_hi, m_i, l_i): the running softmax (SOFTMAX_STATE below)
    queries,  # (q, q_hi, q_pos, alibi_slope): the program's rows (QUERIES below)
    pages,  # this sequence's K/V pages of this KV head (PAGES below)
    scoring,  # (qk_scale, softcap, sliding_window, kv_len) (SCORING below)
    kv_start,  # first key of the range (multiple of BLOCK_N)
    kv_stop,  # one past the last key of the range
    TILE: tl.constexpr,  # the kernel's TILE: shapes of a K/V tile and of a page
    FEATURES: tl.constexpr,  # the kernel's FEATURES: what the launch turns on
    MASKED: tl.constexpr,  # False: every key of every tile is visible to every row
):
    """Online softmax over the KV tiles starting at kv_start, kv_start + BLOCK_N, ...
    below kv_stop. With MASKED=False the tiles skip key-validity and visibility
    masks (the caller guarantees they are fully visible). With SPLIT_HEAD, every
    K/V tile is loaded as two column tiles: q.k sums two dots, p.v updates two
    accumulators. The arguments are packed as the kernel packs them once for its
    three stages (see ``_prefix_prefill_kernel``)."""
    acc, acc_hi, m_i, l_i = state
    q, q_hi, q_pos, alibi_slope = queries
    (k_head_ptr, v_head_ptr, block_table_row_ptr, head_offset,
     k_desc, v_desc, k_desc_hi, v_desc_hi) = pages  # fmt: skip
    qk_scale, softcap, sliding_window, kv_len = scoring
    BLOCK_N: tl.constexpr = TILE[0]
    BLOCK_SIZE: tl.constexpr = TILE[1]
    HEAD_SIZE: tl.constexpr = TILE[2]
    HEAD_LO: tl.constexpr = TILE[3]
    HEAD_LO_PAD: tl.constexpr = TILE[4]
    HEAD_HI: tl.constexpr = TILE[5]
    STRIDE_KV_BLOCK: tl.constexpr = TILE[6]
    SPLIT_HEAD: tl.constexpr = FEATURES[0]
    TILE_IN_PAGE: tl.constexpr = FEATURES[1]
    USE_TMA: tl.constexpr = FEATURES[2]
    FP8_QK: tl.constexpr = FEATURES[3]
    USE_SOFTCAP: tl.constexpr = FEATURES[4]
    USE_ALIBI: tl.constexpr = FEATURES[5]
    USE_WINDOW: tl.constexpr = FEATURES[6]
    ALIBI_SQRT: tl.constexpr = FEATURES[7]
    for tile_start in tl.range(kv_start, kv_stop, BLOCK_N):
        k_pos = tile_start + tl.arange(0, BLOCK_N)
        key_valid = k_pos < kv_len
        if TILE_IN_PAGE:
            first_row = page_tile_offset(
                block_table_row_ptr,
                tile_start,
                STRIDE_KV_BLOCK,
                HEAD_SIZE,  # a page row is HEAD_SIZE elements (contiguous pages)
                BLOCK_SIZE=BLOCK_SIZE,
            )
            rows = first_row + tl.arange(0, BLOCK_N).to(tl.int64) * HEAD_SIZE
        else:
            rows = paged_row_offsets(
                block_table_row_ptr,
                k_pos,
                key_valid,
                STRIDE_KV_BLOCK,
                HEAD_SIZE,
                BLOCK_SIZE=BLOCK_SIZE,
                MASK_KEYS=MASKED,
            )
        # Row of the tile in the TMA descriptors' [rows, HEAD_SIZE] view.
        tma_row = 0
        if USE_TMA:
            tma_row = ((head_offset + first_row) // HEAD_SIZE).to(tl.int32)
        k = _load_kv_columns(
            k_head_ptr,
            k_desc,
            rows,
            key_valid,
            tma_row,
            COLUMN=0,
            COLUMNS=HEAD_LO,
            WIDTH=HEAD_LO_PAD,
            USE_TMA=USE_TMA,
            MASKED=MASKED,
            ZERO_PAST_END=False,  # their scores are masked
        )
        qk = tl.dot(q, tl.trans(to_dot_dtype(k, DOT_DTYPE=q.dtype)))
        if SPLIT_HEAD:
            k_hi = _load_kv_columns(
                k_head_ptr,
                k_desc_hi,
                rows,
                key_valid,
                tma_row,
                COLUMN=HEAD_LO,
                COLUMNS=HEAD_HI,
                WIDTH=HEAD_HI,
                USE_TMA=USE_TMA,
                MASKED=MASKED,
                ZERO_PAST_END=False,
            )
            qk = tl.dot(q_hi, tl.trans(to_dot_dtype(k_hi, DOT_DTYPE=q.dtype)), qk)
        scores, score_scale = scores_and_scale(
            qk,
            q_pos,
            k_pos,
            kv_len,
            qk_scale,
            softcap,
            alibi_slope,
            sliding_window,
            USE_SOFTCAP=USE_SOFTCAP,
            USE_ALIBI=USE_ALIBI,
            APPLY_MASK=MASKED,
            USE_WINDOW=USE_WINDOW,
            ALIBI_SQRT=ALIBI_SQRT,
        )
        v = _load_kv_columns(
            v_head_ptr,
            v_desc,
            rows,
            key_valid,
            tma_row,
            COLUMN=0,
            COLUMNS=HEAD_LO,
            WIDTH=HEAD_LO_PAD,
            USE_TMA=USE_TMA,
            MASKED=MASKED,
            ZERO_PAST_END=MASKED,  # p is 0 there, but 0 * NaN is not
        )
        v = to_dot_dtype(v, DOT_DTYPE=tl.float16 if FP8_QK else q.dtype)
        if SPLIT_HEAD:
            v_hi = _load_kv_columns(
                v_head_ptr,
                v_desc_hi,
                rows,
                key_valid,
                tma_row,
                COLUMN=HEAD_LO,
                COLUMNS=HEAD_HI,
                WIDTH=HEAD_HI,
                USE_TMA=USE_TMA,
                MASKED=MASKED,
                ZERO_PAST_END=MASKED,
            )
            v_hi = to_dot_dtype(v_hi, DOT_DTYPE=v.dtype)
            p, alpha, m_i, l_i = softmax_rescale(m_i, l_i, scores, score_scale)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            acc_hi = tl.dot(p.to(v.dtype), v_hi, acc_hi * alpha[:, None])
        else:
            acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, scores, v, score_scale)
    return acc, acc_hi, m_i, l_i


@triton.jit
def _load_kv_columns(
    head_ptr,  # cache pointer at (block 0, this KV head)
    desc,  # TMA descriptor with [BLOCK_N, WIDTH] boxes (USE_TMA)
    rows,  # [BLOCK_N] int64 element offsets of the tile's keys (pointer loads)
    key_valid,  # [BLOCK_N] bool
    tma_row,  # row of the tile in the descriptor's view (USE_TMA)
    COLUMN: tl.constexpr,  # first head column of the tile
    COLUMNS: tl.constexpr,  # head columns of the tile ...
    WIDTH: tl.constexpr,  # ... in a tile this wide (a power of two)
    USE_TMA: tl.constexpr,
    MASKED: tl.constexpr,  # some keys of the tile may be invalid
    ZERO_PAST_END: tl.constexpr,  # TMA: zero the rows of invalid keys
):
    """A ``[BLOCK_N, WIDTH]`` K or V tile of head columns ``[COLUMN, COLUMN +
    COLUMNS)``, the columns past them zeros: a TMA box, or pointer loads whose
    invalid keys read as zeros. A TMA box holds whatever the page holds past the
    sequence end (maybe NaN); ``ZERO_PAST_END`` zeroes those rows (V needs it)."""
    if USE_TMA:
        tile = desc.load([tma_row, COLUMN])
        if ZERO_PAST_END:
            tile = tl.where(key_valid[:, None], tile, tl.zeros_like(tile))
    else:
        tile = load_kv_tile(
            head_ptr + COLUMN,
            rows,
            key_valid,
            HEAD_SIZE=COLUMNS,
            HEAD_PAD=WIDTH,
            MASK_KEYS=MASKED,
        )
    return tile


# seq_start (the number of decodes), num_seqs and num_splits change from step to
# step: without do_not_specialize, Triton would compile extra variants mid-serving
# when one happens to be 1 or a multiple of 16.
@triton.jit(do_not_specialize=["seq_start", "num_seqs", "num_splits"])
def _prefix_prefill_kernel(
    query_ptr,  # [num_tokens, num_q_heads, head_size]
    key_cache_ptr,  # [num_blocks, num_kv_heads, block_size, head_size]
    value_cache_ptr,  # [num_blocks, num_kv_heads, block_size, head_size]
    output_ptr,  # [num_tokens, num_q_heads, head_size], written unless SPLIT_KV
    workspace_ptr,  # [tokens, num_q_heads, num_splits, head_size + 1] fp32 (SPLIT_KV)
    block_table_ptr,  # [num_seqs_total, max_blocks_per_seq] int32
    query_start_loc_ptr,  # [num_seqs_total + 1] int32
    seq_lens_ptr,  # [num_seqs_total] int32
    k_desc,  # TMA descriptor of key_cache as [rows, head_size] (USE_TMA), or None
    v_desc,  # same for value_cache
    k_desc_hi,  # the same with the second column tile's boxes (SPLIT_HEAD), or None
    v_desc_hi,
    k_scale_ptr,  # [1] fp32 (IS_FP8)
    v_scale_ptr,  # [1] fp32 (IS_FP8)
    alibi_slopes_ptr,  # [num_q_heads] float (USE_ALIBI)
    sinks_ptr,  # [num_q_heads] float (USE_SINKS)
    softmax_scale,  # fp32
    softcap,  # fp32 (USE_SOFTCAP)
    sliding_window,  # int32 (USE_WINDOW)
    block_table_stride,  # int: row stride of block_table (see STRIDES in the docs)
    seq_start,  # first sequence of this launch
    num_seqs,  # sequences of this launch
    num_splits,  # KV splits per row tile (split-KV when > 1)
    STRIDE_Q_TOKEN: tl.constexpr,
    STRIDE_Q_HEAD: tl.constexpr,
    STRIDE_O_TOKEN: tl.constexpr,
    STRIDE_O_HEAD: tl.constexpr,
    STRIDE_KV_BLOCK: tl.constexpr,  # same for K and V (two views of one tensor)
    STRIDE_KV_HEAD: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,  # query rows (token x head of the group) per program
    BLOCK_N: tl.constexpr,  # keys per KV tile
    BLOCK_SIZE: tl.constexpr,  # keys per page
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # output_layout; the tiles use HEAD_LO_PAD and HEAD_HI
    HEAD_LO: tl.constexpr,  # head columns of the first column tile (all unless split)
    HEAD_LO_PAD: tl.constexpr,  # its width: HEAD_PAD, or HEAD_LO when SPLIT_HEAD
    HEAD_HI: tl.constexpr,  # width of the second column tile (SPLIT_HEAD)
    SPLIT_HEAD: tl.constexpr,  # the config's split_head (head_split)
    TILE_IN_PAGE: tl.constexpr,  # BLOCK_N divides BLOCK_SIZE
    USE_TMA: tl.constexpr,  # K/V by TMA: sm_90+, TILE_IN_PAGE
    IS_FP8: tl.constexpr,
    FP8_QK: tl.constexpr,  # IS_FP8 and the config's fp8_qk
    FP8_MAX: tl.constexpr,  # largest finite value of the cache's fp8 format
    LONGEST_FIRST: tl.constexpr,  # the config's program order (program_coords)
    SPLIT_KV: tl.constexpr,  # num_splits > 1: partials to the workspace
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    ALIBI_SQRT: tl.constexpr,  # with USE_ALIBI: on the distance's square root
    USE_WINDOW: tl.constexpr,
    USE_SINKS: tl.constexpr,
    CAUSAL: tl.constexpr,  # False: every row sees all kv_len keys of its sequence
):
    row_tile, seq, kv_head, split = program_coords(
        num_seqs, num_splits, NUM_KV_HEADS=NUM_KV_HEADS, LONGEST_FIRST=LONGEST_FIRST
    )
    seq += seq_start

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_row = row_tile * BLOCK_M
    if first_row >= q_len * GROUP_SIZE:
        return
    kv_len = tl.load(seq_lens_ptr + seq)
    context_len = kv_len - q_len

    # Rows of the packed tile: token-major, the group's heads inside.
    rows = first_row + tl.arange(0, BLOCK_M)
    token = rows // GROUP_SIZE
    q_head = kv_head * GROUP_SIZE + rows % GROUP_SIZE
    row_valid = token < q_len
    first_token = first_row // GROUP_SIZE
    last_token = tl.minimum((first_row + BLOCK_M - 1) // GROUP_SIZE, q_len - 1)
    q_pos = context_len + token
    window = sliding_window
    shift = 0  # keys a row stands past its token
    if not CAUSAL:
        if USE_WINDOW:
            # A bidirectional window, |q - k| < W: each row stands W - 1 keys
            # past its token with a window of 2W - 1, so the causal window's
            # mask (k <= pos, pos - k < window) is the two-sided one.
            shift = sliding_window - 1
            window = 2 * sliding_window - 1
            q_pos += shift
        else:
            # Every row stands at the last key: the mask then hides only keys
            # past the sequence (no ALiBi here: the contract refuses it).
            first_token = q_len - 1
            last_token = q_len - 1
            q_pos = tl.zeros_like(token) + (kv_len - 1)
    dims = tl.arange(0, HEAD_LO_PAD)
    dim_ok = dims < HEAD_LO
    dims_hi = HEAD_LO + tl.arange(0, HEAD_HI)  # SPLIT_HEAD

    token_row = (q_start + token).to(tl.int64)
    q_offsets = token_row * STRIDE_Q_TOKEN + q_head * STRIDE_Q_HEAD
    q = tl.load(
        query_ptr + q_offsets[:, None] + dims[None, :],
        mask=row_valid[:, None] & dim_ok[None, :],
        other=0.0,
    )

    # fp8 cache: both dots in fp16, q pre-scaled (query_for_cache).
    q, qk_scale, v_scale = query_for_cache(
        q, softmax_scale, k_scale_ptr, v_scale_ptr, IS_FP8=IS_FP8
    )
    if SPLIT_HEAD:
        q_hi = tl.load(
            query_ptr + q_offsets[:, None] + dims_hi[None, :],
            mask=row_valid[:, None],
            other=0.0,
        )
        q_hi, _, _ = query_for_cache(
            q_hi, softmax_scale, k_scale_ptr, v_scale_ptr, IS_FP8=IS_FP8
        )
    else:
        q_hi = tl.zeros([BLOCK_M, HEAD_HI], dtype=q.dtype)
    if FP8_QK:
        # q.k on fp8 tensor cores: the tile in the cache's format, one scale for
        # the program (its largest |q| maps to FP8_MAX; an all-zero tile gets 1).
        q_amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
        if SPLIT_HEAD:
            q_amax = tl.maximum(
                q_amax, tl.max(tl.max(tl.abs(q_hi.to(tl.float32)), 1), 0)
            )
        q_scale = tl.where(q_amax > 0.0, q_amax / FP8_MAX, 1.0)
        q = quantize_fp8(
            q, q_scale, FP8_MAX=FP8_MAX, FP8_DTYPE=key_cache_ptr.dtype.element_ty
        )
        if SPLIT_HEAD:
            q_hi = quantize_fp8(
                q_hi,
                q_scale,
                FP8_MAX=FP8_MAX,
                FP8_DTYPE=key_cache_ptr.dtype.element_ty,
            )
        qk_scale = qk_scale * q_scale
    alibi_slope = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_ALIBI:
        alibi_slope = tl.load(alibi_slopes_ptr + q_head, mask=row_valid, other=0.0)
        alibi_slope = alibi_slope.to(tl.float32)
    sink = tl.zeros([BLOCK_M], dtype=tl.float32)
    if USE_SINKS:
        sink = tl.load(sinks_ptr + q_head, mask=row_valid, other=0.0).to(tl.float32)
    if SPLIT_KV:  # the merge adds the sink, once
        m_i, l_i = init_softmax_state(sink, BLOCK_M=BLOCK_M, USE_SINKS=False)
    else:
        m_i, l_i = init_softmax_state(sink, BLOCK_M=BLOCK_M, USE_SINKS=USE_SINKS)
    acc = tl.zeros([BLOCK_M, HEAD_LO_PAD], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HEAD_HI], dtype=tl.float32)  # SPLIT_HEAD

    # Key range of this program: rows sit at positions [pos_lo, pos_hi] (past
    # the last key with a bidirectional window).
    pos_lo = context_len + first_token + shift
    pos_hi = context_len + last_token + shift
    kv_stop = tl.minimum(pos_hi + 1, kv_len)
    # Tiles left of diag_start hold only keys <= pos_lo that exist: visible to all.
    diag_start = (tl.minimum(pos_lo + 1, kv_len) // BLOCK_N) * BLOCK_N
    if USE_WINDOW:
        # First tile with a key inside some row's window, and first tile whose keys
        # are inside every row's window.
        first = (tl.maximum(pos_lo - window + 1, 0) // BLOCK_N) * BLOCK_N
        full_start = tl.cdiv(tl.maximum(pos_hi - window + 1, 0), BLOCK_N)
        full_start = full_start * BLOCK_N
    else:
        first = 0
        full_start = 0
    full_stop = tl.maximum(diag_start, full_start)
    # The three stages below: [first, full_start) the window's left edge (masked),
    # [full_start, full_stop) visible to every row, [full_stop, kv_stop) the causal
    # diagonal (masked).
    edge_lo, edge_hi = first, full_start
    full_lo, full_hi = full_start, full_stop
    diag_lo, diag_hi = full_stop, kv_stop
    if SPLIT_KV:
        # This program's contiguous share [split_lo, split_hi) of the tiles of
        # [first, kv_stop); each stage keeps its part of that share (a constexpr
        # branch, so that the unsplit kernel spends no registers on it).
        tiles_per_split = tl.cdiv(tl.cdiv(kv_stop - first, BLOCK_N), num_splits)
        split_lo = first + split * tiles_per_split * BLOCK_N
        split_hi = tl.minimum(split_lo + tiles_per_split * BLOCK_N, kv_stop)
        edge_lo = tl.maximum(edge_lo, split_lo)
        edge_hi = tl.minimum(edge_hi, split_hi)
        full_lo = tl.maximum(full_lo, split_lo)
        full_hi = tl.minimum(full_hi, split_hi)
        diag_lo = tl.maximum(diag_lo, split_lo)
        diag_hi = split_hi

    head_offset = kv_head.to(tl.int64) * STRIDE_KV_HEAD
    k_head_ptr = key_cache_ptr + head_offset
    v_head_ptr = value_cache_ptr + head_offset
    block_table_row_ptr = block_table_ptr + seq.to(tl.int64) * block_table_stride

    # What the three stages share, packed once (``_attend_kv_range``):
    # SOFTMAX_STATE  (acc [BLOCK_M, HEAD_LO_PAD], acc_hi [BLOCK_M, HEAD_HI], m_i, l_i)
    # QUERIES        (q, q_hi, q_pos, alibi_slope)
    # PAGES          (k_head_ptr, v_head_ptr, block_table_row_ptr, head_offset,
    #                 k_desc, v_desc, k_desc_hi, v_desc_hi): the caches at this KV
    #                 head, the sequence's block-table row, the TMA descriptors
    # SCORING        (qk_scale, softcap, sliding_window, kv_len)
    # TILE           (BLOCK_N, BLOCK_SIZE, HEAD_SIZE, HEAD_LO, HEAD_LO_PAD, HEAD_HI,
    #                 STRIDE_KV_BLOCK)
    # FEATURES       (SPLIT_HEAD, TILE_IN_PAGE, USE_TMA, FP8_QK, USE_SOFTCAP,
    #                 USE_ALIBI, USE_WINDOW, ALIBI_SQRT)
    state = (acc, acc_hi, m_i, l_i)
    queries = (q, q_hi, q_pos, alibi_slope)
    pages = (k_head_ptr, v_head_ptr, block_table_row_ptr, head_offset,
             k_desc, v_desc, k_desc_hi, v_desc_hi)  # fmt: skip
    scoring = (qk_scale, softcap, window, kv_len)
    TILE: tl.constexpr = (BLOCK_N, BLOCK_SIZE, HEAD_SIZE, HEAD_LO, HEAD_LO_PAD,
                          HEAD_HI, STRIDE_KV_BLOCK)  # fmt: skip
    FEATURES: tl.constexpr = (SPLIT_HEAD, TILE_IN_PAGE, USE_TMA, FP8_QK,
                              USE_SOFTCAP, USE_ALIBI, USE_WINDOW,
                              ALIBI_SQRT)  # fmt: skip
    if USE_WINDOW:  # the window's left edge
        state = _attend_kv_range(
            state, queries, pages, scoring, edge_lo, edge_hi, TILE, FEATURES,
            MASKED=True,
        )  # fmt: skip
    state = _attend_kv_range(
        state, queries, pages, scoring, full_lo, full_hi, TILE, FEATURES,
        MASKED=False,
    )  # fmt: skip
    state = _attend_kv_range(  # the causal diagonal
        state, queries, pages, scoring, diag_lo, diag_hi, TILE, FEATURES,
        MASKED=True,
    )  # fmt: skip
    acc, acc_hi, m_i, l_i = state

    out = finalize_output(acc, l_i, v_scale)
    if not SPLIT_KV:
        o_offsets = token_row * STRIDE_O_TOKEN + q_head * STRIDE_O_HEAD
        tl.store(
            output_ptr + o_offsets[:, None] + dims[None, :],
            out.to(output_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_ok[None, :],
        )
        if SPLIT_HEAD:
            tl.store(
                output_ptr + o_offsets[:, None] + dims_hi[None, :],
                finalize_output(acc_hi, l_i, v_scale).to(output_ptr.dtype.element_ty),
                mask=row_valid[:, None],
            )
    else:
        # The split's normalised output and log-sum-exp, at the row of the token
        # within the launch (merge_splits_kernel combines the splits). 32-bit
        # offsets (the launcher bounds the workspace): 64-bit ones per row doubled
        # the spills of the split builds of the 128x64 tiles.
        launch_token = q_start - tl.load(query_start_loc_ptr + seq_start) + token
        ws_row = (
            (launch_token * (NUM_KV_HEADS * GROUP_SIZE) + q_head) * num_splits + split
        ) * (HEAD_SIZE + 1)
        tl.store(
            workspace_ptr + ws_row[:, None] + dims[None, :],
            out,
            mask=row_valid[:, None] & dim_ok[None, :],
        )
        if SPLIT_HEAD:
            tl.store(
                workspace_ptr + ws_row[:, None] + dims_hi[None, :],
                finalize_output(acc_hi, l_i, v_scale),
                mask=row_valid[:, None],
            )
        tl.store(
            workspace_ptr + ws_row + HEAD_SIZE,
            split_log_sum_exp(m_i, l_i),
            mask=row_valid,
        )


# ----------------------------------------------------------------------------------
# Host side: the plan (once per batch), the launch (per layer), the public function
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillLayer:
    """What a prefill plan depends on of a layer, with no tensor in it: shapes,
    dtypes, the cache's page layout and which features are on. The backend's
    builder makes one per kind of layer from the model's specs, the public
    function from its arguments (``of``); a launch checks that its tensors are the
    plan's layer."""

    head_size: int
    num_q_heads: int
    num_kv_heads: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    block_size: int  # keys per page
    pages_are_rows: bool  # page and head strides are multiples of head_size (TMA)
    sliding_window: int | None = None
    soft_cap: bool = False
    alibi: bool = False
    sinks: bool = False
    causal: bool = True  # False: every query sees all keys of its sequence

    @classmethod
    def of(
        cls,
        *,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        sliding_window: int | None = None,
        alibi_slopes: torch.Tensor | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
        causal: bool = True,
    ) -> "PrefillLayer":
        """The layer of a launch's tensors and feature arguments."""
        head_size = query.shape[2]
        return cls(
            head_size=head_size,
            num_q_heads=query.shape[1],
            num_kv_heads=key_cache.shape[1],
            q_dtype=query.dtype,
            kv_dtype=key_cache.dtype,
            block_size=key_cache.shape[2],
            pages_are_rows=key_cache.stride(0) % head_size == 0
            and key_cache.stride(1) % head_size == 0,
            sliding_window=sliding_window,
            soft_cap=bool(logits_soft_cap),
            alibi=alibi_slopes is not None,
            sinks=sinks is not None,
            causal=causal,
        )

    @classmethod
    def of_inputs(cls, inputs: AttentionInputs) -> "PrefillLayer":
        """The layer of one call's inputs (their scales do not change a plan)."""
        return cls.of(query=inputs.query, key_cache=inputs.key_cache, **inputs.features)

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


@dataclass(frozen=True)
class PrefillPlan:
    """One prefill launch, decided before it runs: by the backend's builder once
    per batch (``plan_prefill``), or by ``prefix_prefill_attention`` when it is
    called without one. The launch only reads it.

    kernel: ``"gluon"`` (``prefix_prefill_hopper.py``) or ``"triton"`` (this
        module's portable kernel): chosen first, then the split count for it.
    config: the launch's tiles.
    seq_start, num_seqs: the launch's sequences.
    max_query_len: host bound of their query lengths (sizes the grid).
    num_splits: KV splits (1: none; always 1 for the Gluon kernel).
    programs: programs before splitting (the grid holds ``programs *
        num_splits``; see ``program_coords``).
    workspace: fp32 ``split_workspace_shape`` view when ``num_splits > 1``.
    layer: the layer it was made for.
    """

    kernel: str
    config: PrefillConfig
    seq_start: int
    num_seqs: int
    max_query_len: int
    num_splits: int
    programs: int
    workspace: torch.Tensor | None
    layer: PrefillLayer


@functools.cache
def _hopper_kernels():
    """The Gluon kernel's module (``prefix_prefill_hopper``), or None where this
    Triton has no Gluon: the portable kernel then runs every launch."""
    try:
        from vllm.attention.ops import prefix_prefill_hopper
    except ImportError:
        return None
    return prefix_prefill_hopper


def hopper_kernel_refusal(
    layer: PrefillLayer, config: PrefillConfig, device: torch.device
) -> str | None:
    """Why the Hopper kernel in Gluon cannot run ``layer`` with ``config``'s tiles
    on ``device`` (the portable kernel runs it then), or None when it can. The one
    eligibility rule of that kernel; the tiles' part is ``gluon_config_refusal``."""
    if not is_hopper(device):
        return "not an NVIDIA Hopper (sm_90) GPU"
    if _hopper_kernels() is None:
        return "this Triton has no Gluon"
    if layer.q_dtype not in (torch.bfloat16, torch.float16) or not (
        layer.kv_dtype == layer.q_dtype
        or (layer.kv_dtype == torch.float8_e4m3fn and config.fp8_qk)
    ):
        return (
            "the cache is neither 16-bit of the query's dtype nor e4m3 (float8_e4m3fn)"
            " with the config's fp8_qk"
        )
    if layer.head_size not in GLUON_HEAD_SIZES:
        return f"head size {layer.head_size} is not one of {GLUON_HEAD_SIZES}"
    if config.split_head:
        refusal = gluon_split_head_refusal(layer.head_size, layer.kv_dtype)
        if refusal is not None:
            return refusal
    if layer.alibi:
        return "ALiBi runs in the portable kernel"
    if not layer.causal:
        return "non-causal attention runs in the portable kernel"
    refusal = gluon_config_refusal(config, layer.head_size, layer.kv_dtype)
    if refusal is not None:
        return refusal
    box = min(config.block_n, layer.block_size)
    if config.block_n % box or layer.block_size % box:
        return (
            f"{config.block_n}-key tiles are not whole slices of "
            f"{layer.block_size}-key pages"
        )
    if not layer.pages_are_rows:
        return "cache pages and heads are not whole rows of head_size elements"
    return None


def picked_config(
    device: torch.device, *, use_table: bool = True, **key
) -> PrefillConfig:
    """The launch config of a problem key on ``device`` (``config=None``): the
    device's tuning-table entry, else (or without ``use_table``) the heuristic,
    fitted to its shared memory per program. Both steps are memoised (the lookup
    on its arguments, the fit on the config), so a call costs two cache hits."""
    is_hip = torch.version.hip is not None
    if use_table:
        config = PREFILL_TABLE.lookup(
            gpu_name=device_gpu_name(device), is_hip=is_hip, **key
        )
    else:
        fields = {k: v for k, v in key.items() if k != "q_dtype"}
        config = heuristic_prefill_config(**fields, is_hip=is_hip)
    return fit_shared_memory(
        config,
        head_size=key["head_size"],
        kv_dtype=key["kv_dtype"],
        limit=shared_memory_per_program(device),
    )


def _layer_key(layer: PrefillLayer, max_query_len: int) -> dict:
    return dict(
        head_size=layer.head_size,
        q_dtype=layer.q_dtype,
        kv_dtype=layer.kv_dtype,
        group=layer.group,
        block_size=layer.block_size,
        max_query_len=max_query_len,
    )


def layer_config(
    layer: PrefillLayer, device: torch.device, max_query_len: int
) -> PrefillConfig:
    """``picked_config`` for ``layer``'s problem key at ``max_query_len``."""
    return picked_config(device, **_layer_key(layer, max_query_len))


def portable_config(
    layer: PrefillLayer, device: torch.device, max_query_len: int
) -> PrefillConfig:
    """What the portable kernel runs for a launch of a ``gluon`` config that the
    Hopper kernel does not take: the heuristic's config for ``layer``'s key,
    fitted to the device. A Gluon config's tiles are that kernel's (two consumer
    warpgroups and a load warp behind its nominal 4 warps; 128-key tiles loaded
    as page boxes), which the portable kernel would run on 4 warps with pointer
    loads."""
    return picked_config(device, use_table=False, **_layer_key(layer, max_query_len))


def unsplit_programs(
    *, max_query_len: int, group: int, block_m: int, num_seqs: int, num_kv_heads: int
) -> int:
    """Programs of a launch before KV splitting: ``row_tiles * num_seqs *
    num_kv_heads`` (the grid is this times ``num_splits``; see program_coords)."""
    return triton.cdiv(max_query_len * group, block_m) * num_seqs * num_kv_heads


def choose_prefill_splits(
    *, programs: int, num_warps: int, max_seq_len: int, num_sms: int
) -> int:
    """KV splits for a prefill launch of ``programs`` programs of ``num_warps``
    warps (``num_splits=1``) whose programs see at most ``max_seq_len`` keys.

    1 when the programs fill more than half of the SMs' ``SPLIT_WARPS_PER_SM``
    warp slots. Otherwise as many splits as one wave holds (the programs resident
    at once divided by the launch's, rounded down), at most ``MAX_PREFILL_SPLITS`` and
    at most one per ``SPLIT_MIN_KEYS`` keys: rounding up would start a second,
    partly empty wave (128 programs of 4 warps on 132 SMs, 264 resident: 2 splits
    run in one wave of half the keys each, 3 in two waves of a third). A short
    chunk or spec-decode verification over a long cache and a small group at few
    KV heads split; short sequences and launches that already occupy every SM do
    not."""
    slots = SPLIT_WARPS_PER_SM * max(1, num_sms)
    programs = max(1, programs)
    if 2 * programs * num_warps > slots:
        return 1
    resident = slots // num_warps
    return max(
        1, min(resident // programs, max_seq_len // SPLIT_MIN_KEYS, MAX_PREFILL_SPLITS)
    )


def split_workspace_shape(
    *, num_seqs: int, max_query_len: int, num_tokens: int, num_q_heads: int,
    head_size: int, num_splits: int,
) -> tuple[int, int, int, int]:  # fmt: skip
    """Shape of a split launch's fp32 workspace: a row per token the launch can
    hold (at most ``num_seqs * max_query_len``, at most the batch's tokens), the
    partial output of each query head and split in ``[..., :head_size]`` and its
    log-sum-exp in ``[..., head_size]``."""
    rows = max(1, min(num_tokens, num_seqs * max_query_len))
    return (rows, num_q_heads, num_splits, head_size + 1)


def split_workspace_bound(*, head_size: int, num_sms: int) -> int:
    """fp32 elements that hold the workspace of every automatic split on a GPU of
    ``num_sms`` SMs: only launches that fill at most half of the SMs' warp slots
    split, into at most one wave of resident programs, each of at most
    ``MAX_ROWS_PER_WARP`` rows per warp, so (rows x query heads x splits) is at
    most ``SPLIT_WARPS_PER_SM * num_sms * MAX_ROWS_PER_WARP`` (an H200: 33,792,
    about 35 MB at head size 256). The backend allocates this once."""
    return SPLIT_WARPS_PER_SM * max(1, num_sms) * MAX_ROWS_PER_WARP * (head_size + 1)


def _check_grid(who, programs, num_splits, max_query_len, layer, config, num_seqs):
    if programs * num_splits > _MAX_GRID_X:
        raise ValueError(
            f"{who}: {programs * num_splits} programs (max_query_len {max_query_len}"
            f" x {layer.num_q_heads} query heads in tiles of {config.block_m} rows, "
            f"{num_seqs} sequences, {num_splits} KV splits) exceed the grid limit "
            f"{_MAX_GRID_X}; split the batch."
        )


def plan_prefill(
    *,
    layer: PrefillLayer,
    device: torch.device,
    seq_start: int,
    num_seqs: int,
    num_tokens: int,
    max_query_len: int,
    max_seq_len: int | None = None,
    config: PrefillConfig | None = None,
    num_splits: int | None = None,
    workspace: torch.Tensor | None = None,
) -> PrefillPlan:
    """The plan of one prefill launch, in this order:

    1. the config: ``config``, else the device's table entry or heuristic for the
       layer's key (``picked_config``);
    2. the kernel it can run on: the Hopper kernel in Gluon where the config
       asks for it and ``hopper_kernel_refusal`` allows, else the portable one
       (with ``portable_config`` in place of a ``gluon`` config);
    3. the split count for that kernel: ``num_splits``, else 1 without
       ``max_seq_len``, else ``choose_prefill_splits`` over the launch's
       programs (a Gluon program counts as a whole SM's warps) and the keys one
       program can see (at most ``sliding_window + block_m`` with a window, twice
       the window when it is bidirectional). The
       Gluon kernel takes no split: a split launch runs in the portable kernel
       (with ``portable_config``);
    4. the split workspace: a view of ``workspace`` (a flat fp32 buffer of
       ``split_workspace_bound`` elements, allocated once by the caller; an
       automatic count is lowered until its view fits), else a new tensor.

    Host arithmetic on host values only: no tensor is read. Raises ValueError for
    a config, split count or grid the kernels cannot take.
    """
    who = "prefix_prefill_attention"
    if config is None:
        config = layer_config(layer, device, max_query_len)
    refusal = tile_refusal(config)
    if refusal is not None:
        raise ValueError(f"{who}: config {refusal}.")
    gluon = config.gluon and hopper_kernel_refusal(layer, config, device) is None
    if config.gluon and not gluon:
        config = portable_config(layer, device, max_query_len)

    def programs_of(config: PrefillConfig) -> int:
        return unsplit_programs(
            max_query_len=max_query_len,
            group=layer.group,
            block_m=config.block_m,
            num_seqs=num_seqs,
            num_kv_heads=layer.num_kv_heads,
        )

    programs = programs_of(config)
    automatic = num_splits is None
    if num_splits is None:
        num_splits = 1
        if max_seq_len is not None:
            keys = max_seq_len
            if layer.sliding_window:
                # A bidirectional (non-causal) window spans 2W - 1 keys.
                span = layer.sliding_window * (1 if layer.causal else 2)
                keys = min(keys, span + config.block_m)
            num_splits = choose_prefill_splits(
                programs=programs,
                # A Gluon program holds an SM on its own (two consumer
                # warpgroups, a load warp, most of the shared memory): a full
                # SM's warp slots, so that a launch that fills the SMs once
                # stays whole in the Gluon kernel.
                num_warps=SPLIT_WARPS_PER_SM if gluon else config.num_warps,
                max_seq_len=keys,
                num_sms=num_sms(device),
            )
    if not 1 <= num_splits <= MAX_PREFILL_SPLITS:
        raise ValueError(
            f"{who}: num_splits must be in [1, {MAX_PREFILL_SPLITS}], got {num_splits}."
        )
    _check_grid(who, programs, num_splits, max_query_len, layer, config, num_seqs)
    view = None
    while num_splits > 1:
        shape = split_workspace_shape(
            num_seqs=num_seqs,
            max_query_len=max_query_len,
            num_tokens=num_tokens,
            num_q_heads=layer.num_q_heads,
            head_size=layer.head_size,
            num_splits=num_splits,
        )
        numel = math.prod(shape)
        if numel > _MAX_WORKSPACE_ELEMENTS:
            raise ValueError(
                f"{who}: {num_splits} KV splits need a workspace of {shape} fp32 "
                f"elements, more than the kernel's 32-bit offsets address "
                f"({_MAX_WORKSPACE_ELEMENTS}); pass fewer num_splits (or None) or "
                f"split the batch."
            )
        if workspace is None:
            view = torch.empty(shape, dtype=torch.float32, device=device)
            break
        if numel <= workspace.numel():
            view = workspace[:numel].view(shape)
            break
        if not automatic:
            raise ValueError(
                f"{who}: {num_splits} KV splits need {numel} workspace elements, "
                f"the buffer holds {workspace.numel()}; pass fewer num_splits."
            )
        num_splits -= 1
    # The Gluon kernel takes no split: a launch of so few of its programs that it
    # splits runs split in the portable kernel, whose tiles may hold other rows.
    if gluon and num_splits > 1:
        gluon = False
        config = portable_config(layer, device, max_query_len)
        programs = programs_of(config)
        _check_grid(who, programs, num_splits, max_query_len, layer, config, num_seqs)
    return PrefillPlan(
        kernel="gluon" if gluon else "triton",
        config=config,
        seq_start=seq_start,
        num_seqs=num_seqs,
        max_query_len=max_query_len,
        num_splits=num_splits,
        programs=programs,
        workspace=view,
        layer=layer,
    )


class PrefillPlanner:
    """The prefill launches of a batch, one per kind of layer, planned once per
    batch as ``DecodePlanner`` plans decodes: ``plan_prefill`` for each of
    ``layers`` over the batch's prefill requests, their split workspaces views of
    one buffer allocated here (none where no launch can split: ``max_kv_len``, the
    most keys a request of the group has, below ``2 * SPLIT_MIN_KEYS``). With
    ``batch_invariant`` nothing depends on the batch: no split, and the config of
    the longest query bucket for every batch.
    """

    def __init__(
        self,
        *,
        device: torch.device,
        layers: set[PrefillLayer],
        head_size: int,
        max_kv_len: int,
        batch_invariant: bool = False,
    ):
        self.device = device
        self.layers = frozenset(layers)
        self.workspace = None
        if max_kv_len >= 2 * SPLIT_MIN_KEYS:
            self.workspace = torch.empty(
                split_workspace_bound(head_size=head_size, num_sms=num_sms(device)),
                dtype=torch.float32,
                device=device,
            )
        self.fixed = {
            layer: {
                "config": layer_config(layer, device, QUERY_LEN_BUCKETS[-1]),
                "num_splits": 1,
            }
            if batch_invariant
            else {}
            for layer in self.layers
        }

    def plan(
        self,
        *,
        num_decodes: int,
        num_reqs: int,
        num_tokens: int,
        max_query_len: int,
        max_seq_len: int,
        causal: bool = True,
    ) -> dict[PrefillLayer, PrefillPlan]:
        """The launch of each kind of layer over requests ``[num_decodes,
        num_reqs)`` (none without prefills), keyed by the layer as its launch
        sees it (``PrefillLayer.of_inputs``: the batch's causality included)."""
        if num_reqs <= num_decodes:
            return {}
        plans = (
            plan_prefill(
                layer=replace(layer, causal=causal),
                device=self.device,
                seq_start=num_decodes,
                num_seqs=num_reqs - num_decodes,
                num_tokens=num_tokens,
                max_query_len=max_query_len,
                max_seq_len=max_seq_len,
                workspace=self.workspace,
                **self.fixed[layer],
            )
            for layer in self.layers
        )
        return {plan.layer: plan for plan in plans}


def _launches(plan: PrefillPlan, inputs: AttentionInputs) -> list[tuple]:
    """``(kernel, grid, keyword arguments)`` of each launch of ``plan`` on
    ``inputs`` (the prefill kernel, then the merge when split); strides and
    descriptors from the tensors; no checks. Separate from the launch so the
    offline compile check builds exactly what a launch would."""
    query, key_cache, value_cache = inputs.query, inputs.key_cache, inputs.value_cache
    head_size = query.shape[2]
    # Pages and heads as whole rows of the cache seen as [rows, head_size]: what
    # TMA boxes of page slices need. The plan's layer says so from the model's
    # specs; the tensors decide (a Gluon plan on other pages runs, unsplit, in
    # the portable kernel with pointer loads).
    pages_are_rows = (
        key_cache.stride(0) % head_size == 0 and key_cache.stride(1) % head_size == 0
    )
    if plan.kernel == "gluon" and pages_are_rows:
        return [_hopper_kernels().hopper_launch(plan, inputs)]
    config, num_splits = plan.config, plan.num_splits
    tile_in_page = key_cache.shape[2] % config.block_n == 0
    split = head_split(head_size) if config.split_head else None
    if split:  # two exact column tiles
        lo, lo_pad, hi = split[0], split[0], split[1]
    else:  # one tile, padded; the second is never built
        lo, lo_pad, hi = head_size, head_pad(head_size), 16
    use_tma = (
        config.use_tma
        and tile_in_page
        and pages_are_rows
        and head_size * key_cache.element_size() % TMA_ROW_ALIGN_BYTES == 0
        and tma_supported(query.device)
    )

    def descriptor(cache, columns):
        return cache_descriptor(cache, (config.block_n, columns), TensorDescriptor)

    kwargs = dict(
        **shared_kernel_args(inputs, seq_start=plan.seq_start),
        query_start_loc_ptr=inputs.query_start_loc,
        workspace_ptr=plan.workspace,  # None unless split
        k_desc=descriptor(key_cache, lo_pad) if use_tma else None,
        v_desc=descriptor(value_cache, lo_pad) if use_tma else None,
        k_desc_hi=descriptor(key_cache, hi) if use_tma and split else None,
        v_desc_hi=descriptor(value_cache, hi) if use_tma and split else None,
        num_seqs=plan.num_seqs,
        num_splits=num_splits,
        NUM_KV_HEADS=plan.layer.num_kv_heads,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        HEAD_LO=lo,
        HEAD_LO_PAD=lo_pad,
        HEAD_HI=hi,
        SPLIT_HEAD=split is not None,
        TILE_IN_PAGE=tile_in_page,
        USE_TMA=use_tma,
        # e5m2 keeps 2 mantissa bits: the query is not rounded to it.
        FP8_QK=key_cache.dtype in E4M3_DTYPES and config.fp8_qk,
        FP8_MAX=fp8_max(key_cache.dtype),
        LONGEST_FIRST=config.longest_first,
        SPLIT_KV=num_splits > 1,
        CAUSAL=plan.layer.causal,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    launches = [(_prefix_prefill_kernel, (plan.programs * num_splits,), kwargs)]
    if num_splits > 1:
        launches.append(
            merge_launch(
                kwargs,
                num_seqs=plan.num_seqs,
                num_splits=num_splits,
                rows=plan.workspace.shape[0],
                splits_pad=MAX_PREFILL_SPLITS,  # one variant for every split count
            )
        )
    return launches


def launch_prefix_prefill(
    plan: PrefillPlan, inputs: AttentionInputs, *, layer: PrefillLayer | None = None
) -> None:
    """Run ``plan`` on a layer's ``inputs``, which have passed the input contract
    (``check_attention_inputs``): the per-layer step. It checks only that they are
    the layer the plan was made for (host attributes; the page layout is the
    tensors', see ``_launches``), then launches; no table, device query or
    allocation. ``layer``: ``PrefillLayer.of_inputs(inputs)``, where the caller
    has it already."""
    layer = layer or PrefillLayer.of_inputs(inputs)
    if replace(layer, pages_are_rows=plan.layer.pages_are_rows) != plan.layer:
        raise ValueError(
            f"prefix_prefill_attention: the plan was made for {plan.layer}, the "
            f"tensors are {layer}; plan with this layer (plan_prefill)."
        )
    if plan.num_seqs == 0 or plan.max_query_len <= 0:
        return
    for kernel, grid, kwargs in _launches(plan, inputs):
        kernel[grid](**kwargs)


def prefix_prefill_attention(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    softmax_scale: float,
    seq_start: int = 0,
    num_seqs: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_sqrt: bool = False,
    causal: bool = True,
    config: PrefillConfig | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
) -> None:
    """Attention of sequences ``[seq_start, seq_start + num_seqs)`` over the
    paged KV cache, written into ``output``: checks the inputs, plans the launch
    (``plan_prefill``) and runs it (``launch_prefix_prefill``). The backend plans
    once per batch and calls ``launch_prefix_prefill`` per layer instead.

    Args (semantics in docs/design.md):
        query: [num_tokens, num_q_heads, head_size] bf16/fp16, last dim contiguous.
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_size],
            same strides, last two dims contiguous; the query's dtype, or fp8
            (e4m3fn / e4m3fnuz / e5m2) with ``k_scale``/``v_scale``. The new tokens' K/V
            must already be in the cache.
        output: like ``query``; only the rows of the launched sequences are written.
        block_table: [num_seqs_total, max_blocks_per_seq] int32.
        query_start_loc: [num_seqs_total + 1] int32; seq_lens: [num_seqs_total]
            int32, KV length including the new tokens.
        max_query_len: host int >= the longest query of the launched sequences
            (sizes the grid; never read from the device).
        softmax_scale: multiplies q.k.
        seq_start, num_seqs: range of sequences handled (default: all from
            seq_start).
        k_scale, v_scale: 1-element fp32 tensors, required for an fp8 cache.
        sliding_window: W > 0, or None for full attention.
        alibi_slopes: [num_q_heads] float, or None.
        alibi_sqrt: with alibi_slopes, the bias is ``-slope * sqrt(pos - j)``.
        logits_soft_cap: c > 0 (s = c * tanh(s / c)), or None / 0 for none.
        sinks: [num_q_heads] float, one extra logit per head, or None.
        causal: False: every query token sees all ``seq_len`` keys of its
            sequence (cross-attention over a cached encoder, encoder
            self-attention, bidirectional drafting), or with a sliding window
            the keys less than W away on either side; takes no ALiBi.
        config: launch configuration; None picks it from the tuning table.
        max_seq_len: host int >= the longest KV length of the launched sequences,
            or None (unknown: no split).
        num_splits: KV splits (1 to ``MAX_PREFILL_SPLITS``); None chooses them
            (``plan_prefill``). Split launches write partials to an fp32
            workspace (``split_workspace_shape``), allocated per call here, and
            merge them in a second kernel.

    Raises ValueError for unsupported inputs (nothing is launched then).
    """
    who = "prefix_prefill_attention"
    inputs = AttentionInputs(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        output=output,
        block_table=block_table,
        seq_lens=seq_lens,
        softmax_scale=softmax_scale,
        query_start_loc=query_start_loc,
        k_scale=k_scale,
        v_scale=v_scale,
        sliding_window=sliding_window,
        alibi_slopes=alibi_slopes,
        logits_soft_cap=logits_soft_cap,
        sinks=sinks,
        alibi_sqrt=alibi_sqrt,
        causal=causal,
    )
    check_attention_inputs(who, inputs)
    num_seqs_total = seq_lens.shape[0]
    if num_seqs is None:
        num_seqs = num_seqs_total - seq_start
    check_sequence_range(who, seq_start, num_seqs, num_seqs_total)
    if num_seqs == 0 or max_query_len <= 0 or query.shape[0] == 0:
        return
    plan = plan_prefill(
        layer=PrefillLayer.of_inputs(inputs),
        device=query.device,
        seq_start=seq_start,
        num_seqs=num_seqs,
        num_tokens=query.shape[0],
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        config=config,
        num_splits=num_splits,
    )
    launch_prefix_prefill(plan, inputs)


def check_sequence_range(
    who: str, seq_start: int, num_seqs: int, num_seqs_total: int
) -> None:
    """A launch's sequences ``[seq_start, seq_start + num_seqs)`` lie inside the
    batch's ``num_seqs_total``; raises ValueError naming ``who`` otherwise."""
    if not (
        seq_start >= 0 and num_seqs >= 0 and seq_start + num_seqs <= num_seqs_total
    ):
        raise ValueError(
            f"{who}: sequence range [{seq_start}, {seq_start + num_seqs}) is outside "
            f"the {num_seqs_total} sequences of seq_lens; pass a range inside it."
        )
