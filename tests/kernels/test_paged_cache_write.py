# SPDX-License-Identifier: Apache-2.0
"""write_to_paged_cache against a torch scatter into the same layout.

16-bit caches must be exact copies. fp8 runs two kinds of input: values whose
quotient x / scale is already an e4m3 value (no rounding involved: addressing, the
scale and the clamp must be bit-exact), and random values (rounding; on a GPU the
hardware's). Triton 3.6's own interpreter cast fp32 -> fp8 is wrong (it loses the
carry into the exponent); interpreter_compat routes it through torch on the CPU.
"""

import pytest
import torch

from tests.kernels.conftest import (
    DEVICE,
    assert_close,
    fp8_skip_reason,
)
from vllm.attention.ops.paged_cache_write import write_to_paged_cache

# (num_kv_heads, head_size, block_size): 1 head; 3 heads (not a power of two:
# masked head tile) with a padded head size; odd head sizes (24, 100) whose rows
# are not 16-byte multiples in fp8 or bf16; 8 heads of the common size; 256.
SHAPES = [(1, 64, 16), (3, 80, 32), (2, 24, 16), (3, 100, 64), (8, 128, 64),
          (2, 256, 128)]  # fmt: skip
SENTINEL = -3.0


def _slot_mapping(num_tokens, num_blocks, block_size, gen):
    """Distinct random slots over all pages, every 4th token padding (-1)."""
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1
    return slots.to(torch.int64)


