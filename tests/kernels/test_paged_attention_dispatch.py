# SPDX-License-Identifier: Apache-2.0
"""paged_attention: routing by query length, and end to end against the reference.

The routing tests replace both kernels by recorders, so they need neither a GPU nor
the interpreter and check exactly which sequences each kernel receives. The end-to-end
tests run the real kernels (interpreter on the CPU) on batches that mix decode rows,
chunked-prefill rows and prefix hits, and compare every output row with
ref_paged_attention.
"""

import math
from types import SimpleNamespace

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
from vllm.attention.ops.triton_attention_common import (
    SUPPORTED_HEAD_SIZES,
    AttentionInputs,
)
from vllm.attention.ops.triton_paged_decode_attention_2d import (
    WORKSPACE_DTYPE,
    decode_workspace_shape,
)


@pytest.fixture
def recorded(monkeypatch):
    """Both launches, the contract check, the decode config and the prefill plan
    replaced by recorders: what the dispatch hands to each."""
    calls = []

    def plan(**kw):
        calls.append(("plan", kw))
        return SimpleNamespace(seq_start=kw["seq_start"], num_seqs=kw["num_seqs"])

    monkeypatch.setattr(dispatch, "check_attention_inputs", lambda *a, **kw: None)
    monkeypatch.setattr(dispatch, "config_for", lambda *a: "decode-config")
    monkeypatch.setattr(dispatch, "plan_prefill", plan)
    monkeypatch.setattr(
        dispatch.PrefillLayer, "of_inputs", staticmethod(lambda inputs: "layer")
    )
    monkeypatch.setattr(
        dispatch,
        "launch_paged_decode",
        lambda inputs, **kw: calls.append(("decode", {"inputs": inputs, **kw})),
    )
    monkeypatch.setattr(
        dispatch,
        "launch_prefix_prefill",
        lambda plan, inputs, **kw: calls.append(
            ("prefill", {"plan": plan, "inputs": inputs, **kw})
        ),
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


def _routes(calls):
    routes = []
    for name, kw in calls:
        if name == "decode":
            routes.append(("decode", kw["seq_start"], kw["num_seqs"]))
        elif name == "prefill":
            routes.append(("prefill", kw["plan"].seq_start, kw["plan"].num_seqs))
    return routes


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
    assert _routes(recorded) == expected
    for name, kw in recorded:
        if name == "decode":
            assert kw["num_splits"] == 4 and kw["config"] == "decode-config"
            assert kw["inputs"].sliding_window == 9, "features reach both kernels"
        elif name == "prefill":
            assert kw["inputs"].sliding_window == 9, "features reach both kernels"
        else:  # the plan made here, without the builder's
            assert kw["max_query_len"] == 5
            assert kw["max_seq_len"] == 4096  # lets the prefill part split


def test_explicit_num_seqs_overrides_shape(recorded):
    # A padded seq_lens (CUDA graphs) with fewer real sequences.
    dispatch.paged_attention(**_dispatch_args(8, 2), num_seqs=3)
    assert _routes(recorded) == [("decode", 0, 2), ("prefill", 2, 1)]


def test_given_plans_are_launched_not_remade(recorded):
    plan = SimpleNamespace(seq_start=2, num_seqs=3)
    dispatch.paged_attention(
        **_dispatch_args(5, 2),
        prefill_plans={"layer": plan, "another layer": None},
        decode_config="builder's",
    )
    assert [name for name, _ in recorded] == ["decode", "prefill"]
    assert recorded[0][1]["config"] == "builder's"
    assert recorded[1][1]["plan"] is plan


def test_a_plan_of_other_sequences_is_refused(recorded):
    plan = SimpleNamespace(seq_start=1, num_seqs=4)
    with pytest.raises(ValueError, match=r"covers sequences \[1, 5\)"):
        dispatch.paged_attention(**_dispatch_args(5, 2), prefill_plans={"layer": plan})


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


# ALiBi slopes of the four query heads, steep enough that the sqrt and linear biases
# give different attention.
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)


