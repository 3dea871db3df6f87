# SPDX-License-Identifier: Apache-2.0
"""MI300 (gfx942) compile check of every kernel kind, without a GPU or ROCm.

Triton's AMD backend compiles for ``GPUTarget("hip", "gfx942", 64)`` through to an
hsaco on a CPU machine. This module builds the fork's kernels with the configs the
fork's own selection picks on an MI300X and checks the generated code. It must run
with ``TRITON_INTERPRET`` unset (``tests/kernels/test_amd_compile.py`` runs it as
``python -m`` in a subprocess, as ``hopper_compile.py`` is run); it reuses
``hopper_compile.compile_for_target`` (Triton's launcher specialisation:
divisibility-16 hints, ints equal to 1 as constexpr) and its ``MI300`` target.

Simulated device. ``simulated_device`` makes torch report one MI300X: it patches
``torch.version.hip`` ("6.4") and three ``torch.cuda`` queries,
``get_device_properties`` (name "AMD Instinct MI300X", 304 compute units,
``gcnArchName`` gfx942, warp size 64, 64 KiB of LDS per workgroup),
``get_device_name`` and ``get_device_capability`` ((9, 4), what ROCm reports for
gfx942). Those are all the device queries of ``vllm/attention/ops`` (hardware.py
and tuning/tables.py ask nothing else), and nothing of the fork is patched: its ROCm
branches (``hardware.nvidia_gpu``, ``tma_supported``, ``num_sms``,
``shared_memory_per_program``, ``tables.device_gpu_name``, the ``is_hip`` of the
table lookups) run as they would on the GPU. Patching the hardware.py functions
instead would take one patch per importing module (prefix_prefill.py and the
decode module bind them by name) and would skip those branches. The device is
``torch.device("cuda", 0)``; the launches are built from CPU tensors (only dtypes,
shapes, strides and alignment matter for compiling).

Selection, per case, as the launchers make it:

* prefill: ``prefix_prefill.plan_prefill`` on the device, as the backend's
  builder plans a batch: its config from ``picked_config`` (the GPU's table; none
  ships for the MI300X, so ``heuristic_prefill_config(is_hip=True)``, fitted to
  ``shared_memory_per_program``), its kernel, and its split count over
  ``hardware.num_sms(device)``; the launch keywords from
  ``prefix_prefill._launches``. Unsplit: 4 sequences of 1024 query tokens over 4096
  keys (1 split). Split: one 16-token chunk (spec-decode verification) over 32768
  keys (16 splits), then the merge. Non-causal (``CAUSAL`` off): cross-attention,
  Whisper's first decoder step (64 sequences of 4 query tokens over 1500 keys,
  pages of 16); encoder self-attention over the step's K/V as one-key pages (4
  requests of 512 tokens; 16-bit only, the K/V being the model's), also with a
  two-sided window of 257 (EmbeddingGemma's layers as vLLM runs them).
* decode: ``DECODE_TABLE.lookup`` with the arguments ``paged_decode_attention``
  passes, the split count from ``choose_decode_splits`` over the device's CUs as the
  backend's builder computes it (256 sequences: 1 split; 1 sequence: 64 splits,
  then the merge); the launch keywords from
  ``triton_paged_decode_attention_2d._launches``.
* cache write: ``paged_cache_write._launches`` (its tile follows from the shape).

8 KV heads throughout; pages of 16 keys (vLLM's default), 64 for split prefill so
that its one-page-per-tile addressing (``TILE_IN_PAGE``) is built too.

Sweep: the full cross product of head sizes 64/100/128/256, GQA groups 1/4/8,
queries bf16 and fp16, and KV caches of the query's dtype or fp8 e4m3fnuz (MI300's
format): 48 cases for each of the five paged attention kinds, 24 for each of the
two encoder kinds, the merges (24 distinct builds each: the merge does not depend
on the cache dtype) and 16 cache writes, 352 builds in 100-200 s on 2 CPU cores
with a cold Triton cache (seconds with a warm one), so the check runs the whole
cross product, no covering design.

Checks, per build (a failure prints BAD and makes the exit status 1):

* an hsaco is produced (``compiled.asm["hsaco"]``: non-empty ELF bytes);
* LDS, ``compiled.metadata.shared`` (Triton's dynamic LDS) plus the kernel's
  static ``.group_segment_fixed_size`` (0 in Triton 3.8 builds), <= 65536 bytes;
* no spills and no scratch, from the AMDGPU metadata Triton 3.8 emits at the end
  of ``compiled.asm["amdgcn"]`` (``.vgpr_spill_count``, ``.sgpr_spill_count``,
  ``.private_segment_fixed_size``) and LLVM's ``; ScratchSize:`` comment; a
  missing field fails (a changed format must not pass silently). SGPR spills
  (into VGPR lanes, not scratch) are allowed only where ``KNOWN_SGPR_SPILLS``
  lists them, up to the listed count;
* the attention kernels use MFMA (``v_mfma`` instructions) with operands of the
  dot dtype: bf16 for bf16 caches, f16 for fp16 and fp8 caches (fp8 dots run in
  fp16, ``query_for_cache``); not required of the merges and the cache write;
* no Hopper-only path: the selected prefill config has no TMA and no Gluon kernel
  (``use_tma``, ``gluon``) and its launch has ``USE_TMA`` off; the decode config
  has no ``early_convert`` (inline PTX). Once, on the device: ``nvidia_gpu`` and
  ``tma_supported`` are false, and
  ``prefix_prefill.hopper_kernel_refusal`` refuses a Gluon-eligible config;
  as a control, a simulated H200 allows each of them. (Without the ROCm identity,
  ``torch.version.hip`` unset, the NVIDIA configs are selected and the run fails:
  TMA, spills.)

Occupancy (waves per SIMD, CDNA3): a SIMD lane has 512 VGPRs (arch and
accumulation registers together; ``.vgpr_count`` is that unified count),
allocated in granules of 8, at most 8 waves:
``vgpr_waves = min(8, 512 // roundup8(vgprs))``. A CU has 64 KiB of LDS and 4
SIMDs, and a workgroup of ``num_warps`` waves puts ``num_warps / 4`` waves on each:
``lds_waves = max(1, (65536 // lds) * num_warps // 4)`` when ``lds > 0``;
``occupancy = min(vgpr_waves, lds_waves)``. Each line also prints LLVM's own
figure (``; Occupancy:``), which counts registers but not Triton's dynamic LDS.

Output: one line per build (kind, head size, group, query/cache dtype, page size,
config, splits, VGPRs, SGPRs, LDS bytes, occupancy, spills VGPR/SGPR, scratch
bytes, MFMA count and opcodes), then a summary line; ``--markdown`` adds the
table of docs/rocm.md (the lines aggregated over groups and query dtypes).
"""

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import time
import types
from unittest import mock

