# SPDX-License-Identifier: Apache-2.0
"""The Hopper prefill kernel (Gluon) and its place behind prefix_prefill_attention.

Off Hopper: which launches it takes and which it leaves to the portable kernel
(``prefix_prefill.hopper_kernel_refusal``, the plan, ``_launches``), with the GPU
check stubbed. The sm_90
build itself is compiled without a GPU by ``hopper_compile`` (test_prefix_prefill's
compile test). On an sm_90 GPU: results against ``ref_paged_attention`` on batches
whose unused cache slots are NaN, through the public function.
"""

import dataclasses

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from tests.kernels.conftest import (  # noqa: E402
    DEVICE,
    FP8_QK_TOLERANCE,
    ON_GPU,
    TOLERANCES,
    assert_close,
    make_paged_batch,
    put_query_on_fp8_grid,
)
from tests.kernels.hopper_compile import prefill_launches  # noqa: E402
from vllm.attention.ops import prefix_prefill  # noqa: E402
from vllm.attention.ops import prefix_prefill_hopper as hopper  # noqa: E402
from vllm.attention.ops.prefix_prefill import (  # noqa: E402
    prefix_prefill_attention,
)
from vllm.attention.ops.reference import ref_paged_attention  # noqa: E402
from vllm.attention.ops.triton_attention_common import (  # noqa: E402
    AttentionInputs,
    merge_splits_kernel,
)
from vllm.attention.ops.tuning.prefill_configs import (  # noqa: E402
    PrefillConfig,
    is_valid_config,
)

ON_HOPPER = (
    ON_GPU
    and torch.cuda.get_device_capability()[0] == 9
    and (torch.version.hip is None)
)
GLUON_TILE = PrefillConfig(128, 128, 4, 2, use_tma=True, gluon=True)


def _tensors(head_size=128, group=4, block_size=64, dtype=torch.bfloat16):
    query = torch.empty((32, 2 * group, head_size), dtype=torch.bfloat16)
    cache = torch.empty((6, 2, 2, block_size, head_size), dtype=dtype)
    return query, cache


def _refusal(query, cache, config=GLUON_TILE, **features):
    layer = prefix_prefill.PrefillLayer.of(
        query=query, key_cache=cache[:, 0], **features
    )
    return prefix_prefill.hopper_kernel_refusal(layer, config, query.device)


def _plan(query, cache, config, num_seqs=2, max_query_len=16):
    """The layer of ``query`` over ``cache`` and its plan of one batch of 32
    tokens with ``config``."""
    layer = prefix_prefill.PrefillLayer.of(query=query, key_cache=cache[:, 0])
    plan = prefix_prefill.plan_prefill(
        layer=layer, device=query.device, seq_start=0, num_seqs=num_seqs,
        num_tokens=32, max_query_len=max_query_len, config=config,
    )  # fmt: skip
    return layer, plan


@pytest.fixture
def pretend_hopper(monkeypatch):
    monkeypatch.setattr(prefix_prefill, "is_hopper", lambda device: True)


def test_refuses_off_hopper():
    query, cache = _tensors()
    assert "Hopper" in _refusal(query, cache)


def _tile(**fields):
    return {"config": dataclasses.replace(GLUON_TILE, **fields)}


