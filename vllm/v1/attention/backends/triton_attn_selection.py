# SPDX-License-Identifier: Apache-2.0
"""Which backend serves a layer that reaches TRITON_ATTN: our kernels where they
take it, stock's Triton backend (TRITON_UNIFIED_ATTN) for the rest.

* What the kernels take, as data (the backend declares it; docs/backend.md).
* ``kernel_refusals``: why our kernels do not take a layer, in words that say what
  they take. ``HandOverHooks``: what ``TritonAttentionBackend`` answers vLLM's
  selector: ``validate_configuration`` for ours and stock's together, and
  ``backend_for_layer`` (a hook every platform's selection calls), which hands a
  layer ours do not take to ``handed_over``'s backend, logged once per kind of
  layer.
* ``TritonUnifiedAttentionBackend``: stock's backend (``triton_unified_attn.py``,
  kept unchanged by the build) under its own name, so a layer it serves says so;
  ``log_served_layers``: the startup line of each metadata builder.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm.attention.ops.triton_attention_common import (
    MAX_HEAD_SIZE,
    QUERY_DTYPES,
)
from vllm.attention.ops.triton_attention_common import (
    SUPPORTED_HEAD_SIZES as KERNEL_HEAD_SIZES,
)
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionBackend, AttentionType
from vllm.v1.attention.backends import triton_unified_attn as stock_triton

if TYPE_CHECKING:
    from vllm.platforms.interface import DeviceCapability

logger = init_logger(__name__)

# What the kernels take, as data (docs/backend.md explains each choice).
# Head sizes and model (query) dtypes: the kernels' own (any up to 256, tiles of the
# next power of two with the extra columns masked; bf16 and fp16).
SUPPORTED_HEAD_SIZES: tuple[int, ...] = KERNEL_HEAD_SIZES
KERNEL_DTYPES: tuple[torch.dtype, ...] = QUERY_DTYPES
HEAD_SIZES_TEXT = f"any up to {MAX_HEAD_SIZE}"
# Page sizes (tokens per block). Larger vLLM block sizes (hybrid models) are split
# into kernel blocks of the largest of these that divides them.
SUPPORTED_BLOCK_SIZES: tuple[int, ...] = (16, 32, 64, 128)
# 64 keys per page: a decode KV tile of 64 keys stays inside one page (one
# block-table read per tile) and prefix caching still shares at a fine grain.
PREFERRED_BLOCK_SIZE = 64
# "fp8" is e4m3 on every platform this fork supports; fp8_e5m2 is e5m2.
FP8_CACHE_DTYPES: tuple[str, ...] = ("fp8", "fp8_e4m3", "fp8_e5m2")
_SIXTEEN_BIT_CACHE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Every --kv-cache-dtype the layout and kernels take ("auto": the model's dtype).
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    *_SIXTEEN_BIT_CACHE_DTYPES,
    *FP8_CACHE_DTYPES,
)
# Attention types: decoder self-attention and cross-attention read K/V from a
# paged cache; encoder self-attention (embedding models) has none, and its
# launches read the step's K/V rows instead (the builder's single-key pages).
# All but decoder self-attention are non-causal.
ATTN_TYPES: tuple[str, ...] = (
    AttentionType.DECODER,
    AttentionType.ENCODER_DECODER,
    AttentionType.ENCODER,
    AttentionType.ENCODER_ONLY,
)
STEP_KV_ATTN_TYPES = frozenset({AttentionType.ENCODER, AttentionType.ENCODER_ONLY})
NON_CAUSAL_ATTN_TYPES = STEP_KV_ATTN_TYPES | {AttentionType.ENCODER_DECODER}
# CUDA: bf16 tensor-core dots need SM 8.0; Triton's fp8 e4m3 conversions need 8.9.
MIN_CUDA_CAPABILITY = (8, 0)
MIN_CUDA_FP8_CAPABILITY = (8, 9)
# What to use for a configuration these kernels do not take: stock vLLM's Triton
# backend, which the build keeps under this name (triton_unified_attn.py).
STOCK_BACKEND_HINT = "use --attention-backend TRITON_UNIFIED_ATTN, stock vLLM's Triton"
# The module of TRITON_ATTN's own classes (a subclass elsewhere wraps ours).
BACKEND_MODULE = "vllm.v1.attention.backends.triton_attn"


def fp8_cache_dtype(kv_cache_dtype: str) -> torch.dtype:
    """The torch dtype the kernels read an fp8 cache as (vLLM allocates it as
    bytes): e5m2 for fp8_e5m2, else the platform's e4m3 (e4m3fnuz on MI300)."""
    if kv_cache_dtype == "fp8_e5m2":
        return torch.float8_e5m2
    from vllm.platforms import current_platform

    return current_platform.fp8_dtype()


