# SPDX-License-Identifier: Apache-2.0
"""Shared ``@triton.jit`` building blocks of the paged-attention kernels.

The prefill kernel (``prefix_prefill.py``) and the decode kernel
(``triton_paged_decode_attention_2d.py``) are built from the same small pieces, so
that both read the cache, transform scores and run the softmax the same way:

1. Page addressing: ``paged_row_offsets`` turns key positions of one sequence into
   int64 element offsets of their rows in the paged cache, going through the
   sequence's block-table row. A tile of ``BLOCK_N`` keys may span several pages
   (``BLOCK_N > BLOCK_SIZE``) or be part of one page (``BLOCK_N <= BLOCK_SIZE``);
   ``load_kv_tile`` then loads the ``[BLOCK_N, HEAD_PAD]`` tile. When ``BLOCK_N``
   divides ``BLOCK_SIZE``, ``page_tile_offset`` reads one page id per tile instead
   (the tile is consecutive rows of one page; the prefill kernel can then also load
   it through a TMA descriptor).
2. fp8: ``query_for_cache`` gives the query in the dtype both dots run in, with the
   score and output scales: with an fp8 cache that is fp16 whatever the query dtype
   (Hopper turns e4m3 into fp16 with one instruction but reaches bf16 only through
   fp16, a second conversion per element), the query pre-scaled by the softmax scale
   before its one rounding. ``to_dot_dtype`` upcasts a cache tile to that dtype (exact
   for every e4m3 value); the per-tensor scales are not applied to tiles: ``k_scale``
   folds into the score scale and ``v_scale`` into the final normalisation
   (``finalize_output``). ``quantize_fp8`` is the inverse used by the cache write.
3. Scores: ``scale_scores_log2`` (softmax scale, optional soft-cap, result in log2
   units so that the softmax uses ``exp2``), ``add_alibi_log2``, ``visibility_mask``
   (causal + sliding window + key validity) and ``scores_and_scale`` which chains
   the three, leaving a plain scale to the softmax step (folded into exp2's
   argument).
4. Online softmax (FlashAttention-2): ``init_softmax_state`` (with optional sinks),
   ``online_softmax_step`` (one KV tile) and ``finalize_output``.

Conventions. Row vectors have length ``BLOCK_M`` (one row = one (query token, query
head) pair), column vectors length ``BLOCK_N`` (one column = one key). Positions are
absolute key positions inside the sequence. Scores handed between helpers are fp32
and in log2 units (natural-log score times log2(e)); masked scores are ``-inf``.
The softmax state ``(m_i, l_i)`` is kept in log2 units as well.

Host side, for the launchers: ``FP8_DTYPES`` (the fp8 cache formats), ``fp8_max``,
and the one input contract of every public entry point (``check_attention_inputs``
for the attention kernels, ``check_kv_cache`` for what the cache write shares with
them). Their errors are ``ValueError``s that name the entry point, say what is wrong
and what to pass instead.

Every helper takes its flags as keyword constexprs; callers pass them by name.
These signatures are shared by several kernels: add helpers or trailing keyword
arguments with defaults, never change existing ones.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# The caches' fp8 formats, for the launchers: e4m3 (NVIDIA's e4m3fn, MI300's
# e4m3fnuz) and e5m2 (--kv-cache-dtype fp8_e5m2). Every one converts to fp16, the
# dtype both products run in with an fp8 cache (e5m2 exactly: it is fp16 cut short).
E4M3_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FP8_DTYPES = (*E4M3_DTYPES, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 cache format (a kernel's ``FP8_MAX``); 0.0 for
    16-bit caches, whose kernels do not read it."""
    return float(torch.finfo(dtype).max) if dtype in FP8_DTYPES else 0.0


# --------------------------------------------------------------------------------------
# The input contract (host side)
# --------------------------------------------------------------------------------------

# Query / output dtypes of the attention kernels.
QUERY_DTYPES = (torch.bfloat16, torch.float16)
# Head sizes: any up to 256 (registers and shared memory of one program). Tiles are
# the next power of two, at least 16 (the tl.dot K dimension, ``head_pad``), the
# columns past the head size masked (zeros in q.k, not stored).
MAX_HEAD_SIZE = 256
# Every head size the kernels take: what the backend declares.
SUPPORTED_HEAD_SIZES = tuple(range(1, MAX_HEAD_SIZE + 1))
# TMA reads rows whose byte length is a multiple of this (the global stride rule of
# a tensor map); other head sizes load K/V through pointers.
TMA_ROW_ALIGN_BYTES = 16


def supported_head_size(head_size: int) -> bool:
    """Whether the kernels take this head size (``SUPPORTED_HEAD_SIZES``)."""
    return head_size in SUPPORTED_HEAD_SIZES


def supported_block_size(block_size: int) -> bool:
    """Whether the kernels take this page size: any power of two (tiles may span
    pages or lie inside one)."""
    return block_size > 0 and block_size & (block_size - 1) == 0