@pytest.mark.parametrize(
    "tensors, overrides, match",
    [
        ({}, {}, None),
        ({"head_size": 64, "group": 7, "block_size": 128}, {}, None),
        ({"head_size": 256, "group": 1}, {}, None),
        ({"head_size": 96}, {}, None),
        ({"head_size": 80}, {}, "head size 80"),
        # split_head: head 96 as 64 + 32 on 16-bit caches; not on an fp8 cache,
        # nor at head sizes that do not split (or that the kernel does not split).
        ({"head_size": 96}, _tile(split_head=True), None),
        (
            {"head_size": 96, "dtype": torch.float8_e4m3fn},
            _tile(split_head=True, fp8_qk=True),
            "16-bit caches only",
        ),
        ({"head_size": 128}, _tile(split_head=True), "not 128 (no split)"),
        ({"head_size": 64}, _tile(split_head=True), "not 64 (no split)"),
        ({"head_size": 80}, _tile(split_head=True), "head size 80"),
        ({"dtype": torch.float8_e4m3fn}, {}, "16-bit"),
        # An e4m3 cache runs q.k on fp8 tensor cores: only with fp8_qk.
        ({"dtype": torch.float8_e4m3fn}, _tile(fp8_qk=True), None),
        ({"dtype": torch.float8_e4m3fn, "head_size": 256}, _tile(fp8_qk=True), None),
        ({"dtype": torch.float8_e5m2}, _tile(fp8_qk=True), "float8_e4m3fn"),
        ({"dtype": torch.float8_e4m3fnuz}, _tile(fp8_qk=True), "float8_e4m3fn"),
        ({}, {"alibi_slopes": torch.ones(8)}, "ALiBi"),
        ({}, {"sinks": torch.ones(8)}, None),  # gpt-oss: sinks and a window
        ({}, {"sinks": torch.ones(8), "sliding_window": 128}, None),
        ({}, {"logits_soft_cap": 30.0}, None),
        ({}, _tile(num_stages=1), "2 stages"),
        ({"block_size": 16}, {}, None),  # a 128-key tile in eight TMA boxes
        ({}, _tile(block_n=32), "32-key tiles"),
        ({"head_size": 256, "block_size": 16}, _tile(block_n=64), None),
        ({}, _tile(num_warps=8), "128 or 192 rows on 4 warps (consumer warpgroups"),
        ({}, _tile(block_m=64), "not 64 on 4"),
        ({}, _tile(block_m=256), "not 256 on 4"),
        # Three consumer warpgroups (192 rows): head 64 on 16-bit caches only.
        ({"head_size": 64}, _tile(block_m=192), None),
        ({"head_size": 64}, {**_tile(block_m=192), "sinks": torch.ones(8)}, None),
        ({}, _tile(block_m=192), "not head size 128 on a bfloat16 cache"),
        (
            {"head_size": 64, "dtype": torch.float8_e4m3fn},
            _tile(block_m=192, fp8_qk=True),
            "not head size 64 on a fp8 cache",
        ),
    ],
)
def test_refusal_names_what_the_portable_kernel_keeps(
    pretend_hopper, tensors, overrides, match
):
    reason = _refusal(*_tensors(**tensors), **overrides)
    if match is None:
        assert reason is None
    else:
        assert reason is not None and match in reason


def _launch_kernels(config, **features):
    query, cache = _tensors()
    launches = prefill_launches(
        query=query,
        key_cache=cache[:, 0],
        value_cache=cache[:, 1],
        output=torch.empty_like(query),
        block_table=torch.zeros((2, 8), dtype=torch.int32),
        query_start_loc=torch.zeros(3, dtype=torch.int32),
        seq_lens=torch.zeros(2, dtype=torch.int32),
        max_query_len=16,
        softmax_scale=0.1,
        num_seqs=2,
        k_scale=None,
        v_scale=None,
        config=config,
        num_splits=features.pop("num_splits", 1),
        **{
            "sliding_window": None,
            "alibi_slopes": None,
            "logits_soft_cap": None,
            "sinks": None,
            **features,
        },
    )
    return [kernel for kernel, _, _ in launches]


def test_launch_takes_the_gluon_kernel_only_where_it_applies(pretend_hopper):
    assert _launch_kernels(GLUON_TILE) == [hopper.hopper_prefill_kernel]
    portable = [prefix_prefill._prefix_prefill_kernel]
    assert _launch_kernels(GLUON_TILE, logits_soft_cap=5.0) == [
        hopper.hopper_prefill_kernel
    ]
    assert _launch_kernels(GLUON_TILE, sliding_window=64) == [
        hopper.hopper_prefill_kernel
    ]
    assert _launch_kernels(GLUON_TILE, sinks=torch.ones(8)) == [
        hopper.hopper_prefill_kernel
    ]
    assert _launch_kernels(GLUON_TILE, alibi_slopes=torch.ones(8)) == portable
    no_flag = dataclasses.replace(GLUON_TILE, gluon=False)
    assert _launch_kernels(no_flag) == portable
    # An explicit split runs in the portable kernel, which takes splits.
    assert _launch_kernels(GLUON_TILE, num_splits=2) == [
        prefix_prefill._prefix_prefill_kernel,
        merge_splits_kernel,
    ]