def kernel_refusals(base_reasons: list[str], **config) -> list[str]:
    """Why our kernels do not take a layer (empty: they do), each reason saying
    what they take: ``base_reasons`` (vLLM's own checks,
    ``AttentionBackend.validate_configuration`` answered by TRITON_ATTN's
    capabilities, called with the selector's keyword arguments ``config``) in our
    words, plus ours: head sizes, dtypes, capability, dtype pairing, fp8
    capability."""
    head_size = config["head_size"]
    dtype = config["dtype"]
    kv_cache_dtype = config["kv_cache_dtype"]
    block_size = config["block_size"]
    capability = config["device_capability"]
    attn_type = config["attn_type"]
    explain = {
        "kv_cache_dtype not supported": f"kv_cache_dtype {kv_cache_dtype} not "
        f"supported (supported: {', '.join(KV_CACHE_DTYPES)})",
        "block_size not supported": f"block_size {block_size} not supported "
        f"(use a multiple of one of {SUPPORTED_BLOCK_SIZES}; 64 is preferred)",
        "MLA not supported": "MLA not supported (MLA models need an MLA "
        "backend such as TRITON_MLA)",
        f"attention type {attn_type} not supported": f"attention type "
        f"{attn_type} not supported (supported: {', '.join(ATTN_TYPES)})",
        "KV connector not supported": "KV connector not supported (connectors "
        "expect stock vLLM's packed KV layout, TRITON_ATTN stores "
        "[num_blocks, 2, num_kv_heads, block_size, head_size])",
        "PCP not supported": "prefill context parallelism not supported",
        "partial multimodal token full attention not supported": "multimodal "
        "prefix-LM (bidirectional image tokens) not supported (one causal flag per "
        "batch)",
        "per-head quant scales not supported": "per-head KV quant scales not "
        "supported (fp8 uses per-tensor k/v scales)",
        "DCP not supported": "decode context parallelism not supported (the "
        "decode kernel returns no softmax LSE)",
        "R-SWA not supported": "R-SWA not supported",
        "device-cpu query lens mismatch not supported, this is needed for "
        "adaptive verification": "adaptive speculative verification not "
        "supported (the batch is planned from the host's query lengths)",
    }
    # Head size, dtype and capability are answered for TRITON_ATTN as a whole
    # (above); ours are checked here.
    answered_above = {
        "head_size not supported",
        "dtype not supported",
        "compute capability not supported",
    }
    reasons = [
        explain.get(reason, reason)
        for reason in base_reasons
        if reason not in answered_above
    ]
    if head_size not in SUPPORTED_HEAD_SIZES:
        reasons.append(
            f"head_size {head_size} not supported (supported: {HEAD_SIZES_TEXT})"
        )
    if dtype not in KERNEL_DTYPES:
        reasons.append(f"dtype {dtype} not supported (bfloat16 and float16 are)")
    if not kernels_support_capability(capability):
        reasons.append(
            "compute capability "
            + ("unknown" if capability is None else capability.as_version_str())
            + f" not supported (CUDA needs SM {MIN_CUDA_CAPABILITY[0]}."
            f"{MIN_CUDA_CAPABILITY[1]}+)"
        )
    if attn_type == AttentionType.ENCODER_DECODER and config.get("has_sliding_window"):
        reasons.append(
            "cross-attention with a sliding window not supported (a window measures "
            "the distance between a query and a key of one sequence)"
        )
    cache_dtype = _SIXTEEN_BIT_CACHE_DTYPES.get(kv_cache_dtype or "auto")
    if cache_dtype is not None and cache_dtype != dtype:
        reasons.append(
            f"kv_cache_dtype {kv_cache_dtype} with model dtype {dtype} is not "
            "supported: the kernels read a 16-bit cache in the model's dtype"
        )
    if (
        kv_cache_dtype in FP8_CACHE_DTYPES
        and capability is not None
        and not platform_supports_fp8(capability)
    ):
        reasons.append(
            f"kv_cache_dtype {kv_cache_dtype} needs fp8 support (CUDA "
            f"SM {MIN_CUDA_FP8_CAPABILITY[0]}.{MIN_CUDA_FP8_CAPABILITY[1]}+ or "
            f"an fp8-capable ROCm GPU), this GPU is SM "
            f"{capability.as_version_str()}"
        )
    return reasons


