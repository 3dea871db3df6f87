# SPDX-License-Identifier: Apache-2.0
"""Backend checks inside a vLLM site (stock vLLM with the fork's changes).

Run by test_triton_backend.py through tests/site_runner.py, in a subprocess whose
``PYTHONPATH`` is the ``patched_vllm_site`` fixture; vLLM is imported only there.
Kernels run under ``TRITON_INTERPRET=1`` on tiny shapes.
"""

import contextlib
import logging
import os
import sys
from pathlib import Path
from types import SimpleNamespace

# The checkout: the directory that holds the `tests` package this file is in.
REPO = next(p.parent for p in Path(__file__).resolve().parents if p.name == "tests")
OUR_FILE = REPO / "vllm" / "v1" / "attention" / "backends" / "triton_attn.py"
OURS = "vllm.v1.attention.backends.triton_attn"
UNIFIED = "vllm.v1.attention.backends.triton_unified_attn"  # stock's, kept by the build
# Upstream modules that import from triton_attn.py only to recognise the backend in
# use (isinstance / issubclass of the selected backend), so they must see ours.
# Every other upstream importer builds on stock's classes and must import from the
# kept stock module instead (envs_patch/unified_backend.toml).
REFERS_TO_SELECTED_BACKEND = {
    "vllm/v1/spec_decode/llm_base_proposer.py": "isinstance of the draft metadata",
    "vllm/model_executor/models/whisper_causal.py": "issubclass of the selected "
    "backend (ours, or stock's under TRITON_UNIFIED_ATTN), which its block pooling "
    "then subclasses",
}


# Head sizes our kernels take: usual ones and odd ones (8, 24, 72, 100).
ODD_AND_USUAL_HEAD_SIZES = (8, 16, 24, 48, 64, 72, 80, 96, 100, 112, 128, 160, 224, 256)


def _imports_from(tree, module: str) -> list[str]:
    import ast

    return [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == module
        for alias in node.names
    ]


def _upstream_importers(site: Path, module: str) -> dict[str, list[str]]:
    """Every module of the installed release that imports from ``module``, with the
    names it imports (a scan of the whole tree, not a list kept by hand)."""
    import ast

    needle = module.encode()
    found = {}
    for path in sorted((site / "vllm").rglob("*.py")):
        data = path.read_bytes()
        if needle not in data:
            continue
        names = _imports_from(ast.parse(data), module)
        if names:
            found[path.relative_to(site).as_posix()] = names
    return found


# ----------------------------------------------------------------------------------
# Registry, names, alias
# ----------------------------------------------------------------------------------


def check_registry():
    import ast

    import vllm
    from vllm.v1.attention.backends import triton_attn as ours
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = AttentionBackendEnum.TRITON_ATTN.get_class()
    assert cls is ours.TritonAttentionBackend, cls
    assert Path(ours.__file__).read_text() == OUR_FILE.read_text(), (
        f"{ours.__file__} is not this repository's triton_attn.py"
    )
    assert AttentionBackendEnum[cls.get_name()] is AttentionBackendEnum.TRITON_ATTN
    assert ours.__name__ == OURS
    site = Path(vllm.__file__).parent.parent
    importers = _upstream_importers(site, OURS)
    for rel in list(importers):  # the fork's own modules (the overlay)
        if (REPO / rel).is_file():
            importers.pop(rel)
    unknown = sorted(set(importers) - set(REFERS_TO_SELECTED_BACKEND))
    assert not unknown, (
        f"{unknown} import from triton_attn.py: a module built on stock's classes "
        f"must be pointed at {UNIFIED} (envs_patch/unified_backend.toml); one that "
        "only recognises the selected backend goes into REFERS_TO_SELECTED_BACKEND"
    )
    for rel, names in importers.items():
        missing = [name for name in names if not hasattr(ours, name)]
        assert not missing, f"{rel} imports {missing}, which triton_attn.py lacks"
        classes = [
            node
            for node in ast.walk(ast.parse((site / rel).read_text()))
            if isinstance(node, ast.ClassDef)
            and any(isinstance(b, ast.Name) and b.id in names for b in node.bases)
        ]
        assert not classes, f"{rel} subclasses {names}: point it at {UNIFIED}"
    built_on_stock = _upstream_importers(site, UNIFIED)
    assert built_on_stock, "no upstream module is pointed at the kept stock backend"
    return (
        f"refer to ours: {sorted(importers)}; built on stock's: "
        f"{sorted(built_on_stock)}"
    )


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_rocm_alias():
    from vllm.v1.attention.backends import triton_attn as ours
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    alias_path = f"{ours.__name__}.RocmAttentionBackend"
    note = "registry patched by the frame"
    if AttentionBackendEnum.ROCM_ATTN.get_path() != alias_path:
        register_backend(AttentionBackendEnum.ROCM_ATTN, alias_path)
        note = "registry not patched in this site: ROCM_ATTN overridden for the test"
    alias = AttentionBackendEnum.ROCM_ATTN.get_class()
    assert alias is ours.RocmAttentionBackend
    assert issubclass(alias, ours.TritonAttentionBackend)
    # The layer maps the name back to the registry: it must be a valid member.
    assert AttentionBackendEnum[alias.get_name()] is AttentionBackendEnum.TRITON_ATTN

    records = _Records()
    ours.logger.addHandler(records)
    try:
        assert ours.TritonAttentionBackend.get_impl_cls() is ours.TritonAttentionImpl
        assert records.messages == [], "TRITON_ATTN itself must not warn"
        assert alias.get_impl_cls() is ours.TritonAttentionImpl
        assert alias.get_impl_cls() is ours.TritonAttentionImpl
    finally:
        ours.logger.removeHandler(records)
    renamed = [
        m for m in records.messages if "ROCM_ATTN was renamed to TRITON_ATTN" in m
    ]
    assert len(renamed) == 1, records.messages
    return note


# ----------------------------------------------------------------------------------
# Capabilities
# ----------------------------------------------------------------------------------


def _selector_config(**overrides):
    import torch

    from vllm.platforms.interface import DeviceCapability

    config = {
        "head_size": 128,
        "dtype": torch.bfloat16,
        "kv_cache_dtype": "auto",
        "block_size": None,
        "use_mla": False,
        "has_sink": False,
        "use_sparse": False,
        "use_mm_prefix": False,
        "use_per_head_quant_scales": False,
        "device_capability": DeviceCapability(9, 0),
        "attn_type": "decoder",
    }
    config.update(overrides)
    return config


def check_capabilities():
    """Our kernels' refusals (``kernel_refusals``) say what they take; vLLM's
    question (``validate_configuration``) is answered for TRITON_ATTN as a whole:
    a layer our kernels refuse is accepted exactly when stock's Triton backend
    takes it, and refused with both backends' reasons otherwise."""
    import inspect

    import torch

    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B
    from vllm.v1.attention.backends.triton_attn_selection import (
        TritonUnifiedAttentionBackend as Stock,
    )

    accepted = [
        {},
        {"kv_cache_dtype": "fp8"},
        {"kv_cache_dtype": "fp8_e4m3"},
        {"kv_cache_dtype": "fp8_e5m2"},
        {"kv_cache_dtype": "bfloat16"},
        {"dtype": torch.float16, "kv_cache_dtype": "float16"},
        {"has_sliding_window": True, "has_sink": True},
        {"device_capability": DeviceCapability(8, 0)},
        {"use_batch_invariant": True},  # the builder fixes the plan then
        # Non-causal: cross-attention over the cached encoder output (Whisper),
        # bidirectional drafting; the prefill kernel's CAUSAL off.
        {"attn_type": "encoder_decoder"},
        {"attn_type": "encoder_decoder", "kv_cache_dtype": "fp8"},
        {"attn_type": "encoder_only"},
        {"attn_type": "encoder"},
        {"use_non_causal": True, "has_sink": True},
        # A bidirectional window (EmbeddingGemma's encoder-only layers).
        {"attn_type": "encoder_only", "has_sliding_window": True},
        {"attn_type": "encoder", "has_sliding_window": True},
        {"use_non_causal": True, "has_sliding_window": True},
        # The kernels' head sizes: any up to 256 (odd ones padded and masked).
        *({"head_size": h} for h in ODD_AND_USUAL_HEAD_SIZES),
        *({"block_size": b} for b in (16, 32, 64, 128, 256, 48)),
    ]
    for overrides in accepted:
        config = _selector_config(**overrides)
        assert B.kernel_refusals(**config) == [], (overrides, config)
        assert B.validate_configuration(**config) == [], overrides

    refused = [
        ({"head_size": 272}, "head_size 272 not supported (supported: any up to 256"),
        ({"head_size": 320}, "head_size 320 not supported"),
        ({"dtype": torch.float32}, "dtype torch.float32 not supported"),
        ({"kv_cache_dtype": "int8_per_token_head"}, "not supported (supported: auto"),
        ({"kv_cache_dtype": "float16"}, "16-bit cache in the model's dtype"),
        (
            {"kv_cache_dtype": "fp8", "device_capability": DeviceCapability(8, 0)},
            "needs fp8 support",
        ),
        (
            {"kv_cache_dtype": "fp8_e5m2", "device_capability": DeviceCapability(8, 0)},
            "needs fp8 support",
        ),
        ({"device_capability": DeviceCapability(7, 5)}, "compute capability 7.5"),
        ({"block_size": 8}, "block_size 8 not supported"),
        ({"use_mla": True}, "MLA not supported"),
        ({"use_sparse": True}, "sparse not supported"),
        (
            {"attn_type": "encoder_decoder", "has_sliding_window": True},
            "cross-attention with a sliding window not supported",
        ),
        ({"use_kv_connector": True}, "KV connector not supported"),
        ({"use_pcp": True}, "prefill context parallelism not supported"),
        ({"use_mm_prefix": True}, "multimodal prefix-LM"),
        ({"use_per_head_quant_scales": True}, "per-head KV quant scales"),
    ]
    # Questions only some releases ask.
    asked = inspect.signature(AttentionBackend.validate_configuration).parameters
    for flag, expected in (
        ("use_adaptive_verification", "adaptive speculative verification not"),
        ("use_dcp", "decode context parallelism not supported"),
        ("use_rswa", "R-SWA not supported"),
    ):
        if flag in asked:
            refused.append(({flag: True}, expected))
    handed_over, neither = [], []
    for overrides, expected in refused:
        config = _selector_config(**overrides)
        ours = B.kernel_refusals(**config)
        assert any(expected in r for r in ours), (overrides, ours)
        assert not any("TRITON_UNIFIED_ATTN" in r for r in ours), ours
        answer = B.validate_configuration(**config)
        stock = Stock.validate_configuration(**config)
        if not stock:
            assert answer == [], (overrides, answer)
            handed_over.append(overrides)
        else:
            assert any(expected in r for r in answer), (overrides, answer)
            assert any("does not take it either" in r for r in answer), answer
            neither.append(overrides)
    assert handed_over and neither, (handed_over, neither)
    # The vision encoder's automatic choice asks these (it runs stock's ViT kernel).
    assert B.supports_head_size(72) and B.supports_dtype(torch.float32)
    assert B.supports_compute_capability(DeviceCapability(7, 5))
    return (
        f"{len(accepted)} taken by our kernels; of {len(refused)} refused by them, "
        f"{len(handed_over)} accepted for stock's backend, {len(neither)} refused "
        "with both reasons"
    )


