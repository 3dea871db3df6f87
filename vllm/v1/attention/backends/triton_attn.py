# SPDX-License-Identifier: Apache-2.0
"""TRITON_ATTN: vLLM's attention backend on this fork's Triton kernels.

Replaces stock vLLM's ``triton_attn.py``, keeping the names other vLLM modules
import from it, and adds ``RocmAttentionBackend`` (the deprecated ROCM_ATTN
alias). docs/backend.md describes each part; in short:

* ``TritonAttentionBackend``: capabilities and the KV-cache layout. Which backend
  serves a layer (ours, or stock's Triton backend as TRITON_UNIFIED_ATTN) is
  decided in ``triton_attn_selection.py``.
* ``TritonAttentionMetadataBuilder``: plans once per batch (FlashInfer's
  plan/run): the decode/prefill split, the decode launch and the prefill launch
  of each kind of layer, over buffers allocated once.
* ``TritonAttentionImpl``: runs per layer: writes the step's K/V, then launches
  the one dispatch ``paged_attention`` with the batch's plans.

KV cache, one tensor per layer: ``[num_blocks, 2, num_kv_heads, block_size,
head_size]`` (``kv_cache[:, 0]`` is K; fp8 caches hold ``x / scale`` with the
layer's per-tensor scales). CUDA graphs: full graphs for uniform single-token
decode batches. Every kernel specialisation is compiled at startup
(``triton_attn_warmup.py``), never while serving.
"""

import functools
import inspect
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, ClassVar

import torch

import vllm.envs as envs
from vllm.attention.ops.hardware import num_sms
from vllm.attention.ops.paged_attention import (
    DECODE_QUERY_LEN,
    StepKVPages,
    paged_attention,
    split_decodes,
)
from vllm.attention.ops.paged_cache_write import write_to_paged_cache
from vllm.attention.ops.prefix_prefill import (
    PrefillLayer,
    PrefillPlan,
    PrefillPlanner,
)
from vllm.attention.ops.triton_attention_common import supported_block_size
from vllm.attention.ops.triton_paged_decode_attention_2d import DecodePlanner
from vllm.attention.ops.tuning.decode_configs import DecodeConfig
from vllm.logger import init_logger
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
)
from vllm.v1.attention.backends import triton_attn_selection as selection
from vllm.v1.attention.backends import triton_attn_warmup as warmup
from vllm.v1.attention.backends.triton_attn_selection import (
    ATTN_TYPES,
    FP8_CACHE_DTYPES,
    KV_CACHE_DTYPES,
    PREFERRED_BLOCK_SIZE,
    STEP_KV_ATTN_TYPES,
    SUPPORTED_BLOCK_SIZES,
    SUPPORTED_HEAD_SIZES,
)
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheSpec,
)

if TYPE_CHECKING:  # names used only in annotations
    from vllm.config import VllmConfig
    from vllm.config.cache import CacheDType
    from vllm.v1.attention.backend import (
        AttentionLayer,
        CommonAttentionMetadata,
        MultipleOf,
    )

logger = init_logger(__name__)

# ----------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------


