# SPDX-License-Identifier: Apache-2.0
"""Launch configurations of the paged decode kernel: table lookup + heuristic.

A configuration is ``(block_n, num_warps, num_stages, early_convert)``. It is
chosen per *problem key*, the properties that change which tiles are fast:

    head_size, q_dtype, kv_dtype, group (q heads per KV head), block_size,
    split (num_splits > 1)

never by strides, batch size or context lengths, so a captured CUDA graph keeps one
specialisation. Tables are JSON files in this folder, one per GPU name
(``paged_decode_<gpu>.json``: the prefill tables' schema with ``split`` in place
of ``max_query_len``, see README.md); a key missing from the table (every key of a
GPU without a decode table) falls back to ``heuristic_decode_config``.
``DECODE_CONFIG_SPACE`` is the sweep of ``benchmarks/kernels/tune_attention.py
--kernel decode``, filtered by ``is_valid_config``.

``DECODE_TABLE`` declares the kind for the one loader in tables.py, which finds,
parses and caches the files and falls back to the heuristic
(``DECODE_TABLE.lookup``). Nothing is read at import time.
"""

from dataclasses import dataclass

from vllm.attention.ops.hardware import HOPPER_SMEM_BYTES_PER_PROGRAM
from vllm.attention.ops.triton_attention_common import head_pad as head_pad_of
from vllm.attention.ops.tuning import tables

# 27 configs per 16-bit key (about 1 min of compiling and timing on an H200), 54 per
# fp8 key (early_convert applies to fp8 caches only).
DECODE_CONFIG_SPACE = {
    "block_n": (32, 64, 128),
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3),
    "early_convert": (False, True),
}


@dataclass(frozen=True)
class DecodeConfig:
    """block_n: keys per KV tile (independent of the page size; a tile may span
    pages). num_warps / num_stages: Triton launch knobs (stages pipeline the K/V
    loads of the tile loop). early_convert: e4m3fn caches on NVIDIA only: convert
    each K/V tile to fp16 where it is loaded (inline PTX), so that it reaches the
    tensor cores through ``ldmatrix`` rather than byte-wide shared-memory loads
    (``triton_attention_common.e4m3_to_fp16_at_load``); ignored elsewhere."""

    block_n: int
    num_warps: int
    num_stages: int
    early_convert: bool = False


def is_valid_config(config: DecodeConfig, *, head_size: int, kv_dtype) -> bool:
    """Cheap filter for a sweep: the pipelined K/V tiles fit shared memory."""
    head_pad = head_pad_of(head_size)
    kv_bytes = 1 if tables.dtype_name(kv_dtype) == "fp8" else 2
    smem = config.num_stages * 2 * config.block_n * head_pad * kv_bytes
    return (
        config.block_n >= 16
        and smem <= HOPPER_SMEM_BYTES_PER_PROGRAM
        and not (config.early_convert and kv_bytes != 1)
    )


def heuristic_decode_config(
    *, head_size: int, kv_dtype, is_hip: bool = False
) -> DecodeConfig:
    """Fallback when the table has no entry.

    Decode is bound by reading K/V: a tile should carry enough bytes per
    iteration (64 keys x d128 x 2 B = 16 KB per K tile) while keeping the fp32
    ``[16, HEAD_PAD]`` accumulator and the tiles in registers, so 64 keys up to
    head size 128 and 32 beyond; fp8 tiles are half the bytes, so 64 keys at any
    head size. Two stages double-buffer the loads. AMD: 32 keys, 1 stage.
    """
    if is_hip:
        return DecodeConfig(block_n=32, num_warps=4, num_stages=1)
    small_head = head_pad_of(head_size) <= 128
    block_n = 64 if small_head or tables.dtype_name(kv_dtype) == "fp8" else 32
    return DecodeConfig(block_n=block_n, num_warps=4, num_stages=2)


# The most splits a ``WaveRule`` chooses unless it says otherwise (``max_splits``).
MAX_WAVE_SPLITS = 8


