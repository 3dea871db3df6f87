# SPDX-License-Identifier: Apache-2.0
"""Kernel microbenchmark: our paged attention vs FlashAttention-3 and stock Triton.

Every implementation is a *caller* ``caller(shape, inputs) -> Runner``: setup (layout
conversion, workspaces) happens in the caller, ``Runner.run(i)`` only launches on
input set ``i``. Each point is checked against ``ref_paged_attention`` (max abs
error recorded per implementation), then timed.

Units and formulas (per call):
  decode  GB/s     bytes = sum_s seq_len_s * num_kv_heads * head_size * 2 (K and V)
                           * kv_bytes_per_element
                           + 2 * num_seqs * num_q_heads * head_size * q_bytes (q, out)
  prefill TFLOP/s  flops = 4 * head_size * num_q_heads * sum_s sum_i visible(s, i),
                   visible(s, i) = context_s + i + 1 for query token i (causal:
                   the cached prefix plus the query tokens up to itself), i.e.
                   sum_i = q_len * context + q_len * (q_len + 1) / 2 with
                   context = seq_len - q_len. (2 FLOPs per MAC, QK^T and PV.)

Timing: CUDA graphs (``triton.testing.do_bench_cudagraph``, median) of one pass over
``num_sets`` input sets; for decode the sets are distinct KV pages whose total size
exceeds twice the 50 MB L2, so no call finds its KV in L2. Falls back to
``triton.testing.do_bench`` (median) if a caller cannot be captured.

Imports (ours and stock side by side): stock vLLM 0.26.0 is put first on sys.path
from ``--stock-site`` and imported as ``vllm``; then the checkout's ``vllm/`` folder
is inserted at the FRONT of ``vllm.__path__``. ``vllm.attention.ops.*`` (ours; stock
has no ``vllm/attention``) therefore loads from the checkout, while
``vllm.v1...`` and ``vllm.vllm_flash_attn`` (regular packages of stock) load from
stock. The JSON records the file of every module used. ``--stock-site`` is required
when a stock caller (``fa3``, ``stock_triton``) is requested; ``--callers ours`` runs
without it. A GPU is required (the CPU interpreter runs the kernel tests, not this).

Tuning tables are written by ``tune_attention.py`` in this folder, which reuses this
file's inputs, reference check and timing.
"""

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton
import triton.testing

REPO = Path(__file__).resolve().parents[2]
MAX_SETS = 64

# ----------------------------------------------------------------------------------
# The sweep, as data
# ----------------------------------------------------------------------------------

# name -> (num_q_heads, num_kv_heads, head_size) per GPU.
MODELS = {
    "llama-3.1-8b": (32, 8, 128),
    "llama-3.1-70b-tp2": (32, 4, 128),  # 64 q / 8 kv heads split over 2 GPUs
}
# (batch, context): context = KV length of every sequence.
DECODE_POINTS = [
    (1, 1024), (1, 8192), (1, 32768), (1, 131072),
    (4, 8192), (16, 4096), (16, 32768),
    (64, 1024), (64, 8192), (256, 2048),
]  # fmt: skip
# (batch, query_len, context): context = full KV length incl. the query tokens.
PREFILL_POINTS = [
    (1, 512, 512), (1, 2048, 2048), (1, 8192, 8192), (4, 4096, 4096),
    (1, 1024, 16384), (16, 512, 2048),
]  # fmt: skip
BLOCK_SIZES = (16, 64)  # 16: stock vLLM's default page; 64: ours preferred
FP8_DECODE_POINTS = [(1, 32768), (16, 4096), (64, 8192), (256, 2048)]  # 8B, page 64
FP8_PREFILL_POINTS = [
    (1, 2048, 2048),
    (1, 8192, 8192),
    (4, 4096, 4096),
    (1, 1024, 16384),
]

QUICK = {
    "decode": [("llama-3.1-8b", 16, b, c) for b, c in [(1, 8192), (64, 2048)]]
    + [("llama-3.1-8b", 64, 1, 131072)],
    "prefill": [
        ("llama-3.1-8b", 16, 1, 2048, 2048),
        ("llama-3.1-8b", 64, 1, 512, 8192),
    ],
    "fp8": [("llama-3.1-8b", 64, 64, 8192)],
}
# A seconds-long GPU smoke run (--tiny).
TINY = {
    "decode": [(2, 40, (4, 2, 64), 16), (3, 70, (4, 1, 64), 32)],
    "prefill": [(2, 8, 24, (4, 2, 64), 16)],
}


