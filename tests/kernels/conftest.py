# SPDX-License-Identifier: Apache-2.0
"""Shared parameters and batch builder of the kernel tests.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set
here before any kernel module is imported) on tiny shapes: the CPU suite samples the
feature matrix, one case per feature. The cross product runs on a GPU with
``GPU_FULL=1`` (tests marked ``full_matrix``; they skip elsewhere).
"""

import math
import os
from dataclasses import dataclass

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:
    from tests.kernels.interpreter_compat import (
        install as _install_interpreter_fix,
    )

    _install_interpreter_fix()

DEVICE = "cuda" if ON_GPU else "cpu"
GPU_FULL = os.environ.get("GPU_FULL") == "1"

# Parameter lists (why these values):
# head sizes of real models; 80/96/112/192 are not powers of two (padded + masked).
HEAD_SIZES = (64, 80, 96, 112, 128, 192, 256)
# q heads per KV head: MHA, common GQA ratios, 7 (not a power of two: tiles split
# tokens).
GQA_GROUPS = (1, 2, 4, 7, 8, 16)
# page sizes the backend offers (64 preferred).
BLOCK_SIZES = (16, 32, 64, 128)
QUERY_DTYPES = (torch.bfloat16, torch.float16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)

# (dtype, atol, rtol). The reference is fp32 on the same (rounded) inputs; the kernel
# rounds P to the query dtype for the P@V product (relative error ~eps/2 per term)
# and rounds the output once, so the bound is a few eps of the dtype at |out| <~ 1.
# fp8 caches are dequantised identically by both sides, so they use the query
# dtype's tolerance.
TOLERANCES = {
    torch.bfloat16: (torch.bfloat16, 1.5e-2, 1.5e-2),  # eps 2**-8
    torch.float16: (torch.float16, 2e-3, 2e-3),  # eps 2**-11
}

# fp8_qk rounds the query to e4m3 (3 mantissa bits): ~0.06-0.1 of error at outputs of
# magnitude ~1-3, against 0.015 without it.
FP8_QK_TOLERANCE = (torch.bfloat16, 0.15, 0.05)

FULL_MATRIX_REASON = "cross product runs on a GPU with GPU_FULL=1 (slow elsewhere)"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "full_matrix: large cross product, run on a GPU with GPU_FULL=1"
    )


def pytest_collection_modifyitems(config, items):
    if GPU_FULL and ON_GPU:
        return
    skip = pytest.mark.skip(reason=FULL_MATRIX_REASON)
    for item in items:
        if "full_matrix" in item.keywords:
            item.add_marker(skip)


def fp8_skip_reason(dtype: torch.dtype) -> str | None:
    """Why an fp8 cache dtype cannot run here, or None.

    Every format runs under the interpreter (e4m3fnuz through interpreter_compat's
    fix 4); a GPU runs its native e4m3 format, and e5m2 (--kv-cache-dtype
    fp8_e5m2) on CUDA.
    """
    if ON_GPU and dtype == torch.float8_e5m2 and torch.version.hip is not None:
        return "fp8_e5m2 caches are checked on CUDA GPUs"
    if ON_GPU and dtype == torch.float8_e4m3fnuz and torch.version.hip is None:
        return "e4m3fnuz is the ROCm fp8 format; CUDA GPUs use e4m3fn"
    if ON_GPU and dtype == torch.float8_e4m3fn and torch.version.hip is not None:
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (9, 5):
            return "this ROCm GPU uses e4m3fnuz"
    return None


def assert_close(actual, expected, *, dtype, atol, rtol, what="output"):
    """torch.testing-style check whose message names the worst element."""
    actual = actual.float()
    expected = expected.float()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    bad_nan = torch.isnan(actual) & ~torch.isnan(expected)
    diff = (actual - expected).abs()
    allowed = atol + rtol * expected.abs()
    excess = torch.where(bad_nan, torch.full_like(diff, math.inf), diff - allowed)
    worst = int(torch.argmax(excess))
    if excess.view(-1)[worst] > 0:
        index = tuple(
            int(i) for i in torch.unravel_index(torch.tensor(worst), actual.shape)
        )
        raise AssertionError(
            f"{what} ({dtype}) differs: max |diff| {diff.max().item():.3e}, worst at "
            f"{index}: got {actual[index].item():.5f}, "
            f"want {expected[index].item():.5f}"
            f" (atol {atol}, rtol {rtol}); {int((excess > 0).sum())} of "
            f"{excess.numel()} elements out of tolerance"
        )


