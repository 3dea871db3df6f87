"""Train the tiny Llama of the accuracy harness (addition + long-range key recall).

A Llama-architecture model written here in plain torch (RMSNorm, RoPE, grouped-query
attention through ``scaled_dot_product_attention``, SwiGLU; bf16 autocast, fp32 master
weights, AdamW, cosine schedule over a wall-clock budget, fixed seed), saved as an HF
``LlamaForCausalLM`` checkpoint (safetensors + config + character tokenizer), so vLLM
loads it like any Llama. The export is exact: tests load it with transformers and
compare logits. The loss is taken on the predictable positions only
(``tasks.training_example``).

Curriculum (``CURRICULUM``): short streams first (512 tokens, many lookups per step),
where the copy-from-earlier-occurrence lookup forms, then alternating 2048- and
9216-token streams, so RoPE positions past 8k and recall over 4k+ tokens are trained.
The lookup forms abruptly and not at the same step in every run, so the switch waits
for it: the trainer's short-range recall check runs every ``--check-every-s`` and the
short phase ends when it passes (within bounds). Every check is logged; the final one
(teacher-forced argmax over the answer, which equals greedy decoding's verdict) is
``check`` in ``train_log.json``.

The checkpoint is not kept in the repository: write it to a cache directory outside
it and pass that directory to ``eval.py --model-dir``. The seed fixes the data, the
initialisation and the batch order; the step count follows ``--time-budget-s`` unless
``--max-steps`` ends training first.

GPU (about 3 minutes on one H200; torch and safetensors only, no vLLM needed):
    python benchmarks/accuracy/train_tiny.py --out ~/.cache/tritonattn-accuracy-model
CPU smoke test (a few steps at toy size, seconds):
    python benchmarks/accuracy/train_tiny.py --device cpu --toy --max-steps 3 \
        --out OUT
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks.accuracy import tasks  # noqa: E402
from benchmarks.models.configs import ACCURACY_MODEL, write_json  # noqa: E402
from benchmarks.models.tokenizer import (  # noqa: E402
    char_vocab_size,
    make_char_tokenizer,
    special_ids,
)


@dataclass(frozen=True)
class Curriculum:
    """Two phases of ``[(stream length, batch), ...]``, alternating within a phase
    (each full-size step is about 131k tokens). The short phase ends once the check
    named ``gate`` reaches ``gate_acc`` and at least ``min_end`` of the budget has
    passed, and at ``max_end`` in any case (as a fraction of the budget)."""

    short: tuple
    long: tuple
    min_end: float
    max_end: float
    gate: str
    gate_acc: float = 0.9


# On an H200 the lookup formed between 40 and 80 s of a 170 s budget in one run
# and not at all in another with a fixed 60 s short phase.
CURRICULUM = Curriculum(
    short=((512, 256),),
    long=((2048, 64), (9216, 14)),
    min_end=0.2,
    max_end=0.6,
    gate="recall>=64",  # within the short streams' length
)
# Toy sizes for the CPU smoke test.
TOY_CURRICULUM = Curriculum(
    short=((128, 2),), long=((128, 2), (256, 1)), min_end=0.2, max_end=0.5,
    gate="recall>=64",
)  # fmt: skip
TOY_MODEL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "intermediate_size": 128,
}


def model_config(toy: bool) -> dict:
    cfg = {
        k: v
        for k, v in ACCURACY_MODEL.items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    if toy:
        cfg.update(TOY_MODEL)
    ids = special_ids()
    cfg.update(
        vocab_size=char_vocab_size(tasks.ALPHABET),
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )
    return cfg


def make_rows(job: tuple[int, int, int]) -> tuple[list, list]:
    """``(seed, length, batch)`` -> (token id rows with BOS first, loss masks of the
    next-token targets: 1 where the target is predictable, see tasks). Pure Python, so
    worker processes can make batches while the GPU trains."""
    seed, length, batch = job
    rng = random.Random(seed)
    rows, masks = [], []
    for _ in range(batch):
        text, mask = tasks.training_example(rng, length)
        rows.append([tasks.BOS_ID] + tasks.encode(text))
        masks.append(mask)
    return rows, masks


class BatchSource:
    """Batches of the curriculum phase the training is in, made ahead by ``workers``
    processes (0: in this process). One Python process cannot keep up with an H200."""

    def __init__(self, seed: int, workers: int):
        self.seed, self.step = seed, 0
        self.pool = mp.get_context("fork").Pool(workers) if workers else None
        self.pending: list = []
        self.depth = 2 * workers

    def _job(self, shapes, k: int) -> tuple[int, int, int]:
        length, batch = shapes[k % len(shapes)]
        return (self.seed * 1_000_003 + k, length, batch)

    def next(self, shapes):
        """The next batch, of ``shapes[step % len(shapes)]``."""
        import torch

        if self.pool is None:
            rows, masks = make_rows(self._job(shapes, self.step))
        else:
            # Batches made ahead for an earlier phase are dropped: step k always gets
            # the batch of seed k in the shape of its own phase, with or without a pool.
            self.pending = [(sh, job) for sh, job in self.pending if sh == shapes]
            while len(self.pending) < self.depth:
                k = self.step + len(self.pending)
                job = self.pool.apply_async(make_rows, (self._job(shapes, k),))
                self.pending.append((shapes, job))
            rows, masks = self.pending.pop(0)[1].get()
        self.step += 1
        return torch.tensor(rows), torch.tensor(masks, dtype=torch.float)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()


def masked_loss(logits, targets, weights):
    """Cross-entropy averaged over the positions of weight 1."""
    import torch

    ce = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        reduction="none",
    )
    return (ce * weights.reshape(-1)).sum() / weights.sum().clamp(min=1.0)


def lr_at(progress: float, peak: float, warmup: float = 0.05) -> float:
    """Linear warm-up over the first ``warmup`` of progress, then cosine to 5% of
    peak."""
    progress = min(max(progress, 0.0), 1.0)
    if progress < warmup:
        return peak * progress / warmup
    t = (progress - warmup) / (1.0 - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * t)))


def teacher_forced_accuracy(model, problems, device, batch: int) -> float:
    """Fraction of problems whose answer + ';' is the argmax at every answer
    position."""
    import torch

    correct = 0
    for i in range(0, len(problems), batch):
        chunk = problems[i : i + batch]
        rows = [
            [tasks.BOS_ID] + tasks.encode(p.prompt + p.answer + tasks.END)
            for p in chunk
        ]
        width = max(map(len, rows))
        x = torch.full((len(rows), width), special_ids()["pad"], dtype=torch.long)
        for r, row in enumerate(rows):
            x[r, : len(row)] = torch.tensor(row)
        x = x.to(device)
        with (
            torch.no_grad(),
            torch.autocast(
                device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
            ),
        ):
            pred = model(input_ids=x, use_cache=False).logits.argmax(-1)
        for r, (p, row) in enumerate(zip(chunk, rows)):
            n_ans = len(p.answer) + 1
            start = len(row) - n_ans  # first answer token's index in the row
            got = pred[r, start - 1 : len(row) - 1].tolist()
            correct += got == row[start:]
    return correct / max(1, len(problems))


def check_sets(n: int, seed: int, toy: bool = False) -> dict[str, list]:
    """The trainer's own checks, by name: ``n`` addition problems and ``n // 4``
    recall problems per distance: >= 64 tokens inside the short streams' 512 (the
    curriculum's gate), >= 256 and >= 4096 (toy: 64 and 300). Short-range recall tells
    "no lookup learned" apart from "lookup learned, but not over 4k+ tokens"."""
    # (min length, max length, min distance, seed offset: earlier runs' sets unchanged)
    ranges = (
        [(200, 300, 64, 3), (600, 900, 300, 2)]
        if toy
        else [(300, 480, 64, 4), (1024, 2048, 256, 3), (5000, 8192, 4096, 2)]
    )
    sets = {"addition": tasks.addition_problems(n, seed=seed + 1)}
    for lo, hi, dist, offset in ranges:
        sets[f"recall>={dist}"] = tasks.recall_problems(
            max(2, n // 4),
            seed=seed + offset,
            min_len=lo,
            max_len=hi,
            min_distance=dist,
        )
    return sets


def run_checks(model, sets: dict[str, list], device) -> dict[str, float]:
    """Teacher-forced accuracy per check set (long prompts in smaller batches)."""
    return {
        name: teacher_forced_accuracy(
            model, problems, device, batch=64 if name == "addition" else 8
        )
        for name, problems in sets.items()
    }


def build_model(cfg: dict):
    """The Llama of ``cfg`` (``model_config``) in plain torch, called like transformers'
    models (``model(input_ids=...).logits``). Parameters are created in a fixed order
    and every matrix is drawn from N(0, initializer_range), so a seed gives the same
    weights on any machine."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    h, heads, kv, d = (
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    eps, inter = cfg["rms_norm_eps"], cfg["intermediate_size"]

    def rope(x, cos, sin):  # rotate the two halves (HF's rotate_half convention)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
            self.q = nn.Linear(h, heads * d, bias=False)
            self.kv = nn.Linear(h, 2 * kv * d, bias=False)  # K rows, then V rows
            self.o = nn.Linear(heads * d, h, bias=False)
            self.up = nn.Linear(h, 2 * inter, bias=False)  # gate rows, then up rows
            self.down = nn.Linear(inter, h, bias=False)

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

    class TinyLlama(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(cfg["vocab_size"], h)
            self.blocks = nn.ModuleList(
                Block() for _ in range(cfg["num_hidden_layers"])
            )
            self.norm = nn.RMSNorm(h, eps=eps)
            self.head = nn.Linear(h, cfg["vocab_size"], bias=False)
            inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, input_ids, use_cache=False):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device).float()
            ang = torch.outer(pos, self.inv_freq)
            cos, sin = ang.cos()[None, None], ang.sin()[None, None]
            x = self.emb(input_ids)
            for blk in self.blocks:
                x = blk(x, cos.to(x.dtype), sin.to(x.dtype))
            return SimpleNamespace(logits=self.head(self.norm(x)))

    model = TinyLlama()
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=cfg["initializer_range"])
    return model