def softcap_enabled(logits_soft_cap: float | None) -> bool:
    """Soft-cap contract: ``None`` or ``0`` means off, ``c > 0`` caps at ``c``."""
    return bool(logits_soft_cap)


def head_pad(head_size: int) -> int:
    """The head dimension of the family's tiles: the head size's power of two, at
    least 16 (a ``tl.dot`` minimum). Plain integer arithmetic: launches call it
    per layer, and ``triton.next_power_of_2`` is a constexpr function whose call
    wrapper costs more than the arithmetic."""
    return max(16, 1 << (head_size - 1).bit_length())


def head_split(head_size: int) -> tuple[int, int] | None:
    """``(lo, hi)``, two powers of two of at least 16 whose sum is the head size
    (96 = 64 + 32, 80 = 64 + 16, 160 = 128 + 32, 192 = 128 + 64), or None when the
    head size is a power of two or no such pair exists (112: padded to 128). Tiles
    of ``lo`` and ``hi`` columns carry the head without padding (a config's
    ``split_head``)."""
    lo = triton.next_power_of_2(head_size) // 2
    hi = head_size - lo
    if lo < 16 or hi < 16 or hi & (hi - 1) or head_size & (head_size - 1) == 0:
        return None
    return lo, hi


def output_layout(output: torch.Tensor) -> dict:
    """Constexprs of the ``[num_tokens, num_q_heads, head_size]`` output every kernel
    of the family writes (attention and merge): its token and head strides, the head
    size and its padding (``head_pad``)."""
    head_size = output.shape[2]
    return {
        "STRIDE_O_TOKEN": output.stride(0),
        "STRIDE_O_HEAD": output.stride(1),
        "HEAD_SIZE": head_size,
        "HEAD_PAD": head_pad(head_size),
    }


def cache_as_rows(cache: torch.Tensor) -> torch.Tensor:
    """A ``[num_blocks, num_kv_heads, block_size, head_size]`` cache view as the
    ``[rows, head_size]`` matrix whose row ``r`` starts at element ``r * head_size``
    of the view (pages and heads are whole rows: their strides are multiples of
    head_size), up to the last slot of the last page: what TMA descriptors of page
    slices read. Row of slot ``i`` of head ``h`` of page ``p``: ``p * stride(0) /
    head_size + h * stride(1) / head_size + i``."""
    num_blocks, num_kv_heads, block_size, head_size = cache.shape
    last = (num_blocks - 1) * cache.stride(0) + (num_kv_heads - 1) * cache.stride(1)
    rows = last // head_size + block_size
    return cache.as_strided((rows, head_size), (head_size, 1))


def cache_descriptor(cache: torch.Tensor, block_shape, descriptor_cls, **kwargs):
    """A TMA descriptor (``descriptor_cls``: Triton's or Gluon's, which also takes
    a shared-memory ``layout`` among ``kwargs``) of one cache view as
    ``cache_as_rows``'s ``[rows, head_size]`` matrix, loaded in ``block_shape``
    boxes. A box wider than the head size (80, 96, 112 in a padded tile) has
    columns outside the matrix, which TMA reads as zeros; a box of some of the
    columns is loaded at its first column."""
    flat = cache_as_rows(cache)
    return descriptor_cls(
        flat,
        shape=list(flat.shape),
        strides=[flat.shape[1], 1],
        block_shape=list(block_shape),
        **kwargs,
    )


@dataclass(frozen=True)
class AttentionInputs:
    """The tensors and features of one attention call, in the family's names:
    what every entry point checks (``check_attention_inputs``) and every launcher
    reads, made once per call and passed whole (layouts and meanings in
    docs/design.md)."""

    query: torch.Tensor  # [num_tokens, num_q_heads, head_size]
    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_size]
    value_cache: torch.Tensor  # as key_cache
    output: torch.Tensor  # as query
    block_table: torch.Tensor  # [num_seqs_total, max_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs_total] int32
    softmax_scale: float
    query_start_loc: torch.Tensor | None = None  # [num_seqs_total + 1] int32
    k_scale: torch.Tensor | None = None  # [1] fp32, fp8 caches
    v_scale: torch.Tensor | None = None
    sliding_window: int | None = None
    alibi_slopes: torch.Tensor | None = None  # [num_q_heads] float
    logits_soft_cap: float | None = None
    sinks: torch.Tensor | None = None  # [num_q_heads] float
    alibi_sqrt: bool = False  # ALiBi on the square root of the distance
    causal: bool = True  # False: a query sees every key of its sequence

    @property
    def features(self) -> dict:
        """The features a launch's plan depends on (window, ALiBi, soft-cap, sinks,
        causality), as ``PrefillLayer.of``'s keyword arguments; the ALiBi form
        (``alibi_sqrt``) changes the kernel's code, not its plan."""
        return {
            "sliding_window": self.sliding_window,
            "alibi_slopes": self.alibi_slopes,
            "logits_soft_cap": self.logits_soft_cap,
            "sinks": self.sinks,
            "causal": self.causal,
        }


