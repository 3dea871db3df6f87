# SPDX-License-Identifier: Apache-2.0
"""TRITON_ATTN's warm-up: every kernel specialisation compiled at startup.

vLLM's own warm-ups miss most of the specialisations of our kernels (tile configs
per query-length bucket, split-KV variants, the features of each kind of layer,
the query's two layouts, the block table's row stride class), so the metadata
builder hands this to vLLM's JIT warm-up registry (``register_jit_warm_up``),
which runs it before CUDA-graph capture. ``warm_up_plan`` lists the batches whose
launches cover every specialisation (the prefill ones from the builder's own
plans, ``prefill_planner``); ``warm_up`` runs them on a scratch cache through each
kind of layer's ``forward``. The list is in docs/backend.md.
"""

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm.attention.ops.tuning.prefill_configs import (
    QUERY_LEN_BUCKETS,
    query_len_bucket,
)
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionLayer
    from vllm.v1.attention.backends.triton_attn import (
        TritonAttentionMetadataBuilder,
    )
    from vllm.v1.kv_cache_interface import AttentionSpec

logger = init_logger(__name__)

# Kernel configurations warmed up in this process (builders of several KV-cache
# groups or micro-batches share them).
WARMED_UP: set[tuple] = set()
# How queries reach forward(): vLLM passes a view of the fused QKV output, or a
# contiguous tensor after some compiler passes; the decode kernel specialises on it.
QUERY_LAYOUTS = ("qkv_view", "contiguous")


@dataclass
class WarmUpBatch:
    """A batch of the warm-up: query lengths (decodes first) and the host
    ``max_query_len`` and ``max_seq_len`` to launch with (upper bounds, default the
    longest query)."""

    name: str
    query_lens: list[int]
    max_query_len: int | None = None
    max_seq_len: int | None = None


def stride_class(stride: int) -> tuple[bool, bool]:
    """What Triton specialises an integer argument on: == 1, multiple of 16."""
    return stride == 1, stride % 16 == 0