def check_layer(
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    kv_cache_dtype: str,
    attn_type: str,
    sinks: torch.Tensor | None,
    sliding_window: int | None,
    alibi: bool,
    alibi_sqrt: bool,
    unsupported: dict,
) -> None:
    """Refuse, by name, what a TRITON_ATTN layer (``TritonAttentionImpl``) asks
    of our kernels that they do not take; the selector hands such layers over
    first (``kernel_refusals``), so this stops a model that builds the impl
    itself. ``unsupported``: constructor options the impl has no parameter for."""
    # RNJ-1's chunked attention with lookback passes chunk_lookback=-1 when off.
    if unsupported.get("chunk_lookback", -1) == -1:
        unsupported.pop("chunk_lookback", None)
    if unsupported:
        raise NotImplementedError(
            f"TRITON_ATTN does not support {sorted(unsupported)} (e.g. chunked "
            f"attention with lookback); {STOCK_BACKEND_HINT} backend."
        )
    if attn_type not in ATTN_TYPES:
        raise NotImplementedError(
            f"TRITON_ATTN does not support attention type {attn_type} (supported: "
            f"{', '.join(ATTN_TYPES)}); {STOCK_BACKEND_HINT} backend."
        )
    if attn_type in NON_CAUSAL_ATTN_TYPES and alibi:
        raise NotImplementedError(
            f"TRITON_ATTN runs {attn_type} attention (non-causal) without ALiBi "
            f"(a causal distance); {STOCK_BACKEND_HINT} backend."
        )
    if attn_type == AttentionType.ENCODER_DECODER and sliding_window:
        raise NotImplementedError(
            "TRITON_ATTN runs cross-attention without a sliding window (a window "
            "measures the distance between a query and a key of one sequence); "
            f"{STOCK_BACKEND_HINT} backend."
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}."
        )
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise ValueError(
            f"TRITON_ATTN does not support head size {head_size} (supported: "
            f"{HEAD_SIZES_TEXT}); {STOCK_BACKEND_HINT} backend."
        )
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"TRITON_ATTN does not support --kv-cache-dtype {kv_cache_dtype}; "
            f"use one of {list(KV_CACHE_DTYPES)}, or {STOCK_BACKEND_HINT} backend."
        )
    if alibi_sqrt and not alibi:
        raise ValueError("use_alibi_sqrt needs ALiBi slopes (alibi_slopes).")
    if sinks is not None and sinks.shape != (num_heads,):
        raise ValueError(
            f"sinks must have one value per query head ({num_heads},), got "
            f"{tuple(sinks.shape)}."
        )


def batch_causality(causal, layers) -> bool:
    """The causal flag vLLM gives a batch (``CommonAttentionMetadata.causal``) as
    the kernels take it: one bool for the batch, and non-causal only over ``layers``
    (the group's ``PrefillLayer``s) without ALiBi, whose bias measures the
    distance to a causal query (a sliding window becomes two-sided). Anything
    else is refused."""
    if causal is True:
        return True
    if causal is not False:
        raise NotImplementedError(
            "TRITON_ATTN takes one causal flag per batch; this batch has one per "
            "request. Use --attention-backend FLASH_ATTN or TRITON_UNIFIED_ATTN."
        )
    if any(layer.alibi for layer in layers):
        raise NotImplementedError(
            "TRITON_ATTN runs non-causal attention without ALiBi; this batch asks "
            "for it on such layers. Use --attention-backend FLASH_ATTN or "
            "TRITON_UNIFIED_ATTN."
        )
    return False