@dataclass(frozen=True)
class WaveRule:
    """``choose_decode_splits``' wave-aware rule for one build of the decode kernel.

    programs_per_sm: the resident decode programs an SM holds at the build's
    register use. program_overhead: the share of an unsplit program's time that
    every split program spends again whatever its keys (query load, softmax state,
    partial store, its share of the merge). any_count: choose among every split
    count up to ``max_splits``, for every batch whose grid that many splits bring
    to a full wave; otherwise among powers of two, for grids past the split target
    only (smaller batches keep the target rule). max_splits: the most splits the
    rule chooses (the call's cap still holds). With ``any_count`` a larger cap
    reaches smaller batches: at 64, an e4m3 batch of 4 sequences x 8 KV heads
    gets 12 splits, one wave of 384 programs, where the target rule's 16 make 512,
    1.3 waves of 396.
    """

    programs_per_sm: int
    program_overhead: float = 0.15
    any_count: bool = False
    max_splits: int = MAX_WAVE_SPLITS


# The wave-aware rule of the sm_90 build of the heuristic decode config, by KV-cache
# dtype; listed only where a GPU run measured it faster than the default (8 KV
# heads, pages of 16, against FA3).
# - fp8 e4m3: 150 registers a thread, 3 programs per SM. Any count, at an overhead
#   of 0.05 (the measured split counts fit it, 0.15 picked 2 at batch 64): 3 splits
#   at batches 16, 32, 64 and 128, 2 at 256, none at 96 and 192 (H100, contexts of
#   1k, 8k and 32k, one count forced per arm: batch 32 x 8k 0.74x -> 1.00x FA3,
#   batch 16 x 32k 0.73x -> 0.98x, batch 128 x 8k 0.91x -> 1.00x; batches 96-256 x
#   1k at 1.05x-1.17x). Batch 8 gets 6 (x 32k: 0.99x FA3, 4 and 8 splits 0.80x and
#   0.74x). The rule as a whole at 32k, batches 8-256: 0.98x FA3 median, worst 0.94x
#   (batch 40, unsplit: a wave 81% full, where 2 splits gave 0.97x). Up to 64
#   splits (max_splits), so that batches 1-6 fill one wave too (49, 24, 16, 12, 9
#   and 8 splits where the target rule gave 64, 32, 32, 16, 16 and 16): faster at
#   all 12 points of batches 1-6 at 8k and 32k contexts (H200, two rounds; at 32k
#   0.84x -> 0.97x FA3 at the median, worst 0.72x -> 0.93x; at 8k 1.02x -> 1.12x,
#   worst 0.86x -> 0.99x); from batch 7 up the counts are those of a cap of 8.
# - bf16: 118 registers, 4 per SM, past the target (batch 77 x 8k 0.89x -> 0.96x
#   FA3 and batch 96 0.98x -> 0.99x on an H100, batch 77 x 1.5k 0.91x -> 1.03x on
#   an H200; batches 64, 102 and 128 stay unsplit, as measured fastest). Any
#   count, at the default overhead of 0.15: of 8 KV heads on 132 SMs it changes
#   batches 9-49 only (12: 8 -> 5 splits, 24: 4 -> 2, 34-44: 2 -> 3, 45-49: 2 ->
#   1), faster at all four measured (H200, 10k contexts, batches 12, 24, 40 and
#   46, two rounds: 1.01x -> 1.12x FA3 at the median, worst 0.92x -> 1.03x).
# fp16 caches take bf16's rule (wave_rule; batch 77 x 8k 0.89x -> 0.96x FA3 on an
# H100). test_paged_decode's compile test checks the counts against the builds.
WAVE_RULES = {
    # max_splits: the decode cap (MAX_DECODE_SPLITS, which a test checks)
    "fp8": WaveRule(
        programs_per_sm=3, program_overhead=0.05, any_count=True, max_splits=64
    ),
    "bfloat16": WaveRule(programs_per_sm=4, any_count=True),
}


def wave_rule(*, kv_dtype, hopper: bool) -> WaveRule | None:
    """The ``WaveRule`` for ``choose_decode_splits`` (None: the default rule):
    ``WAVE_RULES`` on sm_90 (``hopper``; CPU interpreter runs pretend to be an H200,
    as for the SM count), an fp16 cache taking bf16's (``tables.DTYPE_STAND_INS``:
    the same build, registers and residency), None elsewhere."""
    if not hopper:
        return None
    name = tables.dtype_name(kv_dtype)
    return WAVE_RULES.get(name, WAVE_RULES.get(tables.DTYPE_STAND_INS.get(name)))


DECODE_TABLE = tables.TuningTable(
    kind="paged_decode",
    config_cls=DecodeConfig,
    key_fields={**tables.COMMON_KEY_FIELDS, "split": bool},
    heuristic=heuristic_decode_config,
    heuristic_fields=("head_size", "kv_dtype"),
)
