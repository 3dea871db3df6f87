# SPDX-License-Identifier: Apache-2.0
"""Fixes for Triton's CPU interpreter (TRITON_INTERPRET=1) used by the kernel tests.

Four defects of the interpreter (found in triton 3.6.0 with numpy 2.4) make correct
kernels give wrong answers or crash on the CPU; ``install()`` patches them (the
kernel tests pass with these patches under triton 3.6.0 and 3.8.0):

1. ``range(lo, hi)`` with bounds computed from loaded values crashes: scalars are
   1-element arrays and ``int(array)`` needs ndim 0 in numpy >= 2.4.
   Fix: convert with ``.item()``.
2. ``tl.dot`` on bf16 operands multiplies their raw uint16 bit patterns (bf16 is
   stored as uint16). Fix: widen bf16 operands to fp32 first.
3. Casts from or to fp8 go through a generic bit-twiddling routine that ignores
   the NaN encodings of e4m3fn / e4m3fnuz. Fix: convert through torch's float8
   dtypes (exact, with torch's conventions, which match the GPU's).
4. The interpreter's ``dtype.to_ir`` knows fp8e4nv, fp8e5 and fp8e4b15 but not
   the ROCm formats fp8e4b8 (e4m3fnuz) and fp8e5b16 (e5m2fnuz), so every kernel
   that names one (a pointer to a ``torch.float8_e4m3fnuz`` cache, a cast) fails
   with "fail to convert fp8e4b8 to ir type". The builder already has their
   ``get_fp8e4b8_ty`` / ``get_fp8e5b16_ty`` and stores them as uint8 like the other
   fp8 types, so loads and stores move raw bytes; casts go through fix 3.
   Fix: map the two names to those builder types.

Nothing changes when the interpreter is not used. Idempotent.
"""

import numpy as np
import torch
import triton.language as tl


def _torch_dtype(tt_dtype):
    return {
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e4b8: torch.float8_e4m3fnuz,
        tl.float8e5: torch.float8_e5m2,
        tl.float8e5b16: torch.float8_e5m2fnuz,
        tl.bfloat16: torch.bfloat16,
        tl.float16: torch.float16,
        tl.float32: torch.float32,
        tl.float64: torch.float64,
    }.get(tt_dtype)


_STORAGE = {1: torch.uint8, 2: torch.uint16}


def _to_torch(data: np.ndarray, tt_dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(data))
    target = _torch_dtype(tt_dtype)
    if tt_dtype in (tl.bfloat16,) or tt_dtype.primitive_bitwidth == 8:
        t = t.view(target)
    return t


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype.itemsize <= 2 and t.dtype not in (torch.float16,):
        t = t.view(_STORAGE[t.dtype.itemsize])
    return t.numpy()


def install() -> None:
    from triton.runtime import interpreter

    if getattr(interpreter, "_vllm_fixes_installed", False):
        return
    builder_cls = interpreter.InterpreterBuilder
    TensorHandle = interpreter.TensorHandle

    # 1. range bounds
    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(
            tensor, "__index__", lambda self: int(np.asarray(self.handle.data).item())
        )

    interpreter._patch_lang_tensor = patch_lang_tensor

    # 2. bf16 dot
    original_dot = builder_cls.create_dot

    def widen(h):
        if h.dtype.scalar == tl.bfloat16:
            data = _to_torch(h.data, tl.bfloat16).float().numpy()
            return TensorHandle(data, tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(
            self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc
        )

    builder_cls.create_dot = create_dot

    # 3. fp8 casts
    original_fp_to_fp = builder_cls.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if _torch_dtype(src_ty) is not None and _torch_dtype(dst_ty) is not None:
            t = _to_torch(src.data, src_ty).to(_torch_dtype(dst_ty))
            return TensorHandle(_to_numpy(t), dst_ty)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder_cls.create_fp_to_fp = create_fp_to_fp

    # 4. ROCm fp8 types in dtype.to_ir
    rocm_fp8 = {
        "fp8e4b8": lambda builder: builder.get_fp8e4b8_ty(),
        "fp8e5b16": lambda builder: builder.get_fp8e5b16_ty(),
    }
    original_patch_core = interpreter._patch_lang_core

    def patch_lang_core(lang, scope):
        original_patch_core(lang, scope)
        interpreted_to_ir = lang.dtype.to_ir

        def to_ir(self, builder):
            if self.name in rocm_fp8:
                return rocm_fp8[self.name](builder)
            return interpreted_to_ir(self, builder)

        scope.set_attr(lang.dtype, "to_ir", to_ir)

    interpreter._patch_lang_core = patch_lang_core
    interpreter._vllm_fixes_installed = True
