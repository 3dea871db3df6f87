# SPDX-License-Identifier: Apache-2.0
"""paged_decode_attention against ref_paged_attention.

CPU (TRITON_INTERPRET=1, set by conftest): ``CASES`` samples the feature matrix on
tiny shapes, each head size, GQA ratio, block size, dtype and feature at least once,
each with and without split-KV. GPU with GPU_FULL=1: the cross product
(``test_decode_full_matrix``), int64 offsets and CUDA-graph replay.
"""

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.kernels.conftest import (
    BLOCK_SIZES,
    DEVICE,
    GQA_GROUPS,
    HEAD_SIZES,
    ON_GPU,
    TOLERANCES,
    assert_close,
    fp8_skip_reason,
    make_paged_batch,
)
from vllm.attention.ops.reference import ref_paged_attention
from vllm.attention.ops.triton_paged_decode_attention_2d import (
    MAX_DECODE_SPLITS,
    SPLIT_LIMIT,
    SPLIT_TARGET_WAVES,
    WORKSPACE_DTYPE,
    DecodePlanner,
    choose_decode_splits,
    decode_wave_rule,
    decode_workspace_shape,
    paged_decode_attention,
)
from vllm.attention.ops.tuning import decode_configs as dc
from vllm.attention.ops.tuning import tables

# Context lengths of one CPU batch: 1 (a single key), a partial page, several pages
# with a partial last tile, and 0 (a CUDA-graph padding row: output must be 0).
CPU_SEQ_LENS = (1, 13, 70, 0)


def _features(
    batch, num_q_heads, *, window=None, alibi=False, softcap=None, sinks=False, seed=1
):
    gen = torch.Generator().manual_seed(seed)
    kw = {}
    if window is not None:
        kw["sliding_window"] = window
    if alibi:
        # Slopes of a real ALiBi model are 2**-(8 i / H); any positive values do.
        kw["alibi_slopes"] = (torch.rand(num_q_heads, generator=gen) * 0.5).to(DEVICE)
    if softcap is not None:
        kw["logits_soft_cap"] = softcap
    if sinks:
        kw["sinks"] = (torch.randn(num_q_heads, generator=gen) * 2).to(DEVICE)
    return kw


def _run_and_compare(
    *,
    seq_lens,
    num_kv_heads,
    group,
    head_size,
    block_size,
    q_dtype,
    cache_dtype,
    num_splits,
    features,
    seq_start=0,
    workspace=False,
    seed=0,
    config=None,
):
    num_q_heads = num_kv_heads * group
    batch = make_paged_batch(
        seqs=[(1, s) for s in seq_lens],
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        q_dtype=q_dtype,
        cache_dtype=cache_dtype,
        seed=seed,
    )
    kw = _features(batch, num_q_heads, **features)
    scale = 1.0 / math.sqrt(head_size)
    # Sentinel: rows the launch must not touch keep it; rows it writes lose it.
    output = torch.full_like(batch.query, 7.0)
    num_seqs = len(seq_lens) - seq_start
    ws = None
    if workspace and num_splits > 1:
        shape = decode_workspace_shape(
            max_num_seqs=num_seqs + 2,
            num_q_heads=num_q_heads,
            head_size=head_size,
            num_splits=num_splits,
        )
        ws = torch.full(shape, float("nan"), dtype=WORKSPACE_DTYPE, device=DEVICE)
    paged_decode_attention(
        query=batch.query,
        key_cache=batch.key_cache,
        value_cache=batch.value_cache,
        output=output,
        block_table=batch.block_table,
        seq_lens=batch.seq_lens,
        softmax_scale=scale,
        seq_start=seq_start,
        num_seqs=num_seqs,
        k_scale=batch.k_scale,
        v_scale=batch.v_scale,
        num_splits=num_splits,
        workspace=ws,
        config=config,
        **kw,
    )
    ref = ref_paged_attention(**batch.ref_kwargs(), softmax_scale=scale, **kw)
    _, atol, rtol = TOLERANCES[q_dtype]
    what = (
        f"decode out (splits={num_splits}, d={head_size}, group={group}, "
        f"bs={block_size}, kv={cache_dtype}, {sorted(features)})"
    )
    assert_close(
        output[seq_start:],
        ref[seq_start:],
        dtype=q_dtype,
        atol=atol,
        rtol=rtol,
        what=what,
    )
    assert (output[:seq_start] == 7.0).all(), "rows before seq_start were written"