class HandOverHooks:
    """What ``TritonAttentionBackend`` (a subclass of this and ``AttentionBackend``,
    in that order) answers vLLM's selector: it takes every layer that our kernels
    or stock's Triton backend take, and hands each layer ours do not take to
    stock's (``handed_over``)."""

    # vLLM asks these three for a vision encoder's attention (which runs stock's
    # ViT kernel, not this backend) and inside validate_configuration: they answer
    # for everything TRITON_ATTN serves, our kernels or stock's backend.
    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size in SUPPORTED_HEAD_SIZES or (
            TritonUnifiedAttentionBackend.supports_head_size(head_size)
        )

    @classmethod
    def supports_dtype(cls, dtype: torch.dtype) -> bool:
        return dtype in KERNEL_DTYPES or TritonUnifiedAttentionBackend.supports_dtype(
            dtype
        )

    @classmethod
    def supports_compute_capability(cls, capability: "DeviceCapability") -> bool:
        return kernels_support_capability(
            capability
        ) or TritonUnifiedAttentionBackend.supports_compute_capability(capability)

    @classmethod
    def kernel_refusals(cls, **config) -> list[str]:
        """Why our kernels do not take a layer (empty: they do), vLLM's own checks
        (answered by the backend's capabilities) included."""
        return kernel_refusals(super().validate_configuration(**config), **config)

    @classmethod
    def validate_configuration(cls, **config) -> list[str]:
        """The check vLLM makes of a layer: empty when our kernels take it or
        stock's Triton backend does (``backend_for_layer`` then hands it over), so
        TRITON_ATTN serves every layer stock's TRITON_ATTN served. A layer neither
        takes is refused with both backends' reasons."""
        reasons = cls.kernel_refusals(**config)
        if not reasons:
            return []
        stock = TritonUnifiedAttentionBackend.validate_configuration(**config)
        if not stock:
            return []
        return [
            *reasons,
            (
                "stock vLLM's Triton backend (TRITON_UNIFIED_ATTN) does not take it "
                f"either: {'; '.join(stock)}"
            ),
        ]

    @classmethod
    def backend_for_layer(
        cls, attn_selector_config, device_capability: "DeviceCapability | None"
    ) -> type[AttentionBackend]:
        """The hook vLLM's selector calls once per kind of layer on every platform
        and selection path, named or automatic: this backend where our kernels
        take the layer, else stock's Triton backend, logged once with our
        reasons. vLLM validated the layer against this backend first
        (``validate_configuration``), so stock's backend takes what ours does not;
        XPU, whose selector validates nothing, keeps stock's backend for every
        layer (our kernels are built and tested for CUDA and ROCm)."""
        from vllm.platforms import current_platform

        if current_platform.is_xpu():
            reasons = ["on XPU (our kernels are built and tested on CUDA and ROCm)"]
        else:
            reasons = cls.kernel_refusals(
                device_capability=device_capability, **attn_selector_config._asdict()
            )
        return handed_over(reasons) if reasons else cls

    @classmethod
    def backend_for_layer_options(cls, **layer_options) -> type[AttentionBackend]:
        """The hook vLLM's attention layer calls, right after choosing this
        backend, for the options the selector does not see: a layer with chunked
        attention with lookback (RNJ-1) runs on stock's Triton backend, logged
        once (ALiBi-sqrt runs on ours). A subclass another vLLM module builds
        around ours (encoder-only, cross-attention, Whisper) is kept."""
        wrapped = cls.__module__ != BACKEND_MODULE
        # Lookback is on where vLLM's layer turns it on: chunk_lookback > -1.
        if not wrapped and layer_options.get("chunk_lookback", -1) > -1:
            return handed_over(["chunked attention with lookback not supported"])
        return cls


def handed_over(reasons: list[str]) -> type[AttentionBackend]:
    """Stock's Triton backend, for a layer our kernels do not take; logged once
    per kind of layer."""
    logger.warning_once(
        "TRITON_ATTN's kernels do not take a layer of this model (%s); it runs on "
        "stock vLLM's Triton backend, TRITON_UNIFIED_ATTN.",
        "; ".join(reasons),
    )
    return TritonUnifiedAttentionBackend


