# SPDX-License-Identifier: Apache-2.0
"""Paged attention for query length 1 (decode), with an optional split-KV pass.

The name: "2d" is the shape of the work of one program, a 2D ``[query heads of one
GQA group, head size]`` query tile against 2D K/V tiles, i.e. one program per
(sequence, KV head), the "2D" grid of vLLM's unified Triton attention. Without
split-KV the grid is that 2D grid; with split-KV (``NUM_SPLITS > 1``) it has a third
axis, one program per (sequence, KV head, split), plus a second, 2D merge kernel.

Algorithm
---------
One program per (sequence, KV head, split). The program owns *all* query heads that
share its KV head (the GQA group), stacked as the rows of one ``[BLOCK_M, HEAD_PAD]``
query tile, ``BLOCK_M = max(16, next_pow2(group))`` so the two matrix products are
``tl.dot`` calls (tensor cores) and every K/V tile is read from memory once for the
whole group. The keys of the sequence are walked in tiles of ``BLOCK_N``; the page
id is read per key (``paged_row_offsets``), so a tile may lie inside one page or span
several and the tile size is independent of the page size. Tiles holding only visible
keys run without masks; only the window-edge tile and the last tile are masked (the
one inner loop ``_attend_tiles`` with a constexpr ``MASKED``). Softmax is the usual
online (flash) softmax in fp32, in base 2 (``exp2``) with ``log2(e)`` folded into the
scores (shared helpers of ``triton_attention_common``).

Split-KV (flash-decoding): with ``NUM_SPLITS > 1`` the grid gets a third axis and
program ``split`` covers the ``split``-th contiguous share of the sequence's KV tiles.
The share is computed *inside* the kernel from ``seq_len`` and ``NUM_SPLITS``, so the
grid depends only on the batch size and stays fixed across CUDA-graph replays while
context lengths grow. Each program writes its normalised partial output and its
log-sum-exp (base 2) to a workspace; ``merge_splits_kernel`` then combines the splits
(and the attention sink, if any) into the output. With ``NUM_SPLITS == 1`` the same
kernel writes the output directly: one kernel, a constexpr flag, no copied variant.

fp8 caches
----------
With an e4m3 cache both products run in fp16, whatever the query dtype: Hopper turns
e4m3 into fp16 with one instruction but reaches bf16 only through fp16 (a second
conversion per element, which made the fp8 decode conversion-bound), and fp16 holds
every e4m3 value and the probabilities ``p`` in [0, 1] exactly or with more mantissa
than bf16. The query is multiplied by ``softmax_scale`` before its one rounding to
fp16, so it would overflow only past ``|q| > 65504 * sqrt(head_size)`` (about 7e5 at
head size 128), far outside what an attention layer produces; k_scale stays in the
fp32 score scale and v_scale in the final normalisation.

Layouts (docs/design.md)
------------------------
query, output: ``[num_tokens, num_q_heads, head_size]``; row ``s`` holds the one query
token of sequence ``s`` (decodes come first in the batch, one token each).
key_cache, value_cache: ``[num_blocks, num_kv_heads, block_size, head_size]``, last two
dims contiguous, same strides (two views of one ``[num_blocks, 2, ...]`` tensor).
workspace (split-KV only): fp32
``[max_num_seqs, num_q_heads, num_splits, head_size + 1]``, the partial output in
``[..., :head_size]`` and its log-sum-exp in ``[..., head_size]``.

Strides (the same rule in the prefill kernel): the query, output and cache strides
are fixed for a model, so they are ``tl.constexpr`` (``STRIDE_*``): specialising on
them removes integer arithmetic from the address computation, a large share of the
work of a decode step at small batch. The block table's row stride is set by the
model runner and stays a runtime argument (``block_table_stride``) so that it does
not multiply the compiled variants.
"""

import math

import torch
import triton
import triton.language as tl