@contextlib.contextmanager
def _cuda_platform(capability):
    """The CUDA platform of vLLM at ``capability`` on this CPU machine (the compiled
    extension cuda.py imports is stubbed), as vLLM's current platform inside the
    block."""
    import types

    sys.modules.setdefault(
        "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch")
    )
    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    CudaPlatform.get_device_capability = classmethod(
        lambda cls, device_id=0: DeviceCapability(*capability)
    )
    before = vllm.platforms.__dict__.get("current_platform")
    vllm.platforms.current_platform = CudaPlatform()
    try:
        yield CudaPlatform
    finally:
        if before is None:
            del vllm.platforms.current_platform
        else:
            vllm.platforms.current_platform = before


def check_selection_on_cuda_platform():
    """The CUDA platform of vLLM (SM 9.0) validating a backend named by the user:
    TRITON_ATTN and ROCM_ATTN resolve to our classes and accept every layer that
    our kernels or stock's backend take; a layer neither takes stops with both
    reasons. TRITON_UNIFIED_ATTN is stock's backend under its own name."""
    with _cuda_platform((9, 0)) as cuda:
        return _named_on_cuda(cuda)


def _named_on_cuda(cuda):
    import torch

    from vllm.v1.attention.backends import triton_unified_attn as stock
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
    from vllm.v1.attention.selector import AttentionSelectorConfig

    ours = "vllm.v1.attention.backends.triton_attn."
    good = AttentionSelectorConfig(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype="fp8", block_size=64
    )
    # Named, TRITON_ATTN takes these: ours (e5m2, encoder-only) or handed over
    # (head size 272).
    also_taken = [
        good._replace(kv_cache_dtype="fp8_e5m2"),
        good._replace(attn_type="encoder_only"),
        good._replace(head_size=272),
    ]
    for config in (good, *also_taken):
        assert cuda.get_attn_backend_cls(E.TRITON_ATTN, config) == (
            ours + "TritonAttentionBackend"
        )
        if E.ROCM_ATTN.get_path() == ours + "RocmAttentionBackend":  # frame's patch
            assert cuda.get_attn_backend_cls(E.ROCM_ATTN, config) == (
                ours + "RocmAttentionBackend"
            )
    for config, expected in [(good._replace(use_mla=True), "MLA not supported")]:
        try:
            cuda.get_attn_backend_cls(E.TRITON_ATTN, config)
        except ValueError as e:
            assert "is not valid for this configuration" in str(e), e
            assert expected in str(e) and "does not take it either" in str(e), e
        else:
            raise AssertionError(f"TRITON_ATTN accepted {config}")
    # Stock's backend under its own name takes what ours hands over.
    unified = (
        "vllm.v1.attention.backends.triton_attn_selection.TritonUnifiedAttentionBackend"
    )
    assert E.TRITON_UNIFIED_ATTN.get_path() == unified
    cls = E.TRITON_UNIFIED_ATTN.get_class()
    assert issubclass(cls, stock.TritonAttentionBackend)
    assert cls.get_name() == "TRITON_UNIFIED_ATTN"
    assert E[cls.get_name()] is E.TRITON_UNIFIED_ATTN
    for config in also_taken:
        assert cuda.get_attn_backend_cls(E.TRITON_UNIFIED_ATTN, config) == unified
    # Backends built on stock's classes keep stock's own paths and classes.
    stock_built = [
        name
        for name in ("TRITON_ATTN_DIFFKV", "TRITON_FLASH_ATTN", "TRITON_FLASHINFER")
        if name in E.__members__
    ]
    for name in stock_built:
        assert not E[name].get_path().startswith(ours), E[name].get_path()
    return f"stock's paths kept: {stock_built}"


def check_layers_ours_do_not_take_run_on_stock_backend():
    """The release's own selector (``_cached_get_attn_backend``) on the CUDA
    platform at SM 9.0, a backend named or vLLM's automatic choice: a layer that
    TRITON_ATTN or ROCM_ATTN serves gets our class where our kernels take it and
    stock's backend (TRITON_UNIFIED_ATTN) where only that one does, logged once
    per kind of layer with our reason; the layer's ``backend`` names what serves
    it. FLASH_ATTN is not asked here (this CPU machine has no FlashAttention)."""
    import torch

    from vllm.v1.attention import selector
    from vllm.v1.attention.backends import triton_attn as ours
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
    from vllm.v1.attention.selector import AttentionSelectorConfig

    cached = selector._cached_get_attn_backend
    choose = getattr(cached, "__wrapped__", cached)
    good = AttentionSelectorConfig(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64
    )
    stock_only = [
        good._replace(head_size=272),
        good._replace(attn_type="encoder_decoder", has_sliding_window=True),
        good._replace(kv_cache_dtype="int8_per_token_head"),
        good._replace(dtype=torch.float32, kv_cache_dtype="auto"),
    ]
    from vllm.v1.attention.backends import triton_attn_selection as selection

    records = _Records()
    selection.logger.addHandler(records)
    try:
        with _cuda_platform((9, 0)):
            for named in (E.TRITON_ATTN, E.ROCM_ATTN):
                assert issubclass(choose(named, good), ours.TritonAttentionBackend)
                for config in stock_only:
                    cls = choose(named, config)
                    assert cls is selection.TritonUnifiedAttentionBackend, (config, cls)
                    assert E[cls.get_name()] is E.TRITON_UNIFIED_ATTN
            # A backend named for itself is never handed over.
            unified = choose(E.TRITON_UNIFIED_ATTN, good)
            assert unified is selection.TritonUnifiedAttentionBackend
    finally:
        selection.logger.removeHandler(records)
    logged = [m for m in records.messages if "TRITON_UNIFIED_ATTN." in m]
    assert logged and any("head_size 272 not supported" in m for m in logged), logged
    assert len(logged) == len(set(logged)), "logged more than once per kind"
    return f"{len(stock_only)} kinds of layer served by TRITON_UNIFIED_ATTN"


def check_vision_encoder_and_whisper_choices():
    """Two upstream paths that ask TRITON_ATTN's class without the selector give
    stock's answers: the CUDA platform's automatic vision-encoder choice (it runs
    stock's ViT kernel for TRITON_ATTN, so head 72 or fp32 must not fall to
    TORCH_SDPA), and Whisper's causal block pooling, which wraps our backend and
    stock's one under TRITON_UNIFIED_ATTN alike."""
    import torch

    from vllm.model_executor.models import whisper_causal
    from vllm.v1.attention.backends import triton_attn as ours
    from vllm.v1.attention.backends import triton_unified_attn as stock
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
    from vllm.v1.attention.backends.registry import register_backend
    from vllm.v1.attention.backends.triton_attn_selection import (
        TritonUnifiedAttentionBackend,
    )

    def vit_choices(cuda):
        shapes = ((72, torch.float32), (100, torch.bfloat16), (160, torch.float16))
        return {f"{h}/{d}": cuda.get_vit_attn_backend(h, d).name for h, d in shapes}

    with _cuda_platform((9, 0)) as cuda:
        fork = vit_choices(cuda)
        # Stock's answer: the same question with TRITON_ATTN naming stock's class.
        register_backend(E.TRITON_ATTN, f"{stock.__name__}.TritonAttentionBackend")
        try:
            stock_answer = vit_choices(cuda)
        finally:
            E.TRITON_ATTN.clear_override()
    assert fork == stock_answer, (fork, stock_answer)
    assert "TRITON_ATTN" in fork.values(), fork  # the question reached TRITON_ATTN
    pooled = whisper_causal.create_whisper_attention_backend_with_block_pooling
    for underlying in (ours.TritonAttentionBackend, TritonUnifiedAttentionBackend):
        wrapped = pooled(underlying, 4)
        assert issubclass(wrapped, underlying), wrapped
    return f"vision encoder: {fork}; Whisper block pooling wraps both backends"


def check_layer_options_the_selector_does_not_see():
    """ALiBi-sqrt and chunked attention with lookback (RNJ-1) reach the backend as
    options of vLLM's attention layer, not through the selector: the release's
    layer asks ``backend_for_layer_options`` right after choosing its backend,
    before it checks ALiBi-sqrt support. Ours keeps an ALiBi-sqrt layer (its
    kernels take it; the layer then passes ``use_alibi_sqrt`` to our impl) and
    hands chunk lookback to stock's backend; wrappers other modules build keep
    their class."""
    import inspect

    from vllm.model_executor.layers.attention import attention as layer
    from vllm.v1.attention.backends import triton_attn as ours
    from vllm.v1.attention.backends.triton_attn_selection import (
        TritonUnifiedAttentionBackend,
    )

    source = inspect.getsource(layer.Attention.__init__)
    asked = source.index(".backend_for_layer_options(")
    assert source.index("get_attn_backend(") < asked, "asked before the choice"
    assert asked < source.index(".supports_alibi_sqrt()"), "asked after the check"
    stock = TritonUnifiedAttentionBackend
    wrapped = type("WrappedTritonAttentionBackend", (ours.TritonAttentionBackend,), {})
    lookback = {"chunk_lookback": 2}
    for cls in (ours.TritonAttentionBackend, ours.RocmAttentionBackend):
        assert cls.backend_for_layer_options(**lookback) is stock, cls
        assert cls.supports_alibi_sqrt()
        assert cls.backend_for_layer_options(use_alibi_sqrt=True) is cls, cls
    assert stock.backend_for_layer_options(**lookback) is stock
    assert wrapped.backend_for_layer_options(**lookback) is wrapped
    plain = {"use_alibi_sqrt": False, "chunk_lookback": -1, "sinks": None}
    B = ours.TritonAttentionBackend
    assert B.backend_for_layer_options(**plain) is B
    return "ALiBi-sqrt kept on ours, chunk lookback handed over at layer construction"