# One CPU case per feature/shape value; each runs unsplit and split. Fields:
# (head_size, group, num_kv_heads, block_size, q_dtype, cache_dtype, features).
BF16, FP16 = torch.bfloat16, torch.float16
E4M3 = torch.float8_e4m3fn
CASES = {
    "d128_gqa4_bs16": (128, 4, 2, 16, BF16, BF16, {}),
    "d64_mha_bs32_fp16": (64, 1, 2, 32, FP16, FP16, {}),
    "d80_gqa2_bs64": (80, 2, 1, 64, BF16, BF16, {}),
    "d96_gqa7_bs16": (96, 7, 1, 16, FP16, FP16, {}),
    "d112_gqa8_bs128": (112, 8, 1, 128, BF16, BF16, {}),
    "d192_gqa16_bs16": (192, 16, 1, 16, BF16, BF16, {}),
    "d256_gqa2_bs32": (256, 2, 1, 32, FP16, FP16, {}),
    # The shared contract's edges (prefill takes them too): the smallest head size,
    # pages smaller than a KV tile (a tile spans many pages), one key per page.
    "d16_gqa4_bs8": (16, 4, 1, 8, BF16, BF16, {}),
    "d64_gqa2_bs1": (64, 2, 1, 1, FP16, FP16, {}),
    "fp8_e4m3fn_bf16": (128, 4, 1, 16, BF16, E4M3, {}),
    "fp8_e4m3fn_fp16": (64, 2, 1, 32, FP16, E4M3, {}),
    "fp8_e4m3fnuz": (64, 2, 1, 16, BF16, torch.float8_e4m3fnuz, {}),
    "fp8_e5m2": (64, 4, 2, 16, BF16, torch.float8_e5m2, {}),
    "window": (64, 4, 1, 16, BF16, BF16, {"window": 20}),
    "window_1": (64, 2, 1, 16, FP16, FP16, {"window": 1}),
    "alibi": (64, 4, 1, 16, FP16, FP16, {"alibi": True}),
    "softcap": (64, 2, 1, 32, BF16, BF16, {"softcap": 2.0}),
    # 0 means "no soft-cap" in every entry point (and in the reference).
    "softcap_0_off": (64, 2, 1, 32, BF16, BF16, {"softcap": 0.0}),
    "sinks": (64, 4, 1, 16, BF16, BF16, {"sinks": True}),
    "all_features_fp8": (
        80,
        7,
        1,
        16,
        BF16,
        E4M3,
        {"window": 33, "alibi": True, "softcap": 3.0, "sinks": True},
    ),
}


def _run_case(case, num_splits, config=None):
    """One entry of CASES against the reference (``config``: the kernel's default
    lookup unless given)."""
    head_size, group, kv_heads, block_size, q_dtype, cache_dtype, feats = CASES[case]
    if reason := fp8_skip_reason(cache_dtype):
        pytest.skip(reason)
    _run_and_compare(
        seq_lens=CPU_SEQ_LENS,
        num_kv_heads=kv_heads,
        group=group,
        head_size=head_size,
        block_size=block_size,
        q_dtype=q_dtype,
        cache_dtype=cache_dtype,
        num_splits=num_splits,
        features=feats,
        workspace=True,
        config=config,
    )