def shared_kernel_args(inputs: AttentionInputs, *, seq_start: int) -> dict:
    """The keyword arguments the prefill and the decode kernel both take, in the
    family's names (docs/kernels.md, "One family"): tensors, the runtime scalars,
    the model-fixed strides and shapes as constexprs, and the feature flags. A
    launcher adds its own (tiles, grid-shaped arguments) to these. Scales are
    passed only for an fp8 cache, which ``IS_FP8`` follows."""
    query, key_cache, output = inputs.query, inputs.key_cache, inputs.output
    sliding_window, logits_soft_cap = inputs.sliding_window, inputs.logits_soft_cap
    alibi_slopes, sinks = inputs.alibi_slopes, inputs.sinks
    is_fp8 = key_cache.dtype in FP8_DTYPES
    return dict(
        **output_layout(output),
        query_ptr=query,
        key_cache_ptr=key_cache,
        value_cache_ptr=inputs.value_cache,
        output_ptr=output,
        block_table_ptr=inputs.block_table,
        seq_lens_ptr=inputs.seq_lens,
        k_scale_ptr=inputs.k_scale if is_fp8 else None,
        v_scale_ptr=inputs.v_scale if is_fp8 else None,
        alibi_slopes_ptr=alibi_slopes,
        sinks_ptr=sinks,
        softmax_scale=float(inputs.softmax_scale),
        softcap=float(logits_soft_cap or 0.0),
        sliding_window=int(sliding_window or 0),
        block_table_stride=inputs.block_table.stride(0),
        seq_start=seq_start,
        STRIDE_Q_TOKEN=query.stride(0),
        STRIDE_Q_HEAD=query.stride(1),
        STRIDE_KV_BLOCK=key_cache.stride(0),
        STRIDE_KV_HEAD=key_cache.stride(1),
        GROUP_SIZE=query.shape[1] // key_cache.shape[1],
        BLOCK_SIZE=key_cache.shape[2],
        IS_FP8=is_fp8,
        USE_SOFTCAP=softcap_enabled(logits_soft_cap),
        USE_ALIBI=alibi_slopes is not None,
        ALIBI_SQRT=inputs.alibi_sqrt,
        USE_WINDOW=sliding_window is not None,
        USE_SINKS=sinks is not None,
    )


def check_kv_cache(
    who: str,
    *,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    device: torch.device,
) -> bool:
    """Check the paged caches (shape, dtype, head size, page size, fp8 scales);
    return whether they are fp8. Raises ValueError naming ``who``."""
    if not (key_cache.dim() == 4 and key_cache.shape == value_cache.shape):
        fail(
            who,
            "key_cache and value_cache must both be [num_blocks, num_kv_heads, "
            f"block_size, head_size], got {tuple(key_cache.shape)} and "
            f"{tuple(value_cache.shape)}",
        )
    _, num_kv_heads, block_size, head_size = key_cache.shape
    if key_cache.dtype != value_cache.dtype:
        fail(
            who,
            f"key/value cache dtypes differ: {key_cache.dtype} vs {value_cache.dtype};"
            " pass two views of one kv_cache tensor",
        )
    if not supported_head_size(head_size):
        fail(
            who,
            f"head size {head_size} is not supported; use one up to "
            f"{MAX_HEAD_SIZE} or another attention backend",
        )
    if not supported_block_size(block_size):
        fail(
            who,
            f"block size {block_size} is not supported; use a power of two "
            "(e.g. 16, 32, 64, 128)",
        )
    if num_kv_heads <= 0:
        fail(who, "the caches have no KV head")
    if not (key_cache.stride(3) == 1 and value_cache.stride(3) == 1):
        fail(who, "the caches' head_size dim must be contiguous (stride 1)")
    if not (key_cache.device == device and value_cache.device == device):
        fail(who, f"the caches must be on {device}, like the other tensors")
    is_fp8 = key_cache.dtype in FP8_DTYPES
    if is_fp8:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not (
                scale is not None
                and scale.numel() == 1
                and scale.dtype == torch.float32
                and scale.device == device
            ):
                fail(
                    who,
                    f"an fp8 cache needs {name} as a 1-element float32 tensor on "
                    f"{device} (stored = x / scale)",
                )
    return is_fp8