def check_layout():
    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B

    assert B.get_name() == "TRITON_ATTN"
    assert B.get_kv_cache_shape(10, 64, 8, 128) == (10, 2, 8, 64, 128)
    assert B.get_kv_cache_shape(10, 16, 8, 128, cache_dtype_str="fp8") == (
        10,
        2,
        8,
        16,
        128,
    )
    assert B.get_kv_cache_stride_order() == (0, 1, 2, 3, 4)
    assert B.get_kv_cache_stride_order(include_num_layers_dimension=True)[0] == 1
    _check_spec_layout()
    # The kernels' rule: any power of two (vLLM picks from SUPPORTED_BLOCK_SIZES).
    assert B.get_kv_cache_shape(10, 8, 8, 128)[3] == 8
    for bad_block in (12, 24):
        try:
            B.get_kv_cache_shape(10, bad_block, 8, 128)
        except ValueError as e:
            assert "block size" in str(e)
        else:
            raise AssertionError(f"block size {bad_block} accepted")
    try:
        B.get_kv_cache_shape(10, 64, 8, 128, cache_dtype_str="int8_per_token_head")
    except ValueError as e:
        assert "kv-cache-dtype" in str(e)
    else:
        raise AssertionError("per-token-head layout accepted")
    assert B.get_preferred_block_size(16) == 64
    assert B.get_supported_kernel_block_sizes() == [16, 32, 64, 128]
    assert not B.forward_includes_kv_cache_update
    assert B.supports_sink() and B.supports_sliding_window()
    assert B.supported_dtypes == [torch.float16, torch.bfloat16]
    assert B.supported_kv_cache_dtypes == [
        "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"
    ]  # fmt: skip
    assert not B.supports_kv_connector() and B.supports_batch_invariance()
    assert B.supports_alibi_sqrt() and B.supports_non_causal()
    assert all(B.supports_attn_type(t) for t in ("encoder_decoder", "encoder_only"))
    assert not B.is_mla() and not B.supports_pcp()


def _check_spec_layout():
    """The cache view vLLM builds from the spec: our spec, layouts and answers to
    the questions the releases ask."""
    from dataclasses import replace

    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheLayout

    for dtype, itemsize in ((torch.bfloat16, 2), (torch.uint8, 1)):  # uint8: fp8
        spec = FullAttentionSpec(
            block_size=64, num_kv_heads=8, head_size=128, dtype=dtype
        )
        ours = B.customize_spec(spec)
        assert ours.num_head_slots == 16 and ours.state_content_bytes == 128 * itemsize
        assert ours.page_size_bytes == spec.page_size_bytes  # same memory plan
        assert B.customize_spec(ours) == ours  # idempotent
        assert B.get_supported_kernel_block_sizes(ours) == [16, 32, 64, 128]
    diff_kv = replace(spec, head_size_v=64)
    assert B.customize_spec(diff_kv) == diff_kv
    assert B.supported_kv_cache_layouts() == (KVCacheLayout.LBHNC, KVCacheLayout.BLHNC)
    assert B.supports_device_cpu_query_lens_mismatch() is False
    assert B.supports_dcp() is False


def check_upstream_modules_on_stock_backend():
    """Upstream modules built on stock's classes run on stock's backend, kept
    unchanged as triton_unified_attn.py: TRITON_ATTN_DIFFKV, the composites
    TRITON_FLASH_ATTN / TRITON_FLASHINFER, and (0.34+) DASH attention, whose cache
    view and metadata builder are checked through the release's own code."""
    import importlib

    import torch

    from vllm.v1.attention.backends import triton_attn as ours
    from vllm.v1.attention.backends import triton_unified_attn as stock

    assert stock.TritonAttentionBackend is not ours.TritonAttentionBackend
    assert not issubclass(stock.TritonAttentionBackend, ours.TritonAttentionBackend)
    assert hasattr(stock, "TritonAttentionImpl") and not hasattr(
        stock, "paged_attention"
    )
    from vllm.v1.attention.backends import triton_attn_diffkv as diffkv

    assert issubclass(diffkv.TritonAttentionDiffKVBackend, stock.TritonAttentionBackend)
    assert issubclass(diffkv.TritonAttentionDiffKVImpl, stock.TritonAttentionImpl)
    seen = ["TRITON_ATTN_DIFFKV"]
    for module, name in (
        ("triton_flash_attn", "TritonFlashAttentionBackend"),
        ("triton_flashinfer", "TritonFlashInferBackend"),
    ):
        try:
            composite = getattr(
                importlib.import_module(f"vllm.v1.attention.backends.{module}"), name
            )
        except ImportError:  # not in this release
            continue
        parts = [
            value
            for value in vars(composite).values()
            if isinstance(value, type)
            and issubclass(value, stock.TritonAttentionBackend)
        ]
        assert parts or issubclass(composite, stock.TritonAttentionBackend), (
            f"{name} holds no stock TRITON_ATTN component: {vars(composite)}"
        )
        assert not any(
            isinstance(v, type) and issubclass(v, ours.TritonAttentionBackend)
            for v in vars(composite).values()
        ), name
        seen.append(composite.get_name())
    try:
        from vllm.model_executor.layers import dash_attention as dash
    except ImportError:
        return f"on stock's backend: {seen} (no DASH attention in this release)"
    seen.append("DASH")
    assert issubclass(dash.DASHAttentionBackend, stock.TritonAttentionBackend)
    assert not issubclass(dash.DASHAttentionBackend, ours.TritonAttentionBackend)
    # The cache view vLLM builds for DASH is stock TRITON_ATTN's, not ours.
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    spec = FullAttentionSpec(
        block_size=64, num_kv_heads=NUM_KV_HEADS + 1, head_size=64, dtype=torch.bfloat16
    )
    dash_spec = customize_attention_spec(dash.DASHAttentionBackend, spec)
    assert dash_spec == customize_attention_spec(stock.TritonAttentionBackend, spec)
    assert dash_spec != customize_attention_spec(ours.TritonAttentionBackend, spec)
    # Its builder is stock's: metadata with the R-SWA prefix lengths DASH reads.
    from vllm.config import CUDAGraphMode

    config = _fake_vllm_config()
    config.model_config.rswa_window = None
    config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    builder = dash.DASHAttentionMetadataBuilder(
        dash_spec, ["layers.0.attn"], config, torch.device("cpu")
    )
    block_table = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    cm = _common_metadata([1, 4], [70, 4], block_table, torch.arange(5), 5)
    if hasattr(cm, "seq_lens_cpu_upper_bound"):
        cm.seq_lens_cpu_upper_bound = cm.seq_lens.clone()
    md = builder.build(0, cm)
    assert isinstance(md, dash.DASHAttentionMetadata)
    assert isinstance(md, stock.TritonAttentionMetadata)
    assert hasattr(md, "rswa_prefix_lens") and md.requests == (
        (0, 0, 1, 70),
        (1, 1, 5, 4),
    )
    return f"on stock's backend: {seen}"


def check_impl_refusals():
    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    bad_impls = [
        ({"attn_type": "encoder_mystery"}, "supported: decoder, encoder_decoder"),
        (
            {"attn_type": "encoder_decoder", "sliding_window": 64},
            "cross-attention without a sliding window",
        ),
        (
            {"attn_type": "encoder_only", "alibi_slopes": [0.5] * 8},
            "(non-causal) without ALiBi",
        ),
        ({"head_size": 272}, "head size 272"),
        ({"kv_cache_dtype": "int8_per_token_head"}, "int8_per_token_head"),
        ({"chunk_lookback": 2}, "chunk_lookback"),
        ({"sinks": torch.zeros(3)}, "sinks must have one value per query head"),
    ]
    for kwargs, expected in bad_impls:
        args = {"num_heads": 8, "head_size": 128, "scale": 0.1, "num_kv_heads": 2}
        args.update(kwargs)
        try:
            TritonAttentionImpl(**args)
        except (NotImplementedError, ValueError) as e:
            assert expected in str(e), (kwargs, e)
        else:
            raise AssertionError(f"TritonAttentionImpl accepted {kwargs}")
    TritonAttentionImpl(num_heads=8, head_size=128, scale=0.1, chunk_lookback=-1)


class _BatchInvariant:
    """VLLM_BATCH_INVARIANT=1 inside the block (vLLM's env cache cleared on the
    way in and out)."""

    def __enter__(self):
        import vllm.envs as envs

        self.before = os.environ.get("VLLM_BATCH_INVARIANT")
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
        assert envs.VLLM_BATCH_INVARIANT

    def __exit__(self, *exc):
        import vllm.envs as envs

        if self.before is None:
            os.environ.pop("VLLM_BATCH_INVARIANT")
        else:
            os.environ["VLLM_BATCH_INVARIANT"] = self.before
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
        assert not envs.VLLM_BATCH_INVARIANT


