# SPDX-License-Identifier: Apache-2.0
"""The one loader of the attention kernels' tuning tables, with heuristic fallback.

A *table kind* (``prefix_prefill``, ``paged_decode``) is declared once, as a
``TuningTable``, by the module that knows its kernel (prefill_configs.py,
decode_configs.py): its config dataclass, its problem-key fields and how each is
normalised, and the heuristic for keys no table holds. This module does what every
kind shares: where the table of a GPU lives, how a JSON file parses into
``{key tuple: config}``, the per-process caches, and the lookup that falls back to
the heuristic. A kernel asks its kind's table directly
(``PREFILL_TABLE.lookup(...)``, ``DECODE_TABLE.lookup(...)``). The file schema is
in README.md.

Nothing happens at import time: the first lookup of a (kind, GPU) reads that file
once; later launches with the same key are a dict hit.
"""

import functools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm.attention.ops.hardware import SAME_ARCHITECTURE

TUNING_DIR = Path(__file__).resolve().parent
# Every table kind's file prefix (one TuningTable each, declared by its kernel).
KINDS = ("prefix_prefill", "paged_decode")

logger = logging.getLogger(__name__)


def _slug(gpu_name: str) -> str:
    """A GPU name as table files spell it: every non-alphanumeric run as '_'."""
    return re.sub(r"[^0-9A-Za-z]+", "_", gpu_name).strip("_")


def has_tables(gpu_name: str) -> bool:
    """Whether any kind of table is shipped for this GPU name."""
    return any((TUNING_DIR / f"{k}_{_slug(gpu_name)}.json").is_file() for k in KINDS)


@functools.cache
def device_gpu_name(device) -> str:
    """Name that picks a device's tables: ``torch.cuda.get_device_name`` when tables
    are shipped for it; else, for an NVIDIA architecture in SAME_ARCHITECTURE, the
    name of the tuned GPU there (logged once); else the device's own name (every
    lookup then takes the heuristic), and the device type off CUDA/ROCm. Queried
    once per device at the first launch, never at import."""
    if device.type != "cuda":
        return device.type
    import torch

    name = torch.cuda.get_device_name(device)
    if has_tables(name) or torch.version.hip is not None:
        return name
    stand_in = SAME_ARCHITECTURE.get(tuple(torch.cuda.get_device_capability(device)))
    if stand_in is None or not has_tables(stand_in):
        return name
    logger.info(
        "TRITON_ATTN: no tuning tables for %s; using those of %s (same "
        "architecture). To tune for this GPU: python3 "
        "benchmarks/kernels/tune_attention.py (vllm/attention/ops/tuning/"
        "README.md).",
        name,
        stand_in,
    )
    return stand_in


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dtype_name(dtype) -> str:
    """Table name of a torch dtype (or of a name); both fp8 e4m3 flavours are 'fp8'."""
    name = str(dtype).removeprefix("torch.")
    return "fp8" if name.startswith("float8") else name


# Key fields of every kind, with their normalisers: what changes which tiles are
# fast (never strides, batch size or context lengths). A kind appends its own.
COMMON_KEY_FIELDS: dict[str, Callable[[Any], Any]] = {
    "head_size": int,
    "q_dtype": dtype_name,
    "kv_dtype": dtype_name,
    "group": int,  # query heads per KV head
    "block_size": int,  # KV page size
}