@dataclass
class TritonAttentionMetadata:
    """Kernel inputs of one batch, shared by all layers of a KV-cache group.

    Lengths of one request in this step::

        |<-------------------------- seq_len -------------------------->|
        |<------------- context_len ------------->|<--- query_len ---->|
        | keys cached by earlier steps (or a      | this step's tokens |
        | prefix-cache hit)                       | (K/V written first)|

        context_len = seq_len - query_len

    The kernels read all ``seq_len`` keys from the paged cache. A decode has
    ``query_len == 1``; a prefill chunk or a spec-decode verification has
    ``query_len > 1``. Encoder self-attention has no cache: its keys are the
    step's own K/V rows (``block_table`` and ``seq_lens`` from ``StepKVPages``,
    ``seq_len == query_len``, every request in the prefill kernel).

    Order of the batch (the builder asks vLLM to put decodes first)::

        requests: | 0 ... num_decodes-1         | num_decodes ... num_reqs-1     |
        tokens:   | 0 ... num_decode_tokens-1   | query_start_loc[num_decodes]...|
                  | paged decode kernel         | prefix_prefill kernel          |

    Requests with query length 0 (CUDA-graph padding) at the end of a decode-only
    batch count as decodes: they have ``seq_len == 0`` and produce zeros.
    """

    num_actual_tokens: int  # tokens of the step, incl. CUDA-graph padding
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32, context_len + query_len
    block_table: torch.Tensor  # [num_reqs, max_blocks_per_req] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64, negative = padding
    num_decodes: int  # requests [0, num_decodes) have query_len <= 1
    num_decode_tokens: int  # their tokens: rows [0, num_decode_tokens)
    decode_num_splits: int  # split-KV count of the decode launch
    decode_workspace: torch.Tensor | None  # fp32 scratch when decode_num_splits > 1
    decode_config: DecodeConfig | None  # the decode launch's tiles
    prefill_max_seq_len: int  # >= every prefill request's seq_len (its split-KV)
    # The prefill launch of each kind of layer the builder serves (empty without
    # prefills): kernel, tiles, split count, workspace view (plan_prefill).
    prefill_plans: dict[PrefillLayer, PrefillPlan]
    # False: every query sees all keys of its request (cross-attention over the
    # cached encoder output, bidirectional drafting); vLLM's flag for the batch.
    causal: bool = True

    @property
    def num_prefills(self) -> int:
        """Requests handled by prefix_prefill (query length > 1)."""
        return self.num_reqs - self.num_decodes

    @functools.cached_property
    def dispatch_args(self) -> dict:
        """The batch's arguments of ``paged_attention`` (the fields it takes under
        the same names), made once per batch for every layer's launch."""
        return {name: getattr(self, name) for name in _dispatch_fields()}


@functools.cache
def _dispatch_fields() -> tuple[str, ...]:
    """The metadata fields that ``paged_attention`` takes under the same name."""
    taken = inspect.signature(paged_attention).parameters
    return tuple(f.name for f in fields(TritonAttentionMetadata) if f.name in taken)


# The metadata fields a batch's CommonAttentionMetadata gives: {ours: vLLM's}.
_FROM_COMMON = {
    "num_actual_tokens": "num_actual_tokens",
    "num_reqs": "num_reqs",
    "max_query_len": "max_query_len",
    "max_seq_len": "max_seq_len",
    "query_start_loc": "query_start_loc",
    "seq_lens": "seq_lens",
    "block_table": "block_table_tensor",
    "slot_mapping": "slot_mapping",
}


# ----------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------


