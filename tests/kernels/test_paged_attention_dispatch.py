# SPDX-License-Identifier: Apache-2.0
"""paged_attention: routing by query length, and end to end against the reference.

The routing tests replace both kernels by recorders, so they need neither a GPU nor
the interpreter and check exactly which sequences each kernel receives. The end-to-end
tests run the real kernels (interpreter on the CPU) on batches that mix decode rows,
chunked-prefill rows and prefix hits, and compare every output row with
ref_paged_attention.
"""

import math

import pytest
import torch

from tests.kernels.conftest import (
    DEVICE,
    TOLERANCES,
    assert_close,
    make_paged_batch,
)
from vllm.attention.ops import paged_attention as dispatch
from vllm.attention.ops.reference import ref_paged_attention
from vllm.attention.ops.triton_paged_decode_attention_2d import (
    WORKSPACE_DTYPE,
    decode_workspace_shape,
)


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(
        dispatch, "paged_decode_attention", lambda **kw: calls.append(("decode", kw))
    )
    monkeypatch.setattr(
        dispatch, "prefix_prefill_attention", lambda **kw: calls.append(("prefill", kw))
    )
    return calls


def _dispatch_args(num_seqs, num_decodes, max_query_len=5):
    t = torch.empty(0)
    return {
        "query": t,
        "key_cache": t,
        "value_cache": t,
        "output": t,
        "block_table": t,
        "query_start_loc": t,
        "seq_lens": torch.empty(num_seqs),
        "num_decodes": num_decodes,
        "num_decode_tokens": num_decodes * dispatch.DECODE_QUERY_LEN,
        "max_query_len": max_query_len,
        "softmax_scale": 0.1,
        "decode_num_splits": 4,
        "sliding_window": 9,
        "prefill_max_seq_len": 4096,
    }


@pytest.mark.parametrize(
    "num_seqs, num_decodes, expected",
    [
        (5, 2, [("decode", 0, 2), ("prefill", 2, 3)]),  # mixed
        (4, 4, [("decode", 0, 4)]),  # decode only: no prefill launch
        (3, 0, [("prefill", 0, 3)]),  # prefill only: no decode launch
        (0, 0, []),  # empty batch: nothing
    ],
    ids=["mixed", "decode_only", "prefill_only", "empty"],
)
def test_routing(recorded, num_seqs, num_decodes, expected):
    dispatch.paged_attention(**_dispatch_args(num_seqs, num_decodes))
    got = [(name, kw["seq_start"], kw["num_seqs"]) for name, kw in recorded]
    assert got == expected
    for name, kw in recorded:
        assert kw["sliding_window"] == 9, "features must reach both kernels"
        if name == "decode":
            assert kw["num_splits"] == 4
        else:
            assert kw["max_query_len"] == 5
            assert kw["max_seq_len"] == 4096  # lets the prefill part split


def test_explicit_num_seqs_overrides_shape(recorded):
    # A padded seq_lens (CUDA graphs) with fewer real sequences.
    dispatch.paged_attention(**_dispatch_args(8, 2), num_seqs=3)
    assert [(n, kw["seq_start"], kw["num_seqs"]) for n, kw in recorded] == [
        ("decode", 0, 2),
        ("prefill", 2, 1),
    ]


@pytest.mark.parametrize(
    "over, match",
    [
        ({"num_decode_tokens": 3}, "num_decode_tokens"),
        ({"num_decodes": 9, "num_decode_tokens": 9}, "num_decodes"),
    ],
)
def test_inconsistent_counts_raise(recorded, over, match):
    with pytest.raises(ValueError, match=match):
        dispatch.paged_attention(**{**_dispatch_args(4, 2), **over})
    assert recorded == [], "nothing may launch on bad counts"