import torch
from triton.backends.compiler import GPUTarget

from tests.kernels.hopper_compile import MI300, compile_for_target
from vllm.attention.ops.triton_attention_common import AttentionInputs

# The simulated device.
MI300X_NAME = "AMD Instinct MI300X"
MI300X_COMPUTE_UNITS = 304
MI300X_LDS_BYTES = 64 * 1024
MI300X_WARP_SIZE = 64
HIP_VERSION = "6.4"
DEVICE = torch.device("cuda", 0)

# CDNA3 resources per SIMD and CU, for the occupancy figure.
VGPRS_PER_LANE = 512
VGPR_GRANULE = 8
MAX_WAVES_PER_SIMD = 8
SIMDS_PER_CU = 4
LDS_BYTES_PER_CU = 64 * 1024

HEAD_SIZES = (64, 100, 128, 256)  # 100: an odd head, padded to 128 and masked
GROUPS = (1, 4, 8)
Q_DTYPES = (torch.bfloat16, torch.float16)
FP8 = torch.float8_e4m3fnuz
# (query dtype, cache dtype) pairs.
DTYPE_PAIRS = tuple((q, kv) for q in Q_DTYPES for kv in (q, FP8))
ATTENTION_KINDS = ("prefill", "prefill-split", "decode", "decode-split",
                   "prefill-cross", "prefill-encoder",
                   "prefill-encoder-window")  # fmt: skip
