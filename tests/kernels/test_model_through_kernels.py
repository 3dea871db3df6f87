# SPDX-License-Identifier: Apache-2.0
"""A small Llama generating through this fork's kernels, against transformers.

transformers' Llama runs the model with its own attention (the reference, fp32). The
same weights then run with every attention call replaced by what the backend does:
the new K/V rows written to a paged cache (``write_to_paged_cache``), attention by
``paged_attention`` (prefill of all prompts in one batch, then one decode step per
generated token, split-KV for the decodes), bf16 q/k/v and cache. Pages are handed
out shuffled, so block tables are not contiguous, and unwritten slots hold NaN.

The weights are random (seeded), with the query and key projections scaled up so
attention is sharp (scores of a few units, as in trained models) and the LM head
scaled so greedy choices have clear margins: a kernel that is wrong (a bad max, a
wrong page, a lost scale) changes the logits by far more than bf16 rounding does.
Short prompts fit one page or a few; two long prompts span ~40 pages of 16 tokens.
"""

import math

import pytest
import torch

from tests.kernels.conftest import DEVICE
from vllm.attention.ops.paged_attention import DECODE_QUERY_LEN, paged_attention
from vllm.attention.ops.paged_cache_write import write_to_paged_cache
from vllm.attention.ops.triton_paged_decode_attention_2d import (
    WORKSPACE_DTYPE,
    decode_workspace_shape,
)

BLOCK_SIZE = 16
DTYPE = torch.bfloat16
DECODE_SPLITS = 2
NEW_TOKENS = 6
VOCAB = 128

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
        m.lm_head.weight.mul_(10.0)
    m.generation_config.eos_token_id = None
    return m.to(DEVICE)


def _prompts():
    gen = torch.Generator().manual_seed(1)
    lens = [5, 9, 16, 17, 23, 31, 40, 64, 560, 640]
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lens]


