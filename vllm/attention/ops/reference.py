# SPDX-License-Identifier: Apache-2.0
"""The one pure-torch reference for paged attention in this fork.

Every kernel test and every benchmark compares against ``ref_paged_attention``. It is
written for clarity, not speed: it walks each sequence's block table page by page,
dequantises fp8 pages with their per-tensor scales, and computes the softmax in fp32.

Cache layout (see docs/design.md): ``key_cache`` and ``value_cache`` are
``[num_blocks, num_kv_heads, block_size, head_size]``.
"""

import math

import torch


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, scale=None
) -> torch.Tensor:
    """The first ``seq_len`` keys (or values) of one sequence as fp32
    ``[seq_len, num_kv_heads, head_size]``."""
    block_size = cache.shape[2]
    num_pages = (seq_len + block_size - 1) // block_size
    pages = cache[block_table_row[:num_pages].long()]  # [pages, kv_heads, bs, d]
    flat = pages.float().permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[3])
    if scale is not None:
        flat = flat * float(scale)
    return flat[:seq_len]


def ref_paged_attention(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    k_scale=None,
    v_scale=None,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_sqrt: bool = False,
    causal: bool = True,
) -> torch.Tensor:
    """Attention of every query token over its sequence's paged K/V, in fp32.

    query: [num_tokens, num_q_heads, head_size]; query_start_loc: [num_seqs + 1];
    seq_lens: [num_seqs], KV length including the new tokens. Returns fp32
    [num_tokens, num_q_heads, head_size]. Semantics as in docs/design.md; with
    ``causal=False`` every query sees all ``seq_len`` keys (with a window
    ``W``: those less than ``W`` away on either side).
    """
    num_q_heads = query.shape[1]
    num_kv_heads = key_cache.shape[1]
    group = num_q_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    starts = query_start_loc.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        q = query[starts[s] : starts[s + 1]].float()  # [q_len, Hq, d]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        k = gather_kv(key_cache, block_table[s], seq_len, k_scale)
        v = gather_kv(value_cache, block_table[s], seq_len, v_scale)
        k = k.repeat_interleave(group, dim=1)  # [seq_len, Hq, d]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
        if logits_soft_cap:  # None or 0: off
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        if alibi_slopes is not None:
            dist = (k_pos - q_pos).float()
            if alibi_sqrt:  # keys after the query are masked below
                dist = -torch.sqrt((-dist).clamp(min=0))
            scores = scores + alibi_slopes.float()[:, None, None] * dist
        visible = (k_pos <= q_pos) | (not causal)
        if sliding_window is not None:  # two-sided when not causal
            distance = q_pos - k_pos if causal else (q_pos - k_pos).abs()
            visible = visible & (distance < sliding_window)
        scores = scores.masked_fill(~visible, -math.inf)
        if sinks is not None:
            sink = sinks.float()[:, None, None].expand(num_q_heads, q_len, 1)
            scores = torch.cat([scores, sink], dim=-1)
            probs = torch.softmax(scores, dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[starts[s] : starts[s + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out