def check_batch_invariance():
    """VLLM_BATCH_INVARIANT=1 runs on our kernels: a request's output is
    bit-identical alone and inside batches of other sizes, for a decode and for a
    chunked prefill over a long context. Without it the same batches plan
    different split counts for the request (what would change its bits)."""
    import torch

    from vllm.v1.attention.backends.triton_attn import (
        TritonAttentionBackend,
        TritonAttentionImpl,
        TritonAttentionMetadataBuilder,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    assert TritonAttentionBackend.supports_batch_invariance()
    config = _selector_config(use_batch_invariant=True)
    assert TritonAttentionBackend.kernel_refusals(**config) == [], config

    block_size, head_size, num_blocks = 64, 64, 300
    gen = torch.Generator().manual_seed(7)
    kv_cache = torch.randn(
        (num_blocks, 2, NUM_KV_HEADS, block_size, head_size), generator=gen
    ).to(torch.bfloat16)
    target_pages = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    impl = TritonAttentionImpl(
        num_heads=NUM_Q_HEADS, head_size=head_size, scale=0.125,
        num_kv_heads=NUM_KV_HEADS,
    )  # fmt: skip
    layer = _FakeAttentionLayer(impl)

    def builder():
        vllm_config = _fake_vllm_config(max_num_seqs=64, max_num_batched_tokens=8192)
        vllm_config.model_config.max_model_len = 8192
        vllm_config.compilation_config.static_forward_context = {"layers.0.attn": layer}
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=NUM_KV_HEADS, head_size=head_size,
            dtype=torch.bfloat16,
        )  # fmt: skip
        return TritonAttentionMetadataBuilder(
            spec, ["layers.0.attn"], vllm_config, torch.device("cpu")
        )

    def target_rows(builder, target, decodes, prefills):
        """The output rows of request ``target`` (query_len, seq_len) in a batch
        with ``decodes`` (their seq_lens) and ``prefills`` ((query_len, seq_len)),
        decodes first; the target has the same query and pages in every batch."""
        if target[0] == 1:
            requests, index = [target, *((1, s) for s in decodes), *prefills], 0
        else:
            requests = [*((1, s) for s in decodes), target, *prefills]
            index = len(decodes)
        q_lens = [q for q, _ in requests]
        s_lens = [s for _, s in requests]
        width = max(-(-s // block_size) for s in s_lens)
        table = torch.randint(0, num_blocks, (len(requests), width), generator=gen)
        table = table.to(torch.int32)
        need = -(-target[1] // block_size)
        table[index, :need] = target_pages[:need]
        queries = [
            torch.randn((q, NUM_Q_HEADS, head_size), generator=gen) for q in q_lens
        ]
        queries[index] = torch.randn(
            (target[0], NUM_Q_HEADS, head_size),
            generator=torch.Generator().manual_seed(target[1]),
        )
        query = torch.cat(queries).to(torch.bfloat16)
        cm = _common_metadata(
            q_lens, s_lens, table, torch.arange(len(query)), len(query)
        )
        md = builder.build(0, cm)
        out = torch.full_like(query, float("nan"))
        impl.forward(layer, query, None, None, kv_cache, md, out)
        start = sum(q_lens[:index])
        rows = out[start : start + target[0]]
        assert not rows.isnan().any(), (target, decodes, prefills)
        splits = (
            md.decode_num_splits
            if target[0] == 1
            else next(iter(md.prefill_plans.values())).num_splits
        )
        return rows, splits

    batches = [
        ([], []),  # alone
        ([100, 200, 300], [(20, 500)]),
        # Many decodes, and enough short prefills to fill the SMs: no split.
        ([150] * 40, [(2, 100)] * 70),
    ]
    targets = [(1, 1500), (16, 4200)]
    free = builder()
    assert not free.batch_invariant
    for target in targets:
        splits = {target_rows(free, target, *b)[1] for b in batches}
        assert len(splits) > 1, (target, splits)  # the batch changes the plan
    with _BatchInvariant():
        fixed = builder()
        assert fixed.batch_invariant
        for target in targets:
            runs = [target_rows(fixed, target, *b) for b in batches]
            assert {splits for _, splits in runs} == {1}, (target, runs)
            for rows, _ in runs[1:]:
                assert torch.equal(rows, runs[0][0]), target
    return "a decode and a chunked prefill: bit-identical in 3 batches each"


def check_features_reaching_our_classes_are_refused():
    """What vLLM's selector hands over can still reach our classes when a model
    passes TRITON_ATTN's class explicitly: each feature our kernels do not
    implement is refused, never ignored (R-SWA, multimodal prefix-LM ranges,
    per-request causal flags, non-causal batches of ALiBi layers; the impl's
    own refusals are check_impl_refusals)."""
    import dataclasses

    import torch

    from vllm.v1.attention.backends import triton_attn as ours

    refused = []

    def expect_refusal(what, make):
        try:
            make()
        except NotImplementedError as e:
            assert "TRITON_UNIFIED_ATTN" in str(e), e
            refused.append(what)
        else:
            raise AssertionError(f"{what} was accepted")

    original = _fake_vllm_config

    def with_rswa(*args, **kwargs):
        config = original(*args, **kwargs)
        config.model_config.rswa_window = 128
        return config

    globals()["_fake_vllm_config"] = with_rswa
    try:
        expect_refusal("R-SWA", lambda: _builder(64, 128, torch.bfloat16))
    finally:
        globals()["_fake_vllm_config"] = original
    builder = _builder(64, 128, torch.bfloat16)
    builder._warm_up_enabled = False
    block_table = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    cm = _common_metadata([1, 4], [70, 4], block_table, torch.arange(5), 5)
    fields = {f.name for f in dataclasses.fields(cm)}
    if "mm_req_doc_ranges" in fields:
        prefix_lm = dataclasses.replace(cm, mm_req_doc_ranges={1: [(0, 3)]})
        expect_refusal("prefix-LM ranges", lambda: builder.build(0, prefix_lm))
    # One causal flag per request (a tensor): the kernels take one per batch.
    per_request = dataclasses.replace(cm, causal=torch.tensor([1, 0]))
    expect_refusal("per-request causal flags", lambda: builder.build(0, per_request))

    # A non-causal batch of ALiBi layers (a causal distance); one of windowed
    # layers is taken (the window becomes two-sided).
    def group_builder(**feature):
        layers = {
            "layers.0.attn": _FakeAttentionLayer(
                ours.TritonAttentionImpl(
                    num_heads=NUM_Q_HEADS, head_size=128, scale=0.1,
                    num_kv_heads=NUM_KV_HEADS, **feature,
                )
            )
        }  # fmt: skip
        config = _fake_vllm_config()
        config.compilation_config.static_forward_context = layers
        made = ours.TritonAttentionMetadataBuilder(
            builder.kv_cache_spec, list(layers), config, torch.device("cpu")
        )
        made._warm_up_enabled = False
        return made

    non_causal = dataclasses.replace(cm, causal=False)
    with_alibi = group_builder(alibi_slopes=[0.5] * NUM_Q_HEADS)
    expect_refusal("non-causal ALiBi", lambda: with_alibi.build(0, non_causal))
    assert with_alibi.build(0, cm).causal is True
    assert group_builder(sliding_window=64).build(0, non_causal).causal is False
    assert builder.build(0, non_causal).causal is False
    return f"refused: {refused}"


def _runner_caches_from_spec(spec, padded, num_blocks, num_layers=2):
    """Releases that build views from the spec: vLLM's own placement and view
    code (compute_layout_strides, create_kv_cache_views) over one buffer of
    ``num_layers`` layers, for every layout the backend declares, with a dense
    and a padded page; the last layer's view of each."""
    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B
    from vllm.v1.kv_cache_interface import (
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )
    from vllm.v1.worker.utils import customize_attention_spec

    caches = []
    for layout in B.supported_kv_cache_layouts():
        for s in (spec, padded):
            s = customize_attention_spec(B, s)
            page = s.page_size_bytes
            block_stride = page * num_layers if layout.is_block_outermost else None
            layer_stride, block_stride, *_ = compute_layout_strides(
                s,
                num_blocks,
                num_layers,
                layout,
                fixed_strides=(None, block_stride, None, None, None),
            )
            tensor = KVCacheTensor(
                size=page * num_layers * num_blocks,
                layers=[f"layer.{i}" for i in range(num_layers)],
                layer_stride=layer_stride,
                block_stride=block_stride,
            )
            raw = torch.zeros(tensor.size, dtype=torch.int8)
            view = create_kv_cache_views(raw, s, num_blocks, layout, tensor)[-1]
            expected = (num_blocks, 2 * NUM_KV_HEADS, s.block_size, s.head_size)
            assert tuple(view.shape) == expected, (layout, view.shape)
            caches.append(view)
    return caches


def check_kv_cache_in_model_runner():
    """The cache views vLLM's model runner builds for this backend (by the
    release's own code) are the layout the kernels read: each K and V page of a
    head is a dense ``[block_size, head_size]`` slice, and a padded page (mixed
    page sizes) or another declared layout only changes strides: the same step on
    every such cache gives the same output."""
    from dataclasses import replace

    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    num_blocks, block_size, head_size = 6, 16, 64
    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=NUM_KV_HEADS,
        head_size=head_size,
        dtype=torch.bfloat16,
    )
    padded = replace(spec, page_size_padded=spec.page_size_bytes + 512)
    caches = _runner_caches_from_spec(spec, padded, num_blocks)

    gen = torch.Generator().manual_seed(1)
    impl = TritonAttentionImpl(
        num_heads=NUM_Q_HEADS, head_size=head_size, scale=0.125, num_kv_heads=2
    )
    for kv in caches:
        key_cache, value_cache = impl._cache_views(kv)
        assert key_cache.shape == (num_blocks, NUM_KV_HEADS, block_size, head_size)
        pages = [c[b, h] for c in (key_cache, value_cache) for b, h in [(0, 0), (5, 1)]]
        assert all(p.is_contiguous() for p in pages), [p.stride() for p in pages]
        starts = {p.data_ptr() for p in pages}
        assert len(starts) == len(pages), "K and V pages overlap"
    layer = SimpleNamespace(_k_scale=torch.tensor(1.0), _v_scale=torch.tensor(1.0))
    # Request 0: decode at position 20 (pages 3, 1); request 1: 3-token prefill
    # (page 4).
    block_table = torch.tensor([[3, 1], [4, 0]], dtype=torch.int32)
    slots = [3 * 16 + p for p in range(16)] + [16 + p for p in range(5)]
    slots += [4 * 16 + p for p in range(3)]
    kv_new = torch.randn((2, len(slots), NUM_KV_HEADS, head_size), generator=gen)
    query = torch.randn((4, NUM_Q_HEADS, head_size), generator=gen).bfloat16()
    cm = _common_metadata(
        [1, 3], [21, 3], block_table, torch.tensor(slots[-4:]), num_tokens=4
    )
    md = _builder(block_size, head_size, torch.bfloat16).build(0, cm)
    outputs = []
    for kv in caches:
        impl.do_kv_cache_update(
            layer,
            kv_new[0].bfloat16(),
            kv_new[1].bfloat16(),
            kv,
            torch.tensor(slots, dtype=torch.int64),
        )
        out = torch.full_like(query, float("nan"))
        impl.forward(layer, query, None, None, kv, md, out)
        outputs.append(out)
    assert torch.isfinite(outputs[0]).all()
    assert torch.equal(outputs[0], outputs[1]), (outputs[0] - outputs[1]).abs().max()


# ----------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------

NUM_Q_HEADS, NUM_KV_HEADS = 4, 2


def check_warm_up_registry():
    """The JIT warm-up registry of vLLM: the builder's warm-up is registered there
    (once per builder and stride) and runs when the registry does."""
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    from vllm.v1.attention.backends import triton_attn_warmup as warmup

    calls = []

    class Builder:  # hashable, as the real builder is
        _warmed: set = set()
        causal = True

    builder = Builder()
    registry = JitWarmupRegistry(vllm_config=None)
    real = warmup.warm_up
    warmup.warm_up = lambda builder, stride: calls.append(stride)
    try:
        with registry.activate():
            warmup.register_jit_warm_up(builder, 64)
            warmup.register_jit_warm_up(builder, 64)  # deduplicated
        assert calls == [], "the warm-up ran before the registry's turn"
        assert builder._warmed == {(warmup.stride_class(64), True)}
        registry.warmup()
    finally:
        warmup.warm_up = real
    assert calls == [64], calls
    return "warm-up registered with vLLM's JIT warm-up registry"


def _fake_vllm_config(max_num_seqs=16, max_num_batched_tokens=256):
    """The parts of VllmConfig the builder reads (VllmConfig() itself needs the
    engine's optional dependencies, absent from the CPU test environment)."""
    import torch

    return SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        ),
        model_config=SimpleNamespace(
            get_num_attention_heads=lambda _: NUM_Q_HEADS,
            max_model_len=4096,
            dtype=torch.bfloat16,
        ),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        compilation_config=SimpleNamespace(static_forward_context={}),
        cache_config=SimpleNamespace(cache_dtype="auto"),
        speculative_config=None,
    )