def _expected(cache_dtype, shape, src, slots, scale=None):
    """Torch scatter of ``src`` [T, H, D] into a sentinel-filled cache."""
    block_size = shape[2]
    cache = torch.full(shape, SENTINEL, dtype=torch.float32)
    valid = slots >= 0
    value = src[valid].float()
    if scale is not None:
        fp8_max = torch.finfo(cache_dtype).max
        value = (value / scale).clamp(-fp8_max, fp8_max)
    slot = slots[valid]
    cache[slot // block_size, :, slot % block_size] = value
    return cache.to(cache_dtype)


@pytest.mark.parametrize("num_kv_heads, head_size, block_size", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_copy_16bit(dtype, num_kv_heads, head_size, block_size):
    gen = torch.Generator().manual_seed(0)
    num_blocks, num_tokens = 5, 11
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    key = torch.randn((num_tokens, num_kv_heads, head_size), generator=gen).to(dtype)
    value = torch.randn((num_tokens, num_kv_heads, head_size), generator=gen).to(dtype)
    slots = _slot_mapping(num_tokens, num_blocks, block_size, gen)
    # The real layout: two views of one [num_blocks, 2, H, bs, D] tensor.
    kv_cache = torch.full(
        (num_blocks, 2) + shape[1:], SENTINEL, dtype=dtype, device=DEVICE
    )
    write_to_paged_cache(
        key=key.to(DEVICE),
        value=value.to(DEVICE),
        key_cache=kv_cache[:, 0],
        value_cache=kv_cache[:, 1],
        slot_mapping=slots.to(DEVICE),
    )
    assert torch.equal(kv_cache[:, 0].cpu(), _expected(dtype, shape, key, slots))
    assert torch.equal(kv_cache[:, 1].cpu(), _expected(dtype, shape, value, slots))


def _fp8_inputs(cache_dtype, shape, scale, gen, on_grid):
    if on_grid:
        # x / scale is an exact value of the cache format (scale a power of two), plus
        # values far beyond the range to exercise the clamp.
        codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
        grid = codes.view(cache_dtype).float()
        grid = torch.where(torch.isnan(grid), 0.0, grid)
        x = grid * scale
        x.view(-1)[::7] = 1e4 * scale
        x.view(-1)[3::7] = -1e4 * scale
        return x
    return torch.randn(shape, generator=gen) * 4 * scale * 30


@pytest.mark.parametrize("inputs", ["fp8-grid", "random"])
@pytest.mark.parametrize(
    "cache_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2]
)
@pytest.mark.parametrize("num_kv_heads, head_size, block_size", SHAPES[:4])
def test_fp8_quantisation(cache_dtype, num_kv_heads, head_size, block_size, inputs):
    reason = fp8_skip_reason(cache_dtype)
    if reason:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(1)
    num_blocks, num_tokens = 4, 9
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    src_shape = (num_tokens, num_kv_heads, head_size)
    k_scale, v_scale = 0.25, 0.0625
    on_grid = inputs == "fp8-grid"
    key = _fp8_inputs(cache_dtype, src_shape, k_scale, gen, on_grid)
    value = _fp8_inputs(cache_dtype, src_shape, v_scale, gen, on_grid)
    key, value = key.to(torch.bfloat16).float(), value.to(torch.bfloat16).float()
    slots = _slot_mapping(num_tokens, num_blocks, block_size, gen)
    sentinel = torch.full((num_blocks, 2) + shape[1:], SENTINEL).to(cache_dtype)
    kv_cache = sentinel.to(DEVICE)
    write_to_paged_cache(
        key=key.to(torch.bfloat16).to(DEVICE),
        value=value.to(torch.bfloat16).to(DEVICE),
        key_cache=kv_cache[:, 0],
        value_cache=kv_cache[:, 1],
        slot_mapping=slots.to(DEVICE),
        k_scale=torch.tensor([k_scale], device=DEVICE),
        v_scale=torch.tensor([v_scale], device=DEVICE),
    )
    for got, src, scale in (
        (kv_cache[:, 0], key, k_scale),
        (kv_cache[:, 1], value, v_scale),
    ):
        want = _expected(cache_dtype, shape, src, slots, scale)
        got = got.cpu()
        if on_grid:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        else:
            # The kernel divides with div_rn and casts round-to-nearest-even like
            # torch, so codes should match; allow the neighbouring value (relative
            # step 2**-3 in e4m3, 2**-2 in e5m2) on rare ties, but require nearly
            # all exact.
            step = 2**-2 if cache_dtype == torch.float8_e5m2 else 2**-3
            assert_close(got, want, dtype=cache_dtype, atol=2**-9, rtol=step)
            exact = (got.view(torch.uint8) == want.view(torch.uint8)).float().mean()
            assert exact > 0.99, f"only {exact:.3f} of the fp8 codes match"


def test_token_dim_longer_than_slot_mapping():
    """The token dim of key/value is padded (as vLLM pads it); rows past
    slot_mapping are not written."""
    key = torch.randn((6, 1, 64)).to(torch.bfloat16).to(DEVICE)
    cache = torch.full((2, 1, 16, 64), SENTINEL, dtype=torch.bfloat16, device=DEVICE)
    slots = torch.tensor([3, 4], dtype=torch.int64, device=DEVICE)
    write_to_paged_cache(
        key=key, value=key, key_cache=cache, value_cache=cache, slot_mapping=slots
    )
    assert torch.equal(cache[0, 0, 3:5], key[:2, 0])
    assert int((cache != SENTINEL).any(dim=-1).sum()) == 2


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda k, c, s: {"key_cache": c.half(), "value_cache": c.half()},
            "must equal the key dtype",
        ),
        (
            lambda k, c, s: {
                "key_cache": c.to(torch.float8_e4m3fn),
                "value_cache": c.to(torch.float8_e4m3fn),
            },
            "needs k_scale",
        ),
        (lambda k, c, s: {"key": k[:, :, :32], "value": k[:, :, :32]}, "head size"),
        (lambda k, c, s: {"slot_mapping": s.float()}, "slot_mapping"),
    ],
    ids=["dtype-mismatch", "fp8-without-scale", "head-size", "float-slots"],
)
def test_rejects_bad_inputs(make, match):
    key = torch.zeros((2, 1, 64), dtype=torch.bfloat16, device=DEVICE)
    cache = torch.zeros((2, 1, 16, 64), dtype=torch.bfloat16, device=DEVICE)
    slots = torch.tensor([0, 1], dtype=torch.int64, device=DEVICE)
    args = {
        "key": key,
        "value": key,
        "key_cache": cache,
        "value_cache": cache,
        "slot_mapping": slots,
    }
    args.update(make(key, cache, slots))
    with pytest.raises(ValueError, match=match):
        write_to_paged_cache(**args)