@dataclass(frozen=True)
class LayerGroup:
    """The layers of one KV-cache group, as the metadata builder plans for them."""

    impls: tuple  # the layers' impls of ``impl_cls`` (their features)
    kinds: frozenset  # attention types: the impls', or the one the spec implies
    num_q_heads: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype  # the cache's as the kernels read it (fp8 views)
    max_kv_len: int  # the most keys a request has

    @property
    def causal(self) -> bool:
        """Causal batches: decoder self-attention (non-causal ones only where
        vLLM says so: bidirectional drafting). Cross-attention (over the
        encoder's output) and encoder self-attention are non-causal."""
        return not self.kinds & NON_CAUSAL_ATTN_TYPES

    @property
    def kv_from_step(self) -> bool:
        """Encoder self-attention: no paged cache, the step's own K/V rows."""
        return bool(self.kinds & STEP_KV_ATTN_TYPES)

    @classmethod
    def of(cls, vllm_config, layer_names, kv_cache_spec, impl_cls) -> "LayerGroup":
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import (
            AttentionLayerBase,
        )
        from vllm.v1.attention.backends.utils import (
            get_num_attention_heads_from_layers,
        )
        from vllm.v1.kv_cache_interface import (
            CrossAttentionSpec,
            EncoderOnlyAttentionSpec,
        )

        layers = get_layers_from_vllm_config(
            vllm_config,
            AttentionLayerBase,  # type: ignore[type-abstract]
            layer_names,
        )
        impls = tuple(
            layer.impl
            for layer in layers.values()
            if isinstance(getattr(layer, "impl", None), impl_cls)
        )
        # A group built without its layers in the forward context (vLLM's
        # backend tests) still has its kind in its spec.
        kinds = {impl.attn_type for impl in impls}
        if isinstance(kv_cache_spec, EncoderOnlyAttentionSpec):
            kinds.add(AttentionType.ENCODER_ONLY)
        if isinstance(kv_cache_spec, CrossAttentionSpec):
            kinds.add(AttentionType.ENCODER_DECODER)
        model, cache = vllm_config.model_config, vllm_config.cache_config
        num_q_heads = get_num_attention_heads_from_layers(vllm_config, layer_names)
        if num_q_heads is None:
            num_q_heads = model.get_num_attention_heads(vllm_config.parallel_config)
        # vLLM allocates an fp8 cache as bytes, which the impl views in its format.
        kv_dtype = kv_cache_spec.dtype
        if cache.cache_dtype in FP8_CACHE_DTYPES:
            kv_dtype = fp8_cache_dtype(cache.cache_dtype)
        elif kv_dtype == torch.uint8:  # not a cache these kernels take
            kv_dtype = model.dtype
        # A cross-attention request's keys are the encoder's, which the
        # scheduler's encoder budget bounds.
        max_kv_len = model.max_model_len
        if AttentionType.ENCODER_DECODER in kinds:
            scheduler = vllm_config.scheduler_config
            encoder = getattr(scheduler, "max_num_encoder_input_tokens", 0)
            max_kv_len = max(max_kv_len, encoder)
        return cls(
            impls=impls,
            kinds=frozenset(kinds),
            num_q_heads=num_q_heads,
            q_dtype=model.dtype,
            kv_dtype=kv_dtype,
            max_kv_len=max_kv_len,
        )


def kernels_support_capability(capability: "DeviceCapability | None") -> bool:
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        return True
    if capability is None:
        return False
    return (capability.major, capability.minor) >= MIN_CUDA_CAPABILITY


class TritonUnifiedAttentionBackend(stock_triton.TritonAttentionBackend):
    """TRITON_UNIFIED_ATTN: stock vLLM's Triton backend (upstream's
    unified-attention kernel), which the build keeps unchanged as
    ``triton_unified_attn.py``, under its own name, so a layer it serves says so
    (``layer.backend``, logs). It serves the layers our kernels do not take
    (``TritonAttentionBackend.backend_for_layer``) and can be named itself."""

    @staticmethod
    def get_name() -> str:
        return "TRITON_UNIFIED_ATTN"

    @staticmethod
    def get_builder_cls() -> type["UnifiedAttentionMetadataBuilder"]:
        return UnifiedAttentionMetadataBuilder


class UnifiedAttentionMetadataBuilder(stock_triton.TritonAttentionMetadataBuilder):
    """Stock's metadata builder, which also says at startup which layers it serves."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        log_served_layers("TRITON_UNIFIED_ATTN", layer_names)


def log_served_layers(backend: str, layer_names: list[str]) -> None:
    """The startup summary, one line per backend and group of layers: vLLM makes
    one metadata builder per group of layers that share a backend and cache spec."""
    shown = ", ".join(layer_names[:2]) + (", ..." if len(layer_names) > 2 else "")
    logger.info(
        "%s serves %d attention layer(s) (%s).", backend, len(layer_names), shown
    )


def platform_supports_fp8(device_capability: "DeviceCapability") -> bool:
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        return current_platform.supports_fp8()
    capability = (device_capability.major, device_capability.minor)
    return capability >= MIN_CUDA_FP8_CAPABILITY