def check_attention_inputs(who: str, inputs: AttentionInputs) -> bool:
    """The contract shared by the prefill and decode kernels (and so by the dispatch
    ``paged_attention``); return whether the cache is fp8.

    query, output: ``[num_tokens, num_q_heads, head_size]``, one of QUERY_DTYPES,
    same shape and dtype, head dim contiguous. Caches: see ``check_kv_cache``, plus
    the same strides (two views of one tensor) and contiguous pages; a 16-bit cache
    has the query's dtype. block_table: int32 ``[>= num_seqs, max_blocks]`` with
    contiguous rows; seq_lens (and query_start_loc, one longer): contiguous int32.
    softmax_scale > 0. sliding_window: None (off) or > 0. logits_soft_cap: None or
    0 (off), or > 0. alibi_slopes, sinks: None or contiguous float
    ``[num_q_heads]``. Everything on the query's device.
    """
    query, key_cache, value_cache = inputs.query, inputs.key_cache, inputs.value_cache
    output, block_table, seq_lens = inputs.output, inputs.block_table, inputs.seq_lens
    k_scale, v_scale, sinks = inputs.k_scale, inputs.v_scale, inputs.sinks
    query_start_loc, softmax_scale = inputs.query_start_loc, inputs.softmax_scale
    sliding_window, alibi_slopes = inputs.sliding_window, inputs.alibi_slopes
    logits_soft_cap = inputs.logits_soft_cap
    if query.dim() != 3:
        fail(
            who,
            "query must be [num_tokens, num_q_heads, head_size], got shape "
            f"{tuple(query.shape)}",
        )
    _, num_q_heads, head_size = query.shape
    device = query.device
    if query.dtype not in QUERY_DTYPES:
        fail(who, f"query dtype {query.dtype} is not supported; use bf16 or fp16")
    if not (
        output.shape == query.shape
        and output.dtype == query.dtype
        and output.device == device
    ):
        fail(
            who,
            f"output must match query ({tuple(query.shape)} {query.dtype} on "
            f"{device}), got {tuple(output.shape)} {output.dtype} on {output.device}",
        )
    if not (query.stride(2) == 1 and output.stride(2) == 1):
        fail(who, "query and output must be contiguous in head_size (stride 1)")
    is_fp8 = check_kv_cache(
        who,
        key_cache=key_cache,
        value_cache=value_cache,
        k_scale=k_scale,
        v_scale=v_scale,
        device=device,
    )
    _, num_kv_heads, _, cache_head_size = key_cache.shape
    if cache_head_size != head_size:
        fail(who, f"cache head size {cache_head_size} != query head size {head_size}")
    if num_q_heads % num_kv_heads:
        fail(
            who,
            f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads "
            f"{num_kv_heads}",
        )
    if key_cache.stride() != value_cache.stride():
        fail(
            who,
            "key_cache and value_cache must have the same strides (pass kv_cache[:, 0]"
            " and kv_cache[:, 1] of one tensor)",
        )
    if key_cache.stride(2) != head_size:
        fail(who, "each cache page must be a contiguous [block_size, head_size] matrix")
    if not is_fp8 and key_cache.dtype != query.dtype:
        fail(
            who,
            f"cache dtype {key_cache.dtype} must equal the query dtype {query.dtype} "
            "or be fp8 (float8_e4m3fn / float8_e4m3fnuz / float8_e5m2) with k_scale "
            "and v_scale",
        )
    num_seqs_total = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    index_tensors = [("seq_lens", seq_lens, num_seqs_total)]
    if query_start_loc is not None:
        index_tensors.append(("query_start_loc", query_start_loc, num_seqs_total + 1))
    for name, tensor, rows in index_tensors:
        if not (
            tensor.dtype == torch.int32
            and tensor.shape == (rows,)
            and tensor.is_contiguous()
            and tensor.device == device
        ):
            fail(
                who,
                f"{name} must be a contiguous 1D int32 tensor on {device} (one entry "
                f"per sequence{', plus one' if name == 'query_start_loc' else ''}), "
                f"got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}",
            )
    if not (
        block_table.dtype == torch.int32
        and block_table.dim() == 2
        and block_table.shape[0] >= num_seqs_total
        and block_table.stride(1) == 1
        and block_table.device == device
    ):
        fail(
            who,
            "block_table must be int32 [num_seqs, max_blocks_per_seq] with contiguous "
            f"rows on {device}, got {tuple(block_table.shape)} {block_table.dtype} on "
            f"{block_table.device}",
        )
    if not softmax_scale > 0:  # the softmax takes row maxima before scaling
        fail(who, f"softmax_scale must be > 0, got {softmax_scale}")
    if not (sliding_window is None or sliding_window > 0):
        fail(who, f"sliding_window must be None (off) or > 0, got {sliding_window}")
    if not (logits_soft_cap is None or logits_soft_cap >= 0):
        fail(
            who,
            f"logits_soft_cap must be None or 0 (off) or > 0, got {logits_soft_cap}",
        )
    if inputs.alibi_sqrt and alibi_slopes is None:
        fail(who, "alibi_sqrt needs alibi_slopes (it changes the ALiBi bias)")
    if not inputs.causal and alibi_slopes is not None:
        fail(
            who,
            "non-causal attention takes no ALiBi here (its bias is defined by the "
            "distance to a causal query); pass causal=True, or use stock vLLM's "
            "Triton backend",
        )
    for name, tensor in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if tensor is not None and not (
            tensor.shape == (num_q_heads,)
            and tensor.is_floating_point()
            and tensor.is_contiguous()
            and tensor.device == device
        ):
            fail(
                who,
                f"{name} must be None or a contiguous float tensor of shape "
                f"({num_q_heads},) on {device}, got {tuple(tensor.shape)} "
                f"{tensor.dtype} on {tensor.device}",
            )
    return is_fp8


def fail(who: str, message: str):
    """The family's input error: ``who`` (the entry point), what is wrong and what
    to pass instead."""
    raise ValueError(f"{who}: {message}.")