# Non-causal kinds: cross-attention over cached pages, encoder self-attention over
# the step's own K/V (one-key pages, in the model's dtype: no fp8 pair).
NON_CAUSAL_KINDS = ("prefill-cross", "prefill-encoder", "prefill-encoder-window")
ENCODER_KINDS = ("prefill-encoder", "prefill-encoder-window")
# A two-sided window (EmbeddingGemma's 512, as vLLM runs bidirectional layers).
WINDOWS = {"prefill-encoder-window": 257}
KINDS = ATTENTION_KINDS + ("prefill-merge", "decode-merge", "cache-write")
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", FP8: "fp8e4m3fnuz"}

NUM_KV_HEADS = 8
PAGE_SIZES = {"prefill": 16, "prefill-split": 64, "decode": 16, "decode-split": 16,
              "prefill-cross": 16, "prefill-encoder": 1,
              "prefill-encoder-window": 1}  # fmt: skip
MAX_MODEL_LEN = 32768
# Launch shapes; the selection must split exactly the "-split" ones (checked).
PREFILL_SHAPES = {
    "prefill": dict(max_query_len=1024, num_seqs=4, max_seq_len=4096),
    "prefill-split": dict(max_query_len=16, num_seqs=1, max_seq_len=MAX_MODEL_LEN),
    # Whisper's first decoder step over its 1500 encoder keys; BERT-style requests.
    "prefill-cross": dict(max_query_len=4, num_seqs=64, max_seq_len=1500),
    "prefill-encoder": dict(max_query_len=512, num_seqs=4, max_seq_len=512),
    "prefill-encoder-window": dict(max_query_len=512, num_seqs=4, max_seq_len=512),
}
DECODE_NUM_SEQS = {"decode": 256, "decode-split": 1}

# Known on MI300 with Triton 3.8, reported and not fixed here (kernel code is not
# this check's to change): the merge of a 64-split decode (SPLITS_PAD 64: batches
# of 1-2 sequences at 8 KV heads on 304 CUs) reaches the SGPR limit (106, counted
# with VCC and the XNACK mask) from 128-wide tiles (head sizes 100 and 128) and
# spills SGPRs into VGPR lanes (v_writelane / v_readlane), with no scratch and no
# VGPR spills; the same merge at
# head size 64, and every prefill merge (SPLITS_PAD 16), spills none (outside the
# sweep, a 32-split merge, batches of 3-4, spills 13 at head size 256). The most
# each may spill: {(kind, head size, SPLITS_PAD): SGPR spills}; more, or a spill
# anywhere else, fails.
KNOWN_SGPR_SPILLS = {
    ("decode-merge", 100, 64): 76,  # padded to 128 columns, masked
    ("decode-merge", 128, 64): 75,
    ("decode-merge", 256, 64): 123,
}


def mi300x_properties():
    return types.SimpleNamespace(
        name=MI300X_NAME,
        gcnArchName="gfx942:sramecc+:xnack-",
        major=9,
        minor=4,
        multi_processor_count=MI300X_COMPUTE_UNITS,
        warp_size=MI300X_WARP_SIZE,
        shared_memory_per_block=MI300X_LDS_BYTES,
        shared_memory_per_block_optin=MI300X_LDS_BYTES,
        shared_memory_per_multiprocessor=MI300X_LDS_BYTES,
        total_memory=192 * 2**30,
    )


def h200_properties():
    """The control device: an H200 (CUDA, sm_90)."""
    return types.SimpleNamespace(
        name="NVIDIA H200",
        major=9,
        minor=0,
        multi_processor_count=132,
        warp_size=32,
        shared_memory_per_block=48 * 1024,
        shared_memory_per_block_optin=232_448,
        total_memory=141 * 2**30,
    )


def _clear_device_caches():
    """Forget what the fork's memoised device queries answered."""
    from vllm.attention.ops import hardware
    from vllm.attention.ops.tuning import tables

    hardware.tma_supported.cache_clear()
    hardware.shared_memory_per_program.cache_clear()
    hardware.num_sms.cache_clear()
    hardware.is_hopper.cache_clear()
    tables.clear_caches()