@pytest.mark.parametrize(
    "features, num_splits",
    [
        ({}, 1),
        ({"sliding_window": 12, "logits_soft_cap": 4.0}, 2),
        ({"alibi_slopes": SLOPES}, 2),
        ({"alibi_slopes": SLOPES, "alibi_sqrt": True}, 2),
        ({"alibi_slopes": SLOPES, "alibi_sqrt": True, "sliding_window": 12}, 1),
        ({"causal": False}, 1),
        ({"causal": False, "logits_soft_cap": 4.0}, 2),
    ],
    ids=[
        "plain",
        "window_softcap_split",
        "alibi_split",
        "alibi_sqrt_split",
        "alibi_sqrt_window",
        "non_causal",
        "non_causal_softcap_split",
    ],  # fmt: skip
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
    # The flag changes the result (the prefill rows', for causality).
    for flag, default in (("alibi_sqrt", False), ("causal", True)):
        if flag in features and features[flag] != default:
            other = ref_paged_attention(
                **batch.ref_kwargs(), softmax_scale=scale, **{**features, flag: default}
            )
            assert (other - ref).abs().max() > 10 * atol


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
    "head-size-past-256": ({"head_size": 272}, {}, "head size 272"),
    "block-size-not-power-of-2": ({"block_size": 24}, {}, "block size 24"),
    "negative-softcap": ({}, {"logits_soft_cap": -1.0}, "logits_soft_cap"),
    "window-0": ({}, {"sliding_window": 0}, "sliding_window"),
    "sinks-shape": ({}, {"sinks": "wrong-shape"}, "sinks"),
    "fp8-without-scales": ({"kv_dtype": torch.float8_e4m3fn}, {}, "k_scale"),
    "non-causal-alibi": ({}, {"causal": False, "alibi_slopes": "per-head"}, "ALiBi"),
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
    if call.get("alibi_slopes") == "per-head":
        call = {**call, "alibi_slopes": torch.full((4,), 0.5, device=DEVICE)}
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


class _Recorder:
    """Stands in for a JIT kernel: ``kernel[grid](**kwargs)`` records the launch."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        return lambda **kwargs: self.launches.append((self.name, grid))


# What reading a launch's tensors costs nothing: metadata and views. Anything else
# (an allocation, a copy, a read such as .item() that syncs the device) would be
# per-layer work.
_METADATA = {
    "__get__", "shape", "dtype", "device", "stride", "dim", "is_contiguous",
    "numel", "data_ptr", "is_floating_point", "element_size", "size",
    "as_strided", "unbind", "view", "__getitem__",
}  # fmt: skip


def test_a_planned_batch_launches_with_no_per_layer_work(monkeypatch):
    """With the builder's plans (decode config and splits, prefill plan with its
    workspace view) the per-layer call checks the inputs and launches: it
    allocates nothing, reads no tensor, asks no table and queries no device. The
    kernels are recorders here; the plan is made before, as the builder does."""
    from torch.overrides import TorchFunctionMode

    from vllm.attention.ops import prefix_prefill as pp
    from vllm.attention.ops import triton_attention_common as common
    from vllm.attention.ops import triton_paged_decode_attention_2d as decode

    batch = _mixed_batch()
    features = {"sliding_window": 12, "logits_soft_cap": 4.0}
    num_splits = 2
    workspace = torch.empty(
        decode_workspace_shape(
            max_num_seqs=NUM_DECODES, num_q_heads=NUM_KV_HEADS * GROUP,
            head_size=HEAD_SIZE, num_splits=num_splits,
        ),
        dtype=WORKSPACE_DTYPE,
    )  # fmt: skip
    buffer = torch.empty(pp.split_workspace_bound(head_size=HEAD_SIZE, num_sms=132))
    num_seqs = len(MIXED_BATCH)
    plan = pp.plan_prefill(
        layer=pp.PrefillLayer.of(
            query=batch.query, key_cache=batch.key_cache, **features
        ),
        device=batch.query.device, seq_start=NUM_DECODES,
        num_seqs=num_seqs - NUM_DECODES, num_tokens=batch.query.shape[0],
        max_query_len=batch.max_query_len, max_seq_len=40, num_splits=2,
        workspace=buffer,
    )  # fmt: skip
    config = decode.config_for(
        AttentionInputs(
            query=batch.query, key_cache=batch.key_cache,
            value_cache=batch.value_cache, output=batch.query,
            block_table=batch.block_table, seq_lens=batch.seq_lens,
            softmax_scale=0.125,
        ),
        num_splits,
    )  # fmt: skip
    launches = []
    for module, name in (
        (pp, "_prefix_prefill_kernel"),
        (decode, "_paged_decode_kernel"),
        (common, "merge_splits_kernel"),
    ):
        monkeypatch.setattr(module, name, _Recorder(name, launches))

    def forbidden(*args, **kwargs):
        raise AssertionError("per-layer table lookup or device query")

    for module, name in (
        (pp, "picked_config"), (pp, "num_sms"), (pp, "plan_prefill"),
        (decode, "config_for"), (decode, "decode_config"),
        (dispatch, "plan_prefill"), (dispatch, "config_for"),
    ):  # fmt: skip
        monkeypatch.setattr(module, name, forbidden)

    class Spy(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    output = torch.empty_like(batch.query)
    with Spy() as spy:
        _dispatch_batch(
            batch, batch.query, output, softmax_scale=0.125,
            decode_num_splits=num_splits, decode_workspace=workspace,
            decode_config=config, prefill_plans={plan.layer: plan}, **features,
        )  # fmt: skip
    assert spy.seen <= _METADATA, sorted(spy.seen - _METADATA)
    assert [name for name, _ in launches] == [
        "_paged_decode_kernel",
        "merge_splits_kernel",
        "_prefix_prefill_kernel",
        "merge_splits_kernel",
    ]
    assert plan.workspace.data_ptr() == buffer.data_ptr()  # a view, not a new one


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_prefill_planner_plans_each_kind_of_layer_once(batch_invariant):
    """PrefillPlanner: one plan per kind of layer over the batch's prefills, split
    workspaces as views of its one buffer; none without prefills. Batch-invariant:
    no split and the longest bucket's config, whatever the batch."""
    from vllm.attention.ops import prefix_prefill as pp
    from vllm.attention.ops.tuning.prefill_configs import QUERY_LEN_BUCKETS

    layer = dict(head_size=HEAD_SIZE, num_q_heads=NUM_KV_HEADS * GROUP,
                 num_kv_heads=NUM_KV_HEADS, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16, block_size=16, pages_are_rows=True,
                 soft_cap=False, alibi=False, sinks=False)  # fmt: skip
    kinds = {pp.PrefillLayer(**layer, sliding_window=w) for w in (None, 3000)}
    device = torch.device("cpu")
    planner = pp.PrefillPlanner(
        device=device, layers=kinds, head_size=HEAD_SIZE, max_kv_len=65536,
        batch_invariant=batch_invariant,
    )  # fmt: skip
    batch = dict(num_tokens=2050, max_query_len=2048, max_seq_len=30000)
    assert planner.plan(num_decodes=3, num_reqs=3, **batch) == {}
    plans = planner.plan(num_decodes=2, num_reqs=3, **batch)
    assert set(plans) == kinds
    for kind, plan in plans.items():
        assert (plan.seq_start, plan.num_seqs, plan.layer) == (2, 1, kind)
        if batch_invariant:
            assert plan.num_splits == 1
            assert plan.config == pp.layer_config(kind, device, QUERY_LEN_BUCKETS[-1])
    whole = plans[next(k for k in kinds if k.sliding_window is None)]
    if not batch_invariant:  # few programs over 30k keys: split, in the buffer
        assert whole.num_splits > 1
        assert whole.workspace.data_ptr() == planner.workspace.data_ptr()
    short = pp.PrefillPlanner(device=device, layers=kinds, head_size=HEAD_SIZE,
                              max_kv_len=2 * pp.SPLIT_MIN_KEYS - 1)  # fmt: skip
    assert short.workspace is None


