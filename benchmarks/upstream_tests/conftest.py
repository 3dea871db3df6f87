"""Runs vLLM's own tests/v1/attention/test_attention_backends.py (unmodified, from
the release's source; ``run.sh``) against this fork's TRITON_ATTN only.

Upstream's tests/conftest.py is not used: it pulls in vLLM's whole test stack.
This file provides the one fixture the selected tests ask for
(``default_vllm_config``) and, per test, patches the test module's namespace:

* every backend list the module keeps is set to ``[TRITON_ATTN]``, and
  ``_test_backend_correctness`` drops any other backend a test passes it
  directly (e.g. FlexAttention's separate block-size-128 call), so only
  TRITON_ATTN is run;
* ``create_and_prepopulate_kv_cache`` is wrapped: the original builds the cache
  in stock's packed layout ``[num_blocks, num_kv_heads, block_size, 2 *
  head_size]`` (K in ``[..., :head_size]``, V in ``[..., head_size:]``, context
  blocks permuted, block table and slot mapping written to match) for every
  backend; while TRITON_ATTN is under test its result is copied into the layout
  the backend declares (``get_kv_cache_shape`` in ``get_kv_cache_stride_order``'s
  physical order), as vLLM's model runner allocates it, block ids unchanged, so
  every block/slot/head holds the same K and V bytes and the test's reference
  comparison is untouched.
"""

import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
# Upstream's ``tests`` package must win over any ``tests`` on PYTHONPATH.
if sys.path[:1] != [_HERE]:
    sys.path.insert(0, _HERE)

# Module-level backend lists of test_attention_backends.py that can name
# TRITON_ATTN (read by the tests at run time, not at collection).
_BACKEND_LISTS = (
    "BACKENDS_TO_TEST",
    "SLIDING_WINDOW_BACKENDS_TO_TEST",
    "SLIDING_WINDOW_ENCODER_BACKENDS_TO_TEST",
    # Upstream does not list TRITON_ATTN here; ours runs non-causal batches.
    "NON_CAUSAL_BACKENDS_TO_TEST",
)


def relay_kv_cache(backend_cls, kv_cache, num_kv_heads, head_size, cache_dtype_str):
    """Copy a stock-layout cache ``[num_blocks, num_kv_heads, block_size,
    2 * head_size]`` (K | V along the last dim; any strides; fp8 caches come as
    uint8) into a fresh tensor of ``backend_cls.get_kv_cache_shape`` allocated
    in the backend's stride order. Same dtype, same block ids."""
    num_blocks, heads, block_size, width = kv_cache.shape
    assert heads == num_kv_heads and width == 2 * head_size, kv_cache.shape
    shape = tuple(
        backend_cls.get_kv_cache_shape(
            num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str
        )
    )
    # The fork's layout: (blocks, K/V, heads, slots, head dims).
    assert shape == (num_blocks, 2, num_kv_heads, block_size, head_size), shape
    try:
        order = tuple(backend_cls.get_kv_cache_stride_order())
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    assert sorted(order) == list(range(len(shape))), order
    physical = torch.zeros(
        tuple(shape[i] for i in order), dtype=kv_cache.dtype, device=kv_cache.device
    )
    out = physical.permute(*[order.index(i) for i in range(len(shape))])
    assert tuple(out.shape) == shape
    out[:, 0].copy_(kv_cache[..., :head_size])
    out[:, 1].copy_(kv_cache[..., head_size:])
    return out


@pytest.fixture
def default_vllm_config():
    """A default VllmConfig made current for the test's duration (what code
    calling get_current_vllm_config() outside an engine expects)."""
    from vllm.config import VllmConfig, set_current_vllm_config

    config = VllmConfig()
    with set_current_vllm_config(config):
        yield config


@pytest.fixture(autouse=True)
def _triton_attn_only(request, monkeypatch):
    module = request.module
    if not hasattr(module, "create_and_prepopulate_kv_cache"):
        yield
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    triton = AttentionBackendEnum.TRITON_ATTN
    for name in _BACKEND_LISTS:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, [triton])

    state = {"active": False, "kv_cache_dtype": "auto"}
    original_create = module.create_and_prepopulate_kv_cache
    original_correctness = module._test_backend_correctness

    def create_and_prepopulate_kv_cache(*args, **kwargs):
        kv_cache = original_create(*args, **kwargs)
        if not state["active"]:
            return kv_cache
        # The test calls this with keyword arguments only.
        dtype_str = kwargs.get("kv_cache_dtype", "auto")
        backend_cls = triton.get_class()
        if not backend_cls.supports_kv_cache_dtype(dtype_str):
            return kv_cache  # the test skips the backend for this dtype
        return relay_kv_cache(
            backend_cls,
            kv_cache,
            kwargs["num_kv_heads"],
            kwargs["head_size"],
            dtype_str,
        )

    def _test_backend_correctness(batch_spec, model, backend_to_test, *a, **kw):
        backends = [b for b in backend_to_test if b == triton]
        if not backends:
            return  # a call for other backends only (e.g. FlexAttention's)
        state["active"] = True
        try:
            return original_correctness(batch_spec, model, backends, *a, **kw)
        finally:
            state["active"] = False

    monkeypatch.setattr(
        module, "create_and_prepopulate_kv_cache", create_and_prepopulate_kv_cache
    )
    monkeypatch.setattr(module, "_test_backend_correctness", _test_backend_correctness)
    yield
