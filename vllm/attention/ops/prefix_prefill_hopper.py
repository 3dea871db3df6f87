# SPDX-License-Identifier: Apache-2.0
"""Prefix prefill for NVIDIA Hopper (sm_90), written in Gluon.

The same contract as ``prefix_prefill.py`` (query rows over the paged KV cache,
causal, the new tokens' K/V already in the cache) for the common case: a 16-bit
cache of the query's dtype or an e4m3 cache with the config's ``fp8_qk``, head size
64, 96, 128 or 256, a sliding window or none, a soft-cap or none, sinks or none,
no ALiBi, K/V tiles that are whole slices of pages, no KV split. Everything else
runs in the portable Triton kernel; the launch plan
(``prefix_prefill.plan_prefill``) is the one place that chooses, from the launch
config's ``gluon`` flag and ``prefix_prefill.hopper_kernel_refusal``, before it
chooses the split count. This module holds the kernel and its launch only; the
constants of what it takes live with the configs
(``tuning/prefill_configs.py``: ``GLUON_*``).

Why a second kernel: Triton 3.6 issues each ``tl.dot`` of the portable kernel as a
wgmma and waits for it where it is issued, so a warpgroup's GEMMs and its softmax
never overlap. Gluon states the schedule explicitly:

* Work split as in the portable kernel: one program per 128 packed query rows
  (token-major, the group's heads inside, no padding rows) of one KV head of one
  sequence. A 1D grid of ``row_tiles * num_seqs * num_kv_heads`` programs:
  every head and sequence's last row tile (the most keys) first, then the one
  before it, so long programs start first.
* K and V tiles of ``BLOCK_N`` keys are page slices loaded by TMA (one box per
  page the tile spans) into rings of ``STAGES`` shared-memory slots; K and V of a
  slot each complete their own mbarrier, so q.k can start before V has landed, and
  each is released on its own: a K slot once q.k of its tile is done, a V slot
  once p.v is, so the next K tile loads while the last p.v still runs.
* A program forks (``gl.warp_specialize``) into a load warp (``_producer``: TMA
  into the ring, each slot refilled once every consumer has released it) and
  two or three consumer warpgroups of 64 rows (``_consumer``; three at head 64,
  FlashAttention-3's 192-row tile there). A consumer loads its query
  rows once into shared memory in the wgmma operand layout; its step t::

      wait for its turn
      issue S(t) = Q K(t)^T, then O += P(t-1) V(t-1)   (async wgmma)
      let the next warpgroup issue
      wait S(t); release K(t); softmax of S(t) -> P(t), alpha
      wait O; release V(t-1); O = alpha * O

  The turns (two named barriers) make one warpgroup's softmax run while the other's
  products occupy the tensor cores (FlashAttention-3's ping-pong). Within a
  warpgroup the softmax of S(t) overlaps P(t-1) V(t-1) only with constexpr
  ``OVERLAP_PV`` (the config's ``overlap_pv``; the H200 table sets it where it
  was measured faster, head 64): K(t) is then released after the softmax, behind
  a branch that keeps the sm_90 build's wait for O after the softmax; without it
  ptxas moves that wait before the softmax (docs/kernels.md).

  Row maxima are fp32 in log2 units (the softmax scale times log2(e)); each
  probability is the exponential of one fused multiply-add of its raw score
  (with a soft-cap c, of ``c * tanh(score / c)`` in log2 units, tanh as one
  ``tanh.approx.f32``, FA3's choice, where the portable kernel's
  ``scale_scores_log2`` spends an exponential and a divide);
  tiles from the first one that reaches the causal diagonal are masked (keys past
  the row's position or the sequence end), earlier ones are not.
* Sinks (one logit per head with no value): each row's softmax state starts at
  its head's sink, ``m = sink * log2(e)`` and ``l = 1``, as the portable kernel's
  ``init_softmax_state``; the sink is not scaled by the softmax scale.
* Value rows past the sequence end in the last tile are zeroed in shared memory
  before P.V (a free cache slot may hold NaN, and 0 * NaN is NaN): the first
  consumer zeroes them, the second waits on a barrier for it.
* The accumulator is divided by the row sums and stored through pointers.
* Head size 96 runs in one of two ways. Padded (the default): in 128 columns
  (``head_pad``), the K/V boxes 128 wide, TMA reading the columns past the cache
  row as zeros; the query's are loaded as zeros and the output's are not stored.
  Split (constexpr ``SPLIT_HEAD``, the config's ``split_head``, 16-bit caches
  only): in two unpadded column parts of 64 and 32 (``head_split``), each with its
  own TMA descriptors (``k_hi_desc``, ``v_hi_desc``: the second part, loaded from
  column 64) and its own rings of query, K and V tiles; one mbarrier per K (or V)
  slot expects both parts' bytes. q.k is two async wgmmas into one score tile
  (``S = Q_lo K_lo^T + Q_hi K_hi^T``), p.v two into two accumulators of 64 and 32
  columns, so the tensor cores do 3/4 of the padded products' work. Every async
  wgmma is one commit group; the wait for S leaves both p.v groups in flight
  (``_consumer``). The H200 table sets it where it was measured faster.
* An e4m3 cache (constexpr ``FP8``, from the descriptors' dtype): q.k runs on fp8
  tensor cores. Each consumer rounds its query rows to e4m3 once, with one scale
  for its tile (its largest magnitude maps to the format's largest value, as the
  portable kernel's ``fp8_qk``), folded with ``k_scale`` into the score scale.
  p.v stays 16-bit: wgmma takes fp8 operands only K-major, and V's tile is
  key-major. A converter partition of two warps (``_converter``) turns each V tile
  once into an fp16 tile of a second ring (exact), zeroing the last tile's rows
  past the sequence end there, and releases the fp8 slot at once; the consumers
  read that ring as they read the V ring of a 16-bit cache, and ``v_scale``
  scales the output. The conversion runs beside the consumers, not between their
  turns.
"""

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from vllm.attention.ops.triton_attention_common import (
    LOG2E,
    AttentionInputs,
    cache_descriptor,
    fp8_max,
    head_pad,
    head_split,
    softcap_enabled,
)
from vllm.attention.ops.tuning.prefill_configs import (
    GLUON_WG_ROWS,
    GLUON_WORKER_REGISTERS,
)

