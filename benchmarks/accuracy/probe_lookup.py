"""Learnability probe for the accuracy tasks: torch only (no transformers, no vLLM).

Trains a Llama-shaped model of ``ACCURACY_MODEL``'s sizes (RMSNorm, RoPE,
grouped-query attention through ``scaled_dot_product_attention``, SwiGLU) on
``tasks.training_example`` with the curriculum, loss mask and optimiser of
``train_tiny.py``, and prints teacher-forced accuracy on addition and on recall at
>= 256 and >= 4096 tokens every ``--check-every-s``. It answers "does this task
design form a lookup within the training budget?" on a GPU host that has torch but
not the vLLM bundle (a few device minutes); the model is not saved.

    python3 benchmarks/accuracy/probe_lookup.py --time-budget-s 150 --out $OUT/p.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks.accuracy import tasks  # noqa: E402
from benchmarks.accuracy.train_tiny import (  # noqa: E402
    FULL_SCHEDULE,
    BatchSource,
    check_sets,
    lr_at,
    masked_loss,
    run_checks,
)
from benchmarks.models.configs import ACCURACY_MODEL  # noqa: E402
from benchmarks.models.tokenizer import char_vocab_size  # noqa: E402


def build_model(vocab: int):
    import torch
    from torch import nn
    from torch.nn import functional as F

    c = ACCURACY_MODEL
    h, heads, kv, d = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
    )

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(h, eps=1e-5), nn.RMSNorm(h, eps=1e-5)
            self.q = nn.Linear(h, heads * d, bias=False)
            self.kv = nn.Linear(h, 2 * kv * d, bias=False)
            self.o = nn.Linear(heads * d, h, bias=False)
            self.up = nn.Linear(h, 2 * c["intermediate_size"], bias=False)
            self.down = nn.Linear(c["intermediate_size"], h, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            y = self.n1(x)
            q = self.q(y).view(b, t, heads, d).transpose(1, 2)
            k, v = self.kv(y).view(b, t, 2, kv, d).permute(2, 0, 3, 1, 4)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, heads * d))
            g, u = self.up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)

    def rope(x, cos, sin):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, h)
            self.blocks = nn.ModuleList(Block() for _ in range(c["num_hidden_layers"]))
            self.norm = nn.RMSNorm(h, eps=1e-5)
            self.head = nn.Linear(h, vocab, bias=False)
            inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, input_ids, use_cache=False):
            """transformers' call convention, so train_tiny's checks can use it."""
            ids = input_ids
            pos = torch.arange(ids.shape[1], device=ids.device).float()
            ang = torch.outer(pos, self.inv_freq)
            cos, sin = ang.cos()[None, None], ang.sin()[None, None]
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x, cos.to(x.dtype), sin.to(x.dtype))
            return SimpleNamespace(logits=self.head(self.norm(x)))

    model = Model()
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--time-budget-s", type=float, default=150.0)
    p.add_argument("--check-every-s", type=float, default=30.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--check-problems", type=int, default=256, help="addition; recall: 1/4 each"
    )
    p.add_argument("--device", default="cuda", help="cpu: a smoke test only")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import torch

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    model = build_model(char_vocab_size(tasks.ALPHABET)).to(dev)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=args.lr,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        fused=dev.type == "cuda",
    )
    checks = check_sets(args.check_problems, args.seed)
    log = []

    def check(step: int, elapsed: float, loss: float) -> None:
        model.eval()
        rec = {"step": step, "elapsed_s": round(elapsed, 1), "loss": round(loss, 4)}
        rec.update(run_checks(model, checks, dev))
        model.train()
        log.append(rec)
        print(f"probe: {rec}", flush=True)

    batches = BatchSource(args.seed, FULL_SCHEDULE, args.workers)
    t0 = time.monotonic()
    step, next_check = 0, args.check_every_s
    while True:
        elapsed = time.monotonic() - t0
        progress = elapsed / args.time_budget_s
        if progress >= 1.0:
            break
        x, w = (t.to(dev) for t in batches.next(progress))
        for g in opt.param_groups:
            g["lr"] = lr_at(progress, args.lr)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=x[:, :-1]).logits
        loss = masked_loss(logits, x[:, 1:], w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if elapsed >= next_check:
            check(step, elapsed, loss.item())
            next_check += args.check_every_s
    batches.close()
    check(step, time.monotonic() - t0, loss.item())
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "gpu": torch.cuda.get_device_name()
                    if dev.type == "cuda"
                    else "cpu",
                    "torch": torch.__version__,
                    "task_design": "tasks.py v3 (one-token keys, masked loss)",
                    "command": " ".join(sys.argv),
                    "log": log,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
