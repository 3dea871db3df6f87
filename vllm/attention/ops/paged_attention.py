# SPDX-License-Identifier: Apache-2.0
"""The one dispatch function of the fork's paged attention, by query length.

vLLM orders a batch with decodes first (the backend sets
``reorder_batch_threshold = DECODE_QUERY_LEN``), so sequences
``[0, num_decodes)`` have query length ``DECODE_QUERY_LEN`` and go to the decode
kernel, and sequences ``[num_decodes, num_seqs)`` (chunked prefill, prefix-cache
hits, spec-decode verification, ...) go to prefix_prefill. The two launches cover
disjoint rows of ``output``.

This runs every step for every layer, so it does host integer arithmetic only, on
values the backend's builder computed once per step; it reads no tensor contents
(no device sync) and allocates nothing.
"""

import torch

from vllm.attention.ops.prefix_prefill import prefix_prefill_attention
from vllm.attention.ops.triton_paged_decode_attention_2d import paged_decode_attention

# Query length of a decode step; sequences with this query length (placed first in
# the batch) use the decode kernel.
DECODE_QUERY_LEN = 1


def paged_attention(
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    output: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    num_decodes: int,
    num_decode_tokens: int,
    max_query_len: int,
    softmax_scale: float,
    num_seqs: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    decode_num_splits: int = 1,
    decode_workspace: torch.Tensor | None = None,
    prefill_max_seq_len: int | None = None,
) -> None:
    """Attention of every query token over its sequence's paged K/V, into ``output``.

    Args (shapes as in docs/design.md):
        query, output: ``[num_tokens, num_q_heads, head_size]``.
        key_cache, value_cache: ``[num_blocks, num_kv_heads, block_size, head_size]``.
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32.
        query_start_loc: ``[num_seqs + 1]`` int32; seq_lens: ``[num_seqs]`` int32.
        num_decodes: leading sequences with query length DECODE_QUERY_LEN.
        num_decode_tokens: their tokens, ``num_decodes * DECODE_QUERY_LEN``.
        max_query_len: longest query of the batch (host int).
        num_seqs: sequences in the batch; default ``seq_lens.shape[0]``.
        decode_num_splits, decode_workspace: split-KV of the decode part
            (``choose_decode_splits`` / ``decode_workspace_shape``, chosen by the
            builder from the batch shape so CUDA graphs stay valid).
        prefill_max_seq_len: host int >= the longest KV length of the prefill
            part, or None: lets it split its keys when its grid is small
            (``prefix_prefill.choose_prefill_splits``).
        The rest are the attention features of both kernels.

    Both kernels check their part of the batch against the one input contract
    (``triton_attention_common.check_attention_inputs``) and raise ValueError.
    """
    if num_seqs is None:
        num_seqs = seq_lens.shape[0]
    if num_decode_tokens != num_decodes * DECODE_QUERY_LEN:
        raise ValueError(
            f"paged_attention: num_decode_tokens ({num_decode_tokens}) must be "
            f"num_decodes ({num_decodes}) * DECODE_QUERY_LEN ({DECODE_QUERY_LEN}); "
            "the batch must be reordered with decodes first."
        )
    if not 0 <= num_decodes <= num_seqs:
        raise ValueError(
            f"paged_attention: num_decodes ({num_decodes}) must be in [0, num_seqs "
            f"= {num_seqs}]."
        )
    features = {
        "k_scale": k_scale,
        "v_scale": v_scale,
        "sliding_window": sliding_window,
        "alibi_slopes": alibi_slopes,
        "logits_soft_cap": logits_soft_cap,
        "sinks": sinks,
    }
    common = {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "output": output,
        "block_table": block_table,
        "seq_lens": seq_lens,
        "softmax_scale": softmax_scale,
    }
    if num_decodes > 0:
        paged_decode_attention(
            **common,
            **features,
            seq_start=0,
            num_seqs=num_decodes,
            num_splits=decode_num_splits,
            workspace=decode_workspace,
        )
    if num_seqs > num_decodes:
        prefix_prefill_attention(
            **common,
            **features,
            query_start_loc=query_start_loc,
            max_query_len=max_query_len,
            seq_start=num_decodes,
            num_seqs=num_seqs - num_decodes,
            max_seq_len=prefill_max_seq_len,
        )
