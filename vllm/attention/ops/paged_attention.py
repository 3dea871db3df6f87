# SPDX-License-Identifier: Apache-2.0
"""The one dispatch function of the fork's paged attention, by query length.

vLLM orders a batch with decodes first (the backend sets
``reorder_batch_threshold = DECODE_QUERY_LEN``), so sequences
``[0, num_decodes)`` have query length ``DECODE_QUERY_LEN`` and go to the decode
kernel, and sequences ``[num_decodes, num_seqs)`` (chunked prefill, prefix-cache
hits, spec-decode verification, ...) go to prefix_prefill. The two launches cover
disjoint rows of ``output``.

This runs every step for every layer, so with the plans the backend's builder
made once per batch (``decode_config``, ``decode_num_splits``,
``decode_workspace``, ``prefill_plans``) it checks the inputs once and launches:
host integer arithmetic only, no tensor read (no device sync), no allocation, no
table lookup. Without plans (tests, benchmarks) it makes them here.
"""

from collections.abc import Mapping

import numpy as np
import torch

from vllm.attention.ops.prefix_prefill import (
    PrefillLayer,
    PrefillPlan,
    check_sequence_range,
    launch_prefix_prefill,
    plan_prefill,
)
from vllm.attention.ops.triton_attention_common import (
    AttentionInputs,
    check_attention_inputs,
)
from vllm.attention.ops.triton_paged_decode_attention_2d import (
    config_for,
    launch_paged_decode,
)
from vllm.attention.ops.tuning.decode_configs import DecodeConfig

# Query length of a decode step; sequences with this query length (placed first in
# the batch) use the decode kernel.
DECODE_QUERY_LEN = 1