# log2(e): scores are multiplied by it once so that exp(x) == exp2(x * LOG2E).
LOG2E = tl.constexpr(1.4426950408889634)


# --------------------------------------------------------------------------------------
# Page addressing
# --------------------------------------------------------------------------------------


@triton.jit
def paged_row_offsets(
    block_table_row_ptr,  # [max_blocks_per_seq] int32: page ids of one sequence
    key_pos,  # [BLOCK_N] int: absolute key positions in the sequence
    key_valid,  # [BLOCK_N] bool: False for positions past the sequence end
    stride_block,  # elements between pages of the cache
    stride_slot,  # elements between two key rows of one page
    BLOCK_SIZE: tl.constexpr,  # keys per page (power of two)
    MASK_KEYS: tl.constexpr,  # False when every key_pos is known to be valid
):
    """int64 offsets ``[BLOCK_N]`` of the key rows ``key_pos`` in the cache.

    Row ``i`` starts at ``page(key_pos[i]) * stride_block + (key_pos[i] % BLOCK_SIZE)
    * stride_slot`` elements from the head's base pointer. The page id is read per
    key, so a tile may span any number of pages. Offsets are int64 because
    ``num_blocks * stride_block`` can pass 2**31. Invalid keys get offset 0 (the
    block table is not read for them); mask their loads.
    """
    page_idx = key_pos // BLOCK_SIZE
    if MASK_KEYS:
        page = tl.load(block_table_row_ptr + page_idx, mask=key_valid, other=0)
    else:
        page = tl.load(block_table_row_ptr + page_idx)
    slot = (key_pos % BLOCK_SIZE).to(tl.int64)
    return page.to(tl.int64) * stride_block + slot * stride_slot


@triton.jit
def page_tile_offset(
    block_table_row_ptr,  # [max_blocks_per_seq] int32: page ids of one sequence
    tile_start,  # first key of the tile, a multiple of the tile size
    stride_block,  # elements between pages of the cache
    stride_slot,  # elements between two key rows of one page
    BLOCK_SIZE: tl.constexpr,  # keys per page (power of two)
):
    """int64 offset of the first row of a tile that lies inside one page.

    When the tile size divides ``BLOCK_SIZE`` and ``tile_start`` is a multiple of
    it, every key of the tile is on the page of ``tile_start``: one block-table read
    per tile instead of one per key (``paged_row_offsets``), and the tile is
    consecutive rows of that page, ``offset + i * stride_slot``. The page of
    ``tile_start`` must exist (``tile_start < kv_len``); rows past the sequence end
    are still inside the page (mask their values as usual).
    """
    page = tl.load(block_table_row_ptr + tile_start // BLOCK_SIZE).to(tl.int64)
    # The slot part is below BLOCK_SIZE * stride_slot: no int64 needed there.
    return page * stride_block + (tile_start % BLOCK_SIZE) * stride_slot


@triton.jit
def load_kv_tile(
    head_ptr,  # cache pointer already offset to one KV head (block 0)
    row_offsets,  # [BLOCK_N] int64 from paged_row_offsets
    key_valid,  # [BLOCK_N] bool
    HEAD_SIZE: tl.constexpr,  # real head size
    HEAD_PAD: tl.constexpr,  # next power of two >= HEAD_SIZE
    MASK_KEYS: tl.constexpr,  # False when every key is valid
):
    """Load a ``[BLOCK_N, HEAD_PAD]`` K or V tile in the cache dtype.

    The last dim of a page is contiguous (stride 1). Padded head dims and invalid
    keys read as 0, so they add nothing to q.k or p.v.
    """
    dims = tl.arange(0, HEAD_PAD)
    ptrs = head_ptr + row_offsets[:, None] + dims[None, :]
    if HEAD_PAD != HEAD_SIZE:
        dim_ok = dims < HEAD_SIZE
        if MASK_KEYS:
            tile = tl.load(ptrs, mask=key_valid[:, None] & dim_ok[None, :], other=0.0)
        else:
            tile = tl.load(ptrs, mask=dim_ok[None, :], other=0.0)
    else:
        if MASK_KEYS:
            tile = tl.load(ptrs, mask=key_valid[:, None], other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


# --------------------------------------------------------------------------------------
# fp8
# --------------------------------------------------------------------------------------


@triton.jit
def query_for_cache(q, softmax_scale, k_scale_ptr, v_scale_ptr, IS_FP8: tl.constexpr):
    """``(q, qk_scale, v_scale)``: the query tile in the dtype of both dots, the scale
    of its raw dot products, and the output scale.

    16-bit cache: the query as loaded, ``softmax_scale``, 1. fp8 cache: fp16 (see the
    module docstring), ``q * softmax_scale`` rounded once, so it overflows only past
    ``|q| > 65504 * sqrt(head_size)`` (scale ``1/sqrt(head_size)``), far outside what an
    attention layer produces; then ``k_scale`` and ``v_scale``. fp16 also holds the
    probabilities in [0, 1] with more mantissa than bf16.
    """
    qk_scale = softmax_scale
    v_scale = 1.0
    if IS_FP8:
        q = (q.to(tl.float32) * softmax_scale).to(tl.float16)
        qk_scale = tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    return q, qk_scale, v_scale


@triton.jit
def to_dot_dtype(tile, DOT_DTYPE: tl.constexpr):
    """Upcast a cache tile (bf16/fp16/fp8) to the 16-bit dtype of the query.

    Every e4m3 value is exactly representable in bf16 and fp16, so this is exact;
    the fp8 scale is applied outside (score scale for K, output for V).
    """
    return tile.to(DOT_DTYPE)


@triton.jit
def e4m3_to_fp16_at_load(tile):
    """``tile.to(tl.float16)`` for an e4m3fn tile on NVIDIA, as inline PTX
    (``cvt.rn.f16x2.e4m3x2``, exact), converted where the tile was loaded.

    Triton moves a plain ``.to`` after the layout change to the dot operand, which
    for a byte-wide tile means byte-wide shared-memory loads; an impure inline asm
    it cannot move, so the fp16 tile takes ``ldmatrix`` like a 16-bit cache's. NVIDIA
    only (no interpreter, no ROCm): the launcher enables it only there.
    """
    return tl.inline_asm_elementwise(
        asm="{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
        "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        constraints="=r,=r,r",
        args=[tile],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


@triton.jit
def quantize_fp8(x, scale, FP8_MAX: tl.constexpr, FP8_DTYPE: tl.constexpr):
    """fp8 value stored for ``x``: ``clamp(x / scale, -FP8_MAX, FP8_MAX)`` cast to
    ``FP8_DTYPE`` (round to nearest even on GPUs)."""
    # div_rn: correctly rounded, like torch (plain "/" is approximate on NVIDIA).
    y = tl.math.div_rn(x.to(tl.float32), scale)
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    return y.to(FP8_DTYPE)


# --------------------------------------------------------------------------------------
# Score transforms
# --------------------------------------------------------------------------------------


@triton.jit
def scale_scores_log2(
    qk,  # [BLOCK_M, BLOCK_N] fp32: raw q.k
    qk_scale,  # fp32 scalar: softmax_scale * k_scale
    softcap,  # fp32 scalar, used only if USE_SOFTCAP
    USE_SOFTCAP: tl.constexpr,
):
    """Scaled scores in log2 units: ``qk * qk_scale * log2(e)``; with a soft-cap c,
    ``c * tanh(qk * qk_scale / c) * log2(e)``.

    tanh is written with exp2 (``1 - 2 / (exp(2x) + 1)``), which is exact enough
    in fp32, saturates correctly at +-1 and needs no libdevice (runs on AMD and in
    the interpreter).
    """
    if USE_SOFTCAP:
        x = qk * (qk_scale / softcap)
        tanh_x = 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * LOG2E)) + 1.0)
        scores = tanh_x * (softcap * LOG2E)
    else:
        scores = qk * (qk_scale * LOG2E)
    return scores