@dataclass(frozen=True)
class Shape:
    kernel: str  # "decode" | "prefill"
    model: str
    batch: int
    query_len: int
    context: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"


def sweep(args) -> list[Shape]:
    shapes = []
    if args.tiny:
        for batch, ctx, (hq, hk, d), bs in TINY["decode"]:
            shapes.append(Shape("decode", "tiny", batch, 1, ctx, hq, hk, d, bs))
        for batch, q, ctx, (hq, hk, d), bs in TINY["prefill"]:
            shapes.append(Shape("prefill", "tiny", batch, q, ctx, hq, hk, d, bs))
        return shapes
    if args.quick:
        for m, bs, b, c in QUICK["decode"]:
            shapes.append(Shape("decode", m, b, 1, c, *MODELS[m], bs))
        for m, bs, b, q, c in QUICK["prefill"]:
            shapes.append(Shape("prefill", m, b, q, c, *MODELS[m], bs))
        for m, bs, b, c in QUICK["fp8"]:
            shapes.append(
                Shape("decode", m, b, 1, c, *MODELS[m], bs, kv_dtype="float8_e4m3fn")
            )
        return shapes
    for m, heads in MODELS.items():
        for bs in BLOCK_SIZES:
            for b, c in DECODE_POINTS:
                shapes.append(Shape("decode", m, b, 1, c, *heads, bs))
            for b, q, c in PREFILL_POINTS:
                shapes.append(Shape("prefill", m, b, q, c, *heads, bs))
    heads = MODELS["llama-3.1-8b"]
    for b, c in FP8_DECODE_POINTS:
        shapes.append(
            Shape("decode", "llama-3.1-8b", b, 1, c, *heads, 64,
                  kv_dtype="float8_e4m3fn")
        )  # fmt: skip
    for b, q, c in FP8_PREFILL_POINTS:
        shapes.append(
            Shape("prefill", "llama-3.1-8b", b, q, c, *heads, 64,
                  kv_dtype="float8_e4m3fn")
        )  # fmt: skip
    return shapes


# ----------------------------------------------------------------------------------
# Work formulas
# ----------------------------------------------------------------------------------


def _elem_bytes(dtype_name: str) -> int:
    return 1 if dtype_name.startswith("float8") else 2


def decode_bytes(s: Shape) -> float:
    kv = (
        s.batch * s.context * s.num_kv_heads * s.head_size * 2 * _elem_bytes(s.kv_dtype)
    )
    q_and_out = 2 * s.batch * s.num_q_heads * s.head_size * _elem_bytes(s.dtype)
    return float(kv + q_and_out)


def prefill_flops(s: Shape) -> float:
    prefix = s.context - s.query_len
    visible = s.query_len * prefix + s.query_len * (s.query_len + 1) // 2
    return 4.0 * s.head_size * s.num_q_heads * s.batch * visible


def throughput(s: Shape, us: float | None) -> float | None:
    if us is None:
        return None
    if s.kernel == "decode":
        return decode_bytes(s) / (us * 1e-6) / 1e9  # GB/s
    return prefill_flops(s) / (us * 1e-6) / 1e12  # TFLOP/s


# ----------------------------------------------------------------------------------
# Inputs (built once per shape, shared by all callers)
# ----------------------------------------------------------------------------------


@dataclass
class Inputs:
    query: torch.Tensor  # [tokens, Hq, d]
    kv_cache: torch.Tensor  # [blocks, 2, Hkv, bs, d] (ours)
    block_tables: list  # num_sets x [batch, pages_per_seq] int32
    seq_lens: torch.Tensor  # [batch] int32
    query_start_loc: torch.Tensor  # [batch + 1] int32
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    softmax_scale: float
    _nhd: tuple | None = field(default=None, repr=False)

    @property
    def num_sets(self) -> int:
        return len(self.block_tables)

    def nhd_caches(self):
        """K and V as [blocks, bs, Hkv, d] (FA3 / stock vLLM layout), built once."""
        if self._nhd is None:
            k = self.kv_cache[:, 0].permute(0, 2, 1, 3).contiguous()
            v = self.kv_cache[:, 1].permute(0, 2, 1, 3).contiguous()
            self._nhd = (k, v)
        return self._nhd