def test_a_gluon_plan_on_pages_that_are_not_rows_runs_the_portable_kernel(
    pretend_hopper,
):
    """The builder plans from the model's specs; where the tensors' pages turn
    out not to be whole rows of the head size (a page padded to a common size),
    the launch runs the portable kernel with pointer loads, unsplit as planned."""
    query, cache = _tensors()
    padded = torch.empty((6, 2 * 2 * 64 * 128 + 8), dtype=cache.dtype)
    padded = padded[:, : cache[0].numel()].view(cache.shape)
    _, plan = _plan(query, cache, GLUON_TILE)
    assert plan.kernel == "gluon"
    inputs = AttentionInputs(
        query=query, key_cache=padded[:, 0], value_cache=padded[:, 1],
        output=torch.empty_like(query),
        block_table=torch.zeros((2, 8), dtype=torch.int32),
        query_start_loc=torch.zeros(3, dtype=torch.int32),
        seq_lens=torch.zeros(2, dtype=torch.int32), softmax_scale=0.1,
    )  # fmt: skip
    ((kernel, _, kwargs),) = prefix_prefill._launches(plan, inputs)
    assert kernel is prefix_prefill._prefix_prefill_kernel
    assert kwargs["USE_TMA"] is False and kwargs["SPLIT_KV"] is False


def test_launch_off_hopper_is_the_portable_kernel():
    assert _launch_kernels(GLUON_TILE) == [prefix_prefill._prefix_prefill_kernel]


def _gluon_launch(query, cache, config=GLUON_TILE, **plan):
    """The one launch of a 100-token plan of 3 sequences with the Gluon tile."""
    ((kernel, grid, kwargs),) = prefill_launches(
        query=query,
        key_cache=cache[:, 0],
        value_cache=cache[:, 1],
        output=torch.empty_like(query),
        block_table=torch.zeros((3, 8), dtype=torch.int32),
        query_start_loc=torch.zeros(4, dtype=torch.int32),
        seq_lens=torch.zeros(3, dtype=torch.int32),
        max_query_len=100,
        softmax_scale=0.1,
        config=config,
        **plan,
    )
    return kernel, grid, kwargs


def test_launch_grid_walks_every_head_and_row_tile(pretend_hopper):
    kernel, grid, kwargs = _gluon_launch(*_tensors(group=7), seq_start=1, num_seqs=2)
    assert kernel is hopper.hopper_prefill_kernel
    # 100 tokens x 7 heads in 6 tiles of 128 rows, for 2 sequences x 2 KV heads.
    assert grid == (6 * 4,)
    assert kwargs["num_seqs"] == 2
    # Pages of the [blocks, 2, heads, slots, head] cache, as rows of the K view.
    assert kwargs["ROWS_PER_BLOCK"] == 2 * 2 * 64
    assert kwargs["ROWS_PER_HEAD"] == 64
    assert kwargs["seq_start"] == 1


def test_head_96_runs_in_128_columns_of_zeros_past_the_row(pretend_hopper):
    """K/V boxes of the padded width over cache rows of the head size: TMA reads
    the columns past a row as zeros. The kernel masks the query and output
    columns by HEAD_SIZE."""
    kernel, _, kwargs = _gluon_launch(*_tensors(head_size=96, group=1))
    assert kernel is hopper.hopper_prefill_kernel
    assert kwargs["HEAD_SIZE"] == 96
    for desc in (kwargs["k_desc"], kwargs["v_desc"]):
        assert list(desc.block_shape) == [64, 128]
        assert list(desc.shape)[1] == 96 and desc.padding == "zero"
    assert kwargs["ROWS_PER_HEAD"] == 64
    assert kwargs["SPLIT_HEAD"] is False
    assert kwargs["k_hi_desc"] is None and kwargs["v_hi_desc"] is None