@triton.jit
def add_alibi_log2(
    scores,  # [BLOCK_M, BLOCK_N] fp32, log2 units
    alibi_slope,  # [BLOCK_M] fp32: slope of each row's query head (natural units)
    q_pos,  # [BLOCK_M] int: absolute query positions
    k_pos,  # [BLOCK_N] int: absolute key positions
    SQRT: tl.constexpr,  # ALiBi-sqrt
):
    """ALiBi bias ``slope * (k_pos - q_pos)``, or with ``SQRT``
    ``-slope * sqrt(q_pos - k_pos)`` (0 for keys after the query, which the causal
    mask hides), added in log2 units."""
    dist = (k_pos[None, :] - q_pos[:, None]).to(tl.float32)
    if SQRT:
        dist = -tl.sqrt(tl.maximum(-dist, 0.0))
    return scores + (alibi_slope * LOG2E)[:, None] * dist


@triton.jit
def visibility_mask(
    q_pos,  # [BLOCK_M] int: absolute query positions
    k_pos,  # [BLOCK_N] int: absolute key positions
    kv_len,  # int scalar: keys at positions >= kv_len do not exist
    sliding_window,  # int scalar, used only if USE_WINDOW
    USE_WINDOW: tl.constexpr,
):
    """``[BLOCK_M, BLOCK_N]`` bool: key ``j`` is visible to query at ``pos`` iff
    ``j < kv_len``, ``j <= pos`` and (with a window W) ``pos - j < W``."""
    visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < kv_len)
    if USE_WINDOW:
        visible = visible & (q_pos[:, None] - k_pos[None, :] < sliding_window)
    return visible


