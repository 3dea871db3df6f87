# SPDX-License-Identifier: Apache-2.0
"""Which backend vLLM's own selector gives each kind of layer, per platform.

Run by test_selection_promise.py through tests/site_runner.py, once in the stock
release's site and once in the patched one; this module runs unchanged in both
(vLLM is imported only inside functions). Each ``check_*`` simulates one platform
on this CPU machine, makes it vLLM's ``current_platform`` and asks the release's
selector (``_cached_get_attn_backend``, undecorated, so nothing is cached between
layers) about every layer of the grid (``_grid``) both ways: automatic (no
backend given) and each backend of ``PATHS`` named that the release registers.
It returns ``{"<path>|<config key>": result}``: the served class's ``get_name()``
(with its registry name where that differs, and ``OURS_MARK`` for the fork's
``TritonAttentionBackend`` and its subclasses), or ``"refused: <message>"``. In
the fork's site it also records, under the path ``KERNELS``, whether our kernels
take the layer (``kernel_refusals``), which says which of the fork's two Triton
backends must serve it.

FlashAttention and FlashInfer cannot import on this CPU machine: CUDA's automatic
choice sees them as unavailable in both sites alike, so the automatic path shows
what vLLM picks without them (on XPU, whose selector validates nothing, its
FlashAttention class imports and is chosen).
"""

import contextlib
import sys
import types

# Selection paths: vLLM's automatic choice, then each backend named on the command
# line (those the release's registry lacks are skipped: ROCM_ATTN where absent,
# TRITON_UNIFIED_ATTN in stock vLLM).
AUTO = "auto"
PATHS = (AUTO, "TRITON_ATTN", "ROCM_ATTN", "TRITON_UNIFIED_ATTN")
OURS_MARK = " (ours)"
REFUSED = "refused: "
# Pseudo-path of the fork's site: does the layer run on our kernels?
KERNELS = "kernels"
KERNELS_TAKE = "take"

# The base layer: a decoder with head size 128 in bf16, KV cache "auto", vLLM's
# block size left to the backend. Every other layer of the grid (``_grid``)
# varies one or two factors of it.
BASE = {
    "head_size": 128,
    "dtype": "bfloat16",
    "kv_cache_dtype": "auto",
    "block_size": None,
}
# Head sizes of models from 8 to 512, and odd ones (24, 100): ours take every one
# up to 256, stock's Triton backend every one from 32, the others their lists.
HEAD_SIZES = (8, 16, 24, 32, 48, 64, 72, 80, 96, 100, 112, 128, 160, 192, 224, 256,
              320, 512)  # fmt: skip
# --block-size values: kernel block sizes of ours (16..128), a multiple of 16 that
# is not a power of two (48), and a hybrid-model page (256).
BLOCK_SIZES = (16, 32, 48, 64, 128, 256)
# Layer features the selector asks about, each switched on alone.
FLAGS = (
    "use_non_causal",
    "has_sliding_window",
    "has_sink",
    "use_batch_invariant",
    "use_mm_prefix",
    "use_kv_connector",
    "use_per_head_quant_scales",
    "use_rswa",
)
ATTN_TYPES = ("encoder", "encoder_only", "encoder_decoder")
# KV-cache dtypes (model bf16 unless paired): 16-bit ones equal to the model dtype
# or not, the fp8 spellings, and (added per release) every per-token-head dtype.
KV_CACHE_DTYPES = (
    {"kv_cache_dtype": "bfloat16"},
    {"kv_cache_dtype": "float16"},  # differs from the bf16 model
    {"dtype": "float16", "kv_cache_dtype": "float16"},
    {"kv_cache_dtype": "fp8"},
    {"kv_cache_dtype": "fp8_e4m3"},
    {"kv_cache_dtype": "fp8_e5m2"},
)
# Pairs of factors models combine.
PAIRS = (
    {"dtype": "float32", "attn_type": "encoder_only"},  # fp32 embedding models
    {"head_size": 72, "kv_cache_dtype": "fp8"},
    {"has_sliding_window": True, "has_sink": True, "kv_cache_dtype": "fp8"},  # gpt-oss
    {"has_sliding_window": True, "has_sink": True},
    {"dtype": "float16", "kv_cache_dtype": "fp8_e5m2"},
    {"dtype": "float16", "kv_cache_dtype": "fp8"},
    {"head_size": 80, "block_size": 48},
    {"head_size": 256, "has_sliding_window": True},  # Gemma-2 style
    {"attn_type": "encoder_only", "kv_cache_dtype": "fp8"},
    {"attn_type": "encoder_decoder", "kv_cache_dtype": "fp8"},  # Whisper cross-attn
    {"head_size": 64, "use_non_causal": True},
    {"use_kv_connector": True, "kv_cache_dtype": "fp8"},
    {"use_mm_prefix": True, "has_sliding_window": True},
    {"dtype": "float32", "head_size": 72},
)