def test_three_consumer_warpgroups_take_192_rows(pretend_hopper):
    """192-row tiles: a grid of 192-row programs, the kernel's BLOCK_M of three
    consumer warpgroups; 128-row tiles keep two."""
    three = dataclasses.replace(GLUON_TILE, block_m=192)
    kernel, grid, kwargs = _gluon_launch(*_tensors(head_size=64, group=7), three)
    assert kernel is hopper.hopper_prefill_kernel
    # 100 tokens x 7 heads in 4 tiles of 192 rows, for 3 sequences x 2 KV heads.
    assert grid == (4 * 6,)
    assert kwargs["BLOCK_M"] == 192
    _, grid, kwargs = _gluon_launch(*_tensors(head_size=64, group=7))
    assert kwargs["BLOCK_M"] == 128 and grid == (6 * 6,)


def test_overlap_pv_is_the_configs_and_the_gluon_kernels_only(pretend_hopper):
    """``overlap_pv`` reaches the kernel as its constexpr; a sweep keeps it to
    Gluon candidates (the portable kernel has no such flag)."""
    tensors = _tensors(head_size=64, group=4)
    three = dataclasses.replace(GLUON_TILE, block_m=192)
    _, _, kwargs = _gluon_launch(*tensors, three)
    assert kwargs["OVERLAP_PV"] is False
    overlap = dataclasses.replace(three, overlap_pv=True)
    _, _, kwargs = _gluon_launch(*tensors, overlap)
    assert kwargs["OVERLAP_PV"] is True
    ok = dict(head_size=64, kv_dtype=torch.bfloat16)
    assert is_valid_config(overlap, **ok)
    portable = dataclasses.replace(overlap, block_m=128, gluon=False)
    assert is_valid_config(dataclasses.replace(portable, overlap_pv=False), **ok)
    assert not is_valid_config(portable, **ok)


SPLIT_TILE = dataclasses.replace(GLUON_TILE, split_head=True)


def test_head_96_split_head_runs_in_64_and_32_column_boxes(pretend_hopper):
    """split_head on a gluon config at head size 96: the plan keeps the Gluon
    kernel with the config, and its launch sets SPLIT_HEAD with a descriptor
    pair per column part of the cache rows of 96: boxes of 64 and 32 columns,
    each in its own width's shared-memory layout."""
    query, cache = _tensors(head_size=96, group=1)
    _, plan = _plan(query, cache, SPLIT_TILE, num_seqs=3, max_query_len=100)
    assert (plan.kernel, plan.config) == ("gluon", SPLIT_TILE)
    kernel, _, kwargs = _gluon_launch(query, cache, config=SPLIT_TILE)
    assert kernel is hopper.hopper_prefill_kernel
    assert kwargs["SPLIT_HEAD"] is True and kwargs["HEAD_SIZE"] == 96
    for cache_view, lo, hi in (
        (cache[:, 0], kwargs["k_desc"], kwargs["k_hi_desc"]),
        (cache[:, 1], kwargs["v_desc"], kwargs["v_hi_desc"]),
    ):
        assert list(lo.block_shape) == [64, 64] and list(hi.block_shape) == [64, 32]
        for desc in (lo, hi):
            assert list(desc.shape)[1] == 96
            assert desc.base.data_ptr() == cache_view.data_ptr()
        # 128-byte rows of the first part, 64-byte rows of the second.
        assert (lo.layout.swizzle_byte_width, hi.layout.swizzle_byte_width) == (
            128, 64)  # fmt: skip