@contextlib.contextmanager
def simulated_device(props=None, hip=HIP_VERSION):
    """Make torch report one GPU with ``props`` (default: an MI300X) as device 0,
    from a ROCm build when ``hip`` is set: ``torch.version.hip`` and the ``torch.cuda``
    device queries the fork makes, nothing of the fork (see the module docstring)."""
    props = props or mi300x_properties()
    _clear_device_caches()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.version, "hip", hip))
        for name, value in (
            ("get_device_properties", lambda device=None: props),
            ("get_device_name", lambda device=None: props.name),
            ("get_device_capability", lambda device=None: (props.major, props.minor)),
        ):
            stack.enter_context(mock.patch.object(torch.cuda, name, value))
        try:
            yield props
        finally:
            _clear_device_caches()


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str  # one of ATTENTION_KINDS
    head_size: int
    group: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype


def cases() -> list[Case]:
    """The cross product (see the module docstring)."""
    return [
        Case(kind, head_size, group, q_dtype, kv_dtype)
        for kind in ATTENTION_KINDS
        for head_size in HEAD_SIZES
        for group in GROUPS
        for q_dtype, kv_dtype in DTYPE_PAIRS
        if kind not in ENCODER_KINDS or kv_dtype == q_dtype
    ]


# ------------------------------------------------------------------ launches


def _scales(kv_dtype):
    return (torch.ones(1), torch.ones(1)) if kv_dtype == FP8 else (None, None)


def _cache(head_size, kv_dtype, page_size):
    shape = (8, 2, NUM_KV_HEADS, page_size, head_size)
    cache = torch.empty(shape, dtype=kv_dtype)
    return cache[:, 0], cache[:, 1]


