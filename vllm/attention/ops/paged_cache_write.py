# SPDX-License-Identifier: Apache-2.0
"""Write the new tokens' keys and values into the paged KV cache.

Token ``t`` goes to slot ``slot_mapping[t] = block * block_size + offset``: row
``offset`` of page ``block`` of every KV head (cache layout in docs/design.md,
``[num_blocks, num_kv_heads, block_size, head_size]`` per K and V). A negative slot
marks a padding token (e.g. CUDA-graph padding) and is skipped.

One program per (token, tile of KV heads) moves a ``[HEADS_PER_PROGRAM, HEAD_PAD]``
tile of K and the same of V; the 16-bit paths are pure copies. For an fp8 cache the
stored value is ``clamp(x / scale, -max, max)`` cast to the cache dtype (e4m3fn on
CUDA, e4m3fnuz on ROCm, or e5m2), with per-tensor fp32 scales read on the device (no
host sync). Cache offsets are int64 (``num_blocks * block stride`` can pass 2**31).

Strides are runtime arguments here, unlike the attention kernels' constexpr
``STRIDE_*``: the key/value inputs reach this copy in several layouts (views of the
fused QKV projection, contiguous tensors after a norm or rotary embedding), each of
which would be one more compiled variant, and a copy has no address arithmetic
worth folding. The input contract (head size, page size, fp8 scales) is the attention
kernels' (``triton_attention_common.check_kv_cache``).
"""

import torch
import triton
import triton.language as tl

from vllm.attention.ops.triton_attention_common import (
    FP8_DTYPES,
    check_kv_cache,
    fail,
    fp8_max,
    quantize_fp8,
)
from vllm.attention.ops.triton_attention_common import (
    head_pad as head_pad_of,
)

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Elements a program moves per tensor (keeps registers per thread small).
_MAX_TILE_ELEMENTS = 4096


@triton.jit
def _store_token_tile(
    src_ptr,  # [num_tokens, num_kv_heads, head_size], at this token
    cache_ptr,  # [num_blocks, num_kv_heads, block_size, head_size], at the slot
    scale_ptr,  # [1] fp32 (IS_FP8)
    heads,  # [HEADS_PER_PROGRAM] int: KV heads of this program
    dims,  # [HEAD_PAD] int
    mask,  # [HEADS_PER_PROGRAM, HEAD_PAD] bool
    stride_src_head,
    stride_cache_head,
    FP8_MAX: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    """Copy (or quantise) one token's heads into its cache slot."""
    x = tl.load(src_ptr + heads[:, None] * stride_src_head + dims[None, :], mask=mask)
    if IS_FP8:
        x = quantize_fp8(
            x, tl.load(scale_ptr), FP8_MAX=FP8_MAX, FP8_DTYPE=cache_ptr.dtype.element_ty
        )
    else:
        x = x.to(cache_ptr.dtype.element_ty)
    offsets = heads[:, None].to(tl.int64) * stride_cache_head + dims[None, :]
    tl.store(cache_ptr + offsets, x, mask=mask)


@triton.jit
def _paged_cache_write_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_size]
    value_ptr,  # [num_tokens, num_kv_heads, head_size]
    key_cache_ptr,  # [num_blocks, num_kv_heads, block_size, head_size]
    value_cache_ptr,  # [num_blocks, num_kv_heads, block_size, head_size]
    slot_mapping_ptr,  # [num_tokens] int64 (or int32)
    k_scale_ptr,  # [1] fp32 (IS_FP8)
    v_scale_ptr,  # [1] fp32 (IS_FP8)
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_kc_block,
    stride_kc_head,
    stride_kc_slot,
    stride_vc_block,
    stride_vc_head,
    stride_vc_slot,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,  # power of two
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,  # next power of two >= HEAD_SIZE
    BLOCK_SIZE: tl.constexpr,
    FP8_MAX: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    heads = tl.program_id(1) * HEADS_PER_PROGRAM + tl.arange(0, HEADS_PER_PROGRAM)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_SIZE)

    _store_token_tile(
        key_ptr + token * stride_key_token,
        key_cache_ptr + block * stride_kc_block + offset * stride_kc_slot,
        k_scale_ptr,
        heads,
        dims,
        mask,
        stride_key_head,
        stride_kc_head,
        FP8_MAX=FP8_MAX,
        IS_FP8=IS_FP8,
    )
    _store_token_tile(
        value_ptr + token * stride_value_token,
        value_cache_ptr + block * stride_vc_block + offset * stride_vc_slot,
        v_scale_ptr,
        heads,
        dims,
        mask,
        stride_value_head,
        stride_vc_head,
        FP8_MAX=FP8_MAX,
        IS_FP8=IS_FP8,
    )


