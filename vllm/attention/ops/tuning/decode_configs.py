# SPDX-License-Identifier: Apache-2.0
"""Launch configurations of the paged decode kernel: table lookup + heuristic.

A configuration is ``(block_n, num_warps, num_stages)``. It is chosen per *problem
key*, the properties that change which tiles are fast:

    head_size, q_dtype, kv_dtype, group (q heads per KV head), block_size,
    split (num_splits > 1)

never by strides, batch size or context lengths, so a captured CUDA graph keeps one
specialisation. Tables are JSON files in this folder, one per GPU name
(``paged_decode_<gpu>.json``, same schema idea as the prefill tables, see
README.md); a key missing from the table falls back to ``heuristic_decode_config``.
``DECODE_CONFIG_SPACE`` is the sweep that ``benchmarks/kernels/bench_kernels.py
--retune-decode`` searches. Nothing is read at import time.
"""

import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from vllm.attention.ops.tuning.prefill_configs import (
    TUNING_DIR,
    dtype_name,
    next_power_of_2,
)

# 27 configs: about 1 min of compiling and timing per problem key on an H200.
DECODE_CONFIG_SPACE = {
    "block_n": (32, 64, 128),
    "num_warps": (2, 4, 8),
    "num_stages": (1, 2, 3),
}

# Shared memory of one Hopper SM as Triton sees it (232,448 bytes per program).
_SMEM_BYTES = 232_448


@dataclass(frozen=True)
class DecodeConfig:
    """block_n: keys per KV tile (independent of the page size; a tile may span
    pages). num_warps / num_stages: Triton launch knobs (stages pipeline the K/V
    loads of the tile loop)."""

    block_n: int
    num_warps: int
    num_stages: int


def problem_key(
    *, head_size: int, q_dtype, kv_dtype, group: int, block_size: int, split: bool
) -> tuple:
    return (
        int(head_size),
        dtype_name(q_dtype),
        dtype_name(kv_dtype),
        int(group),
        int(block_size),
        bool(split),
    )


def is_valid_config(config: DecodeConfig, *, head_size: int, kv_dtype) -> bool:
    """Cheap filter for a sweep: the pipelined K/V tiles fit shared memory."""
    head_pad = next_power_of_2(head_size)
    kv_bytes = 1 if dtype_name(kv_dtype) == "fp8" else 2
    smem = config.num_stages * 2 * config.block_n * head_pad * kv_bytes
    return config.block_n >= 16 and smem <= _SMEM_BYTES


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
    small_head = next_power_of_2(head_size) <= 128
    block_n = 64 if small_head or dtype_name(kv_dtype) == "fp8" else 32
    return DecodeConfig(block_n=block_n, num_warps=4, num_stages=2)


def table_path(gpu_name: str) -> Path:
    """``paged_decode_<gpu>.json`` with every non-alphanumeric run as '_'."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", gpu_name).strip("_")
    return TUNING_DIR / f"paged_decode_{slug}.json"


@functools.cache
def load_decode_table(gpu_name: str) -> dict[tuple, DecodeConfig]:
    """The table of one GPU as {problem key: config}; empty if there is no file."""
    path = table_path(gpu_name)
    if not path.is_file():
        return {}
    table = {}
    for entry in json.loads(path.read_text())["configs"]:
        key = problem_key(
            head_size=entry["head_size"],
            q_dtype=entry["q_dtype"],
            kv_dtype=entry["kv_dtype"],
            group=entry["group"],
            block_size=entry["block_size"],
            split=entry["split"],
        )
        table[key] = DecodeConfig(**entry["config"])
    return table


@functools.lru_cache(maxsize=4096)
def get_decode_config(
    *,
    gpu_name: str,
    head_size: int,
    q_dtype,
    kv_dtype,
    group: int,
    block_size: int,
    split: bool,
    is_hip: bool = False,
) -> DecodeConfig:
    """Config for one launch: the GPU's table entry, else the heuristic. Cached
    (it runs every decode step)."""
    key = problem_key(
        head_size=head_size,
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        group=group,
        block_size=block_size,
        split=split,
    )
    config = load_decode_table(gpu_name).get(key)
    if config is None:
        config = heuristic_decode_config(
            head_size=head_size, kv_dtype=kv_dtype, is_hip=is_hip
        )
    return config


def table_entry(key: tuple, config: DecodeConfig) -> dict:
    """One JSON entry (the inverse of the parsing in load_decode_table)."""
    head_size, q_dtype, kv_dtype, group, block_size, split = key
    return {
        "head_size": head_size,
        "q_dtype": q_dtype,
        "kv_dtype": kv_dtype,
        "group": group,
        "block_size": block_size,
        "split": split,
        "config": asdict(config),
    }