def _builder(block_size, head_size, kv_dtype, max_num_seqs=16, max_tokens=256):
    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=NUM_KV_HEADS,
        head_size=head_size,
        dtype=kv_dtype,
    )
    return TritonAttentionMetadataBuilder(
        spec,
        ["layers.0.attn"],
        _fake_vllm_config(max_num_seqs, max_tokens),
        torch.device("cpu"),
    )


def _common_metadata(query_lens, seq_lens, block_table, slot_mapping, num_tokens):
    import torch

    from vllm.v1.attention.backend import CommonAttentionMetadata

    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    qsl = torch.tensor(starts, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(),
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=len(query_lens),
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
    )


def check_builder():
    import torch

    from vllm.attention.ops.hardware import H200_NUM_SMS
    from vllm.attention.ops.triton_paged_decode_attention_2d import choose_decode_splits
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.attention.backends.triton_attn import (
        DECODE_QUERY_LEN,
        TritonAttentionMetadataBuilder,
    )

    assert DECODE_QUERY_LEN == 1
    builder = _builder(64, 128, torch.bfloat16)
    assert builder.reorder_batch_threshold == DECODE_QUERY_LEN
    support = TritonAttentionMetadataBuilder.get_cudagraph_support(None, None)
    assert support == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    # (query_lens, seq_lens, expected num_decodes, expected num_decode_tokens)
    cases = {
        "decode-only": ([1, 1, 1], [7, 70, 700], 3, 3),
        "mixed": ([1, 1, 5, 1, 300], [9, 10, 40, 5, 300], 2, 2),
        "prefill-only": ([4, 17], [4, 30], 0, 0),
        "padded decode (CUDA graph)": ([1, 1, 0, 0], [5, 9, 0, 0], 4, 4),
        "spec-decode verify": ([3, 3], [20, 30], 0, 0),
    }
    for name, (q_lens, s_lens, want_decodes, want_tokens) in cases.items():
        num_tokens = sum(q_lens)
        cm = _common_metadata(
            q_lens,
            s_lens,
            torch.zeros((len(q_lens), 16), dtype=torch.int32),
            torch.arange(num_tokens, dtype=torch.int64),
            num_tokens,
        )
        md = builder.build(0, cm)
        assert (md.num_decodes, md.num_decode_tokens) == (want_decodes, want_tokens), (
            name,
            md.num_decodes,
            md.num_decode_tokens,
        )
        assert md.num_prefills == len(q_lens) - want_decodes
        assert md.max_query_len == max(q_lens) and md.num_reqs == len(q_lens)
        assert md.seq_lens is cm.seq_lens and md.block_table is cm.block_table_tensor
        splits = choose_decode_splits(
            num_seqs=max(want_decodes, 1),
            num_kv_heads=NUM_KV_HEADS,
            num_sms=H200_NUM_SMS,  # what a CPU run stands in for
        )
        want_splits = splits if want_decodes else 1
        assert md.decode_num_splits == want_splits, (name, md.decode_num_splits)
        if want_splits > 1:
            ws = md.decode_workspace
            assert ws is not None and ws.shape[0] >= want_decodes
            assert ws.shape[1:] == (NUM_Q_HEADS, want_splits, 128 + 1), ws.shape
        # The same plan again reuses the same workspace (allocated once).
        assert builder.build(0, cm).decode_workspace is md.decode_workspace

    # The prefill part's split-KV bound: vLLM's host upper bound of the prefill
    # rows when the model runner gives one, else the batch's max_seq_len.
    q_lens, s_lens = [1, 1, 5, 300], [9000, 10, 40, 300]
    cm = _common_metadata(
        q_lens,
        s_lens,
        torch.zeros((4, 16), dtype=torch.int32),
        torch.arange(sum(q_lens), dtype=torch.int64),
        sum(q_lens),
    )
    assert builder.build(0, cm).prefill_max_seq_len == 9000
    cm.seq_lens_cpu_upper_bound = torch.tensor(s_lens, dtype=torch.int32)
    md = builder.build(0, cm)
    assert md.prefill_max_seq_len == 300, md.prefill_max_seq_len
    assert md.dispatch_args["prefill_max_seq_len"] == 300

    # Every decode batch size up to max_num_seqs has a large enough workspace.
    for num_decodes in range(1, builder.decode_planner.max_num_seqs + 1):
        splits, ws, config = builder.decode_planner.plan(num_decodes)
        assert (splits == 1) == (ws is None), num_decodes
        assert ws is None or ws.shape[0] >= num_decodes
        assert config == builder.decode_planner.configs[splits > 1]

    # A non-causal batch (bidirectional drafting) is planned as such: the
    # dispatch gets the flag, which the prefill kernel takes.
    noncausal = _common_metadata(
        [1, 3], [3, 9], torch.zeros((2, 4), dtype=torch.int32), torch.zeros(4).long(), 4
    ).replace(causal=False)
    md = builder.build(0, noncausal)
    assert md.causal is False and md.dispatch_args["causal"] is False
    assert md.num_decodes == 1


def check_prefill_planned_once_per_batch():
    """The builder plans the prefill launch of each kind of layer once per batch
    (kernel, tiles, split count, a view of its one workspace buffer); a layer's
    forward finds its plan by its tensors and launches it, planning nothing."""
    import torch

    from vllm.attention.ops import prefix_prefill
    from vllm.attention.ops.prefix_prefill import PrefillLayer
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    layers = {
        f"layers.{i}.attn": _FakeAttentionLayer(
            TritonAttentionImpl(
                num_heads=NUM_Q_HEADS, head_size=128, scale=0.125,
                num_kv_heads=NUM_KV_HEADS, sliding_window=window,
            )
        )
        for i, window in enumerate((None, 3000, None))
    }  # fmt: skip
    config = _fake_vllm_config()
    config.model_config.max_model_len = 32768
    config.compilation_config.static_forward_context = layers
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=64, num_kv_heads=NUM_KV_HEADS, head_size=128, dtype=torch.bfloat16
    )
    builder = TritonAttentionMetadataBuilder(
        spec, list(layers), config, torch.device("cpu")
    )
    kinds = builder.prefill_planner.layers
    assert len(kinds) == 2, kinds  # plain, window
    # Two decodes, then a 2k chunk over 30k: few programs, long keys.
    q_lens, s_lens = [1, 1, 2048], [50, 60, 30000]
    block_table = torch.zeros((3, 512), dtype=torch.int32)
    cm = _common_metadata(q_lens, s_lens, block_table, torch.arange(2050), sum(q_lens))
    planned = []
    real_plan = prefix_prefill.plan_prefill
    prefix_prefill.plan_prefill = lambda **kw: planned.append(kw) or real_plan(**kw)
    try:
        md = builder.build(0, cm)
    finally:
        prefix_prefill.plan_prefill = real_plan
    assert len(planned) == 2 and len(md.prefill_plans) == 2, md.prefill_plans
    by_window = {layer.sliding_window: plan for layer, plan in md.prefill_plans.items()}
    whole, windowed = by_window[None], by_window[3000]
    assert (whole.seq_start, whole.num_seqs) == (2, 1)
    # The window bounds the keys a program sees: the full layer splits, the
    # windowed one (3000 + 128 < 2 * 2048 keys) does not.
    assert whole.num_splits > 1 and windowed.num_splits == 1, (whole, windowed)
    assert whole.workspace.data_ptr() == builder.prefill_planner.workspace.data_ptr()
    # forward: each layer finds its own plan by its tensors.
    kv_cache = torch.zeros((4, 2, NUM_KV_HEADS, 64, 128), dtype=torch.bfloat16)
    query = torch.zeros((2050, NUM_Q_HEADS, 128), dtype=torch.bfloat16)
    # (The dispatch's launches are recorders; it may plan nothing itself.)
    from vllm.attention.ops import paged_attention as dispatch

    received = []
    real = {
        n: getattr(dispatch, n)
        for n in ("launch_prefix_prefill", "launch_paged_decode", "plan_prefill")
    }
    dispatch.launch_prefix_prefill = lambda plan, inputs, **kw: received.append(plan)
    dispatch.launch_paged_decode = lambda inputs, **kw: None
    dispatch.plan_prefill = None  # a call would fail: the builder planned them
    try:
        for layer in layers.values():
            layer.impl.forward(
                layer, query, None, None, kv_cache, md, torch.empty_like(query)
            )
    finally:
        for name, value in real.items():
            setattr(dispatch, name, value)
    assert received == [whole, windowed, whole], received
    key_cache = kv_cache[:, 0]
    assert PrefillLayer.of(query=query, key_cache=key_cache) in md.prefill_plans
    # A decode-only batch plans no prefill.
    decode_only = _common_metadata(
        [1, 1], [50, 60], block_table[:2], torch.arange(2), 2
    )
    assert builder.build(0, decode_only).prefill_plans == {}
    return "one plan per kind of layer and batch; forward launches it"