# Pages of 64 take the TMA tiles where a head's row is a multiple of 16 bytes (24
# in bf16) and pointer loads elsewhere (36, 100; 24 in fp8).
ODD_HEADS_ON_TMA_PAGES = [(h, 64, kv) for h in (24, 36, 100)
                          for kv in (torch.bfloat16, torch.float8_e4m3fn)]  # fmt: skip


@pytest.mark.parametrize(
    "head_size, block_size, cache_dtype",
    [(h, 16, torch.bfloat16) for h in SUPPORTED_HEAD_SIZES]
    + [(64, 1, torch.bfloat16), (64, 8, torch.bfloat16), (96, 4, torch.bfloat16)]
    + ODD_HEADS_ON_TMA_PAGES,
)
def test_every_declared_head_size_against_reference(head_size, block_size, cache_dtype):
    """Every head size the kernels declare (and so the backend: one source; any up
    to 256, odd ones in tiles of the next power of two with the extra columns
    masked) runs both kernels correctly: decodes and a chunked prefill in one
    batch, the heuristic's tiles, a group of 3 (padded rows), pages of 16; pages
    smaller than vLLM offers (any power of two is in the contract); and odd head
    sizes on pages of 64, in bf16 and fp8."""
    batch = make_paged_batch(
        seqs=[(1, 33), (1, 2), (5, 40)],
        num_q_heads=6,
        num_kv_heads=2,
        head_size=head_size,
        block_size=block_size,
        q_dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        seed=head_size,
    )
    output = torch.full_like(batch.query, float("nan"))
    scale = head_size**-0.5
    dispatch.paged_attention(
        query=batch.query, key_cache=batch.key_cache, value_cache=batch.value_cache,
        output=output, block_table=batch.block_table,
        query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens,
        num_decodes=2, num_decode_tokens=2, max_query_len=batch.max_query_len,
        softmax_scale=scale, prefill_max_seq_len=40, k_scale=batch.k_scale,
        v_scale=batch.v_scale,
    )  # fmt: skip
    ref = ref_paged_attention(**batch.ref_kwargs(), softmax_scale=scale)
    _, atol, rtol = TOLERANCES[torch.bfloat16]
    assert_close(output, ref, dtype=torch.bfloat16, atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    "sinks, normed_key",
    [(False, False), (True, False), (False, True)],
    ids=["plain", "sinks", "normed-key"],
)
def test_attention_without_a_cache_reads_the_steps_rows(sinks, normed_key):
    """Encoder self-attention: the step's K/V (views of a fused QKV output) as
    one-key pages (``StepKVPages``), every request in the prefill kernel,
    non-causal; each request's queries see all of its own keys and none of the
    others'. The page table is written in place, twice. ``normed_key``: K is a
    tensor of its own (Gemma-3 normalises K, not V), so K and V differ in
    strides."""
    num_q_heads, num_kv_heads, head_size = 4, 2, 64
    pages = dispatch.StepKVPages(max_num_seqs=2, max_query_len=40, device=DEVICE)
    assert pages.stride == 48  # 40 rounded up to 16
    gen = torch.Generator().manual_seed(3)
    sink_logits = torch.randn(num_q_heads, generator=gen).to(DEVICE) if sinks else None
    for q_lens in ([7, 1, 20, 33], [40, 2]):
        starts = [0]
        for q in q_lens:
            starts.append(starts[-1] + q)
        tokens = starts[-1] + 3  # padding rows past the last request
        width = (num_q_heads + 2 * num_kv_heads) * head_size
        qkv = torch.randn((tokens, width), generator=gen).to(torch.bfloat16).to(DEVICE)
        q_end = num_q_heads * head_size
        k_end = q_end + num_kv_heads * head_size
        query = qkv[:, :q_end].view(tokens, num_q_heads, head_size)
        key = qkv[:, q_end:k_end].view(tokens, num_kv_heads, head_size)
        value = qkv[:, k_end:].view(tokens, num_kv_heads, head_size)
        if normed_key:
            key = key * 1.5
            assert key.stride() != value.stride()
        query_start_loc = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
        block_table, seq_lens = pages.table(query_start_loc, len(q_lens))
        assert block_table.data_ptr() == pages.block_table.data_ptr()
        key_cache, value_cache = dispatch.StepKVPages.views(key, value)
        output = torch.full_like(query, float("nan"))
        dispatch.paged_attention(
            query=query, key_cache=key_cache, value_cache=value_cache, output=output,
            block_table=block_table, query_start_loc=query_start_loc,
            seq_lens=seq_lens, num_decodes=0, num_decode_tokens=0,
            max_query_len=max(q_lens), softmax_scale=0.125, sinks=sink_logits,
            causal=False,
        )  # fmt: skip
        assert seq_lens.tolist() == q_lens
        _, atol, rtol = TOLERANCES[torch.bfloat16]
        for r, q_len in enumerate(q_lens):
            # Each request alone, its K/V rows as one dense page of its own.
            rows = slice(starts[r], starts[r + 1])
            ref = ref_paged_attention(
                query=query[rows], key_cache=key[rows].transpose(0, 1)[None],
                value_cache=value[rows].transpose(0, 1)[None],
                block_table=torch.zeros((1, 1), dtype=torch.int32),
                query_start_loc=torch.tensor([0, q_len]),
                seq_lens=torch.tensor([q_len]), softmax_scale=0.125,
                sinks=sink_logits, causal=False,
            )  # fmt: skip
            assert_close(output[rows], ref, dtype=torch.bfloat16, atol=atol,
                         rtol=rtol, what=f"request {r} without a cache")  # fmt: skip