def _grid(fields, cache_dtypes) -> dict[str, dict]:
    """``{config key: overrides of BASE}`` for the release: entries naming a field
    its ``AttentionSelectorConfig`` lacks are left out."""
    entries = [
        {},
        *({"head_size": h} for h in HEAD_SIZES if h != BASE["head_size"]),
        {"dtype": "float16"},
        {"dtype": "float32"},
        *KV_CACHE_DTYPES,
        *({"kv_cache_dtype": d} for d in cache_dtypes if d.endswith("_per_token_head")),
        *({"attn_type": t} for t in ATTN_TYPES),
        *({flag: True} for flag in FLAGS),
        *({"block_size": b} for b in BLOCK_SIZES),
        *PAIRS,
    ]
    grid = {}
    for overrides in entries:
        if set(overrides) <= set(fields):
            key = ",".join(f"{k}={v}" for k, v in overrides.items()) or "base"
            grid[key] = overrides
    return grid


def _sweep() -> dict[str, str]:
    """Every (path, layer) of the release through its selector, under the current
    platform."""
    import inspect
    import typing

    import torch

    from vllm.config.cache import CacheDType
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

    config_cls = selector.AttentionSelectorConfig
    cached = selector._cached_get_attn_backend
    choose = getattr(cached, "__wrapped__", cached)
    run_dtype = "_run_kv_cache_dtype" in inspect.signature(choose).parameters
    ours = _fork_backend()
    registry = _registry(E)
    grid = _grid(config_cls._fields, typing.get_args(CacheDType))
    results = {}
    for key, overrides in grid.items():
        values = {**BASE, **overrides}
        values["dtype"] = getattr(torch, values["dtype"])
        config = config_cls(**values)
        extra = {"_run_kv_cache_dtype": config.kv_cache_dtype} if run_dtype else {}
        for path in PATHS:
            if path != AUTO and path not in E.__members__:
                continue
            backend = None if path == AUTO else E[path]
            try:
                cls = choose(backend, config, **extra)
            except Exception as e:  # a refusal: vLLM stops at startup with it
                # The config's repr (the key names it) would fill the excerpt.
                message = str(e).replace(repr(config), "<layer>")
                result = REFUSED + f"{type(e).__name__}: {message}"[:200]
            else:
                result = _label(cls, registry, ours)
            results[f"{path}|{key}"] = result
        if ours is not None:
            refusals = ours.kernel_refusals(
                device_capability=current_platform.get_device_capability(),
                **config._asdict(),
            )
            results[f"{KERNELS}|{key}"] = (
                "refuse: " + "; ".join(refusals)[:200] if refusals else KERNELS_TAKE
            )
    return results


def _label(cls, registry: dict[str, str], ours) -> str:
    """``cls.get_name()``, then the registry entry of ``cls`` where that is another
    name (ROCM_AITER_FA reports "FLASH_ATTN", the fork's ROCM_ATTN alias
    "TRITON_ATTN"), then ``OURS_MARK`` for the fork's backend."""
    name = cls.get_name()
    entry = registry.get(f"{cls.__module__}.{cls.__qualname__}", name)
    label = name if entry == name else f"{name} [{entry}]"
    if ours is not None and issubclass(cls, ours):
        label += OURS_MARK
    return label


def _registry(backends) -> dict[str, str]:
    """``{class path: registry name}`` of the release's attention backends."""
    paths = {}
    for name, member in backends.__members__.items():
        with contextlib.suppress(ValueError):  # CUSTOM, not registered
            paths.setdefault(member.get_path(), name)
    return paths