@pytest.mark.parametrize(
    "head_size, dtype, match",
    [
        (96, torch.float8_e4m3fn, "16-bit caches only"),
        (128, torch.bfloat16, "not 128 (no split)"),
        (64, torch.bfloat16, "not 64 (no split)"),
    ],
)
def test_split_head_the_gluon_kernel_does_not_split_runs_the_portable_kernel(
    pretend_hopper, head_size, dtype, match
):
    """A split_head gluon config the Hopper kernel cannot split (an fp8 cache,
    whose fp16 V copy is padded; a head size that does not split) is refused with
    the reason, and the plan runs the portable kernel with the key's heuristic
    config, not the Gluon tiles."""
    query, cache = _tensors(head_size=head_size, group=1, dtype=dtype)
    config = dataclasses.replace(SPLIT_TILE, fp8_qk=dtype == torch.float8_e4m3fn)
    assert match in _refusal(query, cache, config)
    layer, plan = _plan(query, cache, config)
    assert plan.kernel == "triton"
    assert plan.config == prefix_prefill.portable_config(layer, query.device, 16)


def test_fp8_cache_launch_quantises_the_query_and_reads_fp8_boxes(pretend_hopper):
    """An e4m3 cache with fp8_qk: the Gluon kernel's descriptors are over the fp8
    cache (its boxes as for a 16-bit one), and the launch passes the cache's
    scales and the format's largest value (the query's quantisation)."""
    k_scale, v_scale = torch.tensor([0.5]), torch.tensor([2.0])
    kernel, _, kwargs = _gluon_launch(
        *_tensors(dtype=torch.float8_e4m3fn),
        config=dataclasses.replace(GLUON_TILE, fp8_qk=True),
        k_scale=k_scale,
        v_scale=v_scale,
    )
    assert kernel is hopper.hopper_prefill_kernel
    assert kwargs["k_scale_ptr"] is k_scale and kwargs["v_scale_ptr"] is v_scale
    assert kwargs["FP8_MAX"] == 448.0
    for desc in (kwargs["k_desc"], kwargs["v_desc"]):
        assert desc.base.dtype == torch.float8_e4m3fn
        assert list(desc.block_shape) == [64, 128]
    # A 16-bit cache passes no scales.
    _, _, kwargs = _gluon_launch(*_tensors())
    assert kwargs["k_scale_ptr"] is None and kwargs["FP8_MAX"] == 0.0


def test_valid_gluon_configs_are_warpgroups_of_64_rows():
    ok = dict(head_size=128, kv_dtype=torch.bfloat16)
    assert is_valid_config(GLUON_TILE, **ok)
    assert is_valid_config(dataclasses.replace(GLUON_TILE, block_n=64), **ok)
    assert not is_valid_config(dataclasses.replace(GLUON_TILE, num_warps=8), **ok)
    assert not is_valid_config(dataclasses.replace(GLUON_TILE, block_m=64), **ok)
    # Three consumer warpgroups: 192 rows at head 64 on 16-bit caches.
    three = dataclasses.replace(GLUON_TILE, block_m=192)
    assert is_valid_config(three, head_size=64, kv_dtype=torch.bfloat16)
    assert not is_valid_config(three, **ok)
    assert not is_valid_config(
        dataclasses.replace(three, fp8_qk=True), head_size=64, kv_dtype="fp8"
    )
    assert not is_valid_config(dataclasses.replace(GLUON_TILE, block_m=256), **ok)
    assert not is_valid_config(dataclasses.replace(GLUON_TILE, num_stages=1), **ok)
    assert not is_valid_config(dataclasses.replace(GLUON_TILE, block_n=32), **ok)
    # Fields the Gluon kernel does not have (it loads by TMA, longest first).
    assert not is_valid_config(dataclasses.replace(GLUON_TILE, use_tma=False), **ok)
    assert not is_valid_config(
        dataclasses.replace(GLUON_TILE, longest_first=False), **ok
    )
    # fp8 caches: the converter's ring of fp16 V tiles counts too, so head 256
    # takes 64-key tiles only.
    fp8 = dataclasses.replace(GLUON_TILE, fp8_qk=True)
    assert is_valid_config(fp8, head_size=128, kv_dtype=torch.float8_e4m3fn)
    assert not is_valid_config(fp8, head_size=256, kv_dtype=torch.float8_e4m3fn)
    assert is_valid_config(
        dataclasses.replace(fp8, block_n=64), head_size=256, kv_dtype="fp8"
    )
    # split_head: head size 96 on 16-bit caches only.
    split = dataclasses.replace(GLUON_TILE, split_head=True)
    assert is_valid_config(split, head_size=96, kv_dtype=torch.bfloat16)
    assert is_valid_config(split, head_size=96, kv_dtype=torch.float16)
    assert not is_valid_config(split, head_size=128, kv_dtype=torch.bfloat16)
    assert not is_valid_config(
        dataclasses.replace(split, fp8_qk=True), head_size=96, kv_dtype="fp8"
    )