# Query rows per consumer warpgroup: a wgmma instruction covers 64 rows of 4 warps;
# a program's BLOCK_M rows are BLOCK_M // 64 consumer warpgroups.
_WG_ROWS = gl.constexpr(GLUON_WG_ROWS)
# Warps of an fp8 cache's converter partition (``_converter``).
_CONVERTER_WARPS = gl.constexpr(2)
_GL_DTYPE = {
    torch.bfloat16: gl.bfloat16,
    torch.float16: gl.float16,
    torch.float8_e4m3fn: gl.float8e4nv,
}
# The block-wide barrier: ``thread_barrier`` in Triton 3.6, ``barrier`` in 3.8.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.constexpr_function
def _turn_asm(WG, NUM_WG, PASS):
    """The instruction of ``_turn``: warpgroup ``WG`` of ``NUM_WG`` waits on its
    own named barrier, or arrives on the next warpgroup's (ids 16 - NUM_WG to 15,
    256 threads each: the waiting warpgroup and the one that passes it the turn)."""
    wg = (WG + 1) % NUM_WG if PASS else WG
    op = "bar.arrive" if PASS else "bar.sync"
    return f"{op} {16 - NUM_WG + wg}, 256; mov.u32 $0, $1;"


@gluon.jit
def _turn(t, WG: gl.constexpr, NUM_WG: gl.constexpr, PASS: gl.constexpr):
    """Warpgroup ``WG`` waits for its turn to issue (``bar.sync`` on its named
    barrier), or passes the turn to the next warpgroup of the ring of ``NUM_WG``
    once it has issued (``PASS``: ``bar.arrive`` on the next one's). Hardware
    named barriers from id 16 - NUM_WG to 15, above those the compiler gives the
    partitions' own barriers; an arrive does not wait, and no warpgroup-wide sync
    precedes it, as one precedes an mbarrier arrive. ``t`` only carries the
    instruction (inline assembly takes an operand)."""
    asm: gl.constexpr = _turn_asm(WG, NUM_WG, PASS)
    gl.inline_asm_elementwise(asm, "=r,r", [t], dtype=gl.int32, is_pure=False, pack=1)


@gluon.constexpr_function
def _box_bytes(descs):
    """Bytes of one box of every column part of the head (``descs``)."""
    return sum(desc.block_type.nbytes for desc in descs)


@gluon.constexpr_function
def _first_column(descs, part):
    """The head column at which column part ``part`` (of ``descs``) starts."""
    return sum(desc.block_type.shape[1] for desc in list(descs)[:part])


@gluon.jit
def _allocate_tiles(descs, COUNT: gl.constexpr, ROWS: gl.constexpr):
    """``COUNT`` shared-memory tiles of ``ROWS`` rows for each column part of the
    head (``descs``: the one padded part, or the split head's two), in the layout
    and width of that part's TMA box; a tuple with one ring per part."""
    tiles = ()
    for part in gl.static_range(len(descs)):
        desc = descs[part]
        tile = gl.allocate_shared_memory(
            desc.dtype, [COUNT, ROWS, desc.block_type.shape[1]], desc.layout
        )
        tiles = tiles + (tile,)
    return tiles


@gluon.jit
def _ring_slot(rings, slot):
    """Slot ``slot`` of each column part's ring (``_allocate_tiles``)."""
    tiles = ()
    for part in gl.static_range(len(rings)):
        tiles = tiles + (rings[part].index(slot),)
    return tiles