class PagedKernelRunner:
    """The model's layers with attention through the fork's cache write + dispatch."""

    def __init__(self, model, prompt_lens, max_new):
        cfg = model.config
        self.model = model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_size = cfg.head_dim
        pages = [math.ceil((n + max_new) / BLOCK_SIZE) for n in prompt_lens]
        gen = torch.Generator().manual_seed(0)
        perm = torch.randperm(sum(pages) + 1, generator=gen).to(torch.int32)
        # Unused entries name the spare page, which stays NaN.
        table = torch.full((len(pages), max(pages)), int(perm[-1]), dtype=torch.int32)
        self.block_table = table
        start = 0
        for s, n in enumerate(pages):
            self.block_table[s, :n] = perm[start : start + n]
            start += n
        self.block_table = self.block_table.to(DEVICE)
        shape = (len(perm), self.kv_heads, BLOCK_SIZE, self.head_size)
        # NaN in every slot not yet written: reading one poisons the answer.
        self.caches = [
            tuple(
                torch.full(shape, float("nan"), dtype=DTYPE, device=DEVICE)
                for _ in "kv"
            )
            for _ in range(cfg.num_hidden_layers)
        ]
        self.workspace = torch.empty(
            decode_workspace_shape(
                max_num_seqs=len(pages),
                num_q_heads=self.heads,
                head_size=self.head_size,
                num_splits=DECODE_SPLITS,
            ),
            dtype=WORKSPACE_DTYPE,
            device=DEVICE,
        )

    def step(self, ids, positions, seq_of_token, seq_lens, query_lens):
        """Logits of the last token of each sequence after a forward of ``ids``."""
        m = self.model.model
        num_tokens = ids.shape[0]
        slot_pages = self.block_table[seq_of_token, positions // BLOCK_SIZE].long()
        slots = slot_pages * BLOCK_SIZE + positions % BLOCK_SIZE
        query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        query_start_loc[1:] = torch.cumsum(torch.tensor(query_lens), 0)
        query_start_loc = query_start_loc.to(DEVICE)
        decode = max(query_lens) == DECODE_QUERY_LEN
        hidden = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(hidden[None], positions[None])
        for layer, (key_cache, value_cache) in zip(m.layers, self.caches):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(1, num_tokens, self.heads, self.head_size)
            k = attn.k_proj(x).view(1, num_tokens, self.kv_heads, self.head_size)
            v = attn.v_proj(x).view(num_tokens, self.kv_heads, self.head_size)
            q, k = transformers.models.llama.modeling_llama.apply_rotary_pos_emb(
                q, k, cos, sin, unsqueeze_dim=2
            )
            write_to_paged_cache(
                key=k[0].to(DTYPE).contiguous(),
                value=v.to(DTYPE).contiguous(),
                key_cache=key_cache,
                value_cache=value_cache,
                slot_mapping=slots,
            )
            out = torch.empty(
                num_tokens, self.heads, self.head_size, dtype=DTYPE, device=DEVICE
            )
            paged_attention(
                query=q[0].to(DTYPE).contiguous(),
                key_cache=key_cache,
                value_cache=value_cache,
                output=out,
                block_table=self.block_table,
                query_start_loc=query_start_loc,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
                num_decodes=len(seq_lens) if decode else 0,
                num_decode_tokens=num_tokens if decode else 0,
                max_query_len=max(query_lens),
                softmax_scale=attn.scaling,
                decode_num_splits=DECODE_SPLITS,
                decode_workspace=self.workspace,
            )
            hidden = hidden + attn.o_proj(out.float().view(num_tokens, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        last = query_start_loc[1:].long() - 1
        return self.model.lm_head(m.norm(hidden[last]))

    def generate(self, prompts, new_tokens):
        seq_lens = [len(p) for p in prompts]
        ids = torch.tensor([t for p in prompts for t in p], device=DEVICE)
        positions = torch.cat([torch.arange(n) for n in seq_lens]).to(DEVICE)
        seq_of_token = torch.cat([torch.full((n,), s) for s, n in enumerate(seq_lens)])
        seq_of_token = seq_of_token.to(DEVICE)
        answers = [[] for _ in prompts]
        self.logits = []  # [num_seqs, vocab] per generated token
        with torch.no_grad():
            logits = self.step(ids, positions, seq_of_token, seq_lens, seq_lens)
            for _ in range(new_tokens):
                self.logits.append(logits)
                nxt = logits.argmax(-1)
                for s, t in enumerate(nxt.tolist()):
                    answers[s].append(t)
                positions = torch.tensor(seq_lens, device=DEVICE)
                seq_lens = [n + 1 for n in seq_lens]
                seq_of_token = torch.arange(len(prompts), device=DEVICE)
                logits = self.step(
                    nxt, positions, seq_of_token, seq_lens, [1] * len(prompts)
                )
        self.answer_ids = answers
        return answers


def _reference_logits(model, prompts, answers):
    """The fp32 logits of transformers at the positions that predicted each answer token
    (teacher-forced on the kernels' own answers): [new_tokens, num_seqs, vocab]."""
    per_seq = []
    for prompt, answer in zip(prompts, answers):
        ids = torch.tensor([prompt + answer[:-1]], device=DEVICE)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 :]
        per_seq.append(logits)
    return torch.stack(per_seq, 1)


def test_model_generates_the_same_through_the_kernels(model):
    prompts = _prompts()
    runner = PagedKernelRunner(model, [len(p) for p in prompts], NEW_TOKENS)
    runner.generate(prompts, NEW_TOKENS)
    ref_logits = _reference_logits(model, prompts, runner.answer_ids)
    ours_logits = torch.stack(runner.logits)
    assert torch.isfinite(ours_logits).all()  # no NaN slot or spare page was read
    diff = (ours_logits - ref_logits).abs().max().item()
    spread = ref_logits.std().item()
    # Seen on the CPU: 0.30 against a spread of 4.5; 6.3 with the softmax scale 20% off.
    assert diff < 0.25 * spread, (diff, spread)
    # Greedy choices agree wherever the reference is not near a tie: a margin
    # between its two best logits of more than twice the largest difference seen
    # above leaves bf16 rounding no room to flip the choice; most positions qualify.
    top2 = ref_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * diff
    assert clear.float().mean() > 0.5, clear.float().mean()
    agree = ours_logits.argmax(-1) == ref_logits.argmax(-1)
    assert agree[clear].all(), (agree, clear)