class TritonAttentionMetadataBuilder(AttentionMetadataBuilder[TritonAttentionMetadata]):
    """Builds ``TritonAttentionMetadata``; owns the split-KV decode workspace."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = (
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    )

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: "VllmConfig",
        device: torch.device,
    ):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # What vLLM's selector hands over (backend_for_layer) can still reach
        # this class when a model passes it explicitly: refuse, never ignore.
        if getattr(vllm_config.model_config, "rswa_window", None) is not None:
            raise NotImplementedError(
                "TRITON_ATTN does not support R-SWA; use --attention-backend "
                "TRITON_UNIFIED_ATTN."
            )
        selection.log_served_layers("TRITON_ATTN", layer_names)
        self.device = torch.device(device)
        # Decodes first, so each kernel sees one contiguous range of requests.
        self._init_reorder_batch_threshold(DECODE_QUERY_LEN)

        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.head_size = kv_cache_spec.head_size
        self.num_sms = num_sms(self.device)  # an H200's count off the GPU
        group = selection.LayerGroup.of(
            vllm_config, layer_names, kv_cache_spec, TritonAttentionImpl
        )
        self.num_q_heads = group.num_q_heads
        # Causal batches, or non-causal ones (cross-attention, encoders; decoder
        # layers where vLLM says so); encoder self-attention has no paged cache:
        # every request runs in the prefill kernel over the step's own K/V rows,
        # seen as pages of one key (``StepKVPages``, made below).
        self.causal, self.kv_from_step = group.causal, group.kv_from_step
        self.max_kv_len = group.max_kv_len
        q_dtype, kv_dtype = group.q_dtype, group.kv_dtype

        # VLLM_BATCH_INVARIANT=1: a request's result must not depend on the batch
        # around it. The kernels reduce each query row's keys in one program, in
        # an order the tiles fix, so only the plan could vary with the batch: the
        # split counts (from the batch size and grid) and the prefill tiles (from
        # the batch's longest query). Both are fixed then: no split, and one
        # prefill config per kind of layer (``PrefillPlanner``).
        self.batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)
        # The decode launch of every batch size up to the largest one vLLM can
        # form (max_num_seqs; CUDA-graph capture sizes never exceed it for decodes).
        self.decode_planner = DecodePlanner(
            device=self.device,
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            block_size=kv_cache_spec.block_size,
            max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
            num_sms=self.num_sms,
            batch_invariant=self.batch_invariant,
        )
        # Elements between two pages of a layer's cache: vLLM's page, padded to a
        # common size in hybrid models (the warm-up's scratch cache copies it).
        self.block_stride = max(
            kv_cache_spec.page_size_bytes // kv_cache_spec.dtype.itemsize,
            2 * self.num_kv_heads * kv_cache_spec.block_size * self.head_size,
        )
        # The prefill launch of each kind of layer in the group (its features on
        # the group's cache, or on the step's K/V rows), planned for every batch.
        pages = {
            "kv_dtype": kv_dtype,
            "block_size": kv_cache_spec.block_size,
            "pages_are_rows": self.block_stride % self.head_size == 0,
        }
        if self.kv_from_step:
            pages = {"kv_dtype": q_dtype, "block_size": 1, "pages_are_rows": True}
        self.prefill_planner = PrefillPlanner(
            device=self.device,
            layers={
                impl.prefill_layer(q_dtype=q_dtype, **pages) for impl in group.impls
            },
            head_size=self.head_size,
            max_kv_len=self.max_kv_len,
            batch_invariant=self.batch_invariant,
        )

        # Compile every kernel specialisation now, at startup (see warm_up), for
        # each (block-table stride class, causality) a batch brings.
        self._warmed: set[tuple] = set()
        self._max_query_len = min(
            vllm_config.scheduler_config.max_num_batched_tokens,
            vllm_config.model_config.max_model_len,
        )
        self.step_kv = None
        if self.kv_from_step:
            self.step_kv = StepKVPages(
                max_num_seqs=vllm_config.scheduler_config.max_num_seqs,
                max_query_len=self._max_query_len,
                device=self.device,
            )
        self._warm_up_enabled = self.device.type == "cuda"
        if self._warm_up_enabled:
            stride = warmup.guess_block_table_stride(vllm_config, kv_cache_spec)
            warmup.register_jit_warm_up(self, self._block_table_stride(stride))

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: "CommonAttentionMetadata",
        fast_build: bool = False,
    ) -> TritonAttentionMetadata:
        cm = common_attn_metadata
        causal = selection.batch_causality(cm.causal, self.prefill_planner.layers)
        stride = self._block_table_stride(cm.block_table_tensor.stride(0))
        if self._warm_up_enabled and (
            (warmup.stride_class(stride), causal) not in self._warmed
        ):
            # The block-table row stride is a kernel argument that Triton
            # specialises on and the startup guess missed its class, or the batch
            # is the first of its causality. This is the first such batch, still
            # before serving: vLLM's warm-up and CUDA-graph capture build
            # metadata first.
            warmup.warm_up(self, stride, causal=causal)
        if getattr(cm, "mm_req_doc_ranges", None) is not None:
            raise NotImplementedError(
                "TRITON_ATTN takes one causal flag per batch; this batch has "
                "multimodal prefix-LM (bidirectional) ranges. Use "
                "--attention-backend TRITON_UNIFIED_ATTN."
            )
        return self._metadata(
            cm.query_start_loc_cpu,
            getattr(cm, "seq_lens_cpu_upper_bound", None),
            causal=causal,
            **{ours: getattr(cm, theirs) for ours, theirs in _FROM_COMMON.items()},
        )

    def _block_table_stride(self, vllm_stride: int) -> int:
        """Row stride of the block table the kernels get: vLLM's, or that of the
        step's one-key page table."""
        return self.step_kv.stride if self.step_kv else vllm_stride

    def _metadata(
        self,
        query_start_loc_cpu: torch.Tensor,
        seq_lens_upper_bound_cpu: torch.Tensor | None = None,
        causal: bool = True,
        **batch,
    ) -> TritonAttentionMetadata:
        """The metadata of a batch from its common fields (``_FROM_COMMON``'s
        names): the decode/prefill split, the decode launch plan and the prefill
        requests' longest KV length added. ``seq_lens_upper_bound_cpu``: vLLM's
        host upper bound of each request's seq_len (exact for prefills), when the
        model runner gives one; else the batch's ``max_seq_len`` bounds the
        prefills. ``causal``: the batch's flag (``selection.batch_causality``)."""
        num_decodes, num_decode_tokens = split_decodes(
            query_start_loc_cpu, batch["num_reqs"], batch["max_query_len"]
        )
        if self.step_kv:  # no cache: every request in the prefill kernel
            num_decodes = num_decode_tokens = 0
            batch["block_table"], batch["seq_lens"] = self.step_kv.table(
                batch["query_start_loc"], batch["num_reqs"]
            )
        num_splits, workspace, config = self.decode_planner.plan(num_decodes)
        prefill_max_seq_len = batch["max_seq_len"]
        if seq_lens_upper_bound_cpu is not None and num_decodes < batch["num_reqs"]:
            prefills = seq_lens_upper_bound_cpu[num_decodes : batch["num_reqs"]]
            prefill_max_seq_len = int(prefills.max())
        return TritonAttentionMetadata(
            **batch,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            decode_num_splits=num_splits,
            decode_workspace=workspace,
            decode_config=config,
            prefill_max_seq_len=prefill_max_seq_len,
            prefill_plans=self.prefill_planner.plan(
                num_decodes=num_decodes,
                num_reqs=batch["num_reqs"],
                num_tokens=batch["num_actual_tokens"],
                max_query_len=batch["max_query_len"],
                max_seq_len=prefill_max_seq_len,
                causal=causal,
            ),
            causal=causal,
        )


