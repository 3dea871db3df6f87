# SPDX-License-Identifier: Apache-2.0
"""Compile Triton kernels for GPU targets without a GPU (ahead of time).

The interpreter runs kernels as numpy and accepts code the GPU compiler rejects
(e.g. non-constexpr globals) and says nothing about the generated code. This
helper builds the kernel for ``sm_90`` from the same keyword arguments a launcher
passes, so a CPU-only test can check that it compiles and that the PTX uses wgmma
and cp.async pipelining. It must run with ``TRITON_INTERPRET`` unset (under the
interpreter ``@triton.jit`` builds interpreted functions); the tests run this
module (``python -m`` with its module name) in a subprocess for that.

Argument specialisation mirrors Triton's launcher: pointers and ints divisible by
16 get the divisibility-16 hint, ints equal to 1 become constexpr 1.
"""

import dataclasses
import glob
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.tensor_descriptor import TensorDescriptor

_TRITON_DTYPE = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e4m3fnuz: "fp8e4b8",
    torch.float8_e5m2: "fp8e5",
}


def importable(path) -> tuple[str, Path]:
    """The module name of the test file at ``path`` and the directory to import it
    from (the parent of its ``tests`` folder), wherever the test tree is placed."""
    path = Path(path).resolve()
    root = next(p.parent for p in path.parents if p.name == "tests")
    return ".".join(path.relative_to(root).with_suffix("").parts), root


def run_compile_module(path, timeout: int) -> subprocess.CompletedProcess:
    """Run the compile-check module at ``path`` (``python -m``, from the parent of
    its ``tests`` folder) with ``TRITON_INTERPRET`` unset, so ``@triton.jit``
    builds real kernels; its output captured."""
    module, root = importable(path)
    return subprocess.run(
        [sys.executable, "-m", module],
        check=False,
        cwd=root,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


HOPPER = GPUTarget("cuda", 90, 32)
try:
    import triton.experimental.gluon  # noqa: F401

    HAS_GLUON = True
except ImportError:  # a Triton without Gluon: the portable kernel only
    HAS_GLUON = False
MI300 = GPUTarget("hip", "gfx942", 64)


def compile_for_target(kernel, kwargs: dict, *, target: GPUTarget = HOPPER):
    """``triton.compile`` the JIT kernel for ``target`` with these arguments
    (tensors may live on the CPU: only dtype and alignment matter)."""
    kwargs = dict(kwargs)
    options = {
        "num_warps": kwargs.pop("num_warps", 4),
        "num_stages": kwargs.pop("num_stages", 3),
    }
    constexpr_names = {kernel.arg_names[i] for i in kernel.constexprs}
    unspecialized = {p.name for p in kernel.params if p.do_not_specialize}
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(kernel.arg_names):
        value = kwargs[name]
        divisible = False
        if name in constexpr_names or value is None or isinstance(value, bool):
            signature[name] = "constexpr"
            constexprs[name] = value
            continue
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_DTYPE[value.dtype]
            divisible = value.data_ptr() % 16 == 0
        elif isinstance(value, int):
            if name in unspecialized:
                signature[name] = "i32"
                continue
            if value == 1:
                signature[name] = "constexpr"
                constexprs[name] = 1
                continue
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            divisible = value % 16 == 0
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif isinstance(value, TensorDescriptor):
            block = ",".join(str(n) for n in value.block_shape)
            signature[name] = f"tensordesc<{_TRITON_DTYPE[value.base.dtype]}[{block}]>"
            continue
        else:
            raise TypeError(f"argument {name}: unsupported {type(value)}")
        if divisible:
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(
        fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs
    )
    return triton.compile(source, target=target, options=options)


def compile_gluon_for_target(kernel, kwargs: dict, *, target: GPUTarget = HOPPER):
    """``compile_for_target`` for a ``@gluon.jit`` kernel: the same specialisation,
    with Gluon's TMA descriptors typed by their block and shared-memory layout."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import (
        TensorDescriptor as GluonDescriptor,
    )

    kwargs = dict(kwargs)
    options = {"num_warps": kwargs.pop("num_warps", 4)}
    constexpr_names = {kernel.arg_names[i] for i in kernel.constexprs}
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(kernel.arg_names):
        value = kwargs.get(name, options["num_warps"] if name == "num_warps" else None)
        if name in constexpr_names or value is None or isinstance(value, bool):
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, GluonDescriptor):
            block = ", ".join(str(n) for n in value.block_shape)
            dtype = _TRITON_DTYPE[value.base.dtype]
            signature[name] = f"tensordesc<{dtype}[{block}],{value.layout!r}>"
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_DTYPE[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif isinstance(value, int):
            signature[name] = "i32"
        else:
            raise TypeError(f"argument {name}: unsupported {type(value)}")
    source = GluonASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=target, options=options)


def wgmma_serialized(compiled) -> bool:
    """Whether ptxas (shipped with Triton) reports that it serialised the
    asynchronous wgmma of the build (warning C7514: a register of an accumulator in
    flight is read before its wait), which undoes the overlap the code states."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    if not os.path.exists(tool):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        target = re.search(r"\.target (\S+)", compiled.asm["ptx"])[1]
        out = subprocess.run(
            [tool, "-v", f"--gpu-name={target}", ptx, "-o", ptx + ".cubin"],
            capture_output=True,
            text=True,
            check=True,
        )
    return "C7514" in out.stdout + out.stderr


def read_cubin(compiled, tool: str, *args: str) -> str | None:
    """What ``tool`` (one of the CUDA binary tools shipped with Triton) prints for
    the cubin Triton built for sm_90, with ``args`` before the file; None when
    there is no cubin or no such tool."""
    path = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin", tool)
    if "cubin" not in compiled.asm or not os.path.exists(path):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run(
            [path, *args, f.name], capture_output=True, text=True, check=True
        ).stdout


def resources(compiled) -> dict:
    """Registers and stack frame (bytes; spilled registers live there) of the sm_90
    cubin, as ``cuobjdump -res-usage`` reads them; empty when there is no cubin or
    no cuobjdump."""
    out = read_cubin(compiled, "cuobjdump", "-res-usage") or ""
    match = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return {"registers": int(match[1]), "stack_bytes": int(match[2])} if match else {}


def softmax_overlaps_pv(compiled, block_n: int) -> bool | None:
    """Whether a warpgroup's softmax runs while its own p.v is in flight in the
    sm_90 build, as nvdisasm reads the cubin: after every wait that leaves wgmma
    groups in flight (``WARPGROUP.DEPBAR.LE gsb0`` with a non-zero count: q.k
    complete, p.v not), the tile's exponentials (``MUFU.EX2``, ``block_n / 2`` a
    thread for 64 rows) come before the next wait for all groups. ptxas may move
    that wait up to the top of its basic block, before the softmax
    (docs/kernels.md, "Where the build waits for p.v"). None without a cubin or
    nvdisasm."""
    sass = read_cubin(compiled, "nvdisasm", "-c")
    if sass is None:
        return None
    # The exponentials after each wait that leaves groups in flight, up to the
    # next wait.
    events = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)|(MUFU\.EX2)", sass)
    exps_in_flight = []
    in_flight = 0
    for depth, ex2 in events:
        if not ex2:
            in_flight = int(depth, 16)
            if in_flight:
                exps_in_flight.append(0)
        elif in_flight:
            exps_in_flight[-1] += 1
    return bool(exps_in_flight) and min(exps_in_flight) >= block_n // 2