def test_shipped_gluon_entries_run_the_gluon_kernel(pretend_hopper):
    """Every table entry that sets ``gluon`` is one the Gluon kernel takes for
    its key's shape (on Hopper, without ALiBi or a split), and a bf16 entry for
    the fp16 queries it stands in for: no shipped entry falls back to the
    portable kernel unnoticed."""
    import json

    from vllm.attention.ops.tuning import tables
    from vllm.attention.ops.tuning.prefill_configs import PREFILL_TABLE

    dtypes = {
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "fp8": torch.float8_e4m3fn,  # the Gluon kernel's fp8 format
    }
    entries = 0
    for path in sorted(tables.TUNING_DIR.glob("prefix_prefill_*.json")):
        gpu = json.loads(path.read_text())["provenance"]["gpu"]
        for key, config in PREFILL_TABLE.load(gpu).items():
            if not config.gluon:
                continue
            fields = dict(zip(PREFILL_TABLE.key_fields, key))
            query, cache = _tensors(
                head_size=fields["head_size"],
                group=fields["group"],
                block_size=fields["block_size"],
                dtype=dtypes[fields["kv_dtype"]],
            )
            query = query.to(dtypes[fields["q_dtype"]])
            assert _refusal(query, cache, config) is None, (path.name, key, config)
            entries += 1
            if fields["q_dtype"] == "bfloat16":  # fp16 queries take it too
                if fields["kv_dtype"] == "bfloat16":
                    cache = cache.to(torch.float16)
                assert _refusal(query.to(torch.float16), cache, config) is None, (
                    path.name, key, config, "fp16")  # fmt: skip
    assert entries > 0