# ----------------------------------------------------------------------------------
# Backend (capabilities)
# ----------------------------------------------------------------------------------


class TritonAttentionBackend(selection.HandOverHooks, AttentionBackend):
    """Capabilities and KV-cache layout of TRITON_ATTN; which backend serves a
    layer (ours or TRITON_UNIFIED_ATTN) is answered by ``selection.HandOverHooks``."""

    supported_kv_cache_dtypes: ClassVar[list["CacheDType"]] = list(KV_CACHE_DTYPES)
    # vLLM writes the cache through do_kv_cache_update before forward().
    forward_includes_kv_cache_update: bool = False

    # The registry name, and the two classes vLLM makes from this backend: one
    # metadata builder per KV-cache group (plans each batch) and one impl per
    # layer (writes K/V, launches).
    @staticmethod
    def get_name() -> str:
        return "TRITON_ATTN"

    @staticmethod
    def get_builder_cls() -> type[TritonAttentionMetadataBuilder]:
        return TritonAttentionMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["TritonAttentionImpl"]:
        return TritonAttentionImpl

    @staticmethod
    def get_supported_kernel_block_sizes(
        kv_cache_spec: "KVCacheSpec | None" = None,
    ) -> "list[int | MultipleOf]":
        # Every spec gets the same page sizes; the argument exists only in later
        # vLLM releases, which pass the layer's spec.
        return [*SUPPORTED_BLOCK_SIZES]

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        return PREFERRED_BLOCK_SIZE

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        # A vLLM block size that is a multiple of a kernel block size is split
        # into kernel blocks by the model runner.
        return block_size is None or any(
            block_size % size == 0 for size in SUPPORTED_BLOCK_SIZES
        )

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        # The kernels take any power of two (models that stretch blocks, like
        # Whisper's block pooling, pass larger ones); vLLM picks from
        # SUPPORTED_BLOCK_SIZES.
        if not supported_block_size(block_size):
            raise ValueError(
                f"TRITON_ATTN kernel block size {block_size} is not supported; "
                f"use one of {SUPPORTED_BLOCK_SIZES} (--block-size)."
            )
        if cache_dtype_str not in KV_CACHE_DTYPES:
            raise ValueError(
                f"TRITON_ATTN has no KV-cache layout for --kv-cache-dtype "
                f"{cache_dtype_str}; use auto, float16, bfloat16 or fp8."
            )
        return (num_blocks, 2, num_kv_heads, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order(
        include_num_layers_dimension: bool = False,
    ) -> tuple[int, ...]:
        """Physical order of the dimensions of ``get_kv_cache_shape``: that shape is
        the layout (blocks, K/V, heads, slots, head dims). A cross-layer cache puts
        a layers dimension in front of the shape, which goes second in memory,
        after the blocks: the kernels address pages by the runtime block stride,
        so a layer's view may have any."""
        per_layer = (0, 1, 2, 3, 4)
        if not include_num_layers_dimension:
            return per_layer
        blocks, *rest = (dim + 1 for dim in per_layer)  # shifted past layers (0)
        return (blocks, 0, *rest)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        """The layout above in the terms of releases that build the cache view
        from the spec: a page holds ``2 * num_kv_heads`` head slots (all K heads,
        then all V heads) of ``head_size`` values each, so the view is
        ``[num_blocks, 2 * num_kv_heads, block_size, head_size]`` and page sizes
        equal stock's. Specs this layout does not cover (already customised, K and
        V of different head sizes) are returned unchanged."""
        if (
            getattr(spec, "num_head_slots", None) is not None
            or getattr(spec, "state_content_bytes", None) is not None
            or getattr(spec, "head_size_v", spec.head_size) != spec.head_size
        ):
            return spec
        return replace(
            spec,
            num_head_slots=2 * spec.num_kv_heads,
            state_content_bytes=spec.head_size * spec.dtype.itemsize,
        )

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple:
        """Layouts (of logical ``[layers, blocks, heads, tokens, content]``) that
        keep each head's page a dense ``[block_size, head_size]`` slice: heads
        inside a block, tokens inside a head. Layer-major first."""
        from vllm.v1.kv_cache_layout import KVCacheLayout

        return (KVCacheLayout.LBHNC, KVCacheLayout.BLHNC)

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # build() splits decodes from prefills by the host's query lengths
        # (query_start_loc_cpu); they must be the device's.
        return False

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_SIZES)

    # Model features the selector asks about: the kernels' USE_SINKS and
    # USE_WINDOW flags; KV connectors (NIXL, ...) are refused: they assume stock's
    # [num_blocks, num_kv_heads, block_size, 2 * head_size] layout.
    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_kv_connector(cls) -> bool:
        return False

    @classmethod
    def supports_alibi_sqrt(cls) -> bool:
        # The kernels' ALIBI_SQRT flag; vLLM then passes use_alibi_sqrt to the impl.
        return True

    @classmethod
    def supports_batch_invariance(cls) -> bool:
        # Under VLLM_BATCH_INVARIANT=1 the builder fixes the split counts and
        # the prefill tiles (TritonAttentionMetadataBuilder.batch_invariant).
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        # Non-causal batches of decoder layers (bidirectional drafting): the
        # prefill kernel's CAUSAL flag, off.
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        # Cross-attention reads the encoder's K/V from its paged cache, encoder
        # self-attention the step's own K/V rows; both non-causally.
        return attn_type in ATTN_TYPES