from vllm.attention.ops.hardware import is_hopper, nvidia_gpu
from vllm.attention.ops.triton_attention_common import (
    AttentionInputs,
    check_attention_inputs,
    e4m3_to_fp16_at_load,
    finalize_output,
    init_softmax_state,
    load_kv_tile,
    merge_launch,
    online_softmax_step,
    paged_row_offsets,
    query_for_cache,
    scores_and_scale,
    shared_kernel_args,
    split_log_sum_exp,
    to_dot_dtype,
)
from vllm.attention.ops.tuning.decode_configs import (
    DECODE_TABLE,
    DecodeConfig,
    WaveRule,
    wave_rule,
)
from vllm.attention.ops.tuning.tables import device_gpu_name

# Cap on splits per sequence. Batch 1 needs it: with 8 KV heads, 64 splits make the
# 512 programs that keep enough K/V loads in flight (on an H200, 16 splits read a 32k
# context at 2.3 TB/s, 64 at 3.4 TB/s). At short contexts most of the 64 are empty
# (a 1k context has 16 tiles), which costs ~1 us per launch. The workspace grows
# with the cap, but only for the few batch sizes that get it.
MAX_DECODE_SPLITS = 64
# What a launch accepts (any count up to this): choose_decode_splits(max_splits=...)
# can go past the default cap, e.g. for benchmarking batch-1 long-context decode.
SPLIT_LIMIT = 256
# choose_decode_splits makes the grid cover the SMs at least this many times. A decode
# program streams K/V with a few tiles in flight; several resident programs per SM
# are needed to keep enough bytes in flight to saturate HBM.
SPLIT_TARGET_WAVES = 3

WORKSPACE_DTYPE = torch.float32


# ----------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------


@triton.jit
def _attend_tiles(
    state,  # (acc [BLOCK_M, HEAD_PAD], m_i [BLOCK_M], l_i [BLOCK_M]) fp32
    queries,  # (q [BLOCK_M, HEAD_PAD], q_pos [BLOCK_M] int, alibi_slope (USE_ALIBI))
    pages,  # (k_head_ptr, v_head_ptr, block_table_row_ptr): this KV head's caches
    scoring,  # (qk_scale, softcap, sliding_window, lo, seq_len): keys [lo, seq_len)
    tile_lo,  # int: first KV tile
    tile_hi,  # int: one past the last KV tile
    TILE: tl.constexpr,  # (BLOCK_N, BLOCK_SIZE, HEAD_SIZE, HEAD_PAD, STRIDE_KV_BLOCK)
    FEATURES: tl.constexpr,  # (USE_SOFTCAP, USE_ALIBI, USE_WINDOW, EARLY_CONVERT,
    #                           ALIBI_SQRT)
    MASKED: tl.constexpr,  # False: every key of every tile is visible
):
    """Online softmax over KV tiles ``[tile_lo, tile_hi)``: the inner loop, written
    once and instantiated masked (range edges) and unmasked (the bulk), with its
    loop-invariant arguments packed as the prefill kernel's ``_attend_kv_range``
    takes them."""
    acc, m_i, l_i = state
    q, q_pos, alibi_slope = queries
    k_head_ptr, v_head_ptr, block_table_row_ptr = pages
    qk_scale, softcap, sliding_window, lo, seq_len = scoring
    BLOCK_N: tl.constexpr = TILE[0]
    BLOCK_SIZE: tl.constexpr = TILE[1]
    HEAD_SIZE: tl.constexpr = TILE[2]
    HEAD_PAD: tl.constexpr = TILE[3]
    STRIDE_KV_BLOCK: tl.constexpr = TILE[4]
    USE_SOFTCAP: tl.constexpr = FEATURES[0]
    USE_ALIBI: tl.constexpr = FEATURES[1]
    USE_WINDOW: tl.constexpr = FEATURES[2]
    EARLY_CONVERT: tl.constexpr = FEATURES[3]  # fp8 e4m3fn on NVIDIA
    ALIBI_SQRT: tl.constexpr = FEATURES[4]
    offs_n = tl.arange(0, BLOCK_N)
    # A masked range holds at most one tile: software pipelining would only add a
    # prologue, so it gets one stage; the unmasked bulk uses the launch's stages.
    for tile in tl.range(tile_lo, tile_hi, num_stages=1 if MASKED else None):
        k_pos = tile * BLOCK_N + offs_n  # absolute key positions [BLOCK_N]
        # Keys outside [lo, seq_len) read as 0, never stale memory: a NaN left in a
        # freed page would otherwise survive 0 * NaN in p @ V.
        key_valid = (k_pos < seq_len) & (k_pos >= lo)
        rows_off = paged_row_offsets(
            block_table_row_ptr,
            k_pos,
            key_valid,
            STRIDE_KV_BLOCK,
            HEAD_SIZE,
            BLOCK_SIZE=BLOCK_SIZE,
            MASK_KEYS=MASKED,
        )
        k = load_kv_tile(
            k_head_ptr,
            rows_off,
            key_valid,
            HEAD_SIZE=HEAD_SIZE,
            HEAD_PAD=HEAD_PAD,
            MASK_KEYS=MASKED,
        )
        v = load_kv_tile(
            v_head_ptr,
            rows_off,
            key_valid,
            HEAD_SIZE=HEAD_SIZE,
            HEAD_PAD=HEAD_PAD,
            MASK_KEYS=MASKED,
        )
        if EARLY_CONVERT:
            k = e4m3_to_fp16_at_load(k)
            v = e4m3_to_fp16_at_load(v)
        k = to_dot_dtype(k, DOT_DTYPE=q.dtype)
        v = to_dot_dtype(v, DOT_DTYPE=q.dtype)
        scores, score_scale = scores_and_scale(
            tl.dot(q, tl.trans(k)),  # [BLOCK_M, BLOCK_N] fp32
            q_pos,
            k_pos,
            seq_len,
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
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, scores, v, score_scale)
    return acc, m_i, l_i