TILE_64 = dataclasses.replace(GLUON_TILE, block_n=64)
# Three consumer warpgroups with the softmax overlapping each one's own p.v, as
# the H200 table runs them (head 64).
TILE_192 = dataclasses.replace(GLUON_TILE, block_m=192, overlap_pv=True)
# (head size, group, page size, config, (query_len, kv_len) rows, sliding window,
# soft-cap)
GPU_CASES = [
    # A second warpgroup with no row of the query (1 token x 4 heads), tails
    # shorter than a page slice, pages of 16 and 128, windows.
    (128, 4, 64, GLUON_TILE, [(1, 1), (37, 100), (200, 200), (64, 1000), (513, 2000)]),
    (128, 7, 128, GLUON_TILE, [(1, 70), (300, 300), (129, 640)]),
    (
        128,
        1,
        64,
        dataclasses.replace(GLUON_TILE, block_n=64, num_stages=3),
        [(700, 700), (5, 64)],
    ),
    (64, 8, 64, dataclasses.replace(GLUON_TILE, num_stages=3), [(257, 257), (33, 999)]),
    (256, 2, 64, dataclasses.replace(GLUON_TILE, block_n=64), [(300, 300), (70, 1000)]),
    # Head 96 in 128 columns (Phi-3-mini: group 1), with a window.
    (96, 1, 64, GLUON_TILE, [(1, 1), (300, 300), (129, 1000)]),
    (96, 4, 16, TILE_64, [(77, 300), (513, 513)], 200),
    (128, 2, 16, GLUON_TILE, [(77, 300), (250, 250)]),
    (128, 4, 64, GLUON_TILE, [(64, 1000), (513, 2000), (300, 300)], 200),
    (128, 7, 64, GLUON_TILE, [(129, 640), (1, 70), (400, 400)], 50),
    (64, 1, 64, dataclasses.replace(GLUON_TILE, num_stages=3), [(130, 1000)], 1),
    # Soft-cap (Gemma-2: head 256, group 2, cap 50, with and without a window).
    (256, 2, 64, TILE_64, [(300, 300), (70, 1000)], None, 50.0),
    (256, 2, 64, TILE_64, [(300, 700), (129, 640)], 200, 50.0),
    (128, 4, 64, GLUON_TILE, [(513, 2000), (37, 100)], None, 5.0),
    # The softmax overlapping its warpgroup's own p.v on two warpgroups.
    (
        128,
        4,
        64,
        dataclasses.replace(GLUON_TILE, overlap_pv=True),
        [(37, 100), (513, 2000)],
        200,
    ),
    # Sinks (gpt-oss: head 64, group 8, a window of 128 on every other layer),
    # alone and with a soft-cap.
    (64, 8, 16, GLUON_TILE, [(1, 1), (300, 300), (129, 1000)], 128, None, True),
    (64, 8, 16, GLUON_TILE, [(77, 300), (513, 513)], None, None, True),
    (128, 4, 64, GLUON_TILE, [(513, 2000), (37, 100)], None, 5.0, True),
    # Three consumer warpgroups (192 rows, head 64): a third warpgroup with no row
    # of the query, programs of one key tile, tails shorter than a page slice, a
    # window, sinks (gpt-oss), a soft-cap.
    (64, 1, 64, TILE_192, [(1, 1), (100, 100), (130, 1000), (700, 700)]),
    (64, 4, 64, TILE_192, [(37, 100), (513, 2000), (48, 48)]),
    (64, 8, 16, TILE_192, [(1, 1), (300, 300), (129, 1000)], 128, None, True),
    (64, 8, 64, TILE_192, [(77, 300), (513, 513)], None, None, True),
    (64, 2, 128, dataclasses.replace(TILE_192, num_stages=3), [(257, 257)], 50, 5.0),
]


def _check_on_hopper(case, q_dtype, cache_dtype=None, tolerance=None):
    """One GPU case through the public function with the Gluon config, against
    the reference (the query dtype's tolerance unless given). An fp8 cache gets
    randn K/V quantised with per-tensor scales; ``tolerance="fp8-grid"`` puts the
    query on the fp8 grid first, so its quantisation is exact (head size 64)."""
    head_size, group, block_size, config, seqs, *features = case
    window, soft_cap, with_sinks = (*features, None, None, False)[:3]
    batch = make_paged_batch(
        seqs=seqs,
        num_q_heads=2 * group,
        num_kv_heads=2,
        head_size=head_size,
        block_size=block_size,
        q_dtype=q_dtype,
        cache_dtype=cache_dtype,
        seed=group,
        device=DEVICE,
    )
    # Sinks of either sign and of the scores' size (gpt-oss's are learned logits).
    generator = torch.Generator().manual_seed(group)
    sinks = (
        (2 * torch.randn(2 * group, generator=generator)).to(DEVICE)
        if with_sinks
        else None
    )
    if tolerance == "fp8-grid":
        put_query_on_fp8_grid(batch, cache_dtype, head_size)
        tolerance = None
    assert _refusal(batch.query, batch.kv_cache, config, sinks=sinks) is None
    output = torch.full_like(batch.query, float("nan"))
    prefix_prefill_attention(
        query=batch.query,
        key_cache=batch.key_cache,
        value_cache=batch.value_cache,
        output=output,
        block_table=batch.block_table,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        max_query_len=batch.max_query_len,
        softmax_scale=head_size**-0.5,
        k_scale=batch.k_scale,
        v_scale=batch.v_scale,
        sliding_window=window,
        logits_soft_cap=soft_cap,
        sinks=sinks,
        config=config,
        num_splits=1,
    )
    expected = ref_paged_attention(
        **batch.ref_kwargs(),
        softmax_scale=head_size**-0.5,
        sliding_window=window,
        logits_soft_cap=soft_cap,
        sinks=sinks,
    )
    dtype, atol, rtol = tolerance or TOLERANCES[q_dtype]
    assert_close(output, expected, dtype=dtype, atol=atol, rtol=rtol)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 only")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_matches_reference_on_hopper(case, q_dtype):
    _check_on_hopper(case, q_dtype)