def put_query_on_fp8_grid(batch, fp8_dtype, head_size):
    """Make ``fp8_qk``'s quantisation exact: every query row holds fp8 values times
    one power of two, and its first element is the format's largest value. With a
    power-of-two softmax scale (head size 64; the portable kernel quantises the
    scaled query), each program's (or consumer warpgroup's) tile then has the same
    largest magnitude, its scale is a power of two and q / scale is q's fp8 value."""
    assert head_size == 64, "the softmax scale 1/8 must be a power of two"
    fp8_max = torch.finfo(fp8_dtype).max
    gen = torch.Generator().manual_seed(7)
    grid = (torch.randn(batch.query.shape, generator=gen) * fp8_max / 4).clamp(
        -fp8_max, fp8_max
    )
    grid = grid.to(fp8_dtype).float()
    grid[..., 0] = fp8_max
    batch.query.copy_((grid * 2.0**-8).to(batch.query.dtype))


@dataclass
class PagedBatch:
    """Inputs of one kernel call, built by ``make_paged_batch``."""

    query: torch.Tensor  # [num_tokens, num_q_heads, head_size]
    kv_cache: torch.Tensor  # [num_blocks, 2, num_kv_heads, block_size, head_size]
    key_cache: torch.Tensor  # kv_cache[:, 0]
    value_cache: torch.Tensor  # kv_cache[:, 1]
    block_table: torch.Tensor  # [num_seqs, max_blocks] int32, shuffled pages
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_lens: list[int]
    max_query_len: int
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None

    def ref_kwargs(self) -> dict:
        return {
            "query": self.query,
            "key_cache": self.key_cache,
            "value_cache": self.value_cache,
            "block_table": self.block_table,
            "query_start_loc": self.query_start_loc,
            "seq_lens": self.seq_lens,
            "k_scale": None if self.k_scale is None else self.k_scale.item(),
            "v_scale": None if self.v_scale is None else self.v_scale.item(),
        }


def _nan_of(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(float("nan")).to(dtype)


def make_paged_batch(
    *,
    seqs: list[tuple[int, int]],
    num_q_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    q_dtype: torch.dtype = torch.bfloat16,
    cache_dtype: torch.dtype | None = None,
    spare_blocks: int = 3,
    seed: int = 0,
    device: str = DEVICE,
) -> PagedBatch:
    """A batch of sequences given as ``(query_len, kv_len)`` pairs, in order.

    K/V and queries are randn (magnitude ~1). Pages are assigned from a random
    permutation of all blocks, so block tables are shuffled. Everything a correct
    kernel never reads is NaN: cache slots past each sequence's end, unused pages,
    and the pages that unused block-table entries point to; a kernel that reads
    such data without masking produces NaN and fails the comparison.
    For fp8 caches, K/V are quantised with per-tensor scales (stored = x / scale).
    """
    gen = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or q_dtype
    pages_per_seq = [math.ceil(kv / block_size) for _, kv in seqs]
    num_blocks = sum(pages_per_seq) + spare_blocks + 1
    max_blocks = max(max(pages_per_seq), 1) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    poison_block = int(perm[-1])  # all-NaN page that unused table entries name
    block_table = torch.full((len(seqs), max_blocks), poison_block, dtype=torch.int32)
    shape = (num_blocks, 2, num_kv_heads, block_size, head_size)
    kv_fp32 = torch.full(shape, float("nan"))
    used = 0
    for s, (_, kv_len) in enumerate(seqs):
        pages = perm[used : used + pages_per_seq[s]]
        used += pages_per_seq[s]
        block_table[s, : len(pages)] = pages.to(torch.int32)
        for p, page in enumerate(pages.tolist()):
            valid = min(block_size, kv_len - p * block_size)
            kv_fp32[page, :, :, :valid] = torch.randn(
                (2, num_kv_heads, valid, head_size), generator=gen
            )
    k_scale = v_scale = None
    if cache_dtype in FP8_DTYPES:
        # Scales put randn (|x| up to ~4.5) near the middle of the e4m3 range.
        k_scale = torch.tensor([0.03], dtype=torch.float32)
        v_scale = torch.tensor([0.02], dtype=torch.float32)
        scaled = kv_fp32.clone()
        scaled[:, 0] /= k_scale
        scaled[:, 1] /= v_scale
        finite = ~torch.isnan(scaled)
        kv = torch.where(finite, scaled, 0.0).to(cache_dtype)
        nan_byte = _nan_of(cache_dtype).view(torch.uint8)
        kv.view(torch.uint8)[~finite] = nan_byte
        k_scale, v_scale = k_scale.to(device), v_scale.to(device)
    else:
        kv = kv_fp32.to(cache_dtype)
    kv = kv.to(device)

    query_lens = [q for q, _ in seqs]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    query = torch.randn((starts[-1], num_q_heads, head_size), generator=gen)
    return PagedBatch(
        query=query.to(q_dtype).to(device),
        kv_cache=kv,
        key_cache=kv[:, 0],
        value_cache=kv[:, 1],
        block_table=block_table.to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([kv for _, kv in seqs], dtype=torch.int32, device=device),
        query_lens=query_lens,
        max_query_len=max(query_lens, default=0),
        k_scale=k_scale,
        v_scale=v_scale,
    )