@triton.jit
def _paged_decode_kernel(
    output_ptr,  # [num_tokens, num_q_heads, HEAD_SIZE], written when NUM_SPLITS == 1
    workspace_ptr,  # [max_num_seqs, num_q_heads, NUM_SPLITS, HEAD_SIZE + 1] fp32
    query_ptr,  # [num_tokens, num_q_heads, HEAD_SIZE]
    key_cache_ptr,  # [num_blocks, num_kv_heads, BLOCK_SIZE, HEAD_SIZE]
    value_cache_ptr,  # [num_blocks, num_kv_heads, BLOCK_SIZE, HEAD_SIZE]
    block_table_ptr,  # [num_seqs_total, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs_total] int32
    alibi_slopes_ptr,  # [num_q_heads] fp32 (USE_ALIBI)
    sinks_ptr,  # [num_q_heads] fp32 (USE_SINKS and NUM_SPLITS == 1)
    k_scale_ptr,  # [1] fp32 (IS_FP8)
    v_scale_ptr,  # [1] fp32 (IS_FP8)
    softmax_scale,  # float
    softcap,  # float (USE_SOFTCAP)
    sliding_window,  # int (USE_WINDOW)
    block_table_stride,  # int: row stride of block_table
    seq_start,  # int: first sequence of this launch
    STRIDE_Q_TOKEN: tl.constexpr,
    STRIDE_Q_HEAD: tl.constexpr,
    STRIDE_O_TOKEN: tl.constexpr,
    STRIDE_O_HEAD: tl.constexpr,
    STRIDE_KV_BLOCK: tl.constexpr,
    STRIDE_KV_HEAD: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,  # rows of the query tile, >= 16 and >= GROUP_SIZE
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # next power of two of HEAD_SIZE
    BLOCK_SIZE: tl.constexpr,  # keys per page
    BLOCK_N: tl.constexpr,  # keys per tile
    NUM_SPLITS: tl.constexpr,
    IS_FP8: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    ALIBI_SQRT: tl.constexpr,  # with USE_ALIBI: on the distance's square root
    USE_SOFTCAP: tl.constexpr,
    USE_SINKS: tl.constexpr,
    EARLY_CONVERT: tl.constexpr,  # the config's early_convert, where it applies
):
    seq_local = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = seq_start + seq_local

    seq_len = tl.load(seq_lens_ptr + seq)
    # Visible keys: [lo, seq_len).
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(seq_len - sliding_window, 0)

    # Tiles [tile_begin, tile_end) of this split; every tile holds >= 1 visible key.
    first_tile = lo // BLOCK_N
    num_tiles = tl.cdiv(seq_len, BLOCK_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_begin = first_tile + split * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, first_tile + num_tiles)

    rows = tl.arange(0, BLOCK_M)
    row_valid = rows < GROUP_SIZE
    q_heads = kv_head * GROUP_SIZE + rows
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + (seq_len - 1)  # the one query token
    offs_d = tl.arange(0, HEAD_PAD)

    q = tl.load(
        query_ptr
        + seq.to(tl.int64) * STRIDE_Q_TOKEN
        + q_heads[:, None] * STRIDE_Q_HEAD
        + offs_d[None, :],
        mask=row_valid[:, None] & (offs_d < HEAD_SIZE)[None, :],
        other=0.0,
    )  # [BLOCK_M, HEAD_PAD]

    # fp8: both dots run in fp16, q pre-scaled (see "fp8 caches" in the module
    # docstring); k_scale folds into the score scale, v_scale into the output.
    q, qk_scale, v_scale = query_for_cache(
        q, softmax_scale, k_scale_ptr, v_scale_ptr, IS_FP8=IS_FP8
    )
    alibi_slope = tl.zeros([BLOCK_M], dtype=tl.float32)  # read only with USE_ALIBI
    if USE_ALIBI:
        alibi_slope = tl.load(alibi_slopes_ptr + q_heads, mask=row_valid, other=0.0)
    sink = None
    if USE_SINKS and NUM_SPLITS == 1:
        # Split-KV adds the sink once, in the merge.
        sink = tl.load(sinks_ptr + q_heads, mask=row_valid, other=0.0)
    m_i, l_i = init_softmax_state(
        sink, BLOCK_M=BLOCK_M, USE_SINKS=USE_SINKS and NUM_SPLITS == 1
    )
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)

    k_head_ptr = key_cache_ptr + kv_head.to(tl.int64) * STRIDE_KV_HEAD
    v_head_ptr = value_cache_ptr + kv_head.to(tl.int64) * STRIDE_KV_HEAD
    block_table_row_ptr = block_table_ptr + seq.to(tl.int64) * block_table_stride
    # Tiles that hold only visible keys skip every mask; at most the first tile
    # (window edge) and the last (sequence end) of the range need them:
    #   [tile_begin, head_end) masked | [head_end, tail_begin) unmasked | [.., tile_end)
    head_end = tl.minimum(tile_end, tl.maximum(tile_begin, tl.cdiv(lo, BLOCK_N)))
    tail_begin = tl.maximum(head_end, tl.minimum(tile_end, seq_len // BLOCK_N))
    state = (acc, m_i, l_i)
    queries = (q, q_pos, alibi_slope)
    pages = (k_head_ptr, v_head_ptr, block_table_row_ptr)
    scoring = (qk_scale, softcap, sliding_window, lo, seq_len)
    TILE: tl.constexpr = (BLOCK_N, BLOCK_SIZE, HEAD_SIZE, HEAD_PAD, STRIDE_KV_BLOCK)
    FEATURES: tl.constexpr = (USE_SOFTCAP, USE_ALIBI, USE_WINDOW, EARLY_CONVERT,
                              ALIBI_SQRT)  # fmt: skip
    if USE_WINDOW:
        state = _attend_tiles(
            state, queries, pages, scoring, tile_begin, head_end, TILE, FEATURES,
            MASKED=True,
        )  # fmt: skip
    state = _attend_tiles(
        state, queries, pages, scoring, head_end, tail_begin, TILE, FEATURES,
        MASKED=False,
    )  # fmt: skip
    state = _attend_tiles(
        state, queries, pages, scoring, tail_begin, tile_end, TILE, FEATURES,
        MASKED=True,
    )  # fmt: skip
    acc, m_i, l_i = state

    out = finalize_output(acc, l_i, v_scale)  # 0 where no key was seen
    if NUM_SPLITS == 1:
        tl.store(
            output_ptr
            + seq.to(tl.int64) * STRIDE_O_TOKEN
            + q_heads[:, None] * STRIDE_O_HEAD
            + offs_d[None, :],
            out.to(output_ptr.dtype.element_ty),
            mask=row_valid[:, None] & (offs_d < HEAD_SIZE)[None, :],
        )
    else:
        lse = split_log_sum_exp(m_i, l_i)  # -inf for an empty split
        ws_row = (
            (seq_local.to(tl.int64) * NUM_Q_HEADS + q_heads) * NUM_SPLITS + split
        ) * (HEAD_SIZE + 1)  # [BLOCK_M]
        tl.store(
            workspace_ptr + ws_row[:, None] + offs_d[None, :],
            out,
            mask=row_valid[:, None] & (offs_d < HEAD_SIZE)[None, :],
        )
        tl.store(workspace_ptr + ws_row + HEAD_SIZE, lse, mask=row_valid)


# ----------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------


def early_convert_applies(key_cache: torch.Tensor) -> bool:
    """Whether ``DecodeConfig.early_convert`` can apply to a cache: e4m3fn on an
    NVIDIA GPU (inline PTX; not ROCm's e4m3fnuz, not the CPU interpreter)."""
    return key_cache.dtype == torch.float8_e4m3fn and nvidia_gpu(key_cache.device)


def choose_decode_splits(
    *,
    num_seqs: int,
    num_kv_heads: int,
    num_sms: int,
    max_splits: int = MAX_DECODE_SPLITS,
    wave: WaveRule | None = None,
) -> int:
    """Number of KV splits for a decode batch, in [1, max_splits].

    Depends only on the batch shape, never on context lengths (they change between
    CUDA-graph replays of one captured batch size; the grid must not). The 2D grid
    has ``num_seqs * num_kv_heads`` programs; the smallest power of two that brings
    the grid to ``SPLIT_TARGET_WAVES * num_sms`` programs is chosen (so the grid ends
    up between 3 and 6 waves), capped at ``max_splits`` (default ``MAX_DECODE_SPLITS``,
    a power of two <= ``SPLIT_LIMIT``); batches that reach the
    target alone get 1 (no workspace traffic, no merge). Short contexts lose little
    to splitting: shares past the end of a context are empty and exit at once.

    ``wave`` (the kernel build's ``WaveRule``; None: not known) makes the rule
    wave-aware (``fewest_waves``) for grids past the target and, with
    ``wave.any_count``, for every grid that ``wave.max_splits`` splits bring to a
    full wave: a grid that fills the GPU 1.2 times otherwise runs a second, mostly
    idle wave of whole programs.
    """
    work = max(1, num_seqs * num_kv_heads)
    target = SPLIT_TARGET_WAVES * max(1, num_sms)
    if wave is not None:
        resident = wave.programs_per_sm * max(1, num_sms)
        cap = min(max_splits, wave.max_splits)
        if work >= target or (wave.any_count and work * cap >= resident):
            return fewest_waves(work=work, resident=resident, max_splits=cap, wave=wave)
    if work >= target:
        return 1
    want = -(-target // work)  # ceil
    return min(max_splits, 1 << (want - 1).bit_length())


def decode_wave_rule(*, kv_dtype: torch.dtype, device: torch.device) -> WaveRule | None:
    """The ``wave`` that decode launches on ``device`` pass to
    ``choose_decode_splits``: the tuning data's ``WaveRule`` where the wave-aware
    rule was measured faster (``wave_rule``), else None (the default rule)."""
    hopper = device.type == "cpu" or is_hopper(device)
    return wave_rule(kv_dtype=kv_dtype, hopper=hopper)


def fewest_waves(*, work: int, resident: int, max_splits: int, wave: WaveRule) -> int:
    """The split count, at most ``max_splits`` (every count with ``wave.any_count``,
    else powers of two), whose grid of ``work * s`` equal programs, ``resident`` at a
    time, finishes first: ``ceil(work * s / resident)`` waves of programs that each
    take ``o + (1 - o) / s`` of an unsplit one (``o``: ``wave.program_overhead``);
    a tie goes to fewer splits."""
    o = wave.program_overhead
    counts = range(2, max_splits + 1)
    if not wave.any_count:
        counts = [s for s in counts if s & (s - 1) == 0]
    best, best_cost = 1, float(-(-work // resident))
    for s in counts:
        cost = -(-work * s // resident) * (o + (1 - o) / s)
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def decode_workspace_shape(
    *, max_num_seqs: int, num_q_heads: int, head_size: int, num_splits: int
) -> tuple[int, int, int, int]:
    """Shape of the split-KV workspace (dtype ``WORKSPACE_DTYPE``, fp32).

    Allocate it once (e.g. in the backend's builder) and pass it to every
    ``paged_decode_attention`` call with ``num_splits > 1``: the launch then
    allocates nothing and is CUDA-graph safe. A call uses the first
    ``num_seqs * num_q_heads * num_splits * (head_size + 1)`` elements as this shape,
    so one buffer of ``decode_workspace_shape(max_num_seqs=max_decodes,
    num_splits=MAX_DECODE_SPLITS, ...)`` serves every batch size and split count.
    Bytes: ``max_num_seqs * num_q_heads * num_splits * (head_size + 1) * 4``.
    """
    return (max_num_seqs, num_q_heads, num_splits, head_size + 1)


def _launches(
    inputs: AttentionInputs,
    *,
    seq_start: int,
    num_seqs: int,
    num_splits: int,
    workspace: torch.Tensor | None,
    config: DecodeConfig,
) -> list[tuple]:
    """``(kernel, grid, keyword arguments)`` of each launch of one decode call (the
    decode kernel, then the merge when split); no checks. Separate from the launch
    so the offline compile test builds exactly what a launch would."""
    num_q_heads = inputs.query.shape[1]
    num_kv_heads = inputs.key_cache.shape[1]
    group_size = num_q_heads // num_kv_heads
    decode = dict(
        **shared_kernel_args(inputs, seq_start=seq_start),
        workspace_ptr=workspace,
        NUM_Q_HEADS=num_q_heads,
        BLOCK_M=max(16, triton.next_power_of_2(group_size)),
        BLOCK_N=config.block_n,
        NUM_SPLITS=num_splits,
        EARLY_CONVERT=config.early_convert and early_convert_applies(inputs.key_cache),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    launches = [(_paged_decode_kernel, (num_seqs, num_kv_heads, num_splits), decode)]
    if num_splits > 1:
        launches.append(
            merge_launch(
                decode,
                num_seqs=num_seqs,
                num_splits=num_splits,
                rows=num_seqs,
                splits_pad=triton.next_power_of_2(num_splits),
            )
        )
    return launches


def paged_decode_attention(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
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
    num_splits: int = 1,
    workspace: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> None:
    """Decode attention (one query token per sequence) over the paged KV cache.

    Handles sequences ``[seq_start, seq_start + num_seqs)`` (default: all sequences
    of ``seq_lens`` from ``seq_start``); query/output row ``s`` belongs to sequence
    ``s``. Writes ``output`` in place.

    Args:
        query: ``[num_tokens, num_q_heads, head_size]``, fp16 or bf16.
        key_cache: ``[num_blocks, num_kv_heads, block_size, head_size]``, the
            query's dtype or fp8 (e4m3fn / e4m3fnuz / e5m2) with ``k_scale`` /
            ``v_scale``.
        value_cache: as ``key_cache``.
        output: as ``query``; written in place.
        block_table: ``[num_seqs_total, max_blocks_per_seq]`` int32.
        seq_lens: ``[num_seqs_total]`` int32, KV length including the new token.
        softmax_scale: multiplies q.k.
        seq_start: the first sequence handled.
        num_seqs: how many sequences are handled (default: all from ``seq_start``).
        k_scale: ``[1]`` fp32, fp8 only (stored = x / scale).
        v_scale: as ``k_scale``.
        sliding_window: key ``j`` is visible iff ``pos - j < sliding_window``.
        alibi_slopes: ``[num_q_heads]`` fp32; adds ``slope * (j - pos)``.
        alibi_sqrt: with alibi_slopes, adds ``-slope * sqrt(pos - j)`` instead.
        logits_soft_cap: c > 0 (``c * tanh(s / c)`` after the scale), or None / 0
            for none.
        sinks: ``[num_q_heads]`` fp32 extra logit per head (no value).
        num_splits: KV splits per sequence (see ``choose_decode_splits``); 1 = no split.
        workspace: contiguous fp32 buffer with at least as many elements as
            ``decode_workspace_shape(max_num_seqs=num_seqs, ..., num_splits)``;
            with it a ``num_splits > 1`` call allocates nothing (CUDA-graph safe);
            allocated here if ``None``.
        config: launch configuration (tile, warps, stages); None picks it from
            the tuning table (tuning/decode_configs.py). For tuning sweeps.

    Raises:
        ValueError: for unsupported inputs (nothing is launched then).

    """
    inputs = AttentionInputs(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        output=output,
        block_table=block_table,
        seq_lens=seq_lens,
        softmax_scale=softmax_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        sliding_window=sliding_window,
        alibi_slopes=alibi_slopes,
        logits_soft_cap=logits_soft_cap,
        sinks=sinks,
        alibi_sqrt=alibi_sqrt,
    )
    check_attention_inputs("paged_decode_attention", inputs)
    if config is None:
        config = config_for(inputs, num_splits)
    launch_paged_decode(
        inputs,
        config=config,
        seq_start=seq_start,
        num_seqs=num_seqs,
        num_splits=num_splits,
        workspace=workspace,
    )


def decode_config(
    *,
    device: torch.device,
    head_size: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    group: int,
    block_size: int,
    split: bool,
) -> DecodeConfig:
    """The launch config of a decode launch: the device's tuning-table entry for
    its key, else the heuristic (tuning/decode_configs.py). The backend asks once
    per model shape and split flag, not per layer."""
    return DECODE_TABLE.lookup(
        gpu_name=device_gpu_name(device),
        head_size=head_size,
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        group=group,
        block_size=block_size,
        split=split,
        is_hip=torch.version.hip is not None,
    )


class DecodePlanner:
    """The decode launch of every batch size a backend can see, decided once:
    split counts (``choose_decode_splits``, wave-aware where
    ``decode_wave_rule`` says; 1 throughout when ``batch_invariant``), the
    configs (``decode_config``, unsplit and split) and one fp32 workspace buffer
    with a view per split count, sized for the largest batch that gets it (views
    share the buffer: one decode launch runs at a time and layers run in order).
    ``plan(num_decodes)`` only looks up."""

    def __init__(
        self,
        *,
        device: torch.device,
        num_q_heads: int,
        num_kv_heads: int,
        head_size: int,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
        block_size: int,
        max_num_seqs: int,
        num_sms: int,
        batch_invariant: bool = False,
    ):
        self.max_num_seqs = max_num_seqs
        wave = decode_wave_rule(kv_dtype=kv_dtype, device=device)
        # splits_for_batch[n]: the split count of a batch of n decodes.
        self.splits_for_batch = [1] + [
            1
            if batch_invariant
            else choose_decode_splits(
                num_seqs=n,
                num_kv_heads=num_kv_heads,
                num_sms=num_sms,
                wave=wave,
            )
            for n in range(1, max_num_seqs + 1)
        ]
        self.configs = {
            split: decode_config(
                device=device,
                head_size=head_size,
                q_dtype=q_dtype,
                kv_dtype=kv_dtype,
                group=num_q_heads // num_kv_heads,
                block_size=block_size,
                split=split,
            )
            for split in (False, True)
        }
        rows_for_splits = {
            splits: n for n, splits in enumerate(self.splits_for_batch) if splits > 1
        }
        shapes = {
            splits: decode_workspace_shape(
                max_num_seqs=rows,
                num_q_heads=num_q_heads,
                head_size=head_size,
                num_splits=splits,
            )
            for splits, rows in rows_for_splits.items()
        }
        self.workspaces: dict[int, torch.Tensor] = {}
        if shapes:
            buffer = torch.empty(
                max(math.prod(shape) for shape in shapes.values()),
                dtype=WORKSPACE_DTYPE,
                device=device,
            )
            self.workspaces = {
                splits: buffer[: math.prod(shape)].view(shape)
                for splits, shape in shapes.items()
            }

    def plan(self, num_decodes: int) -> tuple[int, torch.Tensor | None, DecodeConfig]:
        """``(num_splits, workspace, config)`` of a launch over ``num_decodes``."""
        if num_decodes > self.max_num_seqs:
            # Cannot come from vLLM's scheduler; such a batch fills the GPU anyway.
            return 1, None, self.configs[False]
        splits = self.splits_for_batch[num_decodes]
        return splits, self.workspaces.get(splits), self.configs[splits > 1]


def config_for(inputs: AttentionInputs, num_splits: int) -> DecodeConfig:
    """``decode_config`` of a launch on these inputs."""
    query, key_cache = inputs.query, inputs.key_cache
    return decode_config(
        device=query.device,
        head_size=query.shape[2],
        q_dtype=query.dtype,
        kv_dtype=key_cache.dtype,
        group=query.shape[1] // key_cache.shape[1],
        block_size=key_cache.shape[2],
        split=num_splits > 1,
    )


def launch_paged_decode(
    inputs: AttentionInputs,
    *,
    config: DecodeConfig,
    num_seqs: int | None = None,
    seq_start: int = 0,
    num_splits: int = 1,
    workspace: torch.Tensor | None = None,
) -> None:
    """The per-layer step of ``paged_decode_attention``: the launch of inputs
    that have passed the input contract (``check_attention_inputs``), with the
    config and split plan decided (``decode_config``, ``choose_decode_splits``).
    Checks the sequence range, the split count and the workspace (host
    attributes); allocates only when a split call brings no workspace."""
    query, seq_lens = inputs.query, inputs.seq_lens
    if num_seqs is None:
        num_seqs = seq_lens.shape[0] - seq_start
    if num_seqs <= 0:
        return
    if seq_start < 0 or seq_start + num_seqs > min(seq_lens.shape[0], query.shape[0]):
        raise ValueError(
            f"paged_decode_attention: sequences [{seq_start}, {seq_start + num_seqs}) "
            f"exceed seq_lens ({seq_lens.shape[0]}) or query rows ({query.shape[0]})."
        )
    if not 1 <= num_splits <= SPLIT_LIMIT:
        raise ValueError(
            f"paged_decode_attention: num_splits {num_splits} must be in "
            f"[1, {SPLIT_LIMIT}]; use choose_decode_splits(...)."
        )
    if num_splits > 1:
        shape = decode_workspace_shape(
            max_num_seqs=num_seqs,
            num_q_heads=query.shape[1],
            head_size=query.shape[2],
            num_splits=num_splits,
        )
        if workspace is None:
            workspace = torch.empty(shape, dtype=WORKSPACE_DTYPE, device=query.device)
        elif (
            workspace.dtype != WORKSPACE_DTYPE
            or not workspace.is_contiguous()
            or workspace.numel() < math.prod(shape)
        ):
            raise ValueError(
                "paged_decode_attention: workspace must be a contiguous fp32 tensor "
                f"with >= {math.prod(shape)} elements (decode_workspace_shape"
                f"{shape}); got {workspace.dtype} {tuple(workspace.shape)}."
            )
    launches = _launches(
        inputs,
        seq_start=seq_start,
        num_seqs=num_seqs,
        num_splits=num_splits,
        workspace=workspace,
        config=config,
    )
    for kernel, grid, kwargs in launches:
        kernel[grid](**kwargs)


__all__ = [
    "MAX_DECODE_SPLITS",
    "SPLIT_LIMIT",
    "WORKSPACE_DTYPE",
    "choose_decode_splits",
    "config_for",
    "decode_config",
    "decode_wave_rule",
    "decode_workspace_shape",
    "launch_paged_decode",
    "paged_decode_attention",
]