def _launches(
    *, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale
) -> list[tuple]:
    """``(kernel, grid, keyword arguments)`` of each launch of one cache write (one
    launch); no checks. Separate from the launch so the offline compile check
    builds exactly what a launch would."""
    num_tokens = slot_mapping.shape[0]
    _, num_kv_heads, block_size, head_size = key_cache.shape
    is_fp8 = key_cache.dtype in FP8_DTYPES
    head_pad = head_pad_of(head_size)
    heads_per_program = min(
        triton.next_power_of_2(num_kv_heads), max(1, _MAX_TILE_ELEMENTS // head_pad)
    )
    grid = (num_tokens, triton.cdiv(num_kv_heads, heads_per_program))
    kwargs = {
        "key_ptr": key,
        "value_ptr": value,
        "key_cache_ptr": key_cache,
        "value_cache_ptr": value_cache,
        "slot_mapping_ptr": slot_mapping,
        "k_scale_ptr": k_scale if is_fp8 else None,
        "v_scale_ptr": v_scale if is_fp8 else None,
        "stride_key_token": key.stride(0),
        "stride_key_head": key.stride(1),
        "stride_value_token": value.stride(0),
        "stride_value_head": value.stride(1),
        "stride_kc_block": key_cache.stride(0),
        "stride_kc_head": key_cache.stride(1),
        "stride_kc_slot": key_cache.stride(2),
        "stride_vc_block": value_cache.stride(0),
        "stride_vc_head": value_cache.stride(1),
        "stride_vc_slot": value_cache.stride(2),
        "NUM_KV_HEADS": num_kv_heads,
        "HEADS_PER_PROGRAM": heads_per_program,
        "HEAD_SIZE": head_size,
        "HEAD_PAD": head_pad,
        "BLOCK_SIZE": block_size,
        "FP8_MAX": fp8_max(key_cache.dtype),
        "IS_FP8": is_fp8,
        "num_warps": 4,
    }
    return [(_paged_cache_write_kernel, grid, kwargs)]


def write_to_paged_cache(
    *,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store ``key``/``value`` rows into their cache slots.

    Args:
        key: [num_tokens, num_kv_heads, head_size] bf16/fp16/fp32, last dim
            contiguous. Rows past ``slot_mapping``'s length are ignored (vLLM pads
            the token dim).
        value: as ``key``.
        key_cache: [num_blocks, num_kv_heads, block_size, head_size], last dim
            contiguous; bf16/fp16 (same as ``key``) or fp8 e4m3fn/e4m3fnuz/e5m2.
        value_cache: as ``key_cache``.
        slot_mapping: [num_tokens] int64 (int32 accepted); negative = skip.
        k_scale: 1-element fp32 tensor, required for an fp8 cache
            (stored = clamp(x / scale)).
        v_scale: as ``k_scale``.

    """
    if not (key.dim() == 3 and value.shape == key.shape):
        fail(
            "write_to_paged_cache",
            f"key and value must be [num_tokens, num_kv_heads, head_size], got "
            f"{tuple(key.shape)} and {tuple(value.shape)}",
        )
    is_fp8 = check_kv_cache(
        "write_to_paged_cache",
        key_cache=key_cache,
        value_cache=value_cache,
        k_scale=k_scale,
        v_scale=v_scale,
        device=key.device,
    )
    _, num_kv_heads, _, head_size = key_cache.shape
    if key.shape[1:] != (num_kv_heads, head_size):
        fail(
            "write_to_paged_cache",
            f"key heads/head size {tuple(key.shape[1:])} do not match the cache "
            f"({num_kv_heads}, {head_size})",
        )
    if not (key.dtype in _INPUT_DTYPES and value.dtype == key.dtype):
        fail(
            "write_to_paged_cache",
            f"key/value dtype must be one of {_INPUT_DTYPES} and equal, got "
            f"{key.dtype} and {value.dtype}",
        )
    if not is_fp8 and key_cache.dtype != key.dtype:
        fail(
            "write_to_paged_cache",
            f"cache dtype {key_cache.dtype} must equal the key dtype {key.dtype} "
            f"(or be fp8 e4m3fn/e4m3fnuz/e5m2 with scales)",
        )
    if not (key.stride(2) == 1 and value.stride(2) == 1):
        fail("write_to_paged_cache", "the head dim of key and value must be contiguous")
    if not (
        slot_mapping.dim() == 1
        and slot_mapping.dtype in (torch.int64, torch.int32)
        and slot_mapping.shape[0] <= key.shape[0]
    ):
        fail(
            "write_to_paged_cache",
            f"slot_mapping must be 1D int64 with at most {key.shape[0]} entries, got "
            f"{tuple(slot_mapping.shape)} {slot_mapping.dtype}",
        )
    if any(t.device != key.device for t in (value, slot_mapping)):
        fail("write_to_paged_cache", "all tensors must be on one device")
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    launches = _launches(
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    for kernel, grid, kwargs in launches:
        kernel[grid](**kwargs)