def sm90_resident_programs(*, registers: int, num_warps: int, shared_bytes: int) -> int:
    """Programs of one build an sm_90 SM holds at once: registers are given out per
    warp in units of 256 (a thread's count rounded up to 8) from 65,536, warps
    up to 64, programs up to 32, shared memory 233,472 bytes with 1 KiB reserved
    per program (the CUDA occupancy rules)."""
    per_warp = -(-registers // 8) * 8 * 32
    return min(
        65536 // (per_warp * num_warps),
        64 // num_warps,
        32,
        233472 // (shared_bytes + 1024),
    )


def ptx_summary(compiled) -> dict:
    ptx = compiled.asm["ptx"]
    return {
        **resources(compiled),
        "wgmma": ptx.count("wgmma.mma_async"),
        # fp8_qk: q.k on fp8 tensor cores (wgmma with e4m3 operands).
        "wgmma_e4m3": ptx.count("e4m3.e4m3"),
        # The Gluon kernel's soft-cap: one MUFU tanh per score.
        "tanh": ptx.count("tanh.approx.f32"),
        # The Gluon kernel's waits for its wgmma commit groups (how many each
        # leaves in flight), and its 32-column products (split_head's second part).
        "wgmma_waits": sorted(
            {int(n) for n in re.findall(r"wgmma\.wait_group\S* (\d+)", ptx)}
        ),
        "wgmma_n32": len(re.findall(r"wgmma\.mma_async\S*\.m64n32k", ptx)),
        "mma_sync": ptx.count("mma.sync"),
        "cp_async": ptx.count("cp.async"),
        "tma": ptx.count("cp.async.bulk.tensor"),
        # e4m3 -> bf16 goes through fp16 on sm_90: the second conversion per element
        # that fp8 caches avoid by running their dots in fp16.
        "cvt_bf16_f16": ptx.count("cvt.bf16.f16"),
        # The Gluon kernel's fp8 converter: e4m3 pairs to fp16 pairs; and the 16-bit
        # selects (the zeroing of value rows past the sequence end).
        "cvt_e4m3_f16": ptx.count("cvt.rn.f16x2.e4m3x2"),
        "selp_b16": ptx.count("selp.b16"),
        "shared_bytes": compiled.metadata.shared,
    }


def _amd_prefix_prefill_kwargs():
    """MI300 launch: fp8 e4m3fnuz cache, every feature on, the HIP heuristic."""
    from vllm.attention.ops.tuning.prefill_configs import heuristic_prefill_config

    heads = torch.empty(16)
    config = heuristic_prefill_config(
        head_size=128, group=8, block_size=16, max_query_len=1024, is_hip=True
    )
    _, _, kwargs = prefill_launch(
        128, 8, 16, torch.float8_e4m3fnuz, 1024, config.use_tma, config,
        sliding_window=64, alibi_slopes=heads, logits_soft_cap=5.0, sinks=heads,
    )  # fmt: skip
    return kwargs


# Stack frame the Gluon builds may keep up to head size 128: the 128 x 128 tile at
# head size 128 spills one 8-byte register (Triton 3.6).
MAX_GLUON_STACK_BYTES = 8
# Three consumer warpgroups (160 registers each) with a soft-cap spill (80-88
# bytes a thread, Triton 3.8) with a window, or with the softmax overlapping the
# warpgroup's own p.v (its registers live while p.v is in flight); no served
# model has a soft-cap at head 64 (Gemma-2's heads are 256).
MAX_GLUON_3WG_SOFTCAP_STACK_BYTES = 96
# Marks the cases that are H200 table entries a GPU sweep chose by timing.
TIMED = "[timed H200 table entry]"
# Marks the portable builds behind table entries that run the Gluon kernel on
# Hopper: the key's heuristic config, which the portable kernel runs only for what
# the Gluon kernel refuses (ALiBi, non-causal, a KV split). They may spill
# as much as the timed tiles.
GLUON_FALLBACK = "[Gluon entry, portable fallback]"
# Head sizes whose rows are not 16-byte multiples: no TMA, no cp.async alignment.
ODD_HEAD = "[odd head size]"
RECORDS = os.path.join(
    os.path.dirname(__file__), "..", "..", "benchmarks", "results", "tuning"
)


def _timed_entries():
    """{(table key, PrefillConfig)} of every winner in the committed prefill tuning
    records (a record not merged into the table adds pairs no entry matches); None
    where the records are not shipped (the tests inside an upstream tree), whose
    table is only the records' winners (see its provenance)."""
    from vllm.attention.ops.tuning.prefill_configs import PREFILL_TABLE, PrefillConfig

    if not os.path.isdir(RECORDS):
        return None
    from benchmarks.kernels.merge_tuning import current_prefill_config

    winners = set()
    for path in glob.glob(os.path.join(RECORDS, "*-prefill*.json")):
        with open(path) as f:
            records = json.load(f).get("records", [])
        for record in records:
            if "key" in record and "best" in record:
                # A winner with a retired field (a register cap) is one the
                # kernels no longer run.
                best = current_prefill_config(record["best"])
                if best is not None:
                    key = PREFILL_TABLE.key(**record["key"])
                    winners.add((key, PrefillConfig(**best)))
    return winners


# (BLOCK_M, BLOCK_N, num_warps, num_stages) of tiles that GPU sweeps chose over
# spill-free candidates although they spill a few hundred bytes per thread up to
# head size 128; the H200 table and the heuristic use them. Data, so that the check
# also holds where the tuning records are not shipped (an upstream tree); where
# they are, main() checks that each is a recorded winner.
TIMED_TILES = frozenset({(128, 64, 4, 2), (128, 128, 4, 2), (256, 64, 8, 3)})
# The most those tiles may spill (bytes per thread, up to head size 128): their
# builds spill 140-500 bytes with Triton 3.6 and up to 576 with 3.8. Code that keeps
# more registers live in the key loop (the split-KV arithmetic did, before SPLIT_KV
# became a constexpr: 750-1550 bytes) fails here, not only in a benchmark.
MAX_TIMED_SPILL_BYTES = 640
# The same for their split variants (SPLIT_KV), whose epilogue stores fp32 partials:
# about 700-760 bytes at group 1 with Triton 3.6 and 3.8. Per-row 64-bit workspace
# offsets made them spill 1700-1760 (and ran the matrix's split points 10-26%
# slower); this fails on that, not only in a benchmark.
MAX_SPLIT_SPILL_BYTES = 896


def _recorded_tiles_missing() -> set:
    """The TIMED_TILES no committed tuning record has as a winner (empty where the
    records are not shipped)."""
    timed = _timed_entries()
    if timed is None:
        return set()
    won = {(c.block_m, c.block_n, c.num_warps, c.num_stages) for _, c in timed}
    return set(TIMED_TILES - won)


def prefill_launches(
    *,
    config,
    max_query_len,
    seq_start=0,
    num_seqs=None,
    num_splits=1,
    workspace=None,
    max_seq_len=None,
    **tensors,
) -> list:
    """``prefix_prefill._launches`` of the plan that ``plan_prefill`` makes for
    these tensors and features (``config`` and ``num_splits`` as given; on the
    tensors' device): the launches a call with them makes."""
    from vllm.attention.ops import prefix_prefill as pp
    from vllm.attention.ops.triton_attention_common import AttentionInputs

    layer_args = ("query", "key_cache", "sliding_window", "alibi_slopes",
                  "logits_soft_cap", "sinks", "causal")  # fmt: skip
    query = tensors["query"]
    plan = pp.plan_prefill(
        layer=pp.PrefillLayer.of(**{k: tensors[k] for k in layer_args if k in tensors}),
        device=query.device, seq_start=seq_start,
        num_seqs=num_seqs if num_seqs is not None else tensors["seq_lens"].shape[0],
        num_tokens=query.shape[0], max_query_len=max_query_len,
        max_seq_len=max_seq_len, config=config, num_splits=num_splits,
        workspace=None if workspace is None else workspace.view(-1),
    )  # fmt: skip
    return pp._launches(plan, AttentionInputs(**tensors))


def prefill_launch(
    head_size,
    group,
    block_size,
    cache_dtype,
    max_query_len,
    use_tma=False,
    config=None,
    **extra,
):
    """``(name, grid, keyword arguments)`` of one prefill launch on CPU tensors (2 KV
    heads, 4 sequences): the heuristic's config unless one is given."""
    from vllm.attention.ops.tuning.prefill_configs import heuristic_prefill_config

    num_kv_heads = 2
    query = torch.empty((64, num_kv_heads * group, head_size), dtype=torch.bfloat16)
    cache = torch.empty((8, 2, num_kv_heads, block_size, head_size), dtype=cache_dtype)
    fp8 = cache_dtype != torch.bfloat16
    scale = torch.ones(1) if fp8 else None
    config = config or heuristic_prefill_config(
        head_size=head_size,
        group=group,
        block_size=block_size,
        max_query_len=max_query_len,
        kv_dtype=cache_dtype,
    )
    config = dataclasses.replace(config, use_tma=use_tma)
    ((_, grid, kwargs),) = prefill_launches(
        query=query,
        key_cache=cache[:, 0],
        value_cache=cache[:, 1],
        output=torch.empty_like(query),
        block_table=torch.zeros((4, 37), dtype=torch.int32),
        query_start_loc=torch.zeros(5, dtype=torch.int32),
        seq_lens=torch.zeros(4, dtype=torch.int32),
        max_query_len=max_query_len,
        softmax_scale=0.1,
        num_seqs=4,
        k_scale=scale,
        v_scale=scale,
        config=config,
        **{
            "sliding_window": None,
            "alibi_slopes": None,
            "logits_soft_cap": None,
            "sinks": None,
            **extra,
        },
    )
    name = f"d{head_size}-g{group}-bs{block_size}-{cache_dtype}-{config}"
    return name, grid, kwargs


def prefill_merge_launch(head_size=128, group=4, num_splits=4, sinks=True):
    """``(name, keyword arguments)`` of the merge launch of a split prefill call on
    CPU tensors (2 KV heads, 4 sequences)."""
    (_, (_, _, kwargs)) = _split_launches(head_size, group, num_splits, sinks)
    return f"prefill merge d{head_size}-g{group} sinks={sinks}", kwargs


def _split_launches(
    head_size=128, group=4, num_splits=4, sinks=True, config=None
) -> list:
    """The two launches (kernel, merge) of a split prefill call on CPU tensors (2
    KV heads, 4 sequences; 64x64 TMA tiles unless ``config`` is given)."""
    from vllm.attention.ops import prefix_prefill as pp

    config = config or pp.PrefillConfig(64, 64, 4, 2, use_tma=True)

    num_kv_heads, num_seqs, max_query_len = 2, 4, 16
    query = torch.empty((64, num_kv_heads * group, head_size), dtype=torch.bfloat16)
    cache = torch.empty((8, 2, num_kv_heads, 64, head_size), dtype=torch.bfloat16)
    shape = pp.split_workspace_shape(
        num_seqs=num_seqs, max_query_len=max_query_len, num_tokens=query.shape[0],
        num_q_heads=query.shape[1], head_size=head_size, num_splits=num_splits,
    )  # fmt: skip
    launches = prefill_launches(
        query=query, key_cache=cache[:, 0], value_cache=cache[:, 1],
        output=torch.empty_like(query),
        block_table=torch.zeros((num_seqs, 37), dtype=torch.int32),
        query_start_loc=torch.zeros(num_seqs + 1, dtype=torch.int32),
        seq_lens=torch.zeros(num_seqs, dtype=torch.int32),
        max_query_len=max_query_len, softmax_scale=0.1,
        num_seqs=num_seqs, k_scale=None, v_scale=None, sliding_window=None,
        alibi_slopes=None, logits_soft_cap=None,
        sinks=torch.empty(query.shape[1]) if sinks else None,
        config=config, num_splits=num_splits,
        workspace=torch.empty(shape, dtype=torch.float32),
    )  # fmt: skip
    return launches


def _prefix_prefill_cases():
    """Production-like launches of the prefill kernel: the heuristic's configs, the
    features, and every config the H200 table ships."""
    from vllm.attention.ops.tuning.prefill_configs import (
        PREFILL_TABLE,
        PrefillConfig,
        heuristic_prefill_config,
    )

    def launch(*args, **kwargs):
        name, _, launch_kwargs = prefill_launch(*args, **kwargs)
        return name, launch_kwargs

    heads = torch.empty(16)
    yield launch(128, 8, 64, torch.bfloat16, 4096)
    yield launch(64, 4, 16, torch.bfloat16, 64)
    yield launch(
        80,
        7,
        32,
        torch.float8_e4m3fn,
        1024,
        sliding_window=128,
        alibi_slopes=heads[:14],
        logits_soft_cap=30.0,
        sinks=heads[:14],
    )
    yield launch(256, 2, 128, torch.bfloat16, 16384)
    # ALiBi-sqrt (the bias on the square root of the distance).
    yield launch(128, 4, 64, torch.bfloat16, 1024, alibi_slopes=heads[:8],
                 alibi_sqrt=True)  # fmt: skip
    # Non-causal (cross-attention, bidirectional drafting), with TMA and sinks;
    # encoder self-attention: the step's K/V as one-key pages (BERT heads).
    yield launch(64, 1, 16, torch.bfloat16, 64, causal=False)
    yield launch(64, 1, 1, torch.bfloat16, 512, causal=False)
    yield launch(128, 4, 64, torch.bfloat16, 4096, use_tma=True, causal=False,
                 sinks=heads[:8])  # fmt: skip
    # A two-sided window on one-key pages (EmbeddingGemma: 3 heads of 256).
    yield launch(256, 3, 1, torch.bfloat16, 512, causal=False, sliding_window=257)
    # Head sizes at the ends of the declared range and padded ones past 128.
    yield launch(16, 4, 64, torch.bfloat16, 1024)
    yield launch(48, 1, 16, torch.bfloat16, 4096)
    yield launch(160, 4, 64, torch.bfloat16, 4096)
    yield launch(224, 2, 64, torch.float8_e4m3fn, 1024, sliding_window=128)
    # K/V tiles by TMA (the tile lies in one page).
    yield launch(128, 4, 64, torch.bfloat16, 4096, use_tma=True)
    # TMA boxes wider than the head (96 in 128 columns; the rest reads as zeros).
    yield launch(96, 1, 64, torch.bfloat16, 4096, use_tma=True)
    yield launch(80, 2, 64, torch.float8_e4m3fn, 1024, use_tma=True)
    # Odd head sizes, whose cache rows are not 16-byte multiples (200, 72, 66 bytes;
    # fp8: 100 and 24): the heuristic's pointer-load tile, also under a TMA config.
    for head_size, cache_dtype in ((100, torch.bfloat16), (36, torch.bfloat16),
                                   (33, torch.bfloat16), (100, torch.float8_e4m3fn),
                                   (24, torch.float8_e4m3fn)):  # fmt: skip
        name, kwargs = launch(head_size, 4, 64, cache_dtype, 4096)
        yield f"{ODD_HEAD} {name}", kwargs
    name, kwargs = launch(100, 4, 64, torch.bfloat16, 4096, use_tma=True)
    yield f"{ODD_HEAD} {name}", kwargs
    # The split variant (SPLIT_KV: partials to the workspace, the merge after).
    ((_, _, split_kwargs), _) = _split_launches(head_size=128, group=4, num_splits=4)
    yield "prefill split-KV d128-g4", split_kwargs
    # The split variants of the timed 128x64 tile at the shapes that split (small
    # groups, few sequences over long contexts).
    tile = PrefillConfig(128, 64, 4, 2, use_tma=True, longest_first=True)
    for head_size, group in ((96, 1), (128, 1), (128, 8)):
        ((_, _, split_kwargs), _) = _split_launches(
            head_size=head_size, group=group, num_splits=3, sinks=False, config=tile
        )
        yield f"prefill split-KV d{head_size}-g{group}-{tile}", split_kwargs
    # split_head: head size 96 as 64 + 32 column tiles in the timed tile (TMA boxes
    # of each width), its split variant, and 80 = 64 + 16 with pointer loads.
    split_head = PrefillConfig(128, 64, 4, 2, use_tma=True, split_head=True)
    yield launch(96, 1, 64, torch.bfloat16, 4096, True, split_head)
    ((_, _, split_kwargs), _) = _split_launches(
        head_size=96, group=1, num_splits=2, sinks=False, config=split_head
    )
    yield f"prefill split-KV d96-g1-{split_head}", split_kwargs
    yield launch(
        80,
        2,
        64,
        torch.bfloat16,
        4096,
        False,
        dataclasses.replace(split_head, use_tma=False),
    )
    yield launch(
        128, 8, 64, torch.float8_e4m3fn, 1024, use_tma=True, sliding_window=128
    )
    # fp8_qk: q.k on fp8 tensor cores, p.v in fp16 (V still converted).
    fp8_qk = PrefillConfig(64, 64, 4, 2, use_tma=True, fp8_qk=True)
    yield launch(128, 4, 64, torch.float8_e4m3fn, 4096, True, fp8_qk)
    # What the H200 table ships, each distinct
    # (head size, group, page, cache dtype, config) once: these run in production,
    # for every group of its class (3-4 for 4, 5-8 for 8: the table keys the
    # group's class). An entry that a committed GPU sweep's record chose by timing is
    # marked TIMED.
    timed = _timed_entries()
    shipped = {}
    for key, entry in PREFILL_TABLE.load("NVIDIA H200").items():
        fields = dict(zip(PREFILL_TABLE.key_fields, key))
        if fields["q_dtype"] != "bfloat16":
            continue
        cache_dtype = {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[
            fields["kv_dtype"]
        ]
        gluon_entry = entry.gluon
        if gluon_entry:
            # The portable kernel runs the key's heuristic config for the launches
            # the Gluon kernel does not take (prefix_prefill.portable_config).
            entry = heuristic_prefill_config(
                head_size=fields["head_size"], group=fields["group"],
                block_size=fields["block_size"],
                max_query_len=fields["max_query_len"], kv_dtype=fields["kv_dtype"],
            )  # fmt: skip
        was_timed = not gluon_entry and (timed is None or (key, entry) in timed)
        label = TIMED if was_timed else GLUON_FALLBACK if gluon_entry else ""
        group = fields["group"]
        for member in range(group // 2 + 1, group + 1):  # the group's class
            case = (fields["head_size"], member, fields["block_size"], cache_dtype)
            case = (*case, entry)
            labels = shipped.setdefault(case, set())
            labels.add(label)
    for case, labels in sorted(shipped.items(), key=str):
        head_size, group, block_size, cache_dtype, entry = case
        name, kwargs = launch(
            head_size, group, block_size, cache_dtype, 4096, entry.use_tma, entry
        )
        label = next(x for x in (TIMED, GLUON_FALLBACK, "") if x in labels)
        yield f"{label} {name}".strip(), kwargs


def hopper_kernel_cases():
    """Launches of the Gluon Hopper kernel on CPU tensors (2 KV heads, 4
    sequences), as ``(name, kernel, kwargs)``: the tiles (block_m, block_n,
    num_stages) its tests, the tuning sweep and the H200 table use, per head size
    (192 rows: three consumer warpgroups); on 16-bit caches, and on e4m3 caches
    (fp8_qk) with pages of 64."""
    from vllm.attention.ops import prefix_prefill as pp
    from vllm.attention.ops import prefix_prefill_hopper as hopper
    from vllm.attention.ops.tuning.prefill_configs import PrefillConfig

    tiles = {
        64: [(128, 128, 3), (192, 128, 2)],
        96: [(128, 128, 2)],
        128: [(128, 128, 2), (128, 64, 3)],
        256: [(128, 64, 2)],
    }
    fp8 = torch.float8_e4m3fn
    caches = [(torch.bfloat16, 16), (torch.bfloat16, 64), (torch.bfloat16, 128)]
    caches.append((fp8, 64))
    cases = [
        (head_size, tile, cache, False)
        for head_size, head_tiles in tiles.items()
        for tile, cache in itertools.product(head_tiles, caches)
    ]
    # split_head: head size 96 as unpadded column tiles of 64 and 32 (16-bit
    # caches only; one in fp16), in 2 and 3 stages.
    split_caches = [*caches[:3], (torch.float16, 64)]
    cases += [
        (96, tile, cache, True)
        for tile, cache in itertools.product(
            [(128, 128, 2), (128, 128, 3)], split_caches
        )
    ]
    for head_size, tile, (cache_dtype, block_size), split in cases:
        block_m, block_n, num_stages = tile
        is_fp8 = cache_dtype == fp8
        if is_fp8 and block_m == 192:
            continue  # three consumer warpgroups take 16-bit caches only
        # The softmax overlapping its warpgroup's own p.v where the H200 table
        # sets it: three consumer warpgroups (head 64).
        tile = PrefillConfig(
            block_m, block_n, 4, num_stages, use_tma=True, split_head=split,
            gluon=True, fp8_qk=is_fp8, overlap_pv=block_m == 192,
        )  # fmt: skip
        q_dtype = torch.bfloat16 if is_fp8 else cache_dtype
        query = torch.empty((64, 8, head_size), dtype=q_dtype)
        cache = torch.empty((8, 2, 2, block_size, head_size), dtype=cache_dtype)
        scales = torch.ones(1) if is_fp8 else None
        # The plan of an sm_90 device (these CPU tensors stand in).
        with mock.patch.object(pp, "is_hopper", lambda device: True):
            ((kernel, _, kwargs),) = prefill_launches(
                query=query, key_cache=cache[:, 0], value_cache=cache[:, 1],
                output=torch.empty_like(query),
                block_table=torch.zeros((4, 37), dtype=torch.int32),
                query_start_loc=torch.zeros(5, dtype=torch.int32),
                seq_lens=torch.zeros(4, dtype=torch.int32),
                max_query_len=16, softmax_scale=0.1, config=tile,
                k_scale=scales, v_scale=scales,
            )  # fmt: skip
        name = f"hopper d{head_size}-bs{block_size}-{block_m}x{block_n}-s{num_stages}"
        name += " fp8" if is_fp8 else " fp16" if cache_dtype == torch.float16 else ""
        name += " split-head" if split else ""
        assert kernel is hopper.hopper_prefill_kernel, name
        assert kwargs["SPLIT_HEAD"] == split, name
        name += " overlap-pv" if kwargs["OVERLAP_PV"] else ""
        yield name, kernel, kwargs
        # A sliding window: masks at its edge, the loop from its first tile.
        yield f"{name} window", kernel, {**kwargs, "USE_WINDOW": True}
        # Soft-cap (Gemma-2: with and without a window).
        yield f"{name} soft-cap", kernel, {**kwargs, "USE_SOFTCAP": True}
        yield (
            f"{name} window soft-cap",
            kernel,
            {**kwargs, "USE_WINDOW": True, "USE_SOFTCAP": True},
        )
        # Sinks (gpt-oss: with a window on every other layer).
        sinks = {"sinks_ptr": torch.empty(8), "USE_SINKS": True}
        yield (
            f"{name} window sinks",
            kernel,
            {**kwargs, "USE_WINDOW": True, **sinks},
        )


def _cache_write_cases(*cache_dtypes):
    from vllm.attention.ops import paged_cache_write as pcw

    for cache_dtype in cache_dtypes or (torch.bfloat16, torch.float8_e4m3fn):
        key = torch.empty((16, 8, 128), dtype=torch.bfloat16)
        cache = torch.empty((4, 2, 8, 64, 128), dtype=cache_dtype)
        scale = torch.ones(1) if cache_dtype != torch.bfloat16 else None
        ((_, _, kwargs),) = pcw._launches(
            key=key,
            value=key,
            key_cache=cache[:, 0],
            value_cache=cache[:, 1],
            slot_mapping=torch.zeros(16, dtype=torch.int64),
            k_scale=scale,
            v_scale=scale,
        )
        yield f"cache-write-{cache_dtype}", kwargs


def main() -> int:
    """Compile the kernels' production shapes for sm_90 (and one for MI300) and
    print one line each. Fails unless everything compiles, every Hopper prefill
    shape uses wgmma and cp.async (TMA where asked), no fp8-cache shape converts
    through bf16, fp8 q.k runs on e4m3 wgmma exactly where asked, no shape up to
    head size 128 spills registers (except timed table entries), and the MI300 one
    uses MFMA."""
    from vllm.attention.ops.hardware import HOPPER_SMEM_BYTES_PER_PROGRAM
    from vllm.attention.ops.paged_cache_write import _paged_cache_write_kernel
    from vllm.attention.ops.prefix_prefill import _prefix_prefill_kernel
    from vllm.attention.ops.triton_attention_common import merge_splits_kernel

    ok = True
    missing = _recorded_tiles_missing()
    if missing:
        ok = False
        print(f"BAD TIMED_TILES {sorted(missing)}: no tuning record chose them")
    for name, kwargs in _prefix_prefill_cases():
        summary = ptx_summary(compile_for_target(_prefix_prefill_kernel, kwargs))
        # Pointer loads pipeline as cp.async; TMA launches must really use TMA.
        # Rows that are not 16-byte multiples (odd head sizes) carry no alignment
        # hint, so their loads cannot be cp.async copies.
        good = summary["wgmma"] > 0
        good &= summary["cp_async"] > 0 or name.startswith(ODD_HEAD)
        good &= (summary["tma"] > 0) == kwargs["USE_TMA"]
        good &= not (kwargs["IS_FP8"] and summary["cvt_bf16_f16"])
        good &= (summary["wgmma_e4m3"] > 0) == kwargs["FP8_QK"]
        # No register spills up to head size 128, except in a tile a GPU sweep
        # chose by timing against spill-free ones (TIMED_TILES, e.g. the H200
        # table's 128x64 4-warp 2-stage tiles: a few hundred bytes per thread,
        # faster than every spill-free candidate of their sweeps,
        # benchmarks/results/tuning/*-prefill*.json). Head sizes above 128 are
        # exempt; their printed stack_bytes are for the reader.
        stack_bytes = summary.get("stack_bytes", 0)
        spills = stack_bytes > 0
        most = MAX_SPLIT_SPILL_BYTES if kwargs["SPLIT_KV"] else MAX_TIMED_SPILL_BYTES
        good &= stack_bytes <= most or kwargs["HEAD_SIZE"] > 128
        tile = tuple(kwargs[k] for k in ("BLOCK_M", "BLOCK_N"))
        tile += (kwargs["num_warps"], kwargs["num_stages"])
        good &= (
            not spills
            or kwargs["HEAD_SIZE"] > 128
            or name.startswith((TIMED, GLUON_FALLBACK))
            or tile in TIMED_TILES
        )
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {name}: {summary}")
    if HAS_GLUON:
        for name, kernel, kwargs in hopper_kernel_cases():
            compiled = compile_gluon_for_target(kernel, kwargs)
            summary = ptx_summary(compiled)
            serialized = wgmma_serialized(compiled)
            # TMA loads, wgmma and no serialisation of the asynchronous wgmma
            # (the overlap of softmax and the next q.k is the kernel's point), q.k
            # on e4m3 wgmma exactly for fp8 caches, tanh.approx exactly with
            # soft-cap; up to head size 128 no spills beyond a stray register;
            # shared memory within an sm_90 program's.
            good = summary["wgmma"] > 0 and summary["tma"] > 0 and not serialized
            is_fp8 = kwargs["FP8_MAX"] > 0
            good &= (summary["wgmma_e4m3"] > 0) == is_fp8
            # The converter copies every V tile but the last as it is: its 16-bit
            # selects (two per conversion of two) are in the last tile's copy
            # only, so a build has no more selects than conversions (selecting in
            # the one copy of every tile: twice as many).
            good &= not is_fp8 or summary["selp_b16"] <= summary["cvt_e4m3_f16"]
            good &= (summary["tanh"] > 0) == kwargs["USE_SOFTCAP"]
            stack_bytes = summary.get("stack_bytes", 0)
            most = MAX_GLUON_STACK_BYTES
            if (
                kwargs["BLOCK_M"] == 192
                and kwargs["USE_SOFTCAP"]
                and (kwargs["USE_WINDOW"] or kwargs["OVERLAP_PV"])
            ):
                most = MAX_GLUON_3WG_SOFTCAP_STACK_BYTES
            good &= stack_bytes <= most or kwargs["HEAD_SIZE"] > 128
            good &= summary["shared_bytes"] <= HOPPER_SMEM_BYTES_PER_PROGRAM
            # The q.k wait leaves exactly the p.v groups in flight: one padded,
            # two split (o and o_hi); split_head has its 32-column accumulator's
            # wgmma (its builds keep at most the stray register above: the fp16
            # ones without a feature spill one 4-byte register, Triton 3.8).
            split = kwargs["SPLIT_HEAD"]
            good &= summary["wgmma_waits"] == ([0, 2] if split else [0, 1])
            good &= (summary["wgmma_n32"] > 0) == split
            # The softmax runs while the warpgroup's own p.v is in flight exactly
            # with OVERLAP_PV: without it ptxas waits for p.v before the softmax
            # (should a later ptxas not, this says so: the flag is then moot).
            overlap = softmax_overlaps_pv(compiled, kwargs["BLOCK_N"])
            good &= overlap is None or overlap == kwargs["OVERLAP_PV"]
            ok &= good
            print(
                f"{'ok ' if good else 'BAD'} {name}: {summary} {serialized=} {overlap=}"
            )
    for name, kwargs in _cache_write_cases():
        summary = ptx_summary(compile_for_target(_paged_cache_write_kernel, kwargs))
        print(f"ok  {name}: {summary}")
    for sinks in (False, True):
        name, kwargs = prefill_merge_launch(sinks=sinks)
        summary = ptx_summary(compile_for_target(merge_splits_kernel, kwargs))
        print(f"ok  {name}: {summary}")
    if "amd" in triton.backends.backends:
        compiled = compile_for_target(
            _prefix_prefill_kernel, _amd_prefix_prefill_kwargs(), target=MI300
        )
        mfma = compiled.asm["amdgcn"].count("v_mfma")
        ok &= mfma > 0
        print(
            f"{'ok ' if mfma else 'BAD'} gfx942 prefill fp8-e4m3fnuz all features: "
            f"{mfma} v_mfma"
        )
        # fp8_qk on MI300: q.k on fp8 MFMA (e4m3fnuz operands).
        fp8_qk = {**_amd_prefix_prefill_kwargs(), "FP8_QK": True}
        compiled = compile_for_target(_prefix_prefill_kernel, fp8_qk, target=MI300)
        fp8_mfma = len(re.findall(r"v_mfma\S*fp8_fp8", compiled.asm["amdgcn"]))
        ok &= fp8_mfma > 0
        print(
            f"{'ok ' if fp8_mfma else 'BAD'} gfx942 prefill fp8_qk: "
            f"{fp8_mfma} fp8 v_mfma"
        )
        for name, kwargs in _cache_write_cases(torch.float8_e4m3fnuz):
            compile_for_target(_paged_cache_write_kernel, kwargs, target=MI300)
            print(f"ok  gfx942 {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