@triton.jit
def scores_and_scale(
    qk,  # [BLOCK_M, BLOCK_N] fp32: raw q.k
    q_pos,  # [BLOCK_M] int
    k_pos,  # [BLOCK_N] int
    kv_len,  # int scalar
    qk_scale,  # fp32 scalar, > 0: softmax_scale * k_scale
    softcap,  # fp32 scalar (USE_SOFTCAP)
    alibi_slope,  # [BLOCK_M] fp32 (USE_ALIBI)
    sliding_window,  # int scalar (USE_WINDOW)
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    APPLY_MASK: tl.constexpr,  # False for tiles known to be fully visible
    USE_WINDOW: tl.constexpr,
    ALIBI_SQRT: tl.constexpr = False,  # with USE_ALIBI: ALiBi-sqrt
):
    """Raw q.k -> ``(scores, score_scale)``: ``scores * score_scale`` are the scores
    in log2 units, transformed in the order of the contract (scale, soft-cap, ALiBi,
    then the causal/window/length mask, masked = -inf).

    When the scale is the only transform (no soft-cap, no ALiBi), ``scores`` is the
    masked raw q.k and ``score_scale`` is ``qk_scale * log2(e)``: the softmax step
    takes the row max of the raw scores (a positive scale does not change which one
    is largest) and folds the scale into exp2's argument, one FMA per score where a
    multiply and a subtraction were. Otherwise the scores are transformed here and
    ``score_scale`` is 1.
    """
    if USE_SOFTCAP or USE_ALIBI:
        scores = scale_scores_log2(qk, qk_scale, softcap, USE_SOFTCAP=USE_SOFTCAP)
        if USE_ALIBI:
            scores = add_alibi_log2(scores, alibi_slope, q_pos, k_pos, SQRT=ALIBI_SQRT)
        score_scale = 1.0
    else:
        scores = qk
        score_scale = qk_scale * LOG2E
    if APPLY_MASK:
        visible = visibility_mask(
            q_pos, k_pos, kv_len, sliding_window, USE_WINDOW=USE_WINDOW
        )
        scores = tl.where(visible, scores, float("-inf"))
    return scores, score_scale


# --------------------------------------------------------------------------------------
# Online softmax
# --------------------------------------------------------------------------------------


@triton.jit
def init_softmax_state(
    sink,  # [BLOCK_M] fp32: sink logit of each row's head (natural units), if USE_SINKS
    BLOCK_M: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    """Initial running max ``m_i`` and denominator ``l_i`` (both ``[BLOCK_M]`` fp32,
    log2 units). A sink is a logit with no value: it starts the state at
    ``m = sink * log2(e)``, ``l = 1``. Without sinks ``m = -inf``, ``l = 0``."""
    if USE_SINKS:
        m_i = sink.to(tl.float32) * LOG2E
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    return m_i, l_i


@triton.jit
def softmax_rescale(
    m_i,  # [BLOCK_M] fp32: running max (log2 units), may be -inf
    l_i,  # [BLOCK_M] fp32: running denominator
    scores,  # [BLOCK_M, BLOCK_N] fp32: log2 units once times score_scale; -inf masked
    score_scale=1.0,  # fp32 > 0 (see scores_and_scale)
):
    """One online-softmax update without the value product.

    Returns ``(p, alpha, m_new, l_new)``: ``p = exp2(scores * score_scale - m_new)``
    in fp32 (one FMA per score), the factor ``alpha`` that rescales the old
    accumulator, the new max and denominator. Rows with no visible key so far (max
    still -inf) use 0 as the reference, giving ``p = 0`` and ``alpha = 0`` instead of
    NaN from ``-inf - -inf``.
    """
    m_new = tl.maximum(m_i, tl.max(scores, 1) * score_scale)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(scores * score_scale - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_new = l_i * alpha + tl.sum(p.to(tl.float32), 1)
    return p, alpha, m_new, l_new


@triton.jit
def online_softmax_step(
    acc,  # [BLOCK_M, HEAD_PAD] fp32: unnormalised output
    m_i,  # [BLOCK_M] fp32
    l_i,  # [BLOCK_M] fp32
    scores,  # [BLOCK_M, BLOCK_N] fp32, log2 units once times score_scale; -inf masked
    v,  # [BLOCK_N, HEAD_PAD] in the dot dtype (bf16/fp16)
    score_scale=1.0,  # fp32 > 0 (see scores_and_scale)
):
    """FlashAttention-2 step over one KV tile: rescale ``acc`` and add ``p @ v``
    (``tl.dot``, fp32 accumulation). Returns ``(acc, m_i, l_i)``."""
    p, alpha, m_i, l_i = softmax_rescale(m_i, l_i, scores, score_scale)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_i, l_i


@triton.jit
def finalize_output(
    acc,  # [BLOCK_M, HEAD_PAD] fp32
    l_i,  # [BLOCK_M] fp32
    v_scale,  # fp32 scalar (1.0 for 16-bit caches)
):
    """Normalised output ``acc * v_scale / l_i`` (fp32). Rows that saw no key and no
    sink (``l_i == 0``, only padding rows) give 0 rather than NaN."""
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    return acc * (v_scale / l_safe)[:, None]


@triton.jit
def split_log_sum_exp(
    m_i,  # [BLOCK_M] fp32: running max (log2 units), -inf if no key was seen
    l_i,  # [BLOCK_M] fp32: denominator relative to m_i
):
    """Log-sum-exp (base 2) of the scores one KV split saw, from its softmax state;
    -inf for rows whose split saw no key (their partial output is 0)."""
    seen = l_i > 0.0
    return tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))