class StepKVPages:
    """The keys of attention without a cache (encoder self-attention): the step's
    own K/V rows, for the paged kernels. ``views`` gives the step's key and value
    ``[tokens, kv_heads, head_size]`` as caches of one-key pages ``[tokens,
    kv_heads, 1, head_size]`` (no copy); ``table`` the block table whose row ``r``
    maps page ``j`` to row ``query_start_loc[r] + j``, and the requests' key counts
    (their query lengths). Every request then runs in the prefill kernel,
    non-causally (``num_decodes=0``, ``causal=False``).

    ``table`` writes into buffers allocated here once, which CUDA graphs read
    where they are: ``max_num_seqs`` rows (grown if a batch has more) of
    ``max_query_len`` columns rounded up to a multiple of 16, so that the block
    table's row stride, which Triton specialises on, keeps one class."""

    def __init__(self, *, max_num_seqs: int, max_query_len: int, device):
        width = -(-max(1, max_query_len) // 16) * 16
        self.keys = torch.arange(width, dtype=torch.int32, device=device)
        self._allocate(max_num_seqs)

    def _allocate(self, rows: int) -> None:
        self.block_table = torch.zeros(
            (rows, self.keys.shape[0]), dtype=torch.int32, device=self.keys.device
        )
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=self.keys.device)

    @property
    def stride(self) -> int:
        """Row stride of ``table``'s block table."""
        return self.block_table.stride(0)

    @staticmethod
    def views(key: torch.Tensor, value: torch.Tensor) -> tuple:
        """The kernels read K and V with one set of strides. Views of one fused
        QKV output share them; where a model transformed one of the two (Gemma-3
        normalises K, not V), both are copied into one tensor."""
        if key.stride() != value.stride():
            key, value = torch.stack((key, value)).unbind()
        return key.unsqueeze(2), value.unsqueeze(2)

    def table(
        self, query_start_loc: torch.Tensor, num_reqs: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block_table, seq_lens)`` of a batch's ``num_reqs`` requests, whose
        queries are at most ``max_query_len`` long."""
        if num_reqs > self.block_table.shape[0]:
            self._allocate(num_reqs)
        starts = query_start_loc[:num_reqs]
        block_table = self.block_table[:num_reqs]
        torch.add(starts[:, None], self.keys, out=block_table)
        seq_lens = self.seq_lens[:num_reqs]
        torch.sub(query_start_loc[1 : num_reqs + 1], starts, out=seq_lens)
        return block_table, seq_lens


def split_decodes(
    query_start_loc_cpu: torch.Tensor, num_reqs: int, max_query_len: int
) -> tuple[int, int]:
    """``(num_decodes, num_decode_tokens)``: the leading run of requests whose query
    length is ``DECODE_QUERY_LEN``, and their token count.

    vLLM orders decodes first (``reorder_batch_threshold``); everything after the
    first other query length goes to prefix_prefill, which is correct for any
    query length, so a batch out of order is slower, never wrong. In a decode-only
    batch, trailing requests of query length 0 are CUDA-graph padding: they count
    as decodes with one (padding) token row each and ``seq_len`` 0, which the
    decode kernel turns into zeros.
    """
    if max_query_len <= DECODE_QUERY_LEN:
        return num_reqs, num_reqs * DECODE_QUERY_LEN
    starts = query_start_loc_cpu[: num_reqs + 1].numpy()
    others = np.flatnonzero(np.diff(starts) != DECODE_QUERY_LEN)
    num_decodes = int(others[0]) if others.size else num_reqs
    return num_decodes, num_decodes * DECODE_QUERY_LEN


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
    alibi_sqrt: bool = False,
    causal: bool = True,
    decode_num_splits: int = 1,
    decode_workspace: torch.Tensor | None = None,
    decode_config: DecodeConfig | None = None,
    prefill_plans: Mapping[PrefillLayer, PrefillPlan] | None = None,
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
        decode_config: the decode launch's config, or None: looked up here
            (``triton_paged_decode_attention_2d.decode_config``).
        prefill_plans: the prefill part's launch plans by layer
            (``prefix_prefill.plan_prefill`` for sequences ``[num_decodes,
            num_seqs)``, one per kind of layer: the backend's builder makes them
            once per batch); the one of these inputs' layer
            (``PrefillLayer.of_inputs``) is launched. Without one it is planned
            here, from ``prefill_max_seq_len``.
        prefill_max_seq_len: without a plan, a host int >= the longest KV length
            of the prefill part, or None: lets it split its keys when its grid
            is small (``prefix_prefill.choose_prefill_splits``).
        causal: False: every query sees all ``seq_len`` keys of its sequence,
            or with a sliding window those less than W away on either side (a
            decode's one query, at the last key, sees the same keys either way,
            so only the prefill kernel takes the flag).
        The rest are the attention features of both kernels.

    The inputs are checked once against the one input contract
    (``triton_attention_common.check_attention_inputs``): ValueError.
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
    inputs = AttentionInputs(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        output=output,
        block_table=block_table,
        seq_lens=seq_lens,
        softmax_scale=softmax_scale,
        query_start_loc=query_start_loc,
        k_scale=k_scale,
        v_scale=v_scale,
        sliding_window=sliding_window,
        alibi_slopes=alibi_slopes,
        logits_soft_cap=logits_soft_cap,
        sinks=sinks,
        alibi_sqrt=alibi_sqrt,
        causal=causal,
    )
    check_attention_inputs("paged_attention", inputs)
    if num_decodes > 0:
        if decode_config is None:
            decode_config = config_for(inputs, decode_num_splits)
        launch_paged_decode(
            inputs,
            seq_start=0,
            num_seqs=num_decodes,
            num_splits=decode_num_splits,
            workspace=decode_workspace,
            config=decode_config,
        )
    if num_seqs > num_decodes:
        check_sequence_range(
            "paged_attention", num_decodes, num_seqs - num_decodes, seq_lens.shape[0]
        )
        layer = PrefillLayer.of_inputs(inputs)
        prefill_plan = (prefill_plans or {}).get(layer)
        if prefill_plan is None:
            prefill_plan = plan_prefill(
                layer=layer,
                device=query.device,
                seq_start=num_decodes,
                num_seqs=num_seqs - num_decodes,
                num_tokens=query.shape[0],
                max_query_len=max_query_len,
                max_seq_len=prefill_max_seq_len,
            )
        elif (prefill_plan.seq_start, prefill_plan.num_seqs) != (
            num_decodes,
            num_seqs - num_decodes,
        ):
            raise ValueError(
                f"paged_attention: the prefill plan covers sequences "
                f"[{prefill_plan.seq_start}, "
                f"{prefill_plan.seq_start + prefill_plan.num_seqs}), the batch's "
                f"prefills are [{num_decodes}, {num_seqs})."
            )
        launch_prefix_prefill(prefill_plan, inputs, layer=layer)