def check_warm_up():
    """The warm-up plan covers every split count and prefill bucket, and its
    batches run through the real kernels (here on the CPU)."""
    import torch

    from vllm.v1.attention.backends import triton_attn_warmup as warmup
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    # 64 requests: split counts 64, 32, 16, 8 and 4 with 2 KV heads on 132 SMs.
    builder = _builder(16, 64, torch.bfloat16, max_num_seqs=64)
    plan = warmup.warm_up_plan(builder, block_table_stride=64)
    decodes = [b for b in plan if b.max_query_len is None]
    split_counts = {builder.decode_planner.plan(len(b.query_lens))[0] for b in decodes}
    assert split_counts == set(builder.decode_planner.splits_for_batch[1:]), (
        split_counts
    )
    assert len(decodes) == len(split_counts) > 1, decodes
    prefills = [b for b in plan if b.max_query_len is not None and not b.max_seq_len]
    # max_num_batched_tokens 256 -> buckets 16, 64, 256, one batch each: the
    # number of decodes in front (prefill's seq_start) selects no variant, as the
    # ints that change per step are not specialised by the prefill and merge.
    assert [b.max_query_len for b in prefills] == [16, 64, 256], prefills
    assert all(b.query_lens == [2] for b in prefills), prefills
    from vllm.attention.ops import prefix_prefill
    from vllm.attention.ops.triton_attention_common import merge_splits_kernel

    for kernel in (prefix_prefill._prefix_prefill_kernel, merge_splits_kernel):
        if hasattr(kernel, "params"):  # a JIT function
            unspecialised = {p.name for p in kernel.params if p.do_not_specialize}
        else:  # the interpreter's wrapper keeps the decorator's arguments
            unspecialised = set(kernel.kwargs["do_not_specialize"])
        assert {"seq_start", "num_seqs", "num_splits"} <= unspecialised, kernel
    # Split-KV prefill: one batch per bucket, its shortest query over
    # max_model_len (4096) keys; the first is launched below.
    splits = [b for b in plan if b.max_seq_len]
    assert [(b.max_query_len, b.max_seq_len) for b in splits] == [
        (2, 4096), (17, 4096), (65, 4096)
    ], splits  # fmt: skip
    split = splits[0]

    impl = TritonAttentionImpl(
        num_heads=NUM_Q_HEADS, head_size=64, scale=0.125, num_kv_heads=NUM_KV_HEADS
    )
    layer = SimpleNamespace(
        impl=impl, _k_scale=torch.tensor(1.0), _v_scale=torch.tensor(1.0)
    )
    mixed = warmup.WarmUpBatch("mixed", [1, 1, 1, 2], max_query_len=16)
    for batch in (decodes[0], mixed):  # 1 decode; 3 decodes + a prefill
        for layout in ("qkv_view", "contiguous"):
            warmup.run_warm_up_batch(builder, layer, batch, 64, layout)
    kernels, real = [], prefix_prefill._launches

    def spy(plan, inputs):
        launches = real(plan, inputs)
        kernels.extend((k, kwargs.get("SPLIT_KV")) for k, _, kwargs in launches)
        return launches

    prefix_prefill._launches = spy
    try:
        warmup.run_warm_up_batch(builder, layer, split, 64, "contiguous")
    finally:
        prefix_prefill._launches = real
    assert kernels == [
        (prefix_prefill._prefix_prefill_kernel, True),  # the split variant
        (merge_splits_kernel, None),
    ], kernels

    # warm_up() over a group of three layers with two kernel variants (plain,
    # sliding window): each variant once, and never twice per process.

    layers = {
        f"layers.{i}.attn": _FakeAttentionLayer(
            TritonAttentionImpl(
                num_heads=NUM_Q_HEADS,
                head_size=64,
                scale=0.125,
                num_kv_heads=NUM_KV_HEADS,
                sliding_window=window,
            )
        )
        for i, window in enumerate((None, 8, None))
    }
    builder = _builder(16, 64, torch.bfloat16)
    # The plan was checked above; one batch keeps the interpreter run short.
    real_plan = warmup.warm_up_plan
    warmup.warm_up_plan = lambda builder, stride: plan[:1]
    builder.vllm_config.compilation_config.static_forward_context = layers
    builder.layer_names = list(layers)
    before = len(warmup.WARMED_UP)
    records = _Records()
    level = warmup.logger.level
    warmup.logger.setLevel(logging.INFO)
    warmup.logger.addHandler(records)
    try:
        warmup.warm_up(builder, 64)
        assert len(warmup.WARMED_UP) == before + 2, warmup.WARMED_UP
        warmup.warm_up(builder, 64)
        assert len(warmup.WARMED_UP) == before + 2
    finally:
        warmup.warm_up_plan = real_plan
        warmup.logger.removeHandler(records)
        warmup.logger.setLevel(level)
    assert not [m for m in records.messages if "failed" in m], records.messages
    assert any("4 batches (2 kernel variants" in m for m in records.messages), (
        records.messages
    )
    return f"{len(decodes)} decode and {len(prefills)} prefill batches"


def _fake_attention_layer_class():
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class FakeAttentionLayer(AttentionLayerBase):
        """What the warm-up reads of vLLM's Attention layer: impl and scales."""

        def __init__(self, impl):
            import torch

            self.impl = impl
            self._k_scale = torch.tensor(1.0)
            self._v_scale = torch.tensor(1.0)

        def get_attn_backend(self):
            raise NotImplementedError

        def get_kv_cache_spec(self, vllm_config):
            raise NotImplementedError

    return FakeAttentionLayer


def _FakeAttentionLayer(impl):  # noqa: N802 - reads as a class at call sites
    return _fake_attention_layer_class()(impl)


# ----------------------------------------------------------------------------------
# Forward against the reference
# ----------------------------------------------------------------------------------