def test_dispatch_does_no_tensor_work(recorded):
    # It runs every step for every layer: host int arithmetic only. Any torch call
    # on a tensor (a read such as .item() syncs the device; an allocation or a
    # copy costs time) shows up in a TorchFunctionMode. Speed itself is measured
    # in benchmarks, not asserted here.
    from torch.overrides import TorchFunctionMode

    class Spy(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    args = _dispatch_args(64, 48)
    with Spy() as spy:
        dispatch.paged_attention(**args)
    # seq_lens.shape is read when num_seqs is not given: an attribute, not work.
    assert set(spy.seen) <= {"shape", "__get__"}, spy.seen
    assert [name for name, _ in recorded] == ["decode", "prefill"]


# (query_len, kv_len): decodes first (incl. a single-key one), then a chunked-prefill
# row (query in the middle of its context), a pure prefill, and a prefix hit.
MIXED_BATCH = [(1, 40), (1, 1), (1, 17), (6, 30), (5, 5), (3, 35)]
NUM_DECODES = sum(1 for q, _ in MIXED_BATCH if q == dispatch.DECODE_QUERY_LEN)


NUM_KV_HEADS, GROUP, HEAD_SIZE, BLOCK_SIZE = 2, 2, 64, 16


def _mixed_batch(**kw):
    return make_paged_batch(
        seqs=MIXED_BATCH,
        num_q_heads=NUM_KV_HEADS * GROUP,
        num_kv_heads=NUM_KV_HEADS,
        head_size=HEAD_SIZE,
        block_size=BLOCK_SIZE,
        q_dtype=torch.bfloat16,
        **kw,
    )


def _dispatch_batch(batch, query, output, **kw):
    """paged_attention over a make_paged_batch of MIXED_BATCH (query given apart, so
    a test can scale it)."""
    dispatch.paged_attention(
        query=query,
        key_cache=batch.key_cache,
        value_cache=batch.value_cache,
        output=output,
        block_table=batch.block_table,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        num_decodes=NUM_DECODES,
        num_decode_tokens=NUM_DECODES,
        max_query_len=batch.max_query_len,
        **kw,
    )


@pytest.mark.parametrize(
    "features, num_splits",
    [({}, 1), ({"sliding_window": 12, "logits_soft_cap": 4.0}, 2)],
    ids=["plain", "window_softcap_split"],
)
def test_mixed_batch_against_reference(features, num_splits):
    batch = _mixed_batch()
    workspace = torch.full(
        decode_workspace_shape(
            max_num_seqs=NUM_DECODES,
            num_q_heads=NUM_KV_HEADS * GROUP,
            head_size=HEAD_SIZE,
            num_splits=num_splits,
        ),
        float("nan"),
        dtype=WORKSPACE_DTYPE,
        device=DEVICE,
    )
    output = torch.full_like(batch.query, float("nan"))
    scale = 1.0 / math.sqrt(HEAD_SIZE)
    _dispatch_batch(
        batch,
        batch.query,
        output,
        softmax_scale=scale,
        decode_num_splits=num_splits,
        decode_workspace=workspace,
        **features,
    )
    ref = ref_paged_attention(**batch.ref_kwargs(), softmax_scale=scale, **features)
    _, atol, rtol = TOLERANCES[torch.bfloat16]
    # Output starts as NaN: a row that neither kernel wrote fails here.
    assert_close(
        output, ref, dtype=torch.bfloat16, atol=atol, rtol=rtol, what="dispatch"
    )


def test_fp8_cache_with_a_query_past_fp16_range():
    """With an fp8 cache both kernels run their dots in fp16 with q pre-scaled by
    the softmax scale: a bf16 query past fp16's 65504 must neither overflow nor lose
    more than that one rounding. The oracle gets the same rounded query, ``q *
    scale`` in fp16, with scale 1."""
    batch = _mixed_batch(cache_dtype=torch.float8_e4m3fn, seed=3)
    query = (batch.query.float() * 3e4).to(torch.bfloat16)  # |q| up to ~1.3e5
    assert query.float().abs().max() > 65504
    output = torch.full_like(query, float("nan"))
    scale = 1.0 / math.sqrt(HEAD_SIZE)
    _dispatch_batch(
        batch,
        query,
        output,
        softmax_scale=scale,
        k_scale=batch.k_scale,
        v_scale=batch.v_scale,
        decode_num_splits=1,
    )
    rounded = (query.float() * scale).to(torch.float16).float()
    ref_kwargs = {**batch.ref_kwargs(), "query": rounded}
    ref = ref_paged_attention(**ref_kwargs, softmax_scale=1.0)
    assert torch.isfinite(output.float()).all()
    _, atol, rtol = TOLERANCES[torch.bfloat16]
    assert_close(
        output, ref, dtype=torch.bfloat16, atol=atol, rtol=rtol, what="fp8 big q"
    )


# Inputs outside the one contract (triton_attention_common.check_attention_inputs),
# each with the words its error must contain. Both kernels share the contract, so
# the batch's decode part and its prefill part reject each one alike.
CONTRACT_VIOLATIONS = {
    "head-size-not-multiple-of-16": ({"head_size": 72}, {}, "head size 72"),
    "head-size-past-256": ({"head_size": 272}, {}, "head size 272"),
    "block-size-not-power-of-2": ({"block_size": 24}, {}, "block size 24"),
    "negative-softcap": ({}, {"logits_soft_cap": -1.0}, "logits_soft_cap"),
    "window-0": ({}, {"sliding_window": 0}, "sliding_window"),
    "sinks-shape": ({}, {"sinks": "wrong-shape"}, "sinks"),
    "fp8-without-scales": ({"kv_dtype": torch.float8_e4m3fn}, {}, "k_scale"),
}


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize(
    "build, call, match",
    list(CONTRACT_VIOLATIONS.values()),
    ids=list(CONTRACT_VIOLATIONS),
)
def test_one_contract_for_both_kernels(kernel, build, call, match):
    decode_only = kernel == "decode"
    seqs = [(1, 20)] if decode_only else [(3, 20)]
    shape = {"head_size": 64, "block_size": 16, **build}
    kv_dtype = shape.pop("kv_dtype", torch.bfloat16)
    batch = make_paged_batch(
        seqs=seqs,
        num_q_heads=4,
        num_kv_heads=2,
        q_dtype=torch.bfloat16,
        cache_dtype=kv_dtype,
        **shape,
    )
    if call.get("sinks") == "wrong-shape":
        call = {**call, "sinks": torch.zeros(3, device=DEVICE)}
    with pytest.raises(ValueError, match=match):
        dispatch.paged_attention(
            query=batch.query,
            key_cache=batch.key_cache,
            value_cache=batch.value_cache,
            output=torch.empty_like(batch.query),
            block_table=batch.block_table,
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            num_decodes=1 if decode_only else 0,
            num_decode_tokens=1 if decode_only else 0,
            max_query_len=batch.max_query_len,
            softmax_scale=0.125,
            **call,
        )