# seq_start, num_seqs and num_splits change from launch to launch: one compiled
# variant serves them all.
@triton.jit(do_not_specialize=["seq_start", "num_seqs", "num_splits"])
def merge_splits_kernel(
    output_ptr,  # [num_tokens, num_q_heads, HEAD_SIZE]
    workspace_ptr,  # [rows, num_q_heads, num_splits, HEAD_SIZE + 1] fp32
    sinks_ptr,  # [num_q_heads] fp32 (USE_SINKS)
    query_start_loc_ptr,  # [num_seqs_total + 1] int32 (VARLEN)
    seq_start,  # first sequence of the launch
    num_seqs,  # sequences of the launch
    num_splits,  # KV splits the workspace holds per (token, query head)
    STRIDE_O_TOKEN: tl.constexpr,
    STRIDE_O_HEAD: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # power of two >= num_splits
    USE_SINKS: tl.constexpr,
    VARLEN: tl.constexpr,  # tokens from query_start_loc; else one per sequence
):
    """Merge the KV splits of one (token, query head) into the output:
    ``out = sum_s 2^(lse_s - M) o_s / (sum_s 2^(lse_s - M) [+ 2^(sink - M)])``.

    Program ``(row, q_head)``; workspace row ``row`` is the launch's ``row``-th
    token: token ``seq_start + row`` (one token per sequence: decode), or
    ``query_start_loc[seq_start] + row`` with ``VARLEN`` (prefill). Rows past the
    launch's last token exit (a prefill grid is sized by an upper bound)."""
    row = tl.program_id(0)
    q_head = tl.program_id(1)
    if VARLEN:
        first = tl.load(query_start_loc_ptr + seq_start)
        end = tl.load(query_start_loc_ptr + seq_start + num_seqs)
    else:
        first = seq_start
        end = seq_start + num_seqs
    token = first + row
    if token >= end:
        return
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    split_valid = offs_s < num_splits
    d_valid = offs_d < HEAD_SIZE

    ws_rows = ((row.to(tl.int64) * NUM_Q_HEADS + q_head) * num_splits + offs_s) * (
        HEAD_SIZE + 1
    )  # [SPLITS_PAD]
    lse = tl.load(workspace_ptr + ws_rows + HEAD_SIZE, mask=split_valid, other=0.0)
    lse = tl.where(split_valid, lse, float("-inf"))
    m = tl.max(lse, axis=0)
    if USE_SINKS:
        sink = tl.load(sinks_ptr + q_head).to(tl.float32) * LOG2E
        m = tl.maximum(m, sink)
    # m == -inf: no split saw a key and there is no sink: the output is 0.
    m_safe = tl.where(m > float("-inf"), m, 0.0)
    weights = tl.exp2(lse - m_safe)  # [SPLITS_PAD], 0 for empty splits
    denom = tl.sum(weights, axis=0)
    if USE_SINKS:
        denom += tl.exp2(sink - m_safe)
    partial = tl.load(
        workspace_ptr + ws_rows[:, None] + offs_d[None, :],
        mask=(split_valid & (weights > 0.0))[:, None] & d_valid[None, :],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_PAD]
    out = tl.sum(partial * weights[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    o_offset = token.to(tl.int64) * STRIDE_O_TOKEN + q_head * STRIDE_O_HEAD
    tl.store(
        output_ptr + o_offset + offs_d,
        out.to(output_ptr.dtype.element_ty),
        mask=d_valid,
    )


def merge_launch(
    split_launch: dict,
    *,
    num_seqs: int,
    num_splits: int,
    rows: int,
    splits_pad: int,
) -> tuple:
    """``(kernel, grid, keyword arguments)`` of the merge that follows a split
    launch, from that launch's keyword arguments (``split_launch``): the merge
    reads the workspace it wrote and writes its output, with its sinks and first
    sequence, and with its ``query_start_loc_ptr`` where it has one (prefill; a
    decode row is a sequence). The grid is ``rows`` workspace rows (the launch's
    tokens, or an upper bound for prefill) times the query heads."""
    output = split_launch["output_ptr"]
    kwargs = {
        name: split_launch.get(name)
        for name in ("output_ptr", "workspace_ptr", "sinks_ptr", "seq_start")
    }
    kwargs["query_start_loc_ptr"] = split_launch.get("query_start_loc_ptr")
    kwargs.update(
        output_layout(output),
        num_seqs=num_seqs,
        num_splits=num_splits,
        NUM_Q_HEADS=output.shape[1],
        SPLITS_PAD=splits_pad,
        USE_SINKS=kwargs["sinks_ptr"] is not None,
        VARLEN=kwargs["query_start_loc_ptr"] is not None,
        num_warps=4,
    )
    grid = (rows, output.shape[1])  # program (workspace row, query head)
    return merge_splits_kernel, grid, kwargs
