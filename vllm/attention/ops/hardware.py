# SPDX-License-Identifier: Apache-2.0
"""Hardware facts the kernels and the tuning filters rely on.

One place for what is true of a GPU rather than of a kernel: shared memory per
program, the SM count of the tuned GPU, which devices take inline PTX and TMA, and
which tuned GPU stands in for an untuned one of the same SM design.
Nothing is queried at import time; the device queries below run at the first launch.
"""

import functools

import torch

# Shared memory one Hopper (sm_90) program may use, as Triton sees it: 232,448 bytes
# (227 KiB). The validity filters of the tuning sweeps keep pipelined tiles within it.
HOPPER_SMEM_BYTES_PER_PROGRAM = 232_448
# SMs of an H200 (and H100 SXM). Used where no GPU can be asked: CPU runs under
# TRITON_INTERPRET=1 pretend to be an H200 so that split-KV choices match the GPU's.
H200_NUM_SMS = 132

# A GPU with no tuning table of its own uses the tables of a tuned GPU with the same
# SM design, where the same tiles win: {NVIDIA compute capability: GPU name}. An
# H100 or H800 (sm_90, like the H200) is closer to the H200's tuned TMA tiles than
# to the heuristic, which uses none.
SAME_ARCHITECTURE = {(9, 0): "NVIDIA H200"}


def nvidia_gpu(device: torch.device) -> bool:
    """Whether launches on ``device`` compile for an NVIDIA GPU: what inline PTX
    (``e4m3_to_fp16_at_load``) and TMA need. Not ROCm, not the CPU interpreter."""
    return device.type == "cuda" and torch.version.hip is None


@functools.cache
def tma_supported(device: torch.device) -> bool:
    """Whether K/V tiles may be loaded through TMA descriptors on ``device``: NVIDIA
    sm_90 and newer; CPU tensors only run under TRITON_INTERPRET=1, which emulates
    descriptors (so the CPU tests cover that path). Not on ROCm."""
    if device.type == "cpu":
        return True
    if not nvidia_gpu(device):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def is_hopper(device: torch.device) -> bool:
    """Whether ``device`` is an NVIDIA Hopper (sm_90) GPU: what the prefill kernel
    in Gluon (``prefix_prefill_hopper.py``) is built for."""
    return nvidia_gpu(device) and torch.cuda.get_device_capability(device)[0] == 9


@functools.cache
def num_sms(device: torch.device) -> int:
    """SMs (compute units) of ``device``; ``H200_NUM_SMS`` off the GPU."""
    if device.type != "cuda":
        return H200_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def shared_memory_per_program(device: torch.device) -> int:
    """Bytes of shared memory one program may use on ``device`` (CUDA's opt-in
    limit per block; 64 KiB of LDS per workgroup on ROCm); off the GPU, a Hopper
    program's (``HOPPER_SMEM_BYTES_PER_PROGRAM``), so that interpreter runs pick
    the configs an H200 would."""
    if device.type != "cuda":
        return HOPPER_SMEM_BYTES_PER_PROGRAM
    if torch.version.hip is not None:
        return 64 * 1024
    props = torch.cuda.get_device_properties(device)
    return props.shared_memory_per_block_optin