@dataclass(frozen=True, eq=False)
class TuningTable:
    """One kind of tuning table: ``<kind>_<gpu>.json`` files in TUNING_DIR.

    kind: the file prefix, e.g. ``prefix_prefill``.
    config_cls: the frozen config dataclass; an entry's ``config`` object holds
        exactly its fields.
    key_fields: the problem key, in key order, as {field: normaliser}; the
        normaliser maps what a caller passes (a torch dtype, a raw length) to what
        the key and the JSON hold (a dtype name, a bucket bound).
    heuristic: the config for a key the GPU's table lacks, called as
        ``heuristic(**{f: normalised value for f in heuristic_fields}, is_hip=...)``.
    heuristic_fields: the key fields the heuristic takes.
    entry_refusal: why an entry cannot be what its key's launches run, called
        as ``entry_refusal(fields, config)`` with the normalised key fields
        (None: it can); the loader refuses such a file, naming the entry.

    Instances hash by identity, so each module-level table has its own cache
    entries.
    """

    kind: str
    config_cls: type
    key_fields: dict[str, Callable[[Any], Any]]
    heuristic: Callable[..., Any]
    heuristic_fields: tuple[str, ...]
    entry_refusal: Callable[[dict, Any], str | None] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"add table kind {self.kind!r} to tables.KINDS")

    def path(self, gpu_name: str) -> Path:
        """``<kind>_<gpu>.json``, every non-alphanumeric run of the name as '_'."""
        return TUNING_DIR / f"{self.kind}_{_slug(gpu_name)}.json"

    def key(self, **fields) -> tuple:
        """The problem key of one launch: every key field, normalised, in order."""
        if fields.keys() != self.key_fields.keys():
            raise TypeError(
                f"{self.kind} problem key takes exactly the fields "
                f"{list(self.key_fields)}, got {sorted(fields)}"
            )
        return tuple(norm(fields[name]) for name, norm in self.key_fields.items())

    def entry(self, key: tuple, config) -> dict:
        """One JSON entry: the key fields, then ``config`` (inverse of ``load``)."""
        return {**dict(zip(self.key_fields, key)), "config": asdict(config)}

    def load(self, gpu_name: str) -> dict:
        """The table of one GPU as {problem key: config}; empty if there is no
        file. Read once per process."""
        return _load(self, gpu_name)

    def lookup(self, *, gpu_name: str, is_hip: bool = False, **fields):
        """Config for one launch: the GPU's table entry for the key of ``fields``,
        else for its stand-in key (fp16 queries: the bf16 entry), else the
        heuristic. Runs on every launch, so the answer is memoised on the
        arguments as given (a hit costs one dict probe, no key building)."""
        return _lookup(self, gpu_name, is_hip, **fields)


def clear_caches() -> None:
    """Forget every loaded table and memoised lookup (for tests that swap files)."""
    _load.cache_clear()
    _lookup.cache_clear()
    device_gpu_name.cache_clear()


@functools.cache
def _load(table: TuningTable, gpu_name: str) -> dict:
    path = table.path(gpu_name)
    if not path.is_file():
        return {}
    parsed, first = {}, {}
    for i, entry in enumerate(json.loads(path.read_text())["configs"]):
        try:
            key = table.key(**{name: entry[name] for name in table.key_fields})
            parsed[key] = table.config_cls(**entry["config"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}: entry {i} does not match the {table.kind} schema "
                f"(fields {list(table.key_fields)} and a config of "
                f"{table.config_cls.__name__}; see tuning/README.md): {exc!r}"
            ) from exc
        refusal = table.entry_refusal and table.entry_refusal(
            dict(zip(table.key_fields, key)), parsed[key]
        )
        if refusal:
            raise ValueError(
                f"{path}: entry {i} ({dict(zip(table.key_fields, key))}, "
                f"{parsed[key]}): {refusal}; fix or remove the entry"
            )
        if key in first:  # e.g. groups 7 and 8: one key (a normaliser's class)
            raise ValueError(
                f"{path}: entries {first[key]} and {i} have the same key "
                f"{dict(zip(table.key_fields, key))}; keep one"
            )
        first[key] = i
    return parsed


# A key of fp16 queries that its GPU's table lacks takes the entry of the same key in
# bf16 (a 16-bit cache of the query's dtype follows it; an fp8 cache stays): both run
# the same tiles on the same tensor-core rate, and tables are tuned in bf16.
DTYPE_STAND_INS = {"float16": "bfloat16"}


def stand_in_key(table: TuningTable, key: tuple) -> tuple | None:
    """The key whose entry stands in for ``key`` (DTYPE_STAND_INS), or None."""
    named = dict(zip(table.key_fields, key))
    q_dtype = named.get("q_dtype")
    if q_dtype not in DTYPE_STAND_INS:
        return None
    named["q_dtype"] = DTYPE_STAND_INS[q_dtype]
    if named.get("kv_dtype") == q_dtype:
        named["kv_dtype"] = named["q_dtype"]
    return tuple(named.values())


# Sized for every max_query_len a server sees (one entry each per model shape).
@functools.lru_cache(maxsize=16384)
def _lookup(table: TuningTable, gpu_name: str, is_hip: bool, **fields):
    key = table.key(**fields)
    entries = _load(table, gpu_name)
    config = entries.get(key)
    if config is None and (stand_in := stand_in_key(table, key)) is not None:
        config = entries.get(stand_in)
    if config is None:
        normalised = dict(zip(table.key_fields, key))
        config = table.heuristic(
            **{name: normalised[name] for name in table.heuristic_fields},
            is_hip=bool(is_hip),
        )
    return config