def build_inputs(s: Shape, device: str, rotate: bool) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(0)
    pages = math.ceil(s.context / s.block_size)
    set_bytes = decode_bytes(s) if s.kernel == "decode" else 0
    num_sets = 1
    if rotate and s.kernel == "decode":
        l2_bytes = ops.hardware.H200_L2_BYTES
        num_sets = max(1, min(MAX_SETS, math.ceil(2 * l2_bytes / set_bytes)))
    num_blocks = num_sets * s.batch * pages
    q_dtype = getattr(torch, s.dtype)
    kv_dtype = getattr(torch, s.kv_dtype)
    shape = (num_blocks, 2, s.num_kv_heads, s.block_size, s.head_size)
    kv_cache = torch.empty(shape, dtype=kv_dtype, device=device)
    k_scale = v_scale = None
    if kv_dtype.itemsize == 1:
        k_scale = torch.tensor([0.03], device=device)
        v_scale = torch.tensor([0.02], device=device)
    chunk = max(1, (1 << 28) // math.prod(shape[1:]))  # ~256M elements at a time
    for start in range(0, num_blocks, chunk):
        part = torch.randn(
            (min(chunk, num_blocks - start), *shape[1:]), device=device, generator=gen
        )
        if k_scale is not None:
            part[:, 0] /= k_scale
            part[:, 1] /= v_scale
        kv_cache[start : start + part.shape[0]] = part.to(kv_dtype)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    tables = list(perm.view(num_sets, s.batch, pages).unbind(0))
    tokens = s.batch * s.query_len
    query = torch.randn(
        (tokens, s.num_q_heads, s.head_size), device=device, generator=gen
    ).to(q_dtype)
    return Inputs(
        query=query,
        kv_cache=kv_cache,
        block_tables=[t.contiguous() for t in tables],
        seq_lens=torch.full((s.batch,), s.context, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(
            0, tokens + 1, s.query_len, dtype=torch.int32, device=device
        ),
        k_scale=k_scale,
        v_scale=v_scale,
        softmax_scale=1.0 / math.sqrt(s.head_size),
    )


# ----------------------------------------------------------------------------------
# Callers: caller(shape, inputs) -> Runner; run(i) launches on input set i.
# ----------------------------------------------------------------------------------


@dataclass
class Runner:
    run: Callable[[int], None]
    output: torch.Tensor
    note: str = ""


class Skip(Exception):
    """A caller that cannot run this point; the message says why."""


def caller_ours(
    s: Shape, inp: Inputs, *, decode_config=None, decode_max_splits=None
) -> Runner:
    """Our kernels; ``decode_config`` overrides the decode tuning table (the decode
    tuner's candidates), ``decode_max_splits`` the split cap."""
    out = torch.empty_like(inp.query)
    key_cache, value_cache = inp.kv_cache[:, 0], inp.kv_cache[:, 1]
    if s.kernel == "decode":
        splits = ops.choose_num_splits(
            num_seqs=s.batch,
            num_kv_heads=s.num_kv_heads,
            num_sms=ops.hardware.num_sms(inp.query.device),
            max_splits=decode_max_splits or ops.MAX_NUM_SPLITS,
        )
        workspace = torch.empty(
            ops.decode_workspace_shape(
                max_num_seqs=s.batch,
                num_q_heads=s.num_q_heads,
                head_size=s.head_size,
                num_splits=splits,
            ),
            dtype=ops.WORKSPACE_DTYPE,
            device=inp.query.device,
        )

        def run(i):
            ops.paged_decode_attention(
                query=inp.query,
                key_cache=key_cache,
                value_cache=value_cache,
                output=out,
                block_table=inp.block_tables[i],
                seq_lens=inp.seq_lens,
                softmax_scale=inp.softmax_scale,
                k_scale=inp.k_scale,
                v_scale=inp.v_scale,
                num_splits=splits,
                workspace=workspace,
                config=decode_config,
            )

        return Runner(run, out, note=f"splits={splits}")

    def run(i):
        ops.prefix_prefill_attention(
            query=inp.query,
            key_cache=key_cache,
            value_cache=value_cache,
            output=out,
            block_table=inp.block_tables[i],
            query_start_loc=inp.query_start_loc,
            seq_lens=inp.seq_lens,
            max_query_len=s.query_len,
            softmax_scale=inp.softmax_scale,
            k_scale=inp.k_scale,
            v_scale=inp.v_scale,
        )

    return Runner(run, out)


def caller_fa3(s: Shape, inp: Inputs) -> Runner:
    if stock.flash_attn_varlen_func is None:
        raise Skip(stock.fa3_reason)
    k, v = inp.nhd_caches()
    q, descales = inp.query, {}
    if inp.k_scale is not None:
        # As vLLM's FlashAttention backend with an fp8 cache: the attention layer
        # hands FA3 a query quantised to the cache's format (here once, outside the
        # timing, with a per-tensor scale from its largest value), and per-(sequence,
        # KV head) descales of q, K and V.
        fp8 = k.dtype
        q_scale = (inp.query.float().abs().amax() / torch.finfo(fp8).max).reshape(1)
        q = (inp.query.float() / q_scale).to(fp8)
        shape = (s.batch, s.num_kv_heads)
        descales = {
            "q_descale": q_scale.expand(shape),
            "k_descale": inp.k_scale.expand(shape),
            "v_descale": inp.v_scale.expand(shape),
        }
    out = torch.empty_like(inp.query)

    def run(i):
        stock.flash_attn_varlen_func(
            q=q,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=inp.query_start_loc,
            max_seqlen_q=s.query_len,
            seqused_k=inp.seq_lens,
            max_seqlen_k=s.context,
            softmax_scale=inp.softmax_scale,
            causal=True,
            block_table=inp.block_tables[i],
            fa_version=3,
            **descales,
        )

    return Runner(run, out, note="num_splits=0 (FA3 heuristic)")


def caller_stock_triton(s: Shape, inp: Inputs) -> Runner:
    if stock.unified_attention is None:
        raise Skip(stock.triton_reason)
    k, v = inp.nhd_caches()
    if inp.k_scale is not None:
        k, v = k.view(getattr(torch, s.kv_dtype)), v.view(getattr(torch, s.kv_dtype))
    out = torch.empty_like(inp.query)
    descale = (s.batch, s.num_kv_heads)
    k_descale = inp.k_scale.expand(descale) if inp.k_scale is not None else None
    v_descale = inp.v_scale.expand(descale) if inp.v_scale is not None else None
    # As stock's TritonAttentionMetadataBuilder: 3D (split) decode below a batch
    # threshold, with 16 segments and buffers allocated once.
    threshold = stock.MIN_LAUNCH_GRID_SIZE_2D // s.num_kv_heads
    segments = stock.NUM_PAR_SOFTMAX_SEGMENTS
    dev = inp.query.device
    d_pad = 1 << (s.head_size - 1).bit_length()
    segm_out = torch.empty(
        (threshold, s.num_q_heads, segments, d_pad), dtype=torch.float32, device=dev
    )
    segm_max = torch.empty(
        (threshold, s.num_q_heads, segments), dtype=torch.float32, device=dev
    )
    segm_sum = torch.empty_like(segm_max)
    # Per-tensor fp8 must be requested explicitly (NONE would skip the scales).
    quant_mode = stock.KVQuantMode.NONE
    if inp.k_scale is not None:
        quant_mode = stock.KVQuantMode.FP8_PER_TENSOR

    def run(i):
        stock.unified_attention(
            q=inp.query,
            k=k,
            v=v,
            out=out,
            cu_seqlens_q=inp.query_start_loc,
            max_seqlen_q=s.query_len,
            seqused_k=inp.seq_lens,
            max_seqlen_k=s.context,
            softmax_scale=inp.softmax_scale,
            causal=True,
            window_size=(-1, -1),
            block_table=inp.block_tables[i],
            softcap=0,
            q_descale=None,
            k_descale=k_descale,
            v_descale=v_descale,
            seq_threshold_3D=threshold,
            num_par_softmax_segments=segments,
            softmax_segm_output=segm_out,
            softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_sum,
            kv_quant_mode=quant_mode,
        )

    return Runner(run, out, note=f"3D below {threshold} seqs")


CALLERS = {"ours": caller_ours, "fa3": caller_fa3, "stock_triton": caller_stock_triton}
STOCK_CALLERS = ("fa3", "stock_triton")
# Largest |ours - reference| a point may show before the run warns (and the decode
# tuner rejects a config).
MAX_ABS_ERR = 0.05


# ----------------------------------------------------------------------------------
# Correctness and timing
# ----------------------------------------------------------------------------------


def reference_rows(s: Shape, inp: Inputs) -> list[tuple[slice, torch.Tensor]]:
    """fp32 reference for the checked rows of input set 0: all decode rows of up to
    8 sequences (first and last 4); for prefill the last <= 256 query rows of those
    sequences (same positions as in the full problem; keeps the fp32 reference's
    score matrix small)."""
    seqs = sorted({*range(min(4, s.batch)), *range(max(0, s.batch - 4), s.batch)})
    if s.kernel == "prefill":
        seqs = sorted({0, s.batch - 1})
    rows = min(s.query_len, 256)
    checked = []
    for seq in seqs:
        end = (seq + 1) * s.query_len
        ref = ops.ref_paged_attention(
            query=inp.query[end - rows : end],
            key_cache=inp.kv_cache[:, 0],
            value_cache=inp.kv_cache[:, 1],
            block_table=inp.block_tables[0][seq : seq + 1],
            query_start_loc=torch.tensor([0, rows], device=inp.query.device),
            seq_lens=inp.seq_lens[seq : seq + 1],
            softmax_scale=inp.softmax_scale,
            k_scale=None if inp.k_scale is None else inp.k_scale.item(),
            v_scale=None if inp.v_scale is None else inp.v_scale.item(),
        )
        checked.append((slice(end - rows, end), ref))
    return checked


def max_abs_err(out: torch.Tensor, checked) -> float:
    """Largest |out - ref| over the checked rows (inf if any is NaN)."""
    worst = 0.0
    for rows, ref in checked:
        err = (out[rows].float() - ref).abs().max().item()
        worst = max(worst, err if math.isfinite(err) else math.inf)
    return worst


def time_us(runner: Runner, num_sets: int) -> tuple[float, str]:
    """Median microseconds of one call (averaged over a pass over all sets)."""

    def all_sets():
        for i in range(num_sets):
            runner.run(i)

    all_sets()
    torch.cuda.synchronize()
    try:
        ms = triton.testing.do_bench_cudagraph(all_sets, rep=100, return_mode="median")
        method = "cuda_graph"
    except Exception as exc:  # any capture failure: fall back
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(all_sets, warmup=25, rep=100, return_mode="median")
        method = f"do_bench (graph capture failed: {type(exc).__name__})"
    return ms * 1e3 / num_sets, method


def measure_point(s: Shape, args) -> dict:
    inp = build_inputs(s, "cuda", rotate=True)
    record = {**asdict(s), "num_sets": inp.num_sets}
    record["unit"] = "GB/s" if s.kernel == "decode" else "TFLOP/s"
    record["work"] = decode_bytes(s) if s.kernel == "decode" else prefill_flops(s)
    record["max_abs_err"], record["time_us"], record["notes"] = {}, {}, {}
    checked = None  # reference rows, computed once per point
    for name, caller in CALLERS.items():
        try:
            if name not in args.callers:
                raise Skip("not in --callers")
            if name == "ours":
                runner = caller(s, inp, decode_max_splits=args.decode_max_splits)
            else:
                runner = caller(s, inp)
            runner.run(0)
            torch.cuda.synchronize()
            if checked is None:
                checked = reference_rows(s, inp)
            record["max_abs_err"][name] = max_abs_err(runner.output, checked)
            us, method = time_us(runner, inp.num_sets)
            record["time_us"][name] = us
            record["notes"][name] = f"{runner.note}; {method}".strip("; ")
        except Skip as why:
            record["time_us"][name] = None
            record["notes"][name] = f"skipped: {why}"
        except Exception as exc:  # keep the sweep going; recorded
            record["time_us"][name] = None
            record["notes"][name] = f"failed: {type(exc).__name__}: {exc}"[:300]
        record[name] = throughput(s, record["time_us"].get(name))
    for other in ("fa3", "stock_triton"):
        a, b = record.get("ours"), record.get(other)
        record[f"ratio_vs_{other}"] = a / b if a and b else None
    del inp
    torch.cuda.empty_cache()
    return record


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of a 4 GB buffer; bytes counted = read + written."""
    n = 4 * 2**30 // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * 4 * 2**30 / (ms * 1e-3) / 1e9


# ----------------------------------------------------------------------------------
# Imports, environment, output
# ----------------------------------------------------------------------------------


class _Namespace:
    pass


ops = _Namespace()  # our kernels + reference
stock = _Namespace()  # stock vLLM callables (None when unavailable, with a reason)


def _import_stock(files: dict) -> None:
    """FA3 and stock vLLM's Triton kernel, from the stock install (when found)."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func, is_fa_version_supported

        if is_fa_version_supported(3):
            stock.flash_attn_varlen_func = flash_attn_varlen_func
            files["fa3"] = sys.modules[flash_attn_varlen_func.__module__].__file__
        else:
            stock.fa3_reason = "FA3 not supported on this GPU/build"
    except Exception as exc:  # no FA3 is a skip, not an error
        stock.fa3_reason = f"import failed: {type(exc).__name__}: {exc}"[:200]
    try:
        from vllm.v1.attention.backends import triton_attn
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        from vllm.v1.kv_cache_interface import KVQuantMode

        stock.unified_attention = unified_attention
        stock.KVQuantMode = KVQuantMode
        stock.MIN_LAUNCH_GRID_SIZE_2D = triton_attn.MIN_LAUNCH_GRID_SIZE_2D
        stock.NUM_PAR_SOFTMAX_SEGMENTS = triton_attn.NUM_PAR_SOFTMAX_SEGMENTS
        files["stock_triton"] = sys.modules[unified_attention.__module__].__file__
    except Exception as exc:  # no stock kernel is a skip
        stock.triton_reason = f"import failed: {type(exc).__name__}: {exc}"[:200]
    for name, reason in (
        ("fa3", stock.fa3_reason),
        ("stock_triton", stock.triton_reason),
    ):
        if name not in files:
            print(f"note: {name} skipped: {reason}")


def import_modules(stock_site: str | None) -> dict:
    """Import stock (from ``stock_site``, when given), then ours (from the checkout);
    return the file each module came from. Stock modules are imported first, before
    the checkout joins ``vllm.__path__``, so no file of the checkout can shadow them.
    Call it before anything imports ``vllm``."""
    stock.fa3_reason = stock.triton_reason = "no --stock-site given"
    stock.flash_attn_varlen_func = stock.unified_attention = None
    files = {}
    sys.path.insert(0, str(REPO))  # benchmarks.harness; the checkout's vllm/
    if stock_site is not None:
        sys.path.insert(0, stock_site)
    import vllm

    files["vllm"] = getattr(vllm, "__file__", None)
    if stock_site is not None and files["vllm"]:  # stock vLLM (a regular package)
        _import_stock(files)
        vllm.__path__.insert(0, str(REPO / "vllm"))
    elif stock_site is not None:
        stock.fa3_reason = stock.triton_reason = (
            f"stock vLLM not found at --stock-site {stock_site}"
        )
    from vllm.attention.ops import hardware
    from vllm.attention.ops import triton_paged_decode_attention_2d as dec
    from vllm.attention.ops.prefix_prefill import prefix_prefill_attention
    from vllm.attention.ops.reference import ref_paged_attention

    for name in ("choose_num_splits", "decode_workspace_shape", "WORKSPACE_DTYPE",
                 "paged_decode_attention", "MAX_NUM_SPLITS"):  # fmt: skip
        setattr(ops, name, getattr(dec, name))
    ops.hardware = hardware
    ops.prefix_prefill_attention = prefix_prefill_attention
    ops.ref_paged_attention = ref_paged_attention
    files["ours_decode"] = dec.__file__
    files["ours_prefill"] = sys.modules[prefix_prefill_attention.__module__].__file__
    return files


def _run(cmd: list[str], cwd=None) -> str | None:
    try:
        return subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()
    except Exception:  # metadata only
        return None


def environment(args, files) -> dict:
    import vllm

    commit = args.commit or _run(["git", "rev-parse", "--short=12", "HEAD"], REPO)
    if commit and _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO):
        commit += "-dirty"
    from benchmarks.harness import gpu_info

    return {
        "commit": commit or "unknown",
        "gpu": torch.cuda.get_device_name(),
        "driver": gpu_info()["driver"],
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm": getattr(vllm, "__version__", None),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "modules": files,
    }


def print_table(records: list[dict]) -> None:
    head = (
        f"{'kernel':7} {'model':18} {'bs':>3} {'batch':>5} {'q':>5} {'ctx':>6} "
        f"{'kv':5} {'unit':7} {'ours':>8} {'fa3':>8} {'stock':>8} "
        f"{'/fa3':>5} {'/stock':>6} {'err':>8}"
    )
    print(head)
    print("-" * len(head))

    def f(x, w, p=1):
        return f"{x:>{w}.{p}f}" if isinstance(x, float) else f"{'-':>{w}}"

    for r in records:
        err = r["max_abs_err"].get("ours")
        print(
            f"{r['kernel']:7} {r['model'][:18]:18} {r['block_size']:>3} "
            f"{r['batch']:>5} {r['query_len']:>5} {r['context']:>6} "
            f"{'fp8' if 'float8' in r['kv_dtype'] else 'bf16':5} {r['unit']:7} "
            f"{f(r.get('ours'), 8)} {f(r.get('fa3'), 8)} "
            f"{f(r.get('stock_triton'), 8)} {f(r['ratio_vs_fa3'], 5, 2)} "
            f"{f(r['ratio_vs_stock_triton'], 6, 2)} {f(err, 8, 4)}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~2 minute subset")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (smoke run)")
    p.add_argument(
        "--decode-max-splits",
        type=int,
        default=None,
        help="cap of choose_num_splits for our decode (default: MAX_NUM_SPLITS); "
        "to measure a different cap against FA3 in the same run",
    )
    p.add_argument(
        "--kernels",
        nargs="+",
        default=["decode", "prefill"],
        choices=["decode", "prefill"],
        help="measure only these kernels' points",
    )
    p.add_argument(
        "--kv-dtypes",
        nargs="+",
        default=["bf16", "fp8"],
        choices=["bf16", "fp8"],
        help="measure only the points with these KV-cache dtypes",
    )
    p.add_argument(
        "--stock-site",
        default=None,
        help="folder holding stock vLLM 0.26.0 (imported as vllm); required for "
        "the fa3 and stock_triton callers",
    )
    p.add_argument("--results-dir", default=str(REPO / "benchmarks/results/kernels"))
    p.add_argument("--commit", help="commit id to record (default: git HEAD)")
    p.add_argument("--callers", nargs="+", default=list(CALLERS), choices=list(CALLERS))
    args = p.parse_args()  # fmt: skip
    stock_callers = [c for c in args.callers if c in STOCK_CALLERS]
    if stock_callers and args.stock_site is None:
        p.error(
            f"--stock-site DIR (stock vLLM 0.26.0) is required for the callers "
            f"{stock_callers}; or pass --callers ours"
        )
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a GPU (the kernel tests run on the CPU)")
    files = import_modules(args.stock_site)
    shapes = [
        s
        for s in sweep(args)
        if s.kernel in args.kernels
        and ("fp8" if s.kv_dtype.startswith("float8") else "bf16") in args.kv_dtypes
    ]
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    result = environment(args, files)
    result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    result["bf16_dense_peak_tflops"] = ops.hardware.H200_BF16_DENSE_PEAK_TFLOPS
    result["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
    print(
        f"device-to-device copy: {result['copy_bandwidth_gbs']:.0f} GB/s "
        f"(read + write); bf16 dense peak {result['bf16_dense_peak_tflops']} TFLOP/s"
    )
    result["records"] = []
    for i, s in enumerate(shapes):
        record = measure_point(s, args)
        result["records"].append(record)
        cells = [
            f"{c}={record[c]:.3g}"
            if record[c] is not None
            else f"{c}: {record['notes'][c]}"
            for c in CALLERS
        ]
        print(
            f"[{i + 1}/{len(shapes)} {time.time() - start:.0f}s] {s.kernel} {s.model}"
            f" bs={s.block_size} batch={s.batch} q={s.query_len} ctx={s.context}: "
            + ", ".join(cells)
        )
    result["wall_s"] = time.time() - start
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    suffix = "-tiny" if args.tiny else "-quick" if args.quick else ""
    # runs of a subset or another split cap in the same minute must not overwrite
    if sorted(set(args.kernels)) != ["decode", "prefill"]:
        suffix += "-" + "-".join(sorted(set(args.kernels)))
    if sorted(set(args.kv_dtypes)) != ["bf16", "fp8"]:
        suffix += "-" + "-".join(sorted(set(args.kv_dtypes)))
    if args.decode_max_splits is not None:
        suffix += f"-splits{args.decode_max_splits}"
    path = out_dir / f"{stamp}-{result['commit']}{suffix}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print()
    print_table(result["records"])
    bad = [
        (r["kernel"], r["batch"], r["context"], r["max_abs_err"])
        for r in result["records"]
        if any(e > MAX_ABS_ERR for e in r["max_abs_err"].values())
    ]
    if bad:
        print(f"WARNING: max_abs_err > {MAX_ABS_ERR} at {bad}")
    print(f"wrote {path} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