def guess_block_table_stride(vllm_config: "VllmConfig", spec: "AttentionSpec") -> int:
    """Row stride of vLLM's block table (max blocks per request), as the model
    runners size it: ``cdiv(max_model_len, block_size)``, rounded up to a multiple
    of ``128 // block_size`` (V2 runner). Only its class matters (stride_class);
    build() re-checks the real one."""
    blocks = -(-vllm_config.model_config.max_model_len // spec.block_size)
    align = max(1, 128 // spec.block_size)
    return -(-blocks // align) * align


def warm_up_plan(builder, block_table_stride: int) -> list["WarmUpBatch"]:
    """The batches whose launches cover every specialisation (docs/backend.md).

    Specialisations: constexprs (tile configs, split count, features, dtypes,
    strides of query/output/cache in the decode kernel) and the integer
    arguments Triton specialises by value (== 1, multiple of 16): the
    block-table row stride. The ints that change from step to step in the
    prefill and merge kernels (``seq_start`` = num_decodes, ``num_seqs``,
    ``num_splits``) are ``do_not_specialize``, so the number of decodes in
    front of the prefills selects nothing.
    """
    batches = []
    # Decode: the smallest batch of each split count (the grid's third axis and
    # the merge kernel depend on it).
    first_batch_of_splits: dict[int, int] = {}
    splits_for_batch = builder.decode_planner.splits_for_batch
    for num_seqs in range(1, len(splits_for_batch)):
        first_batch_of_splits.setdefault(splits_for_batch[num_seqs], num_seqs)
    for splits, num_seqs in sorted(first_batch_of_splits.items()):
        batches.append(
            WarmUpBatch(f"decode x{num_seqs} ({splits} splits)", [1] * num_seqs)
        )
    # prefix_prefill: per query-length bucket the scheduler can reach (tile
    # configs are chosen per bucket), its unsplit launch and, where the plan
    # of some layer splits it, its split one (SPLIT_KV is a constexpr; the
    # split one also builds the merge, and may run the other kernel).
    # max_query_len is an upper bound for the kernel, so a 2-token query
    # stands in for a long one. A launch splits when it has few programs and
    # long sequences: one sequence with the bucket's shortest query over
    # max_model_len keys splits exactly when some launch of the bucket can,
    # which plan_prefill answers for each of the group's layers.
    top = query_len_bucket(builder._max_query_len)
    shortest = 2  # a query of one token is a decode
    max_model_len = builder.max_kv_len  # the most keys a request of the group has
    for bound in (b for b in QUERY_LEN_BUCKETS if b <= top):
        batches.append(WarmUpBatch(f"prefill bucket {bound}", [2], max_query_len=bound))
        plans = builder.prefill_planner.plan(
            num_decodes=0,
            num_reqs=1,
            num_tokens=2,
            max_query_len=shortest,
            max_seq_len=max_model_len,
        )
        if not plans or any(plan.num_splits > 1 for plan in plans.values()):
            batches.append(
                WarmUpBatch(
                    f"prefill bucket {bound}, split-KV",
                    [2],
                    max_query_len=shortest,
                    max_seq_len=max_model_len,
                )
            )
        shortest = bound + 1
    return batches


def warm_up(builder, block_table_stride: int, causal: bool | None = None) -> None:
    """Launch every kernel specialisation this group's layers can use, on a
    scratch cache, so that no Triton compilation happens while serving. (vLLM's
    JIT monitor, activated after the worker's warm-up, logs any that does:
    ``--jit-monitor-mode error`` makes it fail instead.) ``causal``: the batches'
    causality (the prefill kernel's CAUSAL), default the group's
    (``builder.causal``).

    A failure here is logged, not raised: it costs compilations at first use,
    never a wrong answer (the same launches then fail or succeed in forward).
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return  # never launch scratch work into a CUDA graph
    causal = builder.causal if causal is None else causal
    builder._warmed.add((stride_class(block_table_stride), causal))
    try:
        _warm_up(builder, block_table_stride, causal)
    except Exception as e:  # the model may still run; say why it was not warmed
        logger.warning(
            "TRITON_ATTN warm-up failed (%s: %s); kernels will compile at first use.",
            type(e).__name__,
            e,
        )


def kernel_variant(impl) -> tuple:
    """What selects a layer's compiled kernels (constexpr flags and specialised
    ints); layers with equal variants share them."""
    window = impl.sliding_window
    return (
        impl.kv_cache_dtype,
        window if window is None else stride_class(window),
        impl.logits_soft_cap is not None,
        impl.alibi_slopes is not None,
        impl.use_alibi_sqrt,
        impl.sinks is not None,
    )


def _warm_up(builder, block_table_stride: int, causal: bool) -> None:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import (
        AttentionLayerBase,
    )
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    layers = get_layers_from_vllm_config(
        builder.vllm_config,
        AttentionLayerBase,  # type: ignore[type-abstract]
        builder.layer_names,
    )
    plan = warm_up_plan(builder, block_table_stride)
    # One representative layer per distinct set of kernel features.
    variants = {}
    for layer in layers.values():
        impl = layer.impl
        if isinstance(impl, TritonAttentionImpl):
            variants.setdefault(kernel_variant(impl), layer)
    key_base = (
        str(builder.device),
        builder.kv_cache_spec.block_size,
        builder.kv_cache_spec.dtype,
        builder.num_q_heads,
        builder.num_kv_heads,
        builder.head_size,
        stride_class(block_table_stride),
        causal,
        len(plan),
    )
    start = time.perf_counter()
    launched = 0
    for variant, layer in variants.items():
        if (key_base, variant) in WARMED_UP:
            continue
        WARMED_UP.add((key_base, variant))
        for batch in plan:
            for query_layout in QUERY_LAYOUTS:
                run_warm_up_batch(
                    builder, layer, batch, block_table_stride, query_layout, causal
                )
                launched += 1
    if launched:
        if builder.device.type == "cuda":
            torch.cuda.synchronize(builder.device)
        logger.info(
            "TRITON_ATTN warm-up: %d batches (%d kernel variants of the layers) "
            "in %.1f s.",
            launched,
            len(variants),
            time.perf_counter() - start,
        )


def scratch_kv_cache(builder, num_blocks: int) -> torch.Tensor:
    """A zeroed cache with the real block stride (vLLM pads pages when KV-cache
    groups of different page sizes share one pool; the decode kernel takes the
    block stride as a constexpr)."""
    spec = builder.kv_cache_spec
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    shape = TritonAttentionBackend.get_kv_cache_shape(
        num_blocks, spec.block_size, builder.num_kv_heads, builder.head_size
    )
    storage = torch.zeros(
        num_blocks * builder.block_stride, dtype=spec.dtype, device=builder.device
    )
    dense = torch.empty(shape, device="meta").stride()
    return storage.as_strided(shape, (builder.block_stride, *dense[1:]))


def run_warm_up_batch(
    builder,
    layer: "AttentionLayer",
    batch: "WarmUpBatch",
    block_table_stride: int,
    query_layout: str,
    causal: bool = True,
) -> None:
    impl = layer.impl
    device = builder.device
    block_size = builder.kv_cache_spec.block_size
    num_reqs = len(batch.query_lens)
    num_tokens = sum(batch.query_lens)
    dtype = builder.vllm_config.model_config.dtype
    kv_cache = scratch_kv_cache(builder, num_blocks=2)
    # Queries as vLLM hands them over: contiguous, or a view of the fused
    # QKV projection output (row stride (num_q + 2 * num_kv) * head_size).
    q_width = builder.num_q_heads * builder.head_size
    kv_width = builder.num_kv_heads * builder.head_size
    qkv = torch.zeros((num_tokens, q_width + 2 * kv_width), dtype=dtype, device=device)
    if query_layout == "contiguous":
        query = qkv[:, :q_width].contiguous()
    else:
        query = qkv[:, :q_width]
    query = query.view(num_tokens, builder.num_q_heads, builder.head_size)
    key = qkv[:, q_width : q_width + kv_width].view(
        num_tokens, builder.num_kv_heads, builder.head_size
    )
    value = qkv[:, q_width + kv_width :].view(
        num_tokens, builder.num_kv_heads, builder.head_size
    )
    output = torch.empty_like(query, memory_format=torch.contiguous_format)
    slot_mapping = torch.arange(num_tokens, dtype=torch.int64, device=device)
    impl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping % block_size)
    starts = [0]
    for q in batch.query_lens:
        starts.append(starts[-1] + q)
    query_start_loc_cpu = torch.tensor(starts, dtype=torch.int32)
    # Every request reads page 1 (1 or 2 keys); rows have the real row stride.
    block_table = torch.ones(
        (num_reqs, block_table_stride), dtype=torch.int32, device=device
    )
    md = builder._metadata(
        query_start_loc_cpu,
        causal=causal,
        num_actual_tokens=num_tokens,
        num_reqs=num_reqs,
        max_query_len=batch.max_query_len or max(batch.query_lens),
        max_seq_len=batch.max_seq_len or max(batch.query_lens),
        query_start_loc=query_start_loc_cpu.to(device),
        seq_lens=torch.tensor(batch.query_lens, dtype=torch.int32, device=device),
        block_table=block_table,
        slot_mapping=slot_mapping,
    )
    impl.forward(layer, query, key, value, kv_cache, md, output)


@dataclass(frozen=True)
class _WarmUpKey:
    builder: "TritonAttentionMetadataBuilder"
    block_table_stride: int


_JIT_WARM_UP = None  # the vLLM JIT-kernel object, made on first use


def register_jit_warm_up(
    builder: "TritonAttentionMetadataBuilder", block_table_stride: int
) -> None:
    """Hand ``builder``'s warm-up to vLLM's JIT warm-up registry, which runs it with
    the other kernels' before CUDA-graph capture."""
    global _JIT_WARM_UP
    from vllm.model_executor.warmup.jit_warmup import VllmJitKernel

    if _JIT_WARM_UP is None:

        class TritonAttentionWarmUp(VllmJitKernel):
            """One key per builder and block-table stride; compiling a key runs
            that builder's warm-up batches (``warm_up_plan``)."""

            CompileKey = _WarmUpKey

            def get_warmup_keys(self, builder, block_table_stride):
                return [_WarmUpKey(builder, block_table_stride)]

            def compile(self, compile_key: _WarmUpKey) -> None:
                warm_up(compile_key.builder, compile_key.block_table_stride)

        _JIT_WARM_UP = TritonAttentionWarmUp()
    # build() must not warm this stride class up again before the registry does.
    builder._warmed.add((stride_class(block_table_stride), builder.causal))
    _JIT_WARM_UP.register_warmup(builder, block_table_stride)