# ----------------------------------------------------------------------------------
# Implementation (per layer)
# ----------------------------------------------------------------------------------


class TritonAttentionImpl(AttentionImpl[TritonAttentionMetadata]):
    """One attention layer: writes the new K/V, then launches the kernels."""

    # No softmax LSE from the decode kernel, so no decode context parallelism.
    can_return_lse_for_decode: bool = False
    supports_dcp: bool = False
    supports_pcp: bool = False
    supports_quant_query_input: bool = False

    # vLLM's attention layer passes the first ten positionally, in this order.
    def __init__(
        self,
        num_heads: int,  # query heads
        head_size: int,  # one of SUPPORTED_HEAD_SIZES
        scale: float,  # softmax scale
        num_kv_heads: int | None = None,  # None: as many as query heads
        alibi_slopes: list[float] | None = None,  # one per query head
        sliding_window: int | None = None,  # keys a query sees, itself included
        kv_cache_dtype: str = "auto",  # KV_CACHE_DTYPES
        logits_soft_cap: float | None = None,  # None or 0: no soft-cap
        attn_type: str = AttentionType.DECODER,  # any of ATTN_TYPES
        kv_sharing_target_layer_name: str | None = None,  # kept for vLLM
        sinks: torch.Tensor | None = None,  # [num_heads] logits (gpt-oss)
        use_alibi_sqrt: bool = False,  # ALiBi on the distance's square root
        **unsupported,  # refused below, by name
    ) -> None:
        num_kv_heads = num_kv_heads or num_heads
        selection.check_layer(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            kv_cache_dtype=kv_cache_dtype,
            attn_type=attn_type,
            sinks=sinks,
            sliding_window=sliding_window,
            alibi=alibi_slopes is not None,
            alibi_sqrt=use_alibi_sqrt,
            unsupported=unsupported,
        )
        # What vLLM reads from an impl (the layer's repr, the metadata builders'
        # checks), in the interface's names.
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_size, self.scale = head_size, float(scale)
        self.kv_cache_dtype, self.attn_type = kv_cache_dtype, attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        # vLLM's sliding window W: a query at position p sees keys j with p - j < W.
        self.sliding_window = sliding_window
        # Some configs spell "no soft-cap" as 0.
        self.logits_soft_cap = logits_soft_cap or None
        self.use_alibi_sqrt = bool(use_alibi_sqrt)
        # Created on the default device of model construction (the GPU in vLLM).
        self.alibi_slopes = (
            None
            if alibi_slopes is None
            else torch.tensor(alibi_slopes, dtype=torch.float32)
        )
        # The layer's parameter; the kernels read fp32 (see
        # process_weights_after_loading, which runs after the checkpoint is loaded).
        self.sinks = sinks
        self._kernel_sinks = (
            sinks if sinks is None or sinks.dtype == torch.float32 else None
        )
        # Encoder self-attention has no cache: the kernels read the step's K/V.
        self.kv_from_step = attn_type in STEP_KV_ATTN_TYPES
        self.is_fp8_cache = kv_cache_dtype in FP8_CACHE_DTYPES and not self.kv_from_step
        self._fp8_dtype = (
            selection.fp8_cache_dtype(kv_cache_dtype) if self.is_fp8_cache else None
        )

    def prefill_layer(
        self,
        *,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
        block_size: int,
        pages_are_rows: bool,
    ) -> PrefillLayer:
        """What a prefill plan needs of this layer on a cache (the builder plans
        once per batch for each kind of layer; ``paged_attention`` finds a
        layer's plan by the same value, ``PrefillLayer.of_inputs`` its inputs)."""
        return PrefillLayer(
            head_size=self.head_size,
            num_q_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            block_size=block_size,
            pages_are_rows=pages_are_rows,
            sliding_window=self.sliding_window,
            soft_cap=self.logits_soft_cap is not None,
            alibi=self.alibi_slopes is not None,
            sinks=self.sinks is not None,
        )

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        if self.sinks is not None and self.sinks.dtype != torch.float32:
            self._kernel_sinks = self.sinks.to(torch.float32)

    def _cache_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V views ``[num_blocks, num_kv_heads, block_size, head_size]`` of
        the layer's cache, given as ``[num_blocks, 2, num_kv_heads, ...]`` or, by
        releases that build it from ``customize_spec``, ``[num_blocks,
        2 * num_kv_heads, ...]`` (a view either way; strides are kept)."""
        if kv_cache.dim() == 4:
            kv_cache = kv_cache.unflatten(1, (2, self.num_kv_heads))
        if self._fp8_dtype is not None:
            # vLLM allocates fp8 caches as uint8.
            kv_cache = kv_cache.view(self._fp8_dtype)
        key_cache, value_cache = kv_cache.unbind(1)
        return key_cache, value_cache

    def do_kv_cache_update(
        self,
        layer: "AttentionLayer",
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store this step's K/V ``[num_tokens, num_kv_heads, head_size]`` at
        ``slot_mapping`` (fp8: quantised with the layer's per-tensor scales);
        encoder self-attention has no cache."""
        if self.kv_from_step:
            return
        # Rows of key/value past len(slot_mapping) are padding and are not written.
        key_cache, value_cache = self._cache_views(kv_cache)
        write_to_paged_cache(
            key=key,
            value=value,
            key_cache=key_cache,
            value_cache=value_cache,
            slot_mapping=slot_mapping,
            k_scale=layer._k_scale if self.is_fp8_cache else None,
            v_scale=layer._v_scale if self.is_fp8_cache else None,
        )

    def forward(
        self,
        layer: "AttentionLayer",  # k/v scales of an fp8 cache
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # already in the cache (do_kv_cache_update)
        value: torch.Tensor,
        kv_cache: torch.Tensor,  # get_kv_cache_shape
        attn_metadata: TritonAttentionMetadata,  # None in the profiling run
        output: torch.Tensor,  # written in place and returned
        output_scale: torch.Tensor | None = None,  # fused output quantization:
        output_block_scale: torch.Tensor | None = None,  # refused
    ) -> torch.Tensor:
        """Attention of ``query`` ``[num_tokens, num_heads, head_size]`` over the
        paged cache (the new K/V are already in it), written into ``output``.

        Launches only: every host-side decision was made in the builder.
        """
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(
                "TRITON_ATTN has no fused output quantization; disable the "
                "attention + quant fusion pass."
            )
        if attn_metadata is None:
            # Memory-profiling run: no cache yet, the values do not matter.
            return output.fill_(0)
        if self._kernel_sinks is None and self.sinks is not None:
            raise RuntimeError(
                "TRITON_ATTN: attention sinks were not converted to fp32; vLLM calls "
                "process_weights_after_loading() after loading, call it first."
            )
        if self.kv_from_step:
            # The step's K/V rows as pages of one key (the builder's table).
            key_cache, value_cache = StepKVPages.views(key, value)
        else:
            key_cache, value_cache = self._cache_views(kv_cache)
        # The batch's plans (attn_metadata.prefill_plans) ride in dispatch_args;
        # paged_attention launches the one of this layer.
        paged_attention(
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            output=output,
            softmax_scale=self.scale,
            k_scale=layer._k_scale if self.is_fp8_cache else None,
            v_scale=layer._v_scale if self.is_fp8_cache else None,
            sliding_window=self.sliding_window,
            alibi_slopes=self.alibi_slopes,
            logits_soft_cap=self.logits_soft_cap,
            sinks=self._kernel_sinks,
            alibi_sqrt=self.use_alibi_sqrt,
            **attn_metadata.dispatch_args,
        )
        return output


# ----------------------------------------------------------------------------------
# Deprecated alias
# ----------------------------------------------------------------------------------


class RocmAttentionBackend(TritonAttentionBackend):
    """ROCM_ATTN, kept as a deprecated alias of TRITON_ATTN (same kernels on AMD).

    ``get_name`` stays "TRITON_ATTN": vLLM maps the name back to the registry
    (``AttentionBackendEnum[get_name()]``) and checks it in places (KV connectors,
    logs), and this class is TRITON_ATTN in every respect.
    """

    @staticmethod
    def get_impl_cls() -> type[TritonAttentionImpl]:
        logger.warning_once(
            "ROCM_ATTN was renamed to TRITON_ATTN; ROCM_ATTN is a deprecated alias "
            "and will be removed. Use --attention-backend TRITON_ATTN."
        )
        return TritonAttentionImpl