@pytest.mark.parametrize("num_splits", [1, 4], ids=["2d", "split4"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_decode_features(case, num_splits):
    _run_case(case, num_splits)


@pytest.mark.parametrize("num_splits", sorted({2, 3, 16, MAX_DECODE_SPLITS}))
def test_split_counts_and_empty_splits(num_splits):
    # 3 splits: uneven shares; 16 splits over <= 5 tiles: most splits are empty and
    # must contribute nothing. The workspace starts as NaN (no stale reads).
    _run_and_compare(
        seq_lens=(300, 5, 64),
        num_kv_heads=2,
        group=2,
        head_size=64,
        block_size=16,
        q_dtype=torch.float16,
        cache_dtype=torch.float16,
        num_splits=num_splits,
        features={"sinks": True},
        workspace=True,
    )


@pytest.mark.parametrize("num_splits", [1, 2])
def test_window_edge_bulk_and_tail_in_one_range(num_splits):
    # Context 300, window 150, 64-key tiles: a masked window-edge tile, unmasked
    # bulk tiles and a masked partial tail; 129 and 64 end on/after tile edges.
    _run_and_compare(
        seq_lens=(300, 129, 64), num_kv_heads=1, group=2, head_size=64,
        block_size=16, q_dtype=torch.float16, cache_dtype=torch.float16,
        num_splits=num_splits, features={"window": 150, "alibi": True},
        workspace=True,
    )  # fmt: skip


@pytest.mark.parametrize("num_splits", [1, 2])
def test_seq_start_subrange(num_splits):
    # A launch over sequences [2, 4) must leave rows 0 and 1 alone.
    _run_and_compare(
        seq_lens=(9, 40, 17, 3),
        num_kv_heads=1,
        group=4,
        head_size=64,
        block_size=16,
        q_dtype=torch.bfloat16,
        cache_dtype=torch.bfloat16,
        num_splits=num_splits,
        features={},
        seq_start=2,
        workspace=True,
    )


def test_split_without_workspace_allocates():
    # The non-graph convenience path: no workspace given, num_splits > 1.
    _run_and_compare(
        seq_lens=(50,),
        num_kv_heads=1,
        group=2,
        head_size=64,
        block_size=16,
        q_dtype=torch.bfloat16,
        cache_dtype=torch.bfloat16,
        num_splits=2,
        features={},
        workspace=False,
    )


def _wave_cost(work, resident, s, rule):
    """The wave model: waves of programs, each split one paying the overhead."""
    o = rule.program_overhead
    program = 1.0 if s == 1 else o + (1 - o) / s
    return -(-work * s // resident) * program


def test_wave_aware_split_rule_past_the_target():
    """With a powers-of-two ``WaveRule``, a grid past the target splits where its
    last wave would run mostly idle (Llama-3.1-8B's 8 KV heads on an H200's 132
    SMs, 4 resident bf16 programs per SM: 77 sequences are 616 programs, 1.17 waves
    of 528); grids under the target keep the default rule, and without a rule
    nothing past the target splits."""
    from vllm.attention.ops.triton_paged_decode_attention_2d import fewest_waves
    from vllm.attention.ops.tuning.decode_configs import MAX_WAVE_SPLITS

    rule = dc.WaveRule(programs_per_sm=4)
    assert not rule.any_count

    def splits(num_seqs):
        return choose_decode_splits(
            num_seqs=num_seqs, num_kv_heads=8, num_sms=132, wave=rule
        )

    assert splits(77) == 2 and splits(128) == 1  # 1.17 waves; 1.94 waves
    for num_seqs in range(1, 600):
        default = choose_decode_splits(num_seqs=num_seqs, num_kv_heads=8, num_sms=132)
        n = splits(num_seqs)
        if num_seqs * 8 < SPLIT_TARGET_WAVES * 132:
            assert n == default, num_seqs
        else:
            assert default == 1 and 1 <= n <= MAX_WAVE_SPLITS, num_seqs
            assert n & (n - 1) == 0, num_seqs

    for work in range(400, 3000, 37):
        s = fewest_waves(work=work, resident=528, max_splits=8, wave=rule)
        assert all(_wave_cost(work, 528, s, rule) <= _wave_cost(work, 528, t, rule)
                   + 1e-9 for t in (1, 2, 4, 8)), work  # fmt: skip
    assert fewest_waves(work=528 * 4, resident=528, max_splits=8, wave=rule) == 1


def test_wave_aware_split_rule_with_any_count():
    """An ``any_count`` rule (fp8's: 3 programs per SM, overhead 0.05) picks among
    every count up to MAX_WAVE_SPLITS, also under the target, wherever that many
    splits fill a wave: 16 sequences (128 programs) split in 3, one full wave of
    384 where 4 splits would start a second; smaller grids keep the default rule."""
    from vllm.attention.ops.triton_paged_decode_attention_2d import fewest_waves
    from vllm.attention.ops.tuning.decode_configs import MAX_WAVE_SPLITS

    rule = dc.WaveRule(programs_per_sm=3, program_overhead=0.05, any_count=True)
    resident = 3 * 132

    def splits(num_seqs):
        return choose_decode_splits(
            num_seqs=num_seqs, num_kv_heads=8, num_sms=132, wave=rule
        )

    got = {b: splits(b) for b in (6, 7, 8, 16, 32, 64, 96, 128, 192, 256)}
    assert got == {6: 16, 7: 7, 8: 6, 16: 3, 32: 3, 64: 3, 96: 1, 128: 3, 192: 1,
                   256: 2}  # fmt: skip
    for num_seqs in range(1, 600):
        work, n = num_seqs * 8, splits(num_seqs)
        if work * MAX_WAVE_SPLITS < resident:
            default = choose_decode_splits(
                num_seqs=num_seqs, num_kv_heads=8, num_sms=132
            )
            assert n == default, num_seqs
            continue
        assert 1 <= n <= MAX_WAVE_SPLITS, num_seqs
        assert all(_wave_cost(work, resident, n, rule)
                   <= _wave_cost(work, resident, t, rule) + 1e-9
                   for t in range(1, MAX_WAVE_SPLITS + 1)), num_seqs  # fmt: skip
    # The cap of the call holds.
    assert fewest_waves(work=64, resident=resident, max_splits=4, wave=rule) == 4
    assert (
        choose_decode_splits(
            num_seqs=16, num_kv_heads=8, num_sms=132, max_splits=2, wave=rule
        )
        == 2
    )


def test_wave_rule_cap_reaches_small_batches():
    """fp8's ``WaveRule``, whose ``max_splits`` is the decode cap (64), fills one
    wave at the batches under the target that 8 splits cannot fill (8 KV heads:
    batch 4 gets 12 splits, 384 programs in one wave of 396, where the target rule
    gives 16, 512 programs in 1.3 waves); from the batches that 8 splits fill
    upwards it chooses what a cap of 8 chooses."""
    wide = dc.WAVE_RULES["fp8"]
    assert wide.max_splits == MAX_DECODE_SPLITS
    fp8 = dataclasses.replace(wide, max_splits=dc.MAX_WAVE_SPLITS)

    def splits(num_seqs, rule):
        return choose_decode_splits(
            num_seqs=num_seqs, num_kv_heads=8, num_sms=132, wave=rule
        )

    assert {b: splits(b, fp8) for b in range(1, 7)} == {
        1: 64, 2: 32, 3: 32, 4: 16, 5: 16, 6: 16}  # fmt: skip
    assert {b: splits(b, wide) for b in range(1, 7)} == {
        1: 49, 2: 24, 3: 16, 4: 12, 5: 9, 6: 8}  # fmt: skip
    for num_seqs in range(7, 600):
        assert splits(num_seqs, wide) == splits(num_seqs, fp8), num_seqs
    # the call's cap still holds
    assert choose_decode_splits(num_seqs=1, num_kv_heads=8, num_sms=132,
                                max_splits=32, wave=wide) == 32  # fmt: skip


def test_choose_decode_splits():
    for num_kv_heads, num_sms in [(8, 132), (4, 132), (1, 304), (8, 1)]:
        target = SPLIT_TARGET_WAVES * num_sms
        prev = MAX_DECODE_SPLITS
        for num_seqs in range(1, 600):
            n = choose_decode_splits(
                num_seqs=num_seqs, num_kv_heads=num_kv_heads, num_sms=num_sms
            )
            work = num_seqs * num_kv_heads
            assert 1 <= n <= MAX_DECODE_SPLITS and n & (n - 1) == 0, n
            assert n <= prev, "more sequences must never mean more splits"
            prev = n
            # The smallest power of two that reaches the target grid, or the cap.
            assert n == MAX_DECODE_SPLITS or n * work >= target, (num_seqs, n)
            assert n == 1 or (n // 2) * work < target, (num_seqs, n)
    # Llama-3.1-8B (8 KV heads) on an H200 (132 SMs).
    splits = {
        b: choose_decode_splits(num_seqs=b, num_kv_heads=8, num_sms=132)
        for b in (1, 2, 3, 4, 6, 7, 8, 16, 34, 50)
    }
    assert splits == {
        1: 64,
        2: 32,
        3: 32,
        4: 16,
        6: 16,
        7: 8,
        8: 8,
        16: 4,
        34: 2,
        50: 1,
    }
    assert choose_decode_splits(num_seqs=0, num_kv_heads=8, num_sms=132) == 64


def test_decode_planner_is_wave_aware_where_the_data_says():
    """fp8 and bf16 caches on sm_90 (and the CPU interpreter, which plans as an
    H200) take the tuning data's wave-aware split rule, fp16 caches bf16's.
    Llama-3.1-8B heads, 132 SMs: fp8 (3 programs per SM, any count)
    splits batch 64 (512 programs, 1.3 waves of 396) in 3 and keeps batch 96
    (768, 1.94 waves) whole; bf16 (4 per SM, any count) keeps batch 64 (one
    wave of 528) whole, splits batch 77 (616 programs, 1.17 waves) in 2, batch
    40 (320 programs) in 3 (960: two waves of programs a third as long, where 2
    splits make 640, two waves of half-length programs) and batch 12 in 5 (480,
    one wave, where the target rule's 8 make 768, 1.45 waves)."""

    def planner(kv_dtype):
        return DecodePlanner(
            device=torch.device("cpu"), num_q_heads=32, num_kv_heads=8,
            head_size=128, q_dtype=torch.bfloat16, kv_dtype=kv_dtype, block_size=16,
            max_num_seqs=256, num_sms=132,
        )  # fmt: skip

    fp8_rule = dc.wave_rule(kv_dtype=torch.float8_e4m3fn, hopper=True)
    assert fp8_rule == dc.WAVE_RULES["fp8"]
    assert (fp8_rule.programs_per_sm, fp8_rule.any_count) == (3, True)
    fp8 = planner(torch.float8_e4m3fn)
    assert [fp8.plan(n)[0] for n in (16, 32, 64, 96, 128)] == [3, 3, 3, 1, 3]
    assert fp8.workspaces[3].shape[0] >= 128
    bf16_rule = dc.wave_rule(kv_dtype=torch.bfloat16, hopper=True)
    assert (bf16_rule.programs_per_sm, bf16_rule.any_count) == (4, True)
    bf16, fp16 = planner(torch.bfloat16), planner(torch.float16)
    assert [bf16.plan(n)[0] for n in (64, 77, 96, 102, 128)] == [1, 2, 2, 1, 1]
    assert [bf16.plan(n)[0] for n in (12, 24, 40, 46)] == [5, 2, 3, 1]
    assert dc.wave_rule(kv_dtype=torch.float16, hopper=True) == bf16_rule
    assert fp16.plan(77)[0] == 2
    for n in range(1, 257):
        for plan, rule in ((fp8, fp8_rule), (bf16, bf16_rule), (fp16, bf16_rule)):
            want = choose_decode_splits(
                num_seqs=n, num_kv_heads=8, num_sms=132, wave=rule
            )
            assert plan.plan(n)[0] == want, (n, rule)
    # Not on other GPUs, nor for a dtype the data does not list.
    assert dc.wave_rule(kv_dtype=torch.float8_e4m3fn, hopper=False) is None
    assert dc.wave_rule(kv_dtype=torch.float32, hopper=True) is None


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_decode_planner_plans_every_batch_once(batch_invariant):
    """Every batch size up to max_num_seqs gets its split count, a workspace view
    that holds that batch (views of one buffer) and the config of its split flag;
    batch invariance means no split at all."""
    planner = DecodePlanner(
        device=torch.device("cpu"),
        num_q_heads=32,
        num_kv_heads=8,
        head_size=128,
        q_dtype=torch.bfloat16,
        kv_dtype=torch.bfloat16,
        block_size=64,
        max_num_seqs=64,
        num_sms=132,
        batch_invariant=batch_invariant,
    )
    buffers = set()
    wave = decode_wave_rule(kv_dtype=torch.bfloat16, device=torch.device("cpu"))
    for n in range(1, 65):
        splits, workspace, config = planner.plan(n)
        want = (
            1
            if batch_invariant
            else choose_decode_splits(
                num_seqs=n, num_kv_heads=8, num_sms=132, wave=wave
            )
        )
        assert splits == want, n
        assert config == planner.configs[splits > 1]
        if splits == 1:
            assert workspace is None
            continue
        assert workspace.dtype == WORKSPACE_DTYPE
        need = decode_workspace_shape(
            max_num_seqs=n, num_q_heads=32, head_size=128, num_splits=splits
        )
        assert workspace.shape[0] >= n and workspace.shape[1:] == need[1:], n
        buffers.add(workspace.untyped_storage().data_ptr())
    assert len(buffers) == (0 if batch_invariant else 1)
    # Larger than vLLM's scheduler forms: unsplit, no workspace.
    assert planner.plan(65)[:2] == (1, None)


def test_decode_table_lookup_prefers_entries_and_falls_back(tmp_path, monkeypatch):
    # The loader's behaviour for the decode kind: a table entry wins over the
    # heuristic for its key only; a GPU without a table (the H200 ships none: no
    # decode entry was measured) and a key outside the table take the heuristic.
    special = dc.DecodeConfig(block_n=128, num_warps=8, num_stages=3)
    key = {
        "head_size": 96,
        "q_dtype": torch.float16,
        "kv_dtype": torch.float16,
        "group": 7,
        "block_size": 32,
        "split": True,
    }
    entry = dc.DECODE_TABLE.entry(dc.DECODE_TABLE.key(**key), special)
    (tmp_path / "paged_decode_Test_GPU.json").write_text(
        json.dumps({"provenance": {"gpu": "Test GPU"}, "configs": [entry]})
    )
    monkeypatch.setattr(tables, "TUNING_DIR", tmp_path)
    tables.clear_caches()
    try:
        assert dc.DECODE_TABLE.lookup(gpu_name="Test GPU", **key) == special
        assert dc.DECODE_TABLE.load("Test GPU") == {dc.DECODE_TABLE.key(**key): special}
        other = {**key, "split": False}
        heuristic = dc.heuristic_decode_config(head_size=96, kv_dtype=torch.float16)
        assert dc.DECODE_TABLE.lookup(gpu_name="Test GPU", **other) == heuristic
        assert dc.DECODE_TABLE.lookup(gpu_name="Other GPU", **key) == heuristic
        assert dc.DECODE_TABLE.load("Other GPU") == {}
    finally:
        tables.clear_caches()


@pytest.mark.parametrize(
    "name, capability, hip, expected",
    [
        # An sm_90 GPU without tables of its own takes the H200's (same SM).
        ("NVIDIA H100 80GB HBM3", (9, 0), False, "NVIDIA H200"),
        ("NVIDIA H200", (9, 0), False, "NVIDIA H200"),  # its own
        ("NVIDIA A100-SXM4-80GB", (8, 0), False, "NVIDIA A100-SXM4-80GB"),
        # ROCm reports gfx942 as capability (9, 4), and no ROCm GPU borrows tables.
        ("AMD Instinct MI300X", (9, 0), True, "AMD Instinct MI300X"),
    ],
)
def test_gpu_without_tables_uses_its_architectures(
    monkeypatch, caplog, name, capability, hip, expected
):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda device=None: capability
    )
    monkeypatch.setattr(torch.version, "hip", "6.4" if hip else None)
    tables.clear_caches()
    try:
        with caplog.at_level("INFO", logger=tables.__name__):
            got = tables.device_gpu_name(torch.device("cuda", 0))
            assert tables.device_gpu_name(torch.device("cuda", 0)) == got
    finally:
        tables.clear_caches()
    assert got == expected
    borrowed = [r.getMessage() for r in caplog.records]
    if expected != name:
        assert len(borrowed) == 1 and f"no tuning tables for {name}" in borrowed[0]
    else:
        assert borrowed == []


def _small_batch(**over):
    args = {
        "seqs": [(1, 20)],
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_size": 64,
        "block_size": 16,
    }
    args.update(over)
    return make_paged_batch(**args)


def _call(batch, **over):
    kw = {
        "query": batch.query,
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "output": torch.empty_like(batch.query),
        "block_table": batch.block_table,
        "seq_lens": batch.seq_lens,
        "softmax_scale": 0.125,
        "k_scale": batch.k_scale,
        "v_scale": batch.v_scale,
    }
    kw.update(over)
    paged_decode_attention(**kw)


@pytest.mark.parametrize(
    "build, call, match",
    [
        ({"head_size": 288}, {}, "head size 288"),
        ({"block_size": 24}, {}, "block size 24"),
        ({"q_dtype": torch.float16, "cache_dtype": torch.bfloat16}, {}, "cache dtype"),
        ({"cache_dtype": torch.float8_e4m3fn}, {"k_scale": None}, "k_scale"),
        ({}, {"num_splits": SPLIT_LIMIT + 1}, "num_splits"),
        ({}, {"num_splits": 2, "workspace": torch.empty(1, 4, 2, 64)}, "workspace"),
        ({}, {"sliding_window": 0}, "sliding_window"),
        ({}, {"logits_soft_cap": -1.0}, "logits_soft_cap"),
        ({}, {"softmax_scale": -0.125}, "softmax_scale"),
        (
            {},
            {
                "query": torch.empty(1, 5, 64, dtype=torch.bfloat16, device=DEVICE),
                "output": torch.empty(1, 5, 64, dtype=torch.bfloat16, device=DEVICE),
            },
            "multiple of num_kv_heads",
        ),
        (
            {},
            {"query": torch.empty(1, 4, 64, dtype=torch.float32, device=DEVICE)},
            "query dtype",
        ),
    ],
    ids=[
        "head288",
        "bs24",
        "dtype_mix",
        "fp8_no_scale",
        "splits-past-limit",
        "bad_workspace",
        "window0",
        "softcap_neg",
        "scale_neg",
        "heads",
        "q_fp32",
    ],
)
def test_unsupported_inputs_raise(build, call, match):
    batch = _small_batch(**build)
    with pytest.raises(ValueError, match=match):
        _call(batch, **call)


# ------------------------------------------------- offline compile (no GPU needed)

# The interpreter does not lower anything; compiling the real launches for real
# targets on the CPU catches lowering errors (and lost pipelining) before a GPU
# run does. Variants: the plain 2D kernel, and split-KV with fp8 and every
# feature on a padded head size and GQA group (decode kernel + merge).
COMPILE_VARIANTS = {
    "2d_bf16_d128": {"fp8": False, "num_splits": 1, "features": False,
                     "head_size": 128, "group": 4, "block_size": 16},
    "split_fp8_all_d80": {"fp8": True, "num_splits": 4, "features": True,
                          "head_size": 80, "group": 7, "block_size": 64},
    # Head sizes at the ends of the declared range, and one padded past 128.
    "2d_bf16_d16": {"fp8": False, "num_splits": 1, "features": False,
                    "head_size": 16, "group": 4, "block_size": 16},
    "split_bf16_d224": {"fp8": False, "num_splits": 4, "features": True,
                        "head_size": 224, "group": 2, "block_size": 64},
    # An odd head size (rows of 200 bytes, 8-byte aligned; 128-wide tiles).
    "2d_bf16_d100": {"fp8": False, "num_splits": 1, "features": False,
                     "head_size": 100, "group": 4, "block_size": 64},
}  # fmt: skip
# DecodeConfig.early_convert (inline PTX): sm90 only; its fp8 tiles must reach the
# mma operands through ldmatrix, as 16-bit tiles do.
EARLY_CONVERT_VARIANT = {"fp8": True, "num_splits": 1, "features": False,
                         "head_size": 128, "group": 4, "block_size": 64}  # fmt: skip


def _decode_launches(*, fp8, num_splits, features, head_size, group, block_size, hip):
    """The launches of one decode call, built from CPU tensors (only dtypes,
    shapes, strides and alignment matter for compiling)."""
    from vllm.attention.ops import triton_paged_decode_attention_2d as mod
    from vllm.attention.ops.triton_attention_common import AttentionInputs

    num_kv_heads = 2
    q_heads = num_kv_heads * group
    query = torch.empty((8, q_heads, head_size), dtype=torch.bfloat16)
    cache_dtype = torch.bfloat16
    if fp8:
        cache_dtype = torch.float8_e4m3fnuz if hip else torch.float8_e4m3fn
    cache = torch.empty((4, 2, num_kv_heads, block_size, head_size), dtype=cache_dtype)
    heads = torch.empty(q_heads) if features else None
    inputs = AttentionInputs(
        query=query,
        key_cache=cache[:, 0],
        value_cache=cache[:, 1],
        output=torch.empty_like(query),
        block_table=torch.zeros((8, 37), dtype=torch.int32),
        seq_lens=torch.zeros(8, dtype=torch.int32),
        softmax_scale=0.1,
        k_scale=torch.ones(1) if fp8 else None,
        v_scale=torch.ones(1) if fp8 else None,
        sliding_window=64 if features else None,
        alibi_slopes=heads,
        logits_soft_cap=5.0 if features else None,
        sinks=heads,
        alibi_sqrt=features,
    )
    return mod._launches(
        inputs,
        seq_start=0,
        num_seqs=8,
        num_splits=num_splits,
        workspace=torch.empty(8 * q_heads * num_splits * (head_size + 1))
        if num_splits > 1
        else None,
        config=dc.heuristic_decode_config(
            head_size=head_size, kv_dtype=cache_dtype, is_hip=hip
        ),
    )


def compile_decode_main() -> None:
    """Subprocess entry of the test below (TRITON_INTERPRET unset): compile every
    launch of every variant for sm90 and gfx942; print one line per kernel."""
    from tests.kernels.hopper_compile import (
        HOPPER,
        MI300,
        compile_for_target,
        resources,
        sm90_resident_programs,
    )

    for target in (HOPPER, MI300):
        hip = target.backend == "hip"
        for name, variant in COMPILE_VARIANTS.items():
            for kernel, _, kwargs in _decode_launches(**variant, hip=hip):
                compiled = compile_for_target(kernel, kwargs, target=target)
                ttgir = compiled.asm["ttgir"]
                pipelined = "async_copy_global_to_local" in ttgir
                # fp8 dots run in fp16: no e4m3 -> fp16 -> bf16 double conversion.
                twice = compiled.asm.get("ptx", "").count("cvt.bf16.f16")
                print(
                    target.backend, name, kernel.__name__, pipelined, twice, flush=True
                )
    # The heuristic 2D builds of Llama-3.1-8B decode, bf16 and fp8: programs per SM
    # (what WAVE_RULES states).
    for fp8 in (False, True):
        ((kernel, _, kwargs),) = _decode_launches(
            fp8=fp8, num_splits=1, features=False, head_size=128, group=4,
            block_size=16, hip=False,
        )  # fmt: skip
        compiled = compile_for_target(kernel, kwargs)
        resident = sm90_resident_programs(
            registers=resources(compiled)["registers"],
            num_warps=compiled.metadata.num_warps,
            shared_bytes=compiled.metadata.shared,
        )
        print("resident", "fp8" if fp8 else "bfloat16", resident)
    for early in (False, True):
        ((kernel, _, kwargs),) = _decode_launches(**EARLY_CONVERT_VARIANT, hip=False)
        ptx = compile_for_target(kernel, {**kwargs, "EARLY_CONVERT": early}).asm["ptx"]
        print("early_convert", early, ptx.count("ldmatrix"), ptx.count("ld.shared"))


def test_compiles_for_hopper_and_mi300():
    pytest.importorskip("triton.backends.nvidia")
    pytest.importorskip("triton.backends.amd")
    from tests.kernels.hopper_compile import importable

    module, root = importable(__file__)
    done = subprocess.run(
        [sys.executable, "-c", f"import {module} as t; t.compile_decode_main()"],
        cwd=root,
        # "0", not unset: conftest would turn the interpreter on for a CPU host.
        env={**os.environ, "TRITON_INTERPRET": "0"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    lines = [ln.split() for ln in done.stdout.splitlines() if ln.strip()]
    early = {
        ln[1]: (int(ln[2]), int(ln[3])) for ln in lines if ln[0] == "early_convert"
    }
    # The wave-aware split rule's data: the resident programs of the builds.
    resident = {ln[1]: int(ln[2]) for ln in lines if ln[0] == "resident"}
    assert resident["bfloat16"] == 4, resident
    for kv, rule in dc.WAVE_RULES.items():
        assert resident[kv] == rule.programs_per_sm, (kv, resident)
    lines = [ln for ln in lines if ln[0] not in ("early_convert", "resident")]
    # early_convert: as many ldmatrix as a 16-bit cache (K and V tiles), and far
    # fewer shared loads than the byte-wide gathers without it.
    (ldm_plain, lds_plain), (ldm_early, lds_early) = early["False"], early["True"]
    assert ldm_early > 4 * max(ldm_plain, 1) and lds_early * 4 < lds_plain, early
    # 2 targets x (1 launch per unsplit variant + 2 per split one: kernel, merge).
    launches = sum(2 if v["num_splits"] > 1 else 1 for v in COMPILE_VARIANTS.values())
    assert len(lines) == 2 * launches, done.stdout
    for backend, name, kernel, pipelined, twice in lines:
        if backend == "cuda" and kernel == "_paged_decode_kernel":
            # K/V loads of the unmasked bulk must be pipelined (cp.async) on sm90.
            assert pipelined == "True", f"{name}: K/V loads not pipelined on sm90"
            if COMPILE_VARIANTS[name]["fp8"]:
                assert twice == "0", f"{name}: {twice} cvt.bf16.f16 in the fp8 decode"


# ---------------------------------------------------------------- GPU only


# (q dtype, cache dtype, splits) variants; each (head size, group, block size) point
# takes the next one in turn, so the 168 points cover every variant ~28 times without
# a 6x larger product (each point compiles its own kernel specialisation).
_FULL_VARIANTS = [
    (torch.bfloat16, None, 1),
    (torch.float16, None, 8),
    (torch.bfloat16, torch.float8_e4m3fn, 8),
    (torch.float16, torch.float8_e4m3fn, 1),
    (torch.bfloat16, None, 8),
    (torch.float16, None, 1),
]
_FULL_POINTS = [
    (hs, g, bs, *_FULL_VARIANTS[i % len(_FULL_VARIANTS)])
    for i, (hs, g, bs) in enumerate(
        itertools.product(HEAD_SIZES, GQA_GROUPS, BLOCK_SIZES)
    )
]


@pytest.mark.full_matrix
@pytest.mark.parametrize(
    "head_size, group, block_size, q_dtype, cache_dtype, num_splits",
    _FULL_POINTS,
    ids=[
        f"d{hs}-g{g}-bs{bs}-{str(q)[6:]}-{str(c or q)[6:]}-s{n}"
        for hs, g, bs, q, c, n in _FULL_POINTS
    ],
)
def test_decode_full_matrix(
    head_size, group, block_size, q_dtype, cache_dtype, num_splits
):
    cache_dtype = cache_dtype or q_dtype
    if reason := fp8_skip_reason(cache_dtype):
        pytest.skip(reason)
    # Long and short contexts in one batch, incl. a 0-length padding row.
    _run_and_compare(
        seq_lens=(1, 17, 1000, 4099, 0),
        num_kv_heads=2,
        group=group,
        head_size=head_size,
        block_size=block_size,
        q_dtype=q_dtype,
        cache_dtype=cache_dtype,
        num_splits=num_splits,
        features={"window": 700, "alibi": True, "softcap": 30.0, "sinks": True}
        if head_size == 128
        else {},
        workspace=True,
    )


@pytest.mark.full_matrix
@pytest.mark.parametrize("num_splits", [1, 16])
def test_decode_long_context(num_splits):
    # 128k keys: the longest context the brief asks for.
    _run_and_compare(
        seq_lens=(131072, 3),
        num_kv_heads=8,
        group=4,
        head_size=128,
        block_size=64,
        q_dtype=torch.bfloat16,
        cache_dtype=torch.bfloat16,
        num_splits=num_splits,
        features={},
        workspace=True,
    )


@pytest.mark.skipif(not ON_GPU, reason="needs > 4 GB of cache: GPU only")
def test_int64_block_offsets():
    # Pages past element 2**31 of the cache: 32-bit offsets would wrap around.
    num_kv_heads, block_size, head_size = 8, 64, 128
    stride_block = 2 * num_kv_heads * block_size * head_size
    num_blocks = (2**31) // stride_block + 64
    kv = torch.zeros(
        num_blocks,
        2,
        num_kv_heads,
        block_size,
        head_size,
        dtype=torch.bfloat16,
        device=DEVICE,
    )
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    pages = torch.arange(num_blocks - 8, num_blocks, device=DEVICE)[
        torch.randperm(8, device=DEVICE, generator=gen)
    ]
    kv[pages] = torch.randn(
        8, 2, num_kv_heads, block_size, head_size, device=DEVICE, generator=gen
    ).to(torch.bfloat16)
    block_table = pages.to(torch.int32).view(1, 8)
    seq_lens = torch.tensor([8 * block_size - 5], dtype=torch.int32, device=DEVICE)
    query = torch.randn(
        1, 4 * num_kv_heads, head_size, device=DEVICE, generator=gen
    ).to(torch.bfloat16)
    for num_splits in (1, 4):
        out = torch.empty_like(query)
        paged_decode_attention(
            query=query,
            key_cache=kv[:, 0],
            value_cache=kv[:, 1],
            output=out,
            block_table=block_table,
            seq_lens=seq_lens,
            softmax_scale=0.088,
            num_splits=num_splits,
        )
        ref = ref_paged_attention(
            query=query,
            key_cache=kv[:, 0],
            value_cache=kv[:, 1],
            block_table=block_table,
            query_start_loc=torch.tensor([0, 1], device=DEVICE),
            seq_lens=seq_lens,
            softmax_scale=0.088,
        )
        _, atol, rtol = TOLERANCES[torch.bfloat16]
        assert_close(
            out,
            ref,
            dtype=torch.bfloat16,
            atol=atol,
            rtol=rtol,
            what=f"int64 offsets, splits={num_splits}",
        )


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_replay_with_growing_contexts():
    # Capture once with a fixed batch size and split count, then replay after the
    # contexts grew: the grid and workspace must not depend on seq_lens.
    num_kv_heads, group, head_size, block_size = 2, 4, 128, 16
    batch = make_paged_batch(
        seqs=[(1, 700), (1, 30), (1, 2000)],
        num_q_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
    )
    num_splits = choose_decode_splits(
        num_seqs=3, num_kv_heads=num_kv_heads, num_sms=132
    )
    ws = torch.empty(
        decode_workspace_shape(
            max_num_seqs=3,
            num_q_heads=num_kv_heads * group,
            head_size=head_size,
            num_splits=num_splits,
        ),
        dtype=WORKSPACE_DTYPE,
        device=DEVICE,
    )
    seq_lens = torch.tensor([5, 1, 100], dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(batch.query)
    kw = {
        "query": batch.query,
        "key_cache": batch.key_cache,
        "value_cache": batch.value_cache,
        "output": out,
        "block_table": batch.block_table,
        "seq_lens": seq_lens,
        "softmax_scale": 0.088,
        "num_splits": num_splits,
        "workspace": ws,
    }
    paged_decode_attention(**kw)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(**kw)
    for lens in ([5, 1, 100], [700, 30, 2000], [1, 29, 1999]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        ref = ref_paged_attention(
            query=batch.query,
            key_cache=batch.key_cache,
            value_cache=batch.value_cache,
            block_table=batch.block_table,
            query_start_loc=batch.query_start_loc,
            seq_lens=seq_lens,
            softmax_scale=0.088,
        )
        _, atol, rtol = TOLERANCES[torch.bfloat16]
        assert_close(
            out,
            ref,
            dtype=torch.bfloat16,
            atol=atol,
            rtol=rtol,
            what=f"graph replay, seq_lens={lens}",
        )


def test_choose_decode_splits_cap_is_an_argument():
    """max_splits raises or lowers the cap only; the count still depends only on
    the batch shape."""
    wide = {
        b: choose_decode_splits(num_seqs=b, num_kv_heads=8, num_sms=132, max_splits=64)
        for b in (1, 2, 8, 50)
    }
    assert wide == {1: 64, 2: 32, 8: 8, 50: 1}
    assert (
        choose_decode_splits(num_seqs=1, num_kv_heads=8, num_sms=132, max_splits=4) == 4
    )


def test_early_convert_only_where_it_applies():
    """DecodeConfig.early_convert is inline PTX for e4m3fn: tables can only set it
    for fp8 keys, and launches use it only for e4m3fn caches on NVIDIA GPUs (the
    interpreter and ROCm's e4m3fnuz run the plain conversion, same result)."""
    from vllm.attention.ops.triton_paged_decode_attention_2d import (
        early_convert_applies,
    )

    early = dc.DecodeConfig(64, 4, 2, early_convert=True)
    assert dc.is_valid_config(early, head_size=128, kv_dtype=torch.float8_e4m3fn)
    assert not dc.is_valid_config(early, head_size=128, kv_dtype=torch.bfloat16)
    cpu = torch.empty(1, dtype=torch.float8_e4m3fn)
    assert not early_convert_applies(cpu)
    assert not early_convert_applies(torch.empty(1, dtype=torch.bfloat16))
    if ON_GPU:
        gpu = torch.empty(1, dtype=torch.float8_e4m3fn, device="cuda")
        assert early_convert_applies(gpu) == (torch.version.hip is None)


@pytest.mark.skipif(not ON_GPU, reason="inline PTX runs on NVIDIA GPUs only")
@pytest.mark.parametrize("num_splits", [1, 4], ids=["2d", "split4"])
def test_early_convert_matches_reference(num_splits):
    """The inline-PTX conversion on the GPU: the fp8 case with every feature."""
    _run_case(
        "all_features_fp8", num_splits, dc.DecodeConfig(64, 4, 2, early_convert=True)
    )
