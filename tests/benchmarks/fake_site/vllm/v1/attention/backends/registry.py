"""Fake ``vllm.v1.attention.backends.registry``: backends in vLLM's CUDA order;
FLASHINFER refuses every layer (as it refuses head size 160)."""

import enum


def _backend(backend_name):
    class Backend:
        @classmethod
        def get_name(cls):
            return backend_name

        @classmethod
        def validate_configuration(cls, *args, **kwargs):
            return ["head size"] if backend_name == "FLASHINFER" else []

    Backend.__qualname__ = f"{backend_name.title().replace('_', '')}Backend"
    return Backend


class AttentionBackendEnum(enum.Enum):
    FLASH_ATTN = "flash"
    FLASHINFER = "flashinfer"
    TRITON_ATTN = "triton"

    def get_class(self):
        return _CLASSES[self.name]


_CLASSES = {b.name: _backend(b.name) for b in AttentionBackendEnum}