FP8_TILE = dataclasses.replace(GLUON_TILE, fp8_qk=True)
# As GPU_CASES, on e4m3 caches: every head size, pages of 16 and 64, a window,
# Gemma-2's soft-cap at head 256 (64-key tiles: the converter's fp16 V ring takes
# shared memory).
GPU_FP8_CASES = [
    (128, 4, 64, FP8_TILE, [(1, 1), (37, 100), (200, 200), (64, 1000), (513, 2000)]),
    (
        128,
        8,
        16,
        dataclasses.replace(FP8_TILE, block_n=64, num_stages=3),
        [(300, 300), (129, 640)],
        200,
    ),
    (64, 1, 64, dataclasses.replace(FP8_TILE, num_stages=3), [(257, 257), (33, 999)]),
    (96, 1, 64, FP8_TILE, [(300, 300), (129, 1000)]),
    (64, 8, 16, FP8_TILE, [(300, 300), (129, 1000)], 128, None, True),  # sinks
    (
        256,
        2,
        64,
        dataclasses.replace(FP8_TILE, block_n=64),
        [(300, 700), (70, 1000)],
        None,
        50.0,
    ),
]


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 only")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", GPU_FP8_CASES, ids=str)
def test_fp8_cache_matches_reference_on_hopper(case, q_dtype):
    """The query rounded to e4m3: the portable kernel's fp8_qk tolerance."""
    _check_on_hopper(
        case, q_dtype, cache_dtype=torch.float8_e4m3fn, tolerance=FP8_QK_TOLERANCE
    )


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 only")
def test_fp8_cache_with_the_query_on_the_fp8_grid_is_exact_to_bf16_tolerance():
    """A query already on the e4m3 grid, its largest element in every row: each
    consumer's quantisation is exact, so a wrong query, key or value scale fails
    the bf16 tolerance."""
    case = (64, 4, 64, FP8_TILE, [(300, 300), (129, 640), (1, 70)])
    _check_on_hopper(
        case, torch.bfloat16, cache_dtype=torch.float8_e4m3fn, tolerance="fp8-grid"
    )


SPLIT_TILE_64 = dataclasses.replace(SPLIT_TILE, block_n=64, num_stages=3)
# Head size 96 as column parts of 64 and 32 (split_head), as GPU_CASES: groups 1,
# 4 and 8 (Phi-3: 1), pages of 16, 64 and 128, 2 and 3 stages, a window, soft-cap
# and sinks (with a window and a soft-cap, and alone); a second warpgroup with no
# row of the query and tails shorter than a page slice.
GPU_SPLIT_HEAD_CASES = [
    (96, 1, 64, SPLIT_TILE, [(1, 1), (37, 100), (300, 300), (129, 1000)]),
    (96, 4, 16, SPLIT_TILE_64, [(77, 300), (513, 513)], 200),
    (96, 8, 128, SPLIT_TILE, [(1, 70), (300, 300), (129, 640)], None, 30.0),
    (
        96,
        4,
        64,
        dataclasses.replace(SPLIT_TILE, num_stages=3),
        [(513, 2000), (37, 100)],
        128,
        5.0,
        True,
    ),
    (96, 1, 16, SPLIT_TILE, [(300, 300), (70, 1000)], None, None, True),
    (96, 8, 64, SPLIT_TILE_64, [(64, 1000), (250, 250)], 50),
]


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon kernel runs on sm_90 only")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", GPU_SPLIT_HEAD_CASES, ids=str)
def test_split_head_matches_reference_on_hopper(case, q_dtype):
    """The Gluon kernel's SPLIT_HEAD launch (a split_head gluon config at head
    size 96, which the plan keeps: the launch test above) against the reference,
    on NaN-poisoned caches."""
    _check_on_hopper(case, q_dtype)