def prefill_launches(case: Case) -> tuple[object, int, list]:
    """(config, num_splits, launches) of one prefill call on the device."""
    from vllm.attention.ops import hardware
    from vllm.attention.ops import prefix_prefill as pp

    shape = PREFILL_SHAPES[case.kind]
    page_size = PAGE_SIZES[case.kind]
    num_seqs, num_tokens = shape["num_seqs"], 64
    query = torch.empty(
        (num_tokens, NUM_KV_HEADS * case.group, case.head_size), dtype=case.q_dtype
    )
    key_cache, value_cache = _cache(case.head_size, case.kv_dtype, page_size)
    k_scale, v_scale = _scales(case.kv_dtype)
    # As the backend's builder plans it (config, kernel, split count), on the
    # simulated device.
    causal = case.kind not in NON_CAUSAL_KINDS
    window = WINDOWS.get(case.kind)
    plan = pp.plan_prefill(
        layer=pp.PrefillLayer.of(
            query=query, key_cache=key_cache, causal=causal, sliding_window=window
        ),
        device=DEVICE, seq_start=0, num_seqs=num_seqs, num_tokens=num_tokens,
        max_query_len=shape["max_query_len"], max_seq_len=shape["max_seq_len"],
        workspace=torch.empty(
            pp.split_workspace_bound(
                head_size=case.head_size, num_sms=hardware.num_sms(DEVICE)
            )
        ),
    )  # fmt: skip
    launches = pp._launches(plan, AttentionInputs(
        query=query, key_cache=key_cache, value_cache=value_cache,
        output=torch.empty_like(query),
        block_table=torch.zeros(
            (num_seqs, MAX_MODEL_LEN // page_size), dtype=torch.int32
        ),
        query_start_loc=torch.zeros(num_seqs + 1, dtype=torch.int32),
        seq_lens=torch.zeros(num_seqs, dtype=torch.int32), softmax_scale=0.1,
        k_scale=k_scale, v_scale=v_scale, causal=causal, sliding_window=window,
    ))  # fmt: skip
    config, num_splits = plan.config, plan.num_splits
    return config, num_splits, launches


def decode_launches(case: Case) -> tuple[object, int, list]:
    """(config, num_splits, launches) of one decode call on the device."""
    from vllm.attention.ops import hardware
    from vllm.attention.ops import triton_paged_decode_attention_2d as dec
    from vllm.attention.ops.tuning.decode_configs import DECODE_TABLE
    from vllm.attention.ops.tuning.tables import device_gpu_name

    page_size = PAGE_SIZES[case.kind]
    num_seqs = DECODE_NUM_SEQS[case.kind]
    # As the backend's metadata builder: the splits of a batch size from the CUs.
    num_splits = dec.choose_decode_splits(
        num_seqs=num_seqs, num_kv_heads=NUM_KV_HEADS, num_sms=hardware.num_sms(DEVICE)
    )
    # As paged_decode_attention looks it up (config=None).
    config = DECODE_TABLE.lookup(
        gpu_name=device_gpu_name(DEVICE),
        head_size=case.head_size,
        q_dtype=case.q_dtype,
        kv_dtype=case.kv_dtype,
        group=case.group,
        block_size=page_size,
        split=num_splits > 1,
        is_hip=torch.version.hip is not None,
    )
    q_heads = NUM_KV_HEADS * case.group
    query = torch.empty((num_seqs, q_heads, case.head_size), dtype=case.q_dtype)
    key_cache, value_cache = _cache(case.head_size, case.kv_dtype, page_size)
    k_scale, v_scale = _scales(case.kv_dtype)
    workspace = None
    if num_splits > 1:
        workspace = torch.empty(
            dec.decode_workspace_shape(
                max_num_seqs=num_seqs, num_q_heads=q_heads,
                head_size=case.head_size, num_splits=num_splits,
            ),
            dtype=dec.WORKSPACE_DTYPE,
        )  # fmt: skip
    inputs = AttentionInputs(
        query=query, key_cache=key_cache, value_cache=value_cache,
        output=torch.empty_like(query),
        block_table=torch.zeros(
            (num_seqs, MAX_MODEL_LEN // page_size), dtype=torch.int32
        ),
        seq_lens=torch.zeros(num_seqs, dtype=torch.int32), softmax_scale=0.1,
        k_scale=k_scale, v_scale=v_scale,
    )  # fmt: skip
    launches = dec._launches(
        inputs, seq_start=0, num_seqs=num_seqs,
        num_splits=num_splits, workspace=workspace, config=config,
    )  # fmt: skip
    return config, num_splits, launches


def cache_write_launches(head_size, q_dtype, kv_dtype) -> list:
    from vllm.attention.ops import paged_cache_write as pcw

    key = torch.empty((64, NUM_KV_HEADS, head_size), dtype=q_dtype)
    key_cache, value_cache = _cache(head_size, kv_dtype, PAGE_SIZES["prefill"])
    k_scale, v_scale = _scales(kv_dtype)
    return pcw._launches(
        key=key,
        value=torch.empty_like(key),
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=torch.zeros(64, dtype=torch.int64),
        k_scale=k_scale,
        v_scale=v_scale,
    )


def hopper_path_problems(kind: str, config, kwargs: dict) -> list[str]:
    """Hopper-only features that a config selected on the device, or its launch,
    uses."""
    problems = []
    if kind.startswith("prefill"):
        for field in ("use_tma", "gluon", "overlap_pv"):
            if getattr(config, field):
                problems.append(f"config.{field}={getattr(config, field)}")
        if kwargs.get("USE_TMA"):
            problems.append("USE_TMA=True")
    elif config.early_convert or kwargs.get("EARLY_CONVERT"):  # decode
        problems.append("early_convert (inline PTX)")
    return problems


def device_gate_problems() -> list[str]:
    """The fork's Hopper gates, asked about the simulated MI300X (each must refuse)
    and, as a control, about a simulated H200 (each must allow)."""
    from vllm.attention.ops import hardware
    from vllm.attention.ops import prefix_prefill as pp
    from vllm.attention.ops.tuning.prefill_configs import PrefillConfig

    hopper = pp._hopper_kernels()  # None where this Triton has no Gluon
    gluon = PrefillConfig(128, 64, 4, 2, use_tma=True, gluon=True)
    query = torch.empty((64, 32, 128), dtype=torch.bfloat16)
    key_cache = torch.empty((8, 2, 8, 64, 128), dtype=torch.bfloat16)[:, 0]

    def gates():
        return {
            "nvidia_gpu": hardware.nvidia_gpu(DEVICE),
            "tma_supported": hardware.tma_supported(DEVICE),
            "gluon": pp.hopper_kernel_refusal(
                pp.PrefillLayer.of(query=query, key_cache=key_cache), gluon, DEVICE
            ) is None,
        }  # fmt: skip

    on_mi300 = gates()
    with simulated_device(h200_properties(), hip=None):
        on_h200 = gates()
    print(f"Hopper gates on the MI300X: {on_mi300}; on an H200 (control): {on_h200}")
    if hopper is None:
        on_h200.pop("gluon")  # no Gluon kernel to allow
    return [f"MI300X allows {gate}" for gate, on in on_mi300.items() if on] + [
        f"the H200 control refuses {gate}" for gate, on in on_h200.items() if not on
    ]


# ------------------------------------------------------------------ analysis


def _field(asm: str, pattern: str) -> int:
    found = re.findall(pattern, asm, flags=re.M)
    if len(found) != 1:
        raise ValueError(f"{pattern!r}: {len(found)} matches in the amdgcn asm")
    return int(found[0])


def amdgcn_summary(compiled) -> dict:
    """Resources of a gfx942 build, from the AMDGPU metadata at the end of its
    amdgcn asm and LLVM's kernel-info comments (see the module docstring)."""
    asm = compiled.asm["amdgcn"]
    summary = {
        name: _field(asm, rf"^[\s-]+\.{name}:\s+(\d+)\s*$")
        for name in (
            "vgpr_count",
            "sgpr_count",
            "vgpr_spill_count",
            "sgpr_spill_count",
            "private_segment_fixed_size",
            "group_segment_fixed_size",
            "wavefront_size",
        )
    }
    summary["scratch"] = _field(asm, r"^; ScratchSize: (\d+)$")
    summary["llvm_occupancy"] = _field(asm, r"^; Occupancy: (\d+)$")
    lds = compiled.metadata.shared + summary["group_segment_fixed_size"]
    vgprs = -(-summary["vgpr_count"] // VGPR_GRANULE) * VGPR_GRANULE
    waves = min(MAX_WAVES_PER_SIMD, VGPRS_PER_LANE // vgprs)
    if lds > 0:
        workgroups = LDS_BYTES_PER_CU // lds
        per_simd = workgroups * compiled.metadata.num_warps // SIMDS_PER_CU
        waves = min(waves, max(1, per_simd))
    mfma = re.findall(r"^\s*(v_mfma\w*)", asm, flags=re.M)
    hsaco = compiled.asm.get("hsaco", b"")
    return {
        **summary,
        "lds": lds,
        "occupancy": waves,
        "mfma": len(mfma),
        "mfma_ops": sorted(set(mfma)),
        "hsaco": isinstance(hsaco, bytes) and hsaco.startswith(b"\x7fELF"),
    }


@dataclasses.dataclass
class Build:
    kind: str
    head_size: int
    group: int | None  # None: the cache write (no query heads)
    q_dtype: torch.dtype
    kv_dtype: torch.dtype | None  # None: a merge (reads fp32 partials)
    page_size: int | None
    config: str
    splits: int
    kernel: object
    kwargs: dict
    problems: list  # found by the selection checks

    def label(self) -> str:
        group = "-" if self.group is None else self.group
        kv = "-" if self.kv_dtype is None else DTYPE_NAMES[self.kv_dtype]
        return (
            f"{self.kind:<13} d{self.head_size:<3} g{group:<2} "
            f"{DTYPE_NAMES[self.q_dtype]}/{kv:<11} page{self.page_size or '-':<3} "
            f"{self.config:<10} splits={self.splits:<2}"
        )


def code_problems(build: Build, summary: dict) -> list[str]:
    problems = []
    if not summary["hsaco"]:
        problems.append("no hsaco")
    if summary["wavefront_size"] != MI300X_WARP_SIZE:
        problems.append(f"wavefront size {summary['wavefront_size']}")
    if summary["lds"] > MI300X_LDS_BYTES:
        problems.append(f"LDS {summary['lds']} > {MI300X_LDS_BYTES}")
    if summary["vgpr_spill_count"]:
        problems.append(f"{summary['vgpr_spill_count']} VGPR spills")
    known = (build.kind, build.head_size, build.kwargs.get("SPLITS_PAD"))
    if summary["sgpr_spill_count"] > KNOWN_SGPR_SPILLS.get(known, 0):
        problems.append(f"{summary['sgpr_spill_count']} SGPR spills")
    if summary["private_segment_fixed_size"] or summary["scratch"]:
        problems.append(
            f"scratch {summary['scratch']} "
            f"(private segment {summary['private_segment_fixed_size']})"
        )
    if build.kind in ATTENTION_KINDS:
        want = "bf16" if build.kv_dtype == torch.bfloat16 else "f16"
        if not summary["mfma"]:
            problems.append("no v_mfma")
        wrong = [op for op in summary["mfma_ops"] if op.rsplit("_", 1)[-1] != want]
        if wrong:
            problems.append(f"MFMA {wrong}, want {want} operands")
    return problems


def _tiles(config) -> str:
    tiles = f"{config.block_n}w{config.num_warps}s{config.num_stages}"
    return f"{config.block_m}x{tiles}" if hasattr(config, "block_m") else tiles


def _specialisation(kernel, kwargs: dict) -> tuple:
    """What a build specialises on: tensors by dtype and alignment, the rest by
    value (merges and cache writes repeat across cases)."""

    def norm(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
        if hasattr(value, "block_shape"):  # a TMA descriptor (never on ROCm)
            return ("descriptor", value.base.dtype, tuple(value.block_shape))
        return value

    return (kernel.__name__, *sorted((k, norm(v)) for k, v in kwargs.items()))


def builds() -> tuple[list[Build], list[str]]:
    """Every distinct build of the sweep, and the problems its selection shows
    (a split count the case's kind does not expect)."""
    out, problems, seen = [], [], set()

    def add(build: Build):
        key = _specialisation(build.kernel, build.kwargs)
        if key not in seen:
            seen.add(key)
            out.append(build)

    for case in cases():
        prefill = case.kind.startswith("prefill")
        launcher = prefill_launches if prefill else decode_launches
        config, num_splits, launches = launcher(case)
        if (num_splits > 1) != case.kind.endswith("-split"):
            problems.append(f"{case}: the selection chose {num_splits} splits")
        merge = "prefill-merge" if prefill else "decode-merge"
        for (kernel, _, kwargs), kind in zip(launches, (case.kind, merge)):
            attention = kind == case.kind
            add(
                Build(
                    kind=kind,
                    head_size=case.head_size,
                    group=case.group,
                    q_dtype=case.q_dtype,
                    kv_dtype=case.kv_dtype if attention else None,
                    page_size=PAGE_SIZES[case.kind] if attention else None,
                    config=_tiles(config) if attention else f"w{kwargs['num_warps']}",
                    splits=num_splits,
                    kernel=kernel,
                    kwargs=kwargs,
                    problems=hopper_path_problems(kind, config, kwargs)
                    if attention
                    else [],
                )
            )
    for head_size in HEAD_SIZES:
        for q_dtype, kv_dtype in DTYPE_PAIRS:
            ((kernel, _, kwargs),) = cache_write_launches(head_size, q_dtype, kv_dtype)
            config = f"{kwargs['HEADS_PER_PROGRAM']}h-w{kwargs['num_warps']}"
            add(
                Build(
                    "cache-write", head_size, None, q_dtype, kv_dtype,
                    PAGE_SIZES["prefill"], config, 1, kernel, kwargs, [],
                )
            )  # fmt: skip
    return out, problems


def markdown_table(rows: list[tuple[Build, dict]]) -> str:
    """The lines of a run, aggregated over groups and query dtypes: one row per
    kind, head size and cache class (16-bit: the query's dtype, or fp8)."""

    def span(values):
        low, high = min(values), max(values)
        return str(low) if low == high else f"{low}-{high}"

    classes = {}
    for build, summary in rows:
        key = (KINDS.index(build.kind), build.head_size, build.kv_dtype == FP8)
        classes.setdefault(key, []).append((build, summary))
    columns = (
        "kernel", "head size", "group", "dtype (query/cache)", "config", "VGPRs",
        "SGPRs", "LDS (bytes)", "occupancy (waves/SIMD)", "spills (VGPR/SGPR)",
        "scratch",
    )  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    short = {**DTYPE_NAMES, FP8: "fp8", None: "-"}
    for key in sorted(classes):
        members = classes[key]
        build = members[0][0]
        pairs = {
            (Q_DTYPES.index(b.q_dtype), short[b.q_dtype], short[b.kv_dtype])
            for b, _ in members
        }
        dtype = ", ".join(q if kv == "-" else f"{q}/{kv}" for _, q, kv in sorted(pairs))
        groups = sorted({b.group for b, _ in members if b.group is not None})
        col = {name: [s[name] for _, s in members] for name in members[0][1]}
        lines.append(
            f"| {build.kind} | {build.head_size} | "
            f"{', '.join(map(str, groups)) or '-'} | {dtype} | {build.config} | "
            f"{span(col['vgpr_count'])} | {span(col['sgpr_count'])} | "
            f"{span(col['lds'])} | {span(col['occupancy'])} | "
            f"{span(col['vgpr_spill_count'])}/{span(col['sgpr_spill_count'])} | "
            f"{span(col['scratch'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--markdown", action="store_true", help="also print docs/rocm.md's table"
    )
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("BAD amd_compile: run with TRITON_INTERPRET unset (it compiles)")
        return 2
    start = time.monotonic()
    with simulated_device() as props:
        from vllm.attention.ops import hardware

        target = GPUTarget("hip", props.gcnArchName.split(":")[0], props.warp_size)
        facts = (
            target,
            hardware.num_sms(DEVICE),
            hardware.shared_memory_per_program(DEVICE),
        )
        ok = facts == (MI300, MI300X_COMPUTE_UNITS, MI300X_LDS_BYTES)
        print(
            f"{'ok ' if ok else 'BAD'} simulated {props.name} "
            f"(torch.version.hip {torch.version.hip}): target {facts[0]}, "
            f"num_sms {facts[1]}, shared_memory_per_program {facts[2]}"
        )
        problems = device_gate_problems()
        todo, selection_problems = builds()
    problems += selection_problems
    for problem in problems:
        print(f"BAD {problem}")
    ok &= not problems
    counts = dict.fromkeys(KINDS, 0)
    rows = []
    for build in todo:
        try:
            compiled = compile_for_target(build.kernel, build.kwargs, target=MI300)
            summary = amdgcn_summary(compiled)
        except Exception as error:  # reported per build; the run goes on
            ok = False
            counts[build.kind] += 1
            print(f"BAD {build.label()} {type(error).__name__}: {error}", flush=True)
            continue
        problems = build.problems + code_problems(build, summary)
        ok &= not problems
        counts[build.kind] += 1
        rows.append((build, summary))
        ops = ",".join(op.removeprefix("v_mfma_") for op in summary["mfma_ops"])
        print(
            f"{'BAD' if problems else 'ok '} {build.label()} "
            f"vgpr={summary['vgpr_count']:<3} sgpr={summary['sgpr_count']:<3} "
            f"lds={summary['lds']:<5} occ={summary['occupancy']} "
            f"(llvm {summary['llvm_occupancy']}) "
            f"spills={summary['vgpr_spill_count']}/{summary['sgpr_spill_count']} "
            f"scratch={summary['scratch']} mfma={summary['mfma']}"
            + (f" [{ops}]" if ops else "")
            + (f" PROBLEMS {problems}" if problems else ""),
            flush=True,
        )
    if args.markdown:
        print(markdown_table(rows))
    print(
        f"{'ok ' if ok else 'BAD'} amd_compile: {len(todo)} gfx942 builds "
        f"({', '.join(f'{kind} {n}' for kind, n in counts.items())}) in "
        f"{time.monotonic() - start:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