def _fork_backend():
    """The fork's TritonAttentionBackend, or None in stock vLLM (whose registry
    has no TRITON_UNIFIED_ATTN)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as E

    if "TRITON_UNIFIED_ATTN" not in E.__members__:
        return None
    return E.TRITON_ATTN.get_class()


def setup():
    """vLLM's Triton helpers (``vllm.triton_utils``) as on a GPU server: they
    disable Triton when no GPU driver is active, as on this machine, and then
    backend modules that build kernels at import (TURBOQUANT, ULTRAQUANT, which
    ROCm's automatic choice imports) fail with an AttributeError that ends the
    whole selection. Where none is active, one Triton GPU driver reports itself
    active while vLLM checks."""
    from triton.backends import backends

    drivers = [b.driver for name, b in backends.items() if name != "cpu" and b.driver]
    active = {"is_active": staticmethod(lambda: True)}
    if any(driver.is_active() for driver in drivers):
        active = {}  # a GPU host
    with _patched(drivers[0], **active):
        import vllm.triton_utils

    assert vllm.triton_utils.HAS_TRITON


# ----------------------------------------------------------------------------------
# Simulated platforms
# ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _patched(obj, **attrs):
    """Set attributes of ``obj`` (a class or module) inside the block."""
    missing = object()
    before = {name: obj.__dict__.get(name, missing) for name in attrs}
    for name, value in attrs.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


def _stub_modules(*names):
    """Empty modules for compiled extensions a platform module imports."""
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))


@contextlib.contextmanager
def _current_platform(platform):
    """``platform`` as vLLM's ``current_platform`` inside the block: the lazy
    attribute of ``vllm.platforms`` and every module-level binding of the one
    before in vLLM modules already imported (``from vllm.platforms import
    current_platform``), so modules imported under another simulated platform
    see this one too."""
    import vllm.platforms

    def rebind(old, new):
        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", None) or ""
            if name.startswith("vllm") and (
                getattr(module, "__dict__", {}).get("current_platform") is old
            ):
                module.current_platform = new

    before = vllm.platforms.current_platform  # resolved (vLLM's lazy default)
    rebind(before, platform)
    vllm.platforms.current_platform = platform
    try:
        yield platform
    finally:
        rebind(platform, before)
        # Back to the lazy attribute, which returns ``before``.
        vllm.platforms.__dict__.pop("current_platform", None)


def _on_cuda(major: int, minor: int):
    """vLLM's CUDA platform at SM ``major.minor`` (its compiled extension stubbed)."""
    _stub_modules("vllm._C_stable_libtorch")
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    capability = classmethod(lambda cls, device_id=0: DeviceCapability(major, minor))
    with (
        _patched(CudaPlatform, get_device_capability=capability),
        _current_platform(CudaPlatform()),
    ):
        return _sweep()


def check_cuda_sm80():
    """Ampere (A100): our kernels without fp8."""
    return _on_cuda(8, 0)


def check_cuda_sm89():
    """Ada (L40S): the first CUDA capability with fp8 in our kernels."""
    return _on_cuda(8, 9)


def check_cuda_sm90():
    """Hopper (H100/H200): the tuned target."""
    return _on_cuda(9, 0)


def _amdsmi_stub(gfx: str) -> types.ModuleType:
    """What rocm.py asks amdsmi at import (the GCN arch of device 0)."""
    amdsmi = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    amdsmi.AmdSmiException = AmdSmiException
    amdsmi.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)
    amdsmi.amdsmi_init = amdsmi.amdsmi_shut_down = lambda *a, **k: None
    amdsmi.amdsmi_get_processor_handles = lambda: [0]
    amdsmi.amdsmi_get_gpu_asic_info = lambda handle: {
        "target_graphics_version": gfx,
        "market_name": "AMD Instinct MI300X",
        "device_id": "0x74a1",
    }
    amdsmi.amdsmi_get_gpu_device_uuid = lambda handle: "stub"
    amdsmi.amdsmi_get_gpu_memory_total = lambda handle, kind: 192 << 30
    amdsmi.amdsmi_topo_get_link_type = lambda a, b: {"type": 0, "hops": 1}
    amdsmi.amdsmi_topo_get_numa_node_number = lambda handle: 0
    return amdsmi


def _on_mi300(aiter_found: bool, aiter_enabled: bool):
    """vLLM's ROCm platform on an MI300X (gfx942), amdsmi stubbed. AITER is not
    installed here: ``aiter_found`` makes vLLM see it installed (its automatic
    choice then lists ROCM_AITER_UNIFIED_ATTN), ``aiter_enabled`` is
    VLLM_ROCM_USE_AITER=1 (ROCM_AITER_FA too)."""
    if "vllm.platforms.rocm" not in sys.modules:
        sys.modules.setdefault("amdsmi", _amdsmi_stub("gfx942"))
    from vllm.platforms import rocm

    assert rocm.on_gfx942() and rocm.on_mi3xx(), rocm._GCN_ARCH
    with _current_platform(rocm.RocmPlatform()):
        from vllm import _aiter_ops

        with (
            _patched(_aiter_ops, IS_AITER_FOUND=aiter_found),
            _patched(
                _aiter_ops.rocm_aiter_ops,
                _AITER_ENABLED=aiter_enabled,
                _MHA_ENABLED=aiter_enabled,
            ),
        ):
            assert bool(_aiter_ops.rocm_aiter_ops.is_mha_enabled()) is aiter_enabled
            return _sweep()


def check_rocm_mi300():
    """MI300X without AITER."""
    return _on_mi300(aiter_found=False, aiter_enabled=False)


def check_rocm_mi300_aiter_installed():
    """MI300X with AITER installed but not enabled (vLLM's ROCm images)."""
    return _on_mi300(aiter_found=True, aiter_enabled=False)


def check_rocm_mi300_aiter():
    """MI300X with AITER installed and enabled (VLLM_ROCM_USE_AITER=1)."""
    return _on_mi300(aiter_found=True, aiter_enabled=True)


def check_xpu():
    """Intel GPU (its kernel package stubbed)."""
    _stub_modules(
        "vllm_xpu_kernels",
        "vllm_xpu_kernels._C",
        "vllm_xpu_kernels._moe_C",
        "vllm_xpu_kernels._xpu_C",
    )
    from vllm.platforms.xpu import XPUPlatform

    with _current_platform(XPUPlatform()):
        return _sweep()