def hf_state_dict(model, cfg: dict) -> dict:
    """``build_model``'s weights under transformers' ``LlamaForCausalLM`` names (the
    fused K/V and gate/up matrices split into their HF halves)."""
    kv_rows = cfg["num_key_value_heads"] * cfg["head_dim"]
    inter = cfg["intermediate_size"]
    out = {
        "model.embed_tokens.weight": model.emb.weight,
        "model.norm.weight": model.norm.weight,
        "lm_head.weight": model.head.weight,
    }
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": b.n1.weight,
            p + "post_attention_layernorm.weight": b.n2.weight,
            p + "self_attn.q_proj.weight": b.q.weight,
            p + "self_attn.k_proj.weight": b.kv.weight[:kv_rows],
            p + "self_attn.v_proj.weight": b.kv.weight[kv_rows:],
            p + "self_attn.o_proj.weight": b.o.weight,
            p + "mlp.gate_proj.weight": b.up.weight[:inter],
            p + "mlp.up_proj.weight": b.up.weight[inter:],
            p + "mlp.down_proj.weight": b.down.weight,
        }
    return {k: v.detach().contiguous() for k, v in out.items()}


def save_checkpoint(model, cfg: dict, out: Path) -> None:
    """HF Llama checkpoint: bf16 safetensors, config.json, tokenizer, generation
    config."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = {
        k: v.to(torch.bfloat16).cpu() for k, v in hf_state_dict(model, cfg).items()
    }
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(
        out / "config.json",
        dict(
            cfg,
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            torch_dtype="bfloat16",
        ),
    )
    ids = special_ids()
    make_char_tokenizer(out, tasks.ALPHABET, cfg["max_position_embeddings"])
    write_json(
        out / "generation_config.json",
        {
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"],
            "do_sample": False,
        },
    )


class ShortPhaseGate:
    """Decides, at each check, whether training moves on to the long streams."""

    def __init__(self, curriculum: Curriculum):
        self.c, self.ended_at = curriculum, None

    def shapes(self, progress: float) -> tuple:
        if self.ended_at is None and progress >= self.c.max_end:
            self.ended_at = self.c.max_end  # the bound, not the check, ended it
        return self.c.short if self.ended_at is None else self.c.long

    def update(self, progress: float, check: dict[str, float]) -> None:
        """Called with each check made during training."""
        passed = check[self.c.gate] >= self.c.gate_acc
        if self.ended_at is None and progress >= self.c.min_end and passed:
            self.ended_at = progress


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=170.0,
        help="wall-clock training budget (the LR schedule follows it)",
    )
    p.add_argument("--max-steps", type=int, default=4000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--toy", action="store_true", help="toy sizes for a CPU smoke test")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="batch-making processes (default 8 on CUDA, 0 on CPU)",
    )
    p.add_argument(
        "--check-problems",
        type=int,
        default=200,
        help="addition problems per check (recall: 1/4 per distance)",
    )
    p.add_argument(
        "--check-every-s",
        type=float,
        default=10.0,
        help="seconds of training between checks (0: check only at the end)",
    )
    args = p.parse_args(argv)

    import torch

    device = torch.device(args.device)
    if args.workers is None:
        args.workers = 8 if device.type == "cuda" else 0
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "train_tiny: CUDA requested but not available; use --device cpu"
        )
    cfg = model_config(args.toy)
    torch.manual_seed(args.seed)
    model = build_model(cfg).to(device)
    n_params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=args.lr,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        fused=device.type == "cuda",
    )
    curriculum = TOY_CURRICULUM if args.toy else CURRICULUM
    gate = ShortPhaseGate(curriculum)
    checks = check_sets(args.check_problems, args.seed, toy=args.toy)
    print(
        f"train_tiny: {n_params / 1e6:.2f}M params, {curriculum}, "
        f"budget {args.time_budget_s:.0f}s / {args.max_steps} steps",
        flush=True,
    )

    def check(progress: float, elapsed: float, final: bool = False) -> dict:
        model.eval()
        got = run_checks(model, checks, device)
        model.train()
        if not final:
            gate.update(progress, got)
        rec = {"step": step, "elapsed_s": round(elapsed, 1), "check": got}
        check_log.append(rec)
        print(f"train_tiny: {rec}", flush=True)
        return got

    batches = BatchSource(args.seed, args.workers)
    log, check_log = [], []
    t0 = time.monotonic()
    step, next_check = 0, args.check_every_s or math.inf
    try:
        while step < args.max_steps:
            elapsed = time.monotonic() - t0
            progress = max(step / args.max_steps, elapsed / args.time_budget_s)
            if progress >= 1.0:
                break
            if elapsed >= next_check:
                check(progress, elapsed)
                next_check = elapsed + args.check_every_s
            lr = lr_at(progress, args.lr)
            for g in opt.param_groups:
                g["lr"] = lr
            batch = batches.next(gate.shapes(progress))
            x, w = (t.to(device, non_blocking=True) for t in batch)
            with torch.autocast(
                device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
            ):
                logits = model(input_ids=x[:, :-1]).logits
            loss = masked_loss(logits, x[:, 1:], w)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 25 == 0 or step <= 2:
                rec = {
                    "step": step,
                    "len": x.shape[1] - 1,
                    "loss": loss.item(),
                    "lr": lr,
                    "elapsed_s": round(time.monotonic() - t0, 1),
                }
                log.append(rec)
                print(f"train_tiny: {rec}", flush=True)
    finally:
        batches.close()
    train_s = time.monotonic() - t0
    final = check(1.0, train_s, final=True)

    save_checkpoint(model, cfg, args.out)
    from benchmarks.harness import environment

    write_json(
        args.out / "train_log.json",
        {
            **environment(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "seed": args.seed,
            "steps": step,
            "train_s": round(train_s, 1),
            "params": n_params,
            "curriculum": vars(curriculum),
            "short_phase_ended_at": gate.ended_at,
            "lr": args.lr,
            "toy": args.toy,
            "check": final,
            "checks": check_log,
            "log": log,
        },
    )
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    print(f"train_tiny: saved {args.out} ({size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