@gluon.jit
def _refill_slot(
    descs, dsts, bar, empty, t, table_row_ptr, kv_head, tile, BLOCK_N: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, ROWS_PER_BLOCK: gl.constexpr,
    ROWS_PER_HEAD: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """Step ``t`` of the load warp for one cache (K or V): wait until every consumer
    warpgroup has released the ring slot ``dsts`` (``empty``, from the ring's
    second round on), then start the TMA loads of key tile ``tile`` into it: one
    box of ``BOX_N`` rows per page the tile spans and column part of the head
    (``descs`` and ``dsts``: one part, or the split head's two); ``bar`` completes
    when the bytes of every box of every part have landed."""
    if t >= STAGES:
        mbarrier.wait(empty, (t // STAGES - 1) & 1)
    BOX_N: gl.constexpr = descs[0].block_type.shape[0]
    mbarrier.expect(bar, _box_bytes(descs) * (BLOCK_N // BOX_N))
    for box in gl.static_range(BLOCK_N // BOX_N):
        key = tile * BLOCK_N + box * BOX_N
        page = gl.load(table_row_ptr + key // BLOCK_SIZE)
        row = page * ROWS_PER_BLOCK + kv_head * ROWS_PER_HEAD + key % BLOCK_SIZE
        for part in gl.static_range(len(descs)):
            dst = dsts[part].slice(box * BOX_N, BOX_N)
            col = _first_column(descs, part)
            tma.async_copy_global_to_shared(descs[part], [row, col], bar, dst)


@gluon.jit
def _softmax_step(
    s, m_i, l_i, tile, first_masked, window_full, pos, seq_len, sliding_window,
    scale_log2, softcap, S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr,
    O_LAYOUT: gl.constexpr, P_DTYPE: gl.constexpr, BLOCK_N: gl.constexpr,
    USE_WINDOW: gl.constexpr, USE_SOFTCAP: gl.constexpr,
):  # fmt: skip
    """Online softmax over one tile of raw scores: the probabilities as the P.V
    operand (the cache's dtype), the accumulator rows' rescale factor, the new row
    max (log2 units) and row sum. Tiles from ``first_masked`` on hide keys past
    each row's position and past the sequence end; with a window, tiles before
    ``window_full`` hide keys at or beyond ``sliding_window`` behind the row.
    With a soft-cap c, ``softcap`` is ``(scale / c, c * log2(e))`` and
    ``scale_log2`` is 1: the capped scores are in log2 units already."""
    if USE_SOFTCAP:
        cap_in, cap_out = softcap
        # One MUFU instruction per score instead of an exp2 and a full divide.
        tanh = gl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;",
            "=f,f",
            [s * cap_in],
            dtype=gl.float32,
            is_pure=True,
            pack=1,
        )
        s = tanh * cap_out
    if (tile >= first_masked) | (tile < window_full):
        keys = tile * BLOCK_N + gl.arange(
            0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT)
        )
        keys = gl.expand_dims(keys, 0)
        visible = (keys <= gl.expand_dims(pos, 1)) & (keys < seq_len)
        if USE_WINDOW:
            visible = visible & (gl.expand_dims(pos, 1) - keys < sliding_window)
        s = gl.where(visible, s, -float("inf"))
    # The scale is positive: scale the row max, not the tile, and fold the scale
    # into the exponent's argument (one fused multiply-add per score).
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
    if USE_WINDOW:  # noqa: SIM108
        # A row whose window starts past every key seen so far has no max yet:
        # exponentiate against 0 so its terms are 0, not NaN.
        m_ref = gl.where(m_new == -float("inf"), 0.0, m_new)
    else:
        m_ref = m_new  # key 0, in the first tile, is visible to every row
    alpha = gl.exp2(m_i - m_ref)
    p = gl.exp2(gl.fma(s, scale_log2, -gl.expand_dims(m_ref, 1)))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    p = gl.convert_layout(p.to(P_DTYPE), P_LAYOUT)
    alpha = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
    return p, alpha, m_new, l_i


@gluon.jit
def _query_to_fp8(q, FP8_MAX: gl.constexpr, FP8_DTYPE: gl.constexpr):
    """A consumer's query rows on the fp8 grid and their scale: the tile's largest
    magnitude maps to ``FP8_MAX`` (an all-zero tile gets scale 1), and each
    element is divided correctly rounded, as the portable kernel's
    ``quantize_fp8`` does (the conversion saturates at ``FP8_MAX``)."""
    q = q.to(gl.float32)
    amax = gl.max(gl.max(gl.abs(q), axis=1), axis=0)
    q_scale = gl.where(amax > 0.0, amax / FP8_MAX, 1.0)
    return gl.div_rn(q, q_scale).to(FP8_DTYPE), q_scale


@gluon.jit
def _converter(
    v_smem, v_bars, v_empty, v16_smem, v16_ready, v16_empty, first_tile, steps,
    seq_len,
):  # fmt: skip
    """The converter partition of an fp8 cache (two warps): V tile ``first_tile +
    t`` from the TMA ring's slot ``t % STAGES`` into the fp16 ring's slot of the
    same index (``_convert_tile``). The last tile's keys past the sequence end
    become zeros (a free cache slot may hold NaN); the other tiles are copied as
    they are, since the zeros are chosen per 16-bit element (splitting and
    repacking each pair: three times the instructions of the copy)."""
    ring = (v_smem, v_bars, v_empty, v16_smem, v16_ready, v16_empty)
    STAGES: gl.constexpr = v_smem.shape[0]
    BLOCK_N: gl.constexpr = v_smem.shape[1]
    last = steps - 1
    # A round of the ring per iteration, so that each slot is a compile-time
    # constant there: its addresses are immediates, and the copy fits the
    # partition's 40 registers without spilling.
    for t0 in range(0, last, STAGES):
        for slot in gl.static_range(STAGES):
            if t0 + slot < last:
                _convert_tile(ring, t0 + slot, slot, 0, seq_len, MASKED=False)
    key0 = (first_tile + last) * BLOCK_N
    _convert_tile(ring, last, last % STAGES, key0, seq_len, MASKED=True)


@gluon.jit
def _convert_tile(ring, t, slot, key0, seq_len, MASKED: gl.constexpr):
    """The converter's tile ``t`` in ring slot ``slot`` (``t % STAGES``), its
    first key ``key0``: converted once every consumer has released the fp16 slot
    (after its p.v) and the TMA has filled the fp8 one. It releases the fp8 slot
    at once, and ``v16_ready`` hands the tile to the consumers. Exact: every e4m3
    value is an fp16 value. ``MASKED``: keys from ``seq_len`` on become zeros."""
    v_smem, v_bars, v_empty, v16_smem, v16_ready, v16_empty = ring
    STAGES: gl.constexpr = v_smem.shape[0]
    BLOCK_N: gl.constexpr = v_smem.shape[1]
    HEAD_PAD: gl.constexpr = v_smem.shape[2]
    # 16 bytes of fp8 per thread and load, 32 elements per thread and pass.
    KEYS: gl.constexpr = 1024 * _CONVERTER_WARPS // HEAD_PAD
    LAYOUT: gl.constexpr = gl.BlockedLayout(
        [1, 16], [512 // HEAD_PAD, HEAD_PAD // 16], [_CONVERTER_WARPS, 1], [1, 0]
    )
    if t >= STAGES:
        mbarrier.wait(v16_empty.index(slot), (t // STAGES - 1) & 1)
    mbarrier.wait(v_bars.index(slot), (t // STAGES) & 1)
    for k0 in gl.static_range(0, BLOCK_N, KEYS):
        v = v_smem.index(slot).slice(k0, KEYS).load(LAYOUT).to(gl.float16)
        if MASKED:
            keys = key0 + k0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, LAYOUT))
            v = gl.where(gl.expand_dims(keys < seq_len, 1), v, 0.0)
        v16_smem.index(slot).slice(k0, KEYS).store(v)
    mbarrier.arrive(v_empty.index(slot))
    fence_async_shared()  # the stores, before wgmma reads them
    mbarrier.arrive(v16_ready.index(slot))


@gluon.jit
def _program_rows(
    query_start_loc_ptr, seq_start, num_seqs, NUM_KV_HEADS: gl.constexpr,
    BLOCK_M: gl.constexpr,
):  # fmt: skip
    """This program's sequence, KV head, the sequence's query start and length,
    and its first packed query row. The 1D grid holds ``row_tiles * num_seqs *
    num_kv_heads`` programs: every head and sequence's last row tile (the most
    keys) first, then the one before it."""
    heads = num_seqs * NUM_KV_HEADS
    row_tile = gl.num_programs(0) // heads - 1 - gl.program_id(0) // heads
    seq = seq_start + (gl.program_id(0) % heads) // NUM_KV_HEADS
    kv_head = gl.program_id(0) % NUM_KV_HEADS
    q_start = gl.load(query_start_loc_ptr + seq)
    q_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
    return seq, kv_head, q_start, q_len, row_tile * BLOCK_M


@gluon.jit
def _key_tiles(
    q_len, seq_len, row0, sliding_window, ROWS: gl.constexpr,
    GROUP_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, USE_WINDOW: gl.constexpr,
):  # fmt: skip
    """The key tiles of packed query rows ``[row0, row0 + ROWS)``:
    ``[first_tile, num_tiles)`` from the first row's window start to the last
    row's position. Tiles in ``[window_full, first_masked)`` are visible to every
    row; the others are masked."""
    context = seq_len - q_len
    first_token = row0 // GROUP_SIZE
    last_token = gl.minimum(q_len - 1, (row0 + ROWS - 1) // GROUP_SIZE)
    num_tiles = (context + last_token + BLOCK_N) // BLOCK_N
    first_masked = (context + first_token + 1) // BLOCK_N
    first_tile = 0
    window_full = 0
    if USE_WINDOW:
        first_tile = gl.maximum(context + first_token - sliding_window + 1, 0)
        first_tile = first_tile // BLOCK_N
        window_full = gl.maximum(context + last_token - sliding_window + 1, 0)
        window_full = (window_full + BLOCK_N - 1) // BLOCK_N
    return first_tile, num_tiles, first_masked, window_full


@gluon.jit
def _producer(
    args, BLOCK_N: gl.constexpr, BLOCK_SIZE: gl.constexpr,
    ROWS_PER_BLOCK: gl.constexpr, ROWS_PER_HEAD: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """The load warp: K and V of key tile ``first_tile + t`` into ring slot
    ``t % STAGES``, each once its readers have released that ring's slot from its
    previous tile (K: every consumer warpgroup, after q.k; V: every consumer,
    after p.v, or an fp8 cache's converter). ``k_descs``, ``k_smem`` (and V's): a
    descriptor and a ring per column part of the head."""
    (
        k_descs, v_descs, k_smem, v_smem, k_bars, v_bars, k_empty, v_empty,
        table_row_ptr, kv_head, first_tile, steps,
    ) = args  # fmt: skip
    for t in range(steps):
        slot = t % STAGES
        tile = first_tile + t
        _refill_slot(
            k_descs, _ring_slot(k_smem, slot), k_bars.index(slot),
            k_empty.index(slot), t, table_row_ptr, kv_head, tile, BLOCK_N,
            BLOCK_SIZE, ROWS_PER_BLOCK, ROWS_PER_HEAD, STAGES,
        )  # fmt: skip
        _refill_slot(
            v_descs, _ring_slot(v_smem, slot), v_bars.index(slot),
            v_empty.index(slot), t, table_row_ptr, kv_head, tile, BLOCK_N,
            BLOCK_SIZE, ROWS_PER_BLOCK, ROWS_PER_HEAD, STAGES,
        )  # fmt: skip


@gluon.constexpr_function
def _io_layout(cols):
    """The register layout of a warpgroup's ``[64, cols]`` query and output rows
    (and of a V tile's rows when its tail is zeroed): 16-byte accesses along a
    row, a warp's threads across ``cols // 8`` of them."""
    return gl.BlockedLayout([1, 8], [256 // cols, cols // 8], [4, 1], [1, 0])


@gluon.jit
def _head_rows(
    first_row, q_len, kv_head, GROUP_SIZE: gl.constexpr, M: gl.constexpr,
    COL0: gl.constexpr, COLS: gl.constexpr, HEAD_SIZE: gl.constexpr,
):  # fmt: skip
    """Packed rows ``[first_row, first_row + M)`` and head columns ``[COL0, COL0 +
    COLS)`` in ``_io_layout(COLS)``: each row's token and query head, the columns,
    and the elements that exist (rows of the query, columns of the head: a padded
    part's columns past the head size do not)."""
    IO_LAYOUT: gl.constexpr = _io_layout(COLS)
    rows = first_row + gl.arange(0, M, layout=gl.SliceLayout(1, IO_LAYOUT))
    cols = COL0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, IO_LAYOUT))
    token = rows // GROUP_SIZE
    head = kv_head * GROUP_SIZE + rows % GROUP_SIZE
    valid = gl.expand_dims(token < q_len, 1)
    if HEAD_SIZE < COL0 + COLS:
        valid = valid & gl.expand_dims(cols < HEAD_SIZE, 0)
    return token, head, cols, valid


@gluon.jit
def _row_ptrs(ptr, q_start, io, STRIDE_TOKEN: gl.constexpr, STRIDE_HEAD: gl.constexpr):
    """Pointers to the elements of ``io`` (``_head_rows``) in a ``[num_tokens,
    num_q_heads, head_size]`` tensor of these strides, the sequence's query
    tokens from ``q_start``."""
    token, head, cols, _ = io
    offsets = (q_start + token).to(gl.int64) * STRIDE_TOKEN + head * STRIDE_HEAD
    return ptr + gl.expand_dims(offsets, 1) + gl.expand_dims(cols, 0)


@gluon.jit
def _store_rows(
    output_ptr, o, l_o, q_start, io, STRIDE_O_TOKEN: gl.constexpr,
    STRIDE_O_HEAD: gl.constexpr,
):  # fmt: skip
    """One column part of the output: the accumulator ``o`` divided by the row
    sums ``l_o``, stored to the elements of ``io`` (``_head_rows``)."""
    out = (o / gl.expand_dims(l_o, 1)).to(output_ptr.dtype.element_ty)
    out = gl.convert_layout(out, _io_layout(o.shape[1]))
    out_ptrs = _row_ptrs(output_ptr, q_start, io, STRIDE_O_TOKEN, STRIDE_O_HEAD)
    gl.store(out_ptrs, out, mask=io[3])


@gluon.jit
def _issue_qk(q_smem, k_smem, WG: gl.constexpr, slot, s_init):
    """Issue S = Q K^T of K ring slot ``slot`` as one async wgmma (one commit
    group) per column part of the head, into one accumulator: the first part's
    from zero, the second's onto the first's result, without a wait between
    (wgmma accumulates in order into the same registers)."""
    s = warpgroup_mma(
        q_smem[0].index(WG), k_smem[0].index(slot).permute((1, 0)), s_init,
        use_acc=False, is_async=True,
    )  # fmt: skip
    for part in gl.static_range(1, len(k_smem)):
        s = warpgroup_mma(
            q_smem[part].index(WG), k_smem[part].index(slot).permute((1, 0)), s,
            is_async=True,
        )  # fmt: skip
    return s


@gluon.jit
def _zero_keys_past_end(v_ring, slot, key0, seq_len):
    """Zero the rows of the V tile in ``v_ring``'s slot ``slot`` (keys from
    ``key0``) past the sequence end, in shared memory."""
    ROWS: gl.constexpr = v_ring.shape[1]
    LAYOUT: gl.constexpr = _io_layout(v_ring.shape[2])
    keys = key0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
    v = v_ring.index(slot).load(LAYOUT)
    v = gl.where(gl.expand_dims(keys < seq_len, 1), v, 0.0)
    v_ring.index(slot).store(v)


@gluon.jit
def _consumer(
    args, STRIDE_Q_TOKEN: gl.constexpr, STRIDE_Q_HEAD: gl.constexpr,
    STRIDE_O_TOKEN: gl.constexpr, STRIDE_O_HEAD: gl.constexpr,
    GROUP_SIZE: gl.constexpr, HEAD_SIZE: gl.constexpr, USE_WINDOW: gl.constexpr,
    USE_SOFTCAP: gl.constexpr, USE_SINKS: gl.constexpr, FP8_MAX: gl.constexpr,
    SPLIT_HEAD: gl.constexpr, OVERLAP_PV: gl.constexpr, WG: gl.constexpr,
):  # fmt: skip
    """One consumer warpgroup: 64 query rows from ``row0 + 64 * WG``. Its q.k and
    p.v are issued in turns with the other warpgroups' (``_turn``, round a ring),
    so one's softmax runs while another's products occupy the tensor cores.
    ``args``: the values all consumer warpgroups share
    (``hopper_prefill_kernel``); ``q_smem`` (one tile per warpgroup), ``k_smem``
    and ``v_smem`` hold one ring per column part of the head. With
    ``SPLIT_HEAD`` there are two parts (``lo`` and ``hi`` columns): q.k sums one
    product per part into one score tile, and p.v runs into one accumulator per
    part, ``o`` (the first ``lo`` columns) and ``o_hi``."""
    (
        query_ptr, output_ptr, q_smem, k_smem, v_smem, k_bars, v_bars, k_empty,
        v_empty, tail_bar, q_start, q_len, seq_len, row0, kv_head, first_tile,
        steps, scale_log2, softcap, sliding_window, fp8_args, sinks_ptr,
    ) = args  # fmt: skip
    M: gl.constexpr = _WG_ROWS
    NUM_WG: gl.constexpr = q_smem[0].shape[0]  # one query tile per warpgroup
    STAGES: gl.constexpr = k_smem[0].shape[0]
    BLOCK_N: gl.constexpr = k_smem[0].shape[1]
    # The first column part: the whole (padded) head, or the split head's lo.
    HEAD_PAD: gl.constexpr = k_smem[0].shape[2]
    FP8: gl.constexpr = k_smem[0].dtype.is_fp8()
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0],
        warps_per_cta=[4, 1],
        instr_shape=[16, BLOCK_N, 32 if FP8 else 16],  # K of a wgmma: 32 bytes
    )
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_PAD, 16]
    )
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=O_LAYOUT, k_width=2
    )
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    P_DTYPE: gl.constexpr = gl.float16 if FP8 else k_smem[0].dtype
    if SPLIT_HEAD:
        HEAD_HI: gl.constexpr = k_smem[1].shape[2]
        O_HI_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_HI, 16]
        )
        # P as the operand of the second accumulator's wgmma, and the row
        # factors in its rows: the same registers as for the first (an A
        # operand's and a row's place in a wgmma do not depend on its N), which
        # ``assert_trivial`` checks when the kernel is traced.
        P_HI_LAYOUT: gl.constexpr = gl.DotOperandLayout(
            operand_index=0, parent=O_HI_LAYOUT, k_width=2
        )
        ROW_HI: gl.constexpr = gl.SliceLayout(1, O_HI_LAYOUT)

    first_row = row0 + WG * M
    context = seq_len - q_len
    _, _, first_masked, window_full = _key_tiles(
        q_len, seq_len, first_row, sliding_window, M, GROUP_SIZE, BLOCK_N, USE_WINDOW
    )

    io = _head_rows(first_row, q_len, kv_head, GROUP_SIZE, M, 0, HEAD_PAD, HEAD_SIZE)
    q = gl.load(
        _row_ptrs(query_ptr, q_start, io, STRIDE_Q_TOKEN, STRIDE_Q_HEAD),
        mask=io[3],
        other=0.0,
    )
    if FP8:
        k_scale, v_scale = fp8_args
        q, q_scale = _query_to_fp8(q, FP8_MAX, k_smem[0].dtype)
        if USE_SOFTCAP:
            softcap = (softcap[0] * (q_scale * k_scale), softcap[1])
        else:
            scale_log2 = scale_log2 * (q_scale * k_scale)
    q_smem[0].index(WG).store(q)
    if SPLIT_HEAD:
        io_hi = _head_rows(
            first_row, q_len, kv_head, GROUP_SIZE, M, HEAD_PAD, HEAD_HI, HEAD_SIZE
        )
        q_hi = gl.load(
            _row_ptrs(query_ptr, q_start, io_hi, STRIDE_Q_TOKEN, STRIDE_Q_HEAD),
            mask=io_hi[3],
            other=0.0,
        )
        q_smem[1].index(WG).store(q_hi)
    fence_async_shared()
    _cta_barrier()  # the warpgroup's own barrier inside a partition

    rows_s = first_row + gl.arange(0, M, layout=ROW_S)
    pos = context + rows_s // GROUP_SIZE
    if USE_SINKS:
        # A sink is a logit with no value: the row's state starts at it (log2
        # units, not scaled by the softmax scale), with a denominator of 1.
        sink_head = kv_head * GROUP_SIZE + rows_s % GROUP_SIZE
        sink = gl.load(
            sinks_ptr + sink_head, mask=rows_s // GROUP_SIZE < q_len, other=0.0
        )
        m_i = sink.to(gl.float32) * LOG2E
        l_i = gl.full([M], 1.0, gl.float32, ROW_S)
    else:
        m_i = gl.full([M], -float("inf"), gl.float32, ROW_S)
        l_i = gl.zeros([M], gl.float32, ROW_S)
    s_init = gl.zeros([M, BLOCK_N], gl.float32, S_LAYOUT)
    o = gl.zeros([M, HEAD_PAD], gl.float32, O_LAYOUT)
    if SPLIT_HEAD:
        o_hi = gl.zeros([M, HEAD_HI], gl.float32, O_HI_LAYOUT)

    # The turn goes round the ring from warpgroup 0: the last one passes it first,
    # one turn ahead, and keeps its last (every barrier sees one arrive per wait).
    LAST_WG: gl.constexpr = NUM_WG - 1
    if WG == LAST_WG:
        _turn(0, WG, NUM_WG, PASS=True)
    _turn(0, WG, NUM_WG, PASS=False)
    mbarrier.wait(k_bars.index(0), 0)
    s = _issue_qk(q_smem, k_smem, WG, 0, s_init)
    if (WG < LAST_WG) | (steps > 1):
        _turn(0, WG, NUM_WG, PASS=True)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(0))
    p, alpha, m_i, l_i = _softmax_step(
        s, m_i, l_i, first_tile, first_masked, window_full, pos, seq_len,
        sliding_window, scale_log2, softcap, S_LAYOUT, P_LAYOUT, O_LAYOUT, P_DTYPE,
        BLOCK_N, USE_WINDOW, USE_SOFTCAP,
    )  # fmt: skip
    for t in range(1, steps):
        # Issue q.k of tile t and p.v of tile t - 1 in this warpgroup's turn.
        cur = t % STAGES
        prev = (t - 1) % STAGES
        _turn(t, WG, NUM_WG, PASS=False)
        mbarrier.wait(k_bars.index(cur), (t // STAGES) & 1)
        s_tok = _issue_qk(q_smem, k_smem, WG, cur, s_init)
        mbarrier.wait(v_bars.index(prev), ((t - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_smem[0].index(prev), o, is_async=True)
        if SPLIT_HEAD:
            p_hi = gl.convert_layout(p, P_HI_LAYOUT, assert_trivial=True)
            o_hi_tok = warpgroup_mma(p_hi, v_smem[1].index(prev), o_hi, is_async=True)
        if (WG < LAST_WG) | (t < steps - 1):
            _turn(t, WG, NUM_WG, PASS=True)
        # The softmax of tile t runs while p.v of tile t - 1 is in flight with
        # OVERLAP_PV (without it the sm_90 build waits for p.v before the
        # softmax: docs/kernels.md, "Where the build waits for p.v"). Each async
        # wgmma above is one commit group; in issue order: q.k (1 group, or
        # split 2: lo, then hi onto it), then p.v (1, or split 2: ``o``, then
        # ``o_hi``). Groups complete in order, so waiting until at most as many
        # groups as p.v issued are outstanding completes all of q.k and leaves
        # all of p.v in flight: wait(1) padded, wait(2) split.
        s = warpgroup_mma_wait(2 if SPLIT_HEAD else 1, deps=[s_tok])
        if not OVERLAP_PV:
            mbarrier.arrive(k_empty.index(cur))
        p_next, alpha, m_i, l_i = _softmax_step(
            s, m_i, l_i, first_tile + t, first_masked, window_full, pos, seq_len,
            sliding_window, scale_log2, softcap, S_LAYOUT, P_LAYOUT, O_LAYOUT,
            P_DTYPE, BLOCK_N, USE_WINDOW, USE_SOFTCAP,
        )  # fmt: skip
        # A compile-time branch around a run-time one: K's slot is released
        # after the softmax, behind a branch always taken here. ptxas puts the
        # wait for p.v at the top of its basic block, so the branch keeps that
        # wait after the softmax, which then runs while this warpgroup's own p.v
        # is in flight (docs/kernels.md, "Where the build waits for p.v").
        if OVERLAP_PV:  # noqa: SIM102
            if seq_len > 0:
                mbarrier.arrive(k_empty.index(cur))
        if SPLIT_HEAD:
            o, o_hi, p, p_hi = warpgroup_mma_wait(0, deps=[o_tok, o_hi_tok, p, p_hi])
        else:
            o, p = warpgroup_mma_wait(0, deps=[o_tok, p])
        mbarrier.arrive(v_empty.index(prev))
        o = o * gl.expand_dims(alpha, 1)
        if SPLIT_HEAD:
            alpha_hi = gl.convert_layout(alpha, ROW_HI, assert_trivial=True)
            o_hi = o_hi * gl.expand_dims(alpha_hi, 1)
        p = p_next

    last = first_tile + steps - 1
    cur = (steps - 1) % STAGES
    mbarrier.wait(v_bars.index(cur), ((steps - 1) // STAGES) & 1)
    # A compile-time branch around a run-time one: an fp8 cache's converter has
    # zeroed the rows past the end already.
    if not FP8:  # noqa: SIM102
        if (last + 1) * BLOCK_N > seq_len:
            # Zero the value rows past the sequence end (see the module doc): one
            # warpgroup writes, the others wait for it.
            if WG == 0:
                for part in gl.static_range(len(v_smem)):
                    _zero_keys_past_end(v_smem[part], cur, last * BLOCK_N, seq_len)
                fence_async_shared()
                _cta_barrier()
                mbarrier.arrive(tail_bar)
            else:
                mbarrier.wait(tail_bar, 0)
    o_tok = warpgroup_mma(p, v_smem[0].index(cur), o, is_async=True)
    if SPLIT_HEAD:
        p_hi = gl.convert_layout(p, P_HI_LAYOUT, assert_trivial=True)
        o_hi_tok = warpgroup_mma(p_hi, v_smem[1].index(cur), o_hi, is_async=True)
    if SPLIT_HEAD:
        o, o_hi, p, p_hi = warpgroup_mma_wait(0, deps=[o_tok, o_hi_tok, p, p_hi])
    else:
        o, p = warpgroup_mma_wait(0, deps=[o_tok, p])

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))
    if FP8:
        l_o = l_o / v_scale
    _store_rows(output_ptr, o, l_o, q_start, io, STRIDE_O_TOKEN, STRIDE_O_HEAD)
    if SPLIT_HEAD:
        l_hi = gl.convert_layout(l_o, ROW_HI, assert_trivial=True)
        _store_rows(
            output_ptr, o_hi, l_hi, q_start, io_hi, STRIDE_O_TOKEN, STRIDE_O_HEAD
        )


@gluon.constexpr_function
def _worker_warps(num_wg, fp8):
    """Warps of the worker partitions: the consumers past the first, then an fp8
    cache's converter (two warps), then the load warp."""
    return [4] * (num_wg - 1) + ([_CONVERTER_WARPS.value] if fp8 else []) + [1]


@gluon.constexpr_function
def _worker_registers(num_wg, fp8):
    """Registers a thread of each worker partition (``GLUON_WORKER_REGISTERS``;
    an fp8 cache's converter and the load warp share one warpgroup's count)."""
    consumer, load = GLUON_WORKER_REGISTERS[(num_wg, fp8)]
    return [consumer] * (num_wg - 1) + [load] * (2 if fp8 else 1)


@gluon.jit(do_not_specialize=["seq_start", "num_seqs"])
def hopper_prefill_kernel(
    query_ptr, output_ptr, k_desc, v_desc, k_hi_desc, v_hi_desc, block_table_ptr,
    query_start_loc_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr, sinks_ptr,
    softmax_scale, softcap, sliding_window, block_table_stride, seq_start,
    num_seqs,
    STRIDE_Q_TOKEN: gl.constexpr,
    STRIDE_Q_HEAD: gl.constexpr, STRIDE_O_TOKEN: gl.constexpr,
    STRIDE_O_HEAD: gl.constexpr,
    NUM_KV_HEADS: gl.constexpr, GROUP_SIZE: gl.constexpr, HEAD_SIZE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, ROWS_PER_BLOCK: gl.constexpr,
    ROWS_PER_HEAD: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, USE_WINDOW: gl.constexpr, USE_SOFTCAP: gl.constexpr,
    USE_SINKS: gl.constexpr, FP8_MAX: gl.constexpr, SPLIT_HEAD: gl.constexpr,
    OVERLAP_PV: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    gl.static_assert(STAGES >= 2)
    gl.static_assert(num_warps == 4)
    NUM_WG: gl.constexpr = BLOCK_M // _WG_ROWS  # consumer warpgroups
    gl.static_assert(BLOCK_M == NUM_WG * _WG_ROWS)
    gl.static_assert((NUM_WG == 2) | (NUM_WG == 3))
    FP8: gl.constexpr = k_desc.dtype.is_fp8()
    gl.static_assert(not (SPLIT_HEAD and FP8))  # 16-bit only
    gl.static_assert(not (FP8 and NUM_WG == 3))  # its builds spill
    # The first column part's width: the head size's power of two, or the split
    # head's first part.
    HEAD_PAD: gl.constexpr = k_desc.block_type.shape[1]
    seq, kv_head, q_start, q_len, row0 = _program_rows(
        query_start_loc_ptr, seq_start, num_seqs, NUM_KV_HEADS, BLOCK_M
    )
    if row0 < q_len * GROUP_SIZE:
        seq_len = gl.load(seq_lens_ptr + seq)
        first_tile, num_tiles, _, _ = _key_tiles(
            q_len, seq_len, row0, sliding_window, BLOCK_M, GROUP_SIZE, BLOCK_N,
            USE_WINDOW,
        )  # fmt: skip
        steps = num_tiles - first_tile
        table_row_ptr = block_table_ptr + seq.to(gl.int64) * block_table_stride

        # One ring of each per column part of the head: the padded head, or the
        # split head's two parts (``k_hi_desc``: its second), each part in its
        # own boxes' width and layout.
        if SPLIT_HEAD:
            k_descs = (k_desc, k_hi_desc)
            v_descs = (v_desc, v_hi_desc)
        else:
            k_descs = (k_desc,)
            v_descs = (v_desc,)
        q_smem = _allocate_tiles(k_descs, NUM_WG, _WG_ROWS)
        k_smem = _allocate_tiles(k_descs, STAGES, BLOCK_N)
        v_smem = _allocate_tiles(v_descs, STAGES, BLOCK_N)
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        tail_bar = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
        # An fp8 cache's V slots have one reader, the converter.
        V_READERS: gl.constexpr = 1 if FP8 else NUM_WG
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_WG)
            mbarrier.init(v_empty.index(i), count=V_READERS)
        mbarrier.init(tail_bar.index(0), count=1)
        if FP8:
            # The converter's ring of fp16 V tiles (``_converter``), which the
            # consumers read in place of the TMA ring.
            v16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(
                [BLOCK_N, HEAD_PAD], gl.float16
            )
            v16_smem = gl.allocate_shared_memory(
                gl.float16, [STAGES, BLOCK_N, HEAD_PAD], v16_layout
            )
            v16_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
            v16_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
            for i in gl.static_range(STAGES):
                mbarrier.init(v16_ready.index(i), count=1)
                mbarrier.init(v16_empty.index(i), count=NUM_WG)
            v_read = ((v16_smem,), v16_ready, v16_empty)
            fp8_args = (gl.load(k_scale_ptr), gl.load(v_scale_ptr))
        else:
            v_read = (v_smem, v_bars, v_empty)
            fp8_args = ()
        fence_async_shared()

        if USE_SOFTCAP:  # capped scores are in log2 units (``_softmax_step``)
            scale_log2 = softcap * 0.0 + 1.0
            capping = (softmax_scale / softcap, softcap * LOG2E)
        else:
            scale_log2 = softmax_scale * LOG2E
            capping = ()
        # What every consumer warpgroup takes: the values (one tuple), then the
        # compile-time constants and the warpgroup (its rows from ``64 * WG``).
        consumer = (
            query_ptr, output_ptr, q_smem, k_smem, v_read[0], k_bars, v_read[1],
            k_empty, v_read[2], tail_bar.index(0), q_start, q_len, seq_len, row0,
            kv_head, first_tile, steps, scale_log2, capping, sliding_window,
            fp8_args, sinks_ptr,
        )  # fmt: skip
        producer = (k_descs, v_descs, k_smem, v_smem, k_bars, v_bars, k_empty,
                    v_empty, table_row_ptr, kv_head, first_tile, steps)  # fmt: skip
        # Warpgroup 0 is the default partition; the other consumers, an fp8
        # cache's converter and the load warp are workers, with their registers
        # (setmaxnreg) from the table. Gluon takes the partitions only as a list
        # written in the call, and a compile-time constant only as a value
        # written there (in a variable it is a run-time value): one call per
        # count of consumer warpgroups, and one for an fp8 cache.
        # fmt: off
        if FP8:
            gl.warp_specialize(
                [
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 0)),
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 1)),
                    (_converter, (v_smem[0], v_bars, v_empty, v16_smem, v16_ready,
                                  v16_empty, first_tile, steps, seq_len)),
                    (_producer, (producer, BLOCK_N, BLOCK_SIZE, ROWS_PER_BLOCK,
                                 ROWS_PER_HEAD, STAGES)),
                ],
                _worker_warps(NUM_WG, FP8),
                _worker_registers(NUM_WG, FP8),
            )
        elif NUM_WG == 2:
            gl.warp_specialize(
                [
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 0)),
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 1)),
                    (_producer, (producer, BLOCK_N, BLOCK_SIZE, ROWS_PER_BLOCK,
                                 ROWS_PER_HEAD, STAGES)),
                ],
                _worker_warps(NUM_WG, FP8),
                _worker_registers(NUM_WG, FP8),
            )
        else:
            gl.warp_specialize(
                [
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 0)),
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 1)),
                    (_consumer, (consumer, STRIDE_Q_TOKEN, STRIDE_Q_HEAD,
                                 STRIDE_O_TOKEN, STRIDE_O_HEAD, GROUP_SIZE, HEAD_SIZE,
                                 USE_WINDOW, USE_SOFTCAP, USE_SINKS, FP8_MAX,
                                 SPLIT_HEAD, OVERLAP_PV, 2)),
                    (_producer, (producer, BLOCK_N, BLOCK_SIZE, ROWS_PER_BLOCK,
                                 ROWS_PER_HEAD, STAGES)),
                ],
                _worker_warps(NUM_WG, FP8),
                _worker_registers(NUM_WG, FP8),
            )
        # fmt: on


