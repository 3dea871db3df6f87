"""The upstream-test adapter's cache re-layout (benchmarks/upstream_tests): every
block, head and slot of stock's packed K|V cache lands in the backend's declared
layout, in any stride order, fp8 bytes included."""

import importlib.util
from pathlib import Path

import pytest
import torch

CONFTEST = Path(__file__).resolve().parents[2] / "benchmarks/upstream_tests/conftest.py"


def _relay():
    spec = importlib.util.spec_from_file_location("upstream_conftest", CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.relay_kv_cache


def _backend(order):
    class Backend:
        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, _):
            return (num_blocks, 2, num_kv_heads, block_size, head_size)

        @staticmethod
        def get_kv_cache_stride_order():
            return order

    return Backend


@pytest.mark.parametrize("order", [(0, 1, 2, 3, 4), (1, 0, 2, 3, 4), (0, 1, 3, 2, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8])
def test_relay_keeps_every_key_and_value(order, dtype):
    blocks, heads, slots, head = 5, 3, 4, 8
    packed = (torch.arange(blocks * heads * slots * 2 * head) % 251).to(dtype)
    packed = packed.view(blocks, heads, slots, 2 * head)
    out = _relay()(_backend(order), packed, heads, head, "auto")
    assert out.shape == (blocks, 2, heads, slots, head) and out.dtype == dtype
    for b, h, s in [(0, 0, 0), (4, 2, 3), (2, 1, 2)]:
        assert torch.equal(out[b, 0, h, s], packed[b, h, s, :head])
        assert torch.equal(out[b, 1, h, s], packed[b, h, s, head:])
    assert torch.equal(out[:, 0], packed[..., :head])
    assert torch.equal(out[:, 1], packed[..., head:])
    # the physical order is the declared one
    assert out.permute(*order).is_contiguous()