def _run_step(
    *,
    seqs,
    q_dtype,
    cache_dtype_str,
    head_size=64,
    block_size=16,
    pad_tokens=1,
    pad_reqs=0,
    sliding_window=None,
    logits_soft_cap=None,
    with_sinks=False,
    with_alibi=False,
    alibi_sqrt=False,
    seed=0,
    uncommitted=0,
):
    """One vLLM step through the backend; returns (output, reference, metadata).

    ``uncommitted``: that many blocks after the ones the batch uses stand for the
    part of an extensible KV cache that is reserved but not yet backed by memory
    (vLLM 0.34+): they hold NaN, the block-table entries past each request's pages
    name them, and the step must neither read them (the output stays finite and
    right) nor write them.

    ``seqs`` are ``(query_len, context_len)`` pairs in batch order. Earlier steps'
    K/V are written with do_kv_cache_update (one call for all contexts), then this
    step's K/V, then forward(). The reference fills its own cache by plain
    indexing from the same K/V and runs ref_paged_attention on it, so a wrong cache
    write shows up as well as a wrong attention.
    """
    import torch

    from vllm.attention.ops.reference import ref_paged_attention
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    gen = torch.Generator().manual_seed(seed)
    fp8 = cache_dtype_str.startswith("fp8")
    fp8_dtype = (
        torch.float8_e5m2 if cache_dtype_str == "fp8_e5m2" else torch.float8_e4m3fn
    )
    scale = head_size**-0.5
    seq_lens = [q + c for q, c in seqs] + [0] * pad_reqs
    q_lens = [q for q, _ in seqs] + [0] * pad_reqs
    pages = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = sum(pages) + 3
    max_pages = max(pages) + 1
    # Shuffled pages; block 0 is vLLM's null block and never assigned.
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    # Entries past a request's pages: vLLM's null block 0, or an uncommitted one.
    spare = num_blocks if uncommitted else 0
    block_table = torch.full((len(seq_lens), max_pages), spare, dtype=torch.int32)
    used = 0
    for s, n in enumerate(pages):
        block_table[s, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n

    def slot(s, pos):
        return int(block_table[s, pos // block_size]) * block_size + pos % block_size

    keys = [torch.randn((n, NUM_KV_HEADS, head_size), generator=gen) for n in seq_lens]
    values = [
        torch.randn((n, NUM_KV_HEADS, head_size), generator=gen) for n in seq_lens
    ]
    num_tokens = sum(q_lens)
    query = torch.randn(
        (num_tokens + pad_tokens, NUM_Q_HEADS, head_size), generator=gen
    ).to(q_dtype)

    sinks = torch.randn(NUM_Q_HEADS, generator=gen).to(q_dtype) if with_sinks else None
    alibi = [2.0 ** -(h + 1) for h in range(NUM_Q_HEADS)] if with_alibi else None
    impl = TritonAttentionImpl(
        num_heads=NUM_Q_HEADS,
        head_size=head_size,
        scale=scale,
        num_kv_heads=NUM_KV_HEADS,
        alibi_slopes=alibi,
        sliding_window=sliding_window,
        kv_cache_dtype=cache_dtype_str,
        logits_soft_cap=logits_soft_cap,
        sinks=sinks,
        use_alibi_sqrt=alibi_sqrt,
    )
    impl.process_weights_after_loading(q_dtype)
    layer = SimpleNamespace(
        _k_scale=torch.tensor(0.05 if fp8 else 1.0),
        _v_scale=torch.tensor(0.03 if fp8 else 1.0),
    )
    storage_dtype = torch.uint8 if fp8 else q_dtype  # vLLM allocates fp8 as uint8
    shape = (num_blocks + uncommitted, 2, NUM_KV_HEADS, block_size, head_size)
    # Stale garbage everywhere: the kernels must never read unwritten slots.
    kv_cache = (
        torch.randint(0, 0x38, shape, dtype=torch.uint8)
        if fp8
        else (torch.randn(shape, generator=gen).to(storage_dtype) * 100)
    )
    if uncommitted:
        kv_cache[num_blocks:] = 0x7F if fp8 else float("nan")  # e4m3 / e5m2 NaN
        untouched = kv_cache[num_blocks:].clone()

    # Earlier steps: every sequence's context.
    ctx = [(s, p) for s, (_, c) in enumerate(seqs) for p in range(c)]
    if ctx:
        impl.do_kv_cache_update(
            layer,
            torch.stack([keys[s][p] for s, p in ctx]).to(q_dtype),
            torch.stack([values[s][p] for s, p in ctx]).to(q_dtype),
            kv_cache,
            torch.tensor([slot(s, p) for s, p in ctx], dtype=torch.int64),
        )
    # This step: the new tokens, then padding tokens (slot -1).
    new = [(s, c + i) for s, (q, c) in enumerate(seqs) for i in range(q)]
    pad_kv = torch.zeros((pad_tokens, NUM_KV_HEADS, head_size))
    step_k = torch.cat([torch.stack([keys[s][p] for s, p in new]), pad_kv])
    step_v = torch.cat([torch.stack([values[s][p] for s, p in new]), pad_kv])
    slots = [slot(s, p) for s, p in new] + [-1] * pad_tokens
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    impl.do_kv_cache_update(
        layer, step_k.to(q_dtype), step_v.to(q_dtype), kv_cache, slot_mapping
    )

    builder = _builder(block_size, head_size, storage_dtype)
    cm = _common_metadata(
        q_lens, seq_lens, block_table, slot_mapping, num_tokens + pad_tokens
    )
    md = builder.build(0, cm)
    output = torch.full_like(query, float("nan"))
    impl.forward(layer, query, step_k, step_v, kv_cache, md, output)
    if uncommitted:
        same = kv_cache[num_blocks:].view(torch.uint8) == untouched.view(torch.uint8)
        assert same.all(), "a block past the committed ones was written"

    # Reference cache, filled by indexing (fp8: stored = x / scale, in its format).
    ref_cache = torch.zeros((num_blocks, *shape[1:]), dtype=torch.float32)
    for s, n in enumerate(seq_lens):
        for p in range(n):
            b, o = divmod(slot(s, p), block_size)
            ref_cache[b, 0, :, o] = keys[s][p].to(q_dtype).float()
            ref_cache[b, 1, :, o] = values[s][p].to(q_dtype).float()
    k_scale = v_scale = None
    if fp8:
        k_scale, v_scale = 0.05, 0.03
        ref_cache[:, 0] = (ref_cache[:, 0] / k_scale).to(fp8_dtype).float()
        ref_cache[:, 1] = (ref_cache[:, 1] / v_scale).to(fp8_dtype).float()
    reference = ref_paged_attention(
        query=query[:num_tokens],
        key_cache=ref_cache[:, 0],
        value_cache=ref_cache[:, 1],
        block_table=block_table,
        query_start_loc=cm.query_start_loc_cpu,
        seq_lens=cm.seq_lens,
        softmax_scale=scale,
        k_scale=k_scale,
        v_scale=v_scale,
        sliding_window=sliding_window,
        alibi_slopes=None if alibi is None else torch.tensor(alibi),
        logits_soft_cap=logits_soft_cap,
        sinks=None if sinks is None else sinks.float(),
        alibi_sqrt=alibi_sqrt,
    )
    return output, reference, md, num_tokens


def _assert_close(actual, expected, atol, rtol, what):
    import torch

    actual = actual.float()
    diff = (actual - expected).abs()
    bad = ~(diff <= atol + rtol * expected.abs())  # NaN counts as bad
    if bad.any():
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements differ, max |diff| "
            f"{diff.nan_to_num(float('inf')).max().item():.3e}; first at {index}: "
            f"got {actual[index].item():.5f}, want {expected[index].item():.5f}"
        )


# (dtype -> atol, rtol): the kernels round P to the query dtype for P @ V and the
# output once; inputs are randn (magnitude ~1), so errors of a broken kernel are O(1).
_TOLERANCE = {"bfloat16": (2e-2, 2e-2), "float16": (5e-3, 5e-3)}


def _all_keys_reference(query, key, value, scale, sliding_window=None):
    """fp32 attention of every query row over all of ``key``/``value`` ``[keys,
    kv_heads, head_size]`` (one request, non-causal; with a window, the keys less
    than it away on either side): the one reference, ``ref_paged_attention``,
    with the K/V as a single dense page."""
    import torch

    from vllm.attention.ops.reference import ref_paged_attention

    return ref_paged_attention(
        query=query, key_cache=key.transpose(0, 1)[None],
        value_cache=value.transpose(0, 1)[None],
        block_table=torch.zeros((1, 1), dtype=torch.int32),
        query_start_loc=torch.tensor([0, query.shape[0]]),
        seq_lens=torch.tensor([key.shape[0]]), softmax_scale=scale, causal=False,
        sliding_window=sliding_window,
    )  # fmt: skip


def check_forward_cross_attention():
    """Whisper-style cross-attention through vLLM's own wrapper
    (``create_cross_attention_backend`` around TRITON_ATTN) on our kernels: a
    request's first step writes its encoder K/V into the cache (vLLM's cross
    slot mapping) and attends over all of it, non-causally, from a decoder prompt
    of several tokens; later steps decode over the cached encoder output; one step
    mixes a decode with a new request's prompt. Against softmax attention of each
    decoder query over all of its request's encoder keys, from the K/V as given."""
    import dataclasses

    import numpy as np
    import torch

    from vllm.model_executor.layers.attention.cross_attention import (
        create_cross_attention_backend,
    )
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.triton_attn import (
        TritonAttentionBackend,
        TritonAttentionImpl,
    )
    from vllm.v1.kv_cache_interface import CrossAttentionSpec

    head_size, block_size, scale = 64, 16, 0.125
    backend = create_cross_attention_backend(TritonAttentionBackend)
    impl = backend.get_impl_cls()(
        num_heads=NUM_Q_HEADS, head_size=head_size, scale=scale,
        num_kv_heads=NUM_KV_HEADS, attn_type=AttentionType.ENCODER_DECODER,
    )  # fmt: skip
    assert isinstance(impl, TritonAttentionImpl)
    layer = _FakeAttentionLayer(impl)
    layer.kv_sharing_target_layer_name = None
    name = "decoder.layers.0.encoder_attn"
    config = _fake_vllm_config()
    config.compilation_config.static_forward_context = {name: layer}
    # The encoder budget bounds a cross-attention request's keys (max_model_len,
    # 4096 here, bounds the decoder's).
    config.scheduler_config.max_num_encoder_input_tokens = 6000
    spec = CrossAttentionSpec(
        block_size=block_size, num_kv_heads=NUM_KV_HEADS, head_size=head_size,
        dtype=torch.bfloat16,
    )  # fmt: skip
    builder = backend.get_builder_cls()(spec, [name], config, torch.device("cpu"))
    assert builder.causal is False and builder.max_kv_len == 6000

    gen = torch.Generator().manual_seed(5)
    encoder_lens = {"a": 20, "b": 37, "c": 50}
    enc_k = {r: torch.randn((n, NUM_KV_HEADS, head_size), generator=gen).bfloat16()
             for r, n in encoder_lens.items()}  # fmt: skip
    enc_v = {r: torch.randn((n, NUM_KV_HEADS, head_size), generator=gen).bfloat16()
             for r, n in encoder_lens.items()}  # fmt: skip
    pages = {r: -(-n // block_size) for r, n in encoder_lens.items()}
    num_blocks = sum(pages.values()) + 2
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    blocks, used = {}, 0
    for r, n in pages.items():
        blocks[r], used = perm[used : used + n], used + n
    # Slots never written hold NaN: a read of one would show.
    kv_cache = torch.full(
        (num_blocks, 2, NUM_KV_HEADS, block_size, head_size), float("nan"),
        dtype=torch.bfloat16,
    )  # fmt: skip

    def step(requests):
        """One step: ``[(request, decoder tokens computed before, query_len)]``."""
        q_lens = [q for _, _, q in requests]
        seq_lens = [c + q for _, c, q in requests]
        table = torch.zeros((len(requests), max(pages.values()) + 1), dtype=torch.int32)
        for i, (r, _, _) in enumerate(requests):
            table[i, : pages[r]] = torch.tensor(blocks[r], dtype=torch.int32)
        num_tokens = sum(q_lens)
        cm = _common_metadata(q_lens, seq_lens, table, torch.zeros(num_tokens).long(),
                              num_tokens)  # fmt: skip
        enc = np.array([encoder_lens[r] for r, _, _ in requests], dtype=np.int32)
        cm = dataclasses.replace(
            cm,
            encoder_seq_lens=torch.from_numpy(enc.copy()),
            encoder_seq_lens_cpu=enc,
            seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
        )
        md = builder.build(0, cm)
        assert md.causal is False and md.dispatch_args["causal"] is False
        assert all(not plan.layer.causal for plan in md.prefill_plans.values())
        new = [r for r, computed, _ in requests if computed == 0]
        key = torch.cat([enc_k[r] for r in new]) if new else None
        value = torch.cat([enc_v[r] for r in new]) if new else None
        query = torch.randn((num_tokens, NUM_Q_HEADS, head_size), generator=gen)
        query = query.bfloat16()
        output = torch.full_like(query, float("nan"))
        impl.forward(layer, query, key, value, kv_cache, md, output)
        start = 0
        for r, _, q_len in requests:
            rows = slice(start, start + q_len)
            expected = _all_keys_reference(query[rows], enc_k[r], enc_v[r], scale)
            _assert_close(output[start : start + q_len], expected,
                          *_TOLERANCE["bfloat16"], f"cross-attention {r}")  # fmt: skip
            start += q_len
        return md

    first = step([("a", 0, 3), ("b", 0, 5)])
    assert first.num_decodes == 0 and first.prefill_plans, first
    decodes = step([("a", 3, 1), ("b", 5, 1)])
    assert decodes.num_decodes == 2 and not decodes.prefill_plans
    mixed = step([("a", 4, 1), ("c", 0, 4)])
    assert mixed.num_decodes == 1, mixed

    # The group's warm-up compiles the non-causal prefill variants, up to the
    # encoder budget's keys.
    from vllm.attention.ops import prefix_prefill
    from vllm.v1.attention.backends import triton_attn_warmup as warmup

    plan = warmup.warm_up_plan(builder, 64)
    assert max(b.max_seq_len or 0 for b in plan) == 6000, plan
    launched = []
    real_launches, real_plan = prefix_prefill._launches, warmup.warm_up_plan
    prefix_prefill._launches = lambda plan, inputs: [
        launched.append(kwargs.get("CAUSAL")) or (k, g, kwargs)
        for k, g, kwargs in real_launches(plan, inputs)
    ]
    warmup.warm_up_plan = lambda builder, stride: [
        b for b in plan if b.max_query_len is not None
    ][:1]
    try:
        warmup.warm_up(builder, 64)
    finally:
        prefix_prefill._launches, warmup.warm_up_plan = real_launches, real_plan
    assert launched and not any(launched), launched
    assert builder._warmed == {(warmup.stride_class(64), False)}
    return "prompt, decode and mixed steps over the cached encoder output"


def check_forward_encoder_only():
    """Encoder self-attention (BERT-style embedding models) through vLLM's own
    wrapper (``create_encoder_only_attention_backend`` around TRITON_ATTN) on our
    kernels: no cache; each request's queries attend to all of its own keys, read
    from the step's K/V (views of the fused QKV output, as vLLM passes them)
    through the builder's single-key page table, which two batches reuse in
    place. Against softmax attention over each request's K/V. Then a layer with
    a sliding window (EmbeddingGemma's), which is two-sided here, and whose K is
    not a view of the fused output (Gemma-3 normalises K)."""
    import torch

    from vllm.model_executor.layers.attention.encoder_only_attention import (
        create_encoder_only_attention_backend,
    )
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl
    from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

    head_size, scale = 64, 0.125
    backend = create_encoder_only_attention_backend(B)

    def encoder_layer(sliding_window=None):
        impl = backend.get_impl_cls()(
            num_heads=NUM_Q_HEADS, head_size=head_size, scale=scale,
            num_kv_heads=NUM_KV_HEADS, attn_type=AttentionType.ENCODER_ONLY,
            sliding_window=sliding_window,
        )  # fmt: skip
        assert isinstance(impl, TritonAttentionImpl) and impl.kv_from_step
        layer = _FakeAttentionLayer(impl)
        name = "encoder.layer.0.attention"
        config = _fake_vllm_config()
        config.compilation_config.static_forward_context = {name: layer}
        spec = EncoderOnlyAttentionSpec(
            block_size=16, num_kv_heads=NUM_KV_HEADS, head_size=head_size,
            dtype=torch.bfloat16,
        )  # fmt: skip
        builder = backend.get_builder_cls()(spec, [name], config, torch.device("cpu"))
        assert builder.kv_from_step and not builder.causal
        return impl, layer, builder

    impl, layer, builder = encoder_layer()
    gen = torch.Generator().manual_seed(11)
    q_end = NUM_Q_HEADS * head_size
    k_end = q_end + NUM_KV_HEADS * head_size
    tables = []
    batches = [([7, 1, 20, 33], None), ([1, 1, 40], None), ([30, 1, 9], 6)]
    for q_lens, window in batches:
        if window is not None:
            impl, layer, builder = encoder_layer(sliding_window=window)
        num_tokens, pad = sum(q_lens), 2
        qkv = torch.randn((num_tokens + pad, k_end + k_end - q_end), generator=gen)
        qkv = qkv.bfloat16()
        query = qkv[:, :q_end].view(-1, NUM_Q_HEADS, head_size)
        key = qkv[:, q_end:k_end].view(-1, NUM_KV_HEADS, head_size)
        value = qkv[:, k_end:].view(-1, NUM_KV_HEADS, head_size)
        if window is not None:
            # EmbeddingGemma (Gemma-3) normalises K and not V: K is a tensor of
            # its own, with other strides than V's view of the fused output.
            key = key * 1.5
        cm = _common_metadata(
            q_lens, q_lens, torch.zeros((len(q_lens), 1), dtype=torch.int32),
            torch.zeros(num_tokens + pad).long(), num_tokens + pad,
        )  # fmt: skip
        md = builder.build(0, cm)
        assert md.num_decodes == 0 and md.causal is False, md
        tables.append(md.block_table.data_ptr())
        output = torch.full_like(query, float("nan"))
        impl.do_kv_cache_update(layer, key, value, torch.empty(0), cm.slot_mapping)
        impl.forward(layer, query, key, value, torch.empty(0), md, output)
        start = 0
        for q_len in q_lens:
            rows = slice(start, start + q_len)
            expected = _all_keys_reference(
                query[rows], key[rows], value[rows], scale, sliding_window=window
            )
            what = f"encoder-only request of {q_len}, window {window}"
            _assert_close(output[rows], expected, *_TOLERANCE["bfloat16"], what)
            start += q_len
    assert tables[0] == tables[1], "the page table was not reused in place"

    # The group's warm-up runs through the same path: non-causal launches over
    # one-key pages (the scratch cache is not read), with the table's stride.
    from vllm.attention.ops import prefix_prefill
    from vllm.v1.attention.backends import triton_attn_warmup as warmup

    launched = []
    real_launches, real_plan = prefix_prefill._launches, warmup.warm_up_plan
    prefix_prefill._launches = lambda plan, inputs: [
        launched.append((kwargs["CAUSAL"], kwargs["BLOCK_SIZE"])) or (k, g, kwargs)
        for k, g, kwargs in real_launches(plan, inputs)
    ]
    plan = warmup.warm_up_plan(builder, builder.step_kv.stride)
    warmup.warm_up_plan = lambda builder, stride: [plan[0], plan[-1]]
    try:
        warmup.warm_up(builder, builder.step_kv.stride)
    finally:
        prefix_prefill._launches, warmup.warm_up_plan = real_launches, real_plan
    assert launched and set(launched) == {(False, 1)}, launched
    assert builder._warmed == {(warmup.stride_class(builder.step_kv.stride), False)}
    return "two batches, requests of 1-40 tokens, GQA 2; a two-sided window; warm-up"


def check_forward_mixed_bf16():
    """Split-KV decodes + a prefix-hit chunk + a fresh prefill + a padding token."""
    import torch

    out, ref, md, n = _run_step(
        seqs=[(1, 20), (1, 3), (5, 17), (3, 0)],
        q_dtype=torch.bfloat16,
        cache_dtype_str="auto",
    )
    assert md.num_decodes == 2 and md.decode_num_splits > 1, md
    _assert_close(out[:n], ref, *_TOLERANCE["bfloat16"], "bf16 mixed batch")
    return f"decode splits {md.decode_num_splits}"


def check_forward_fp8_window_softcap_sinks():
    """fp8 cache with per-tensor scales, sliding window, soft-cap and sinks."""
    import torch

    out, ref, md, n = _run_step(
        seqs=[(1, 29), (4, 12), (2, 0)],
        q_dtype=torch.float16,
        cache_dtype_str="fp8",
        sliding_window=8,
        logits_soft_cap=30.0,
        with_sinks=True,
        block_size=32,
    )
    assert md.num_decodes == 1, md
    _assert_close(out[:n], ref, *_TOLERANCE["float16"], "fp8 window/softcap/sinks")


def check_forward_fp8_e5m2():
    """--kv-cache-dtype fp8_e5m2: the cache write stores e5m2, both kernels read it
    (a decode and two prefill chunks, one with a cached prefix)."""
    import torch

    out, ref, md, n = _run_step(
        seqs=[(1, 40), (5, 20), (3, 0)],
        q_dtype=torch.bfloat16,
        cache_dtype_str="fp8_e5m2",
        block_size=16,
    )
    assert md.num_decodes == 1, md
    _assert_close(out[:n], ref, *_TOLERANCE["bfloat16"], "fp8_e5m2 cache")


def check_forward_padded_decode_alibi():
    """CUDA-graph style decode batch: 2 requests padded to 4 (query length 0,
    seq_len 0) and 4 tokens; ALiBi; head size 80 (padded to 128 in the kernels)."""
    import torch

    out, ref, md, n = _run_step(
        seqs=[(1, 4), (1, 8)],
        q_dtype=torch.bfloat16,
        cache_dtype_str="auto",
        head_size=80,
        pad_tokens=2,
        pad_reqs=2,
        with_alibi=True,
    )
    assert md.num_decodes == 4 and md.num_decode_tokens == 4, md
    _assert_close(out[:n], ref, *_TOLERANCE["bfloat16"], "padded decode batch")
    assert torch.isfinite(out[n:]).all(), "padding rows must not be NaN/inf"


def check_forward_alibi_sqrt():
    """ALiBi-sqrt (vLLM's ``use_alibi_sqrt``) on our kernels: split-KV decodes, a
    prefix-hit chunk and a fresh prefill against the reference's sqrt bias, which
    differs from linear ALiBi's by more than the tolerance on these inputs."""
    import torch

    step = dict(seqs=[(1, 40), (1, 3), (6, 30), (9, 0)], q_dtype=torch.bfloat16,
                cache_dtype_str="auto", with_alibi=True)  # fmt: skip
    out, ref, md, n = _run_step(**step, alibi_sqrt=True)
    assert md.num_decodes == 2, md
    _assert_close(out[:n], ref, *_TOLERANCE["bfloat16"], "ALiBi-sqrt")
    _, linear, _, _ = _run_step(**step)
    assert (linear - ref).abs().max() > 10 * _TOLERANCE["bfloat16"][0]
    try:
        from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

        TritonAttentionImpl(num_heads=8, head_size=64, scale=0.1, use_alibi_sqrt=True)
    except ValueError as e:
        assert "needs ALiBi slopes" in str(e), e
    else:
        raise AssertionError("ALiBi-sqrt without slopes accepted")


def check_extensible_kv_cache():
    """The extensible KV cache (vLLM 0.34+) backs only a prefix of the blocks during
    warm-up: decodes (split-KV), prefix-hit chunks, fresh prefills and CUDA-graph
    padding, bf16 and fp8, read and write only the blocks their requests hold;
    block-table entries past a request's pages may name any block. The builder's
    warm-up runs on its own scratch cache, never on the model's."""
    import torch

    cases = [
        dict(seqs=[(1, 40), (1, 3), (6, 17), (9, 0)], cache_dtype_str="auto"),
        dict(seqs=[(1, 70), (4, 30)], cache_dtype_str="fp8", block_size=32),
        dict(seqs=[(1, 5), (1, 9)], cache_dtype_str="auto", pad_tokens=2, pad_reqs=2),
    ]
    for case in cases:
        q_dtype = torch.float16 if case["cache_dtype_str"] == "fp8" else torch.bfloat16
        out, ref, md, n = _run_step(q_dtype=q_dtype, uncommitted=3, **case)
        tolerance = _TOLERANCE["float16" if q_dtype == torch.float16 else "bfloat16"]
        _assert_close(out[:n], ref, *tolerance, f"uncommitted blocks: {case}")
    from vllm.v1.attention.backends import triton_attn_warmup as warmup

    builder = _builder(16, 64, torch.bfloat16)
    assert warmup.scratch_kv_cache(builder, 2).shape[0] == 2
    return f"{len(cases)} batches, no read or write past the committed blocks"


def check_forward_profile_run():
    """attn_metadata None (vLLM's memory-profiling run) writes zeros."""
    import torch

    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    impl = TritonAttentionImpl(num_heads=4, head_size=64, scale=0.1, num_kv_heads=2)
    out = torch.full((3, 4, 64), float("nan"), dtype=torch.bfloat16)
    layer = SimpleNamespace(_k_scale=torch.tensor(1.0), _v_scale=torch.tensor(1.0))
    impl.forward(layer, out, out, out, torch.empty(0), None, out)
    assert (out == 0).all()


def setup():
    if os.environ.get("TRITON_INTERPRET") == "1":
        from tests.kernels.interpreter_compat import install

        install()