@functools.cache
def _box_layout(box: tuple[int, int], dtype: torch.dtype):
    """The shared-memory layout of a K/V box (Gluon's default swizzle for its
    shape and dtype), made once per shape: launches run per layer."""
    return gl.NVMMASharedLayout.get_default_for(list(box), _GL_DTYPE[dtype])


def _descriptors(cache: torch.Tensor, boxes: list) -> list:
    """TMA descriptors of ``cache`` (a K or V cache) in ``boxes``, one per column
    part of the head."""
    return [
        cache_descriptor(
            cache, box, TensorDescriptor, layout=_box_layout(box, cache.dtype)
        )
        for box in boxes
    ]


def hopper_launch(plan, inputs: AttentionInputs) -> tuple:
    """``(kernel, grid, keyword arguments)`` of the launch of ``plan``
    (``prefix_prefill.PrefillPlan``, made for this kernel: ``plan.kernel ==
    "gluon"``, which ``hopper_kernel_refusal`` allowed) on ``inputs``. The head
    is one column part of ``head_pad`` columns, or with the config's
    ``split_head`` the two of ``head_split`` (a descriptor pair each)."""
    query, key_cache, output = inputs.query, inputs.key_cache, inputs.output
    config, head_size = plan.config, query.shape[2]
    block_size = key_cache.shape[2]
    split = head_split(head_size) if config.split_head else None
    box_n = min(config.block_n, block_size)
    boxes = [(box_n, columns) for columns in split or (head_pad(head_size),)]
    k_descs = _descriptors(key_cache, boxes)
    v_descs = _descriptors(inputs.value_cache, boxes)
    kwargs = dict(
        query_ptr=query,
        output_ptr=output,
        k_desc=k_descs[0],
        v_desc=v_descs[0],
        # The split head's second part (None: one part).
        k_hi_desc=k_descs[1] if split else None,
        v_hi_desc=v_descs[1] if split else None,
        block_table_ptr=inputs.block_table,
        softmax_scale=float(inputs.softmax_scale),
        softcap=float(inputs.logits_soft_cap or 0.0),
        query_start_loc_ptr=inputs.query_start_loc,
        seq_lens_ptr=inputs.seq_lens,
        k_scale_ptr=inputs.k_scale,  # None for a 16-bit cache
        v_scale_ptr=inputs.v_scale,
        sinks_ptr=inputs.sinks,  # None without sinks
        sliding_window=int(inputs.sliding_window or 0),
        block_table_stride=inputs.block_table.stride(0),
        seq_start=plan.seq_start,
        num_seqs=plan.num_seqs,
        STRIDE_Q_TOKEN=query.stride(0),
        STRIDE_Q_HEAD=query.stride(1),
        STRIDE_O_TOKEN=output.stride(0),
        STRIDE_O_HEAD=output.stride(1),
        NUM_KV_HEADS=plan.layer.num_kv_heads,
        GROUP_SIZE=plan.layer.group,
        HEAD_SIZE=head_size,
        BLOCK_SIZE=block_size,
        ROWS_PER_BLOCK=key_cache.stride(0) // head_size,
        ROWS_PER_HEAD=key_cache.stride(1) // head_size,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        STAGES=config.num_stages,
        USE_WINDOW=bool(inputs.sliding_window),
        USE_SOFTCAP=softcap_enabled(inputs.logits_soft_cap),
        USE_SINKS=inputs.sinks is not None,
        FP8_MAX=fp8_max(key_cache.dtype),
        SPLIT_HEAD=split is not None,
        OVERLAP_PV=config.overlap_pv,
        num_warps=config.num_warps,
    )
    return hopper_prefill_kernel, (plan.programs,), kwargs
