"""Train the tiny Llama of the accuracy harness (addition + long-range key recall).

Plain torch loop over ``transformers.LlamaForCausalLM`` (SDPA attention, bf16 autocast,
fp32 master weights, AdamW, cosine schedule over a wall-clock budget), fixed seed; the
loss is taken on the predictable positions only (``tasks.training_example``). A
curriculum: the first part of the budget trains on short streams (512 tokens, many
lookups per step, where the copy-from-earlier-occurrence lookup forms), the rest
alternates 2048-token and 9216-token streams so RoPE positions past 8k and recall over
4k+ tokens are trained. Saves
safetensors + config + character tokenizer in HF Llama format, so vLLM loads it like
any checkpoint, then checks exact-match accuracy with the trained model itself
(teacher-forced argmax over the answer, which equals greedy decoding's verdict).

GPU (about 3 minutes on one H200):
    python3 benchmarks/accuracy/train_tiny.py --out benchmarks/accuracy/model
CPU smoke test (a few steps at toy size):
    python3 benchmarks/accuracy/train_tiny.py --device cpu --toy --max-steps 3 \
        --out /tmp/m
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

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

# Curriculum: (end of the phase as a fraction of the budget, [(stream length, batch),
# ...] alternating within the phase); each step is about 131k tokens.
FULL_SCHEDULE = [(0.35, [(512, 256)]), (1.0, [(2048, 64), (9216, 14)])]
# Toy sizes for the CPU smoke test.
TOY_SCHEDULE = [(0.5, [(128, 2)]), (1.0, [(128, 2), (256, 1)])]
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

    def __init__(self, seed: int, schedule, workers: int):
        self.seed, self.schedule, self.step = seed, schedule, 0
        self.pool = mp.get_context("fork").Pool(workers) if workers else None
        self.pending: list = []
        self.depth = 2 * workers

    def _job(self, shapes, k: int) -> tuple[int, int, int]:
        length, batch = shapes[k % len(shapes)]
        return (self.seed * 1_000_003 + k, length, batch)

    def next(self, progress: float):
        import torch

        shapes = phase_shapes(self.schedule, progress)
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


def phase_shapes(schedule, progress: float) -> list[tuple[int, int]]:
    """The (length, batch) list of the curriculum phase ``progress`` falls in."""
    for end, shapes in schedule:
        if progress < end:
            return shapes
    return schedule[-1][1]


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
    recall problems over >= 256 and over >= 4096 tokens (toy: 64 and 300). Short-range
    recall tells "no lookup learned" apart from "lookup learned, but not over 4k+
    tokens"."""
    ranges = (
        [(200, 300, 64), (600, 900, 300)]
        if toy
        else [(1024, 2048, 256), (5000, 8192, 4096)]
    )
    sets = {"addition": tasks.addition_problems(n, seed=seed + 1)}
    for k, (lo, hi, dist) in enumerate(ranges):
        sets[f"recall>={dist}"] = tasks.recall_problems(
            max(2, n // 4), seed=seed + 3 - k, min_len=lo, max_len=hi, min_distance=dist
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
        help="addition problems for the after-training check (recall: 1/4)",
    )
    args = p.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.workers is None:
        args.workers = 8 if device.type == "cuda" else 0
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "train_tiny: CUDA requested but not available; use --device cpu"
        )
    cfg_dict = model_config(args.toy)
    config = LlamaConfig(**cfg_dict)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device)
    n_params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=args.lr,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        fused=device.type == "cuda",
    )
    schedule = TOY_SCHEDULE if args.toy else FULL_SCHEDULE
    print(
        f"train_tiny: {n_params / 1e6:.2f}M params, schedule {schedule}, "
        f"budget {args.time_budget_s:.0f}s / {args.max_steps} steps",
        flush=True,
    )

    batches = BatchSource(args.seed, schedule, args.workers)
    log = []
    t0 = time.monotonic()
    step = 0
    try:
        while step < args.max_steps:
            elapsed = time.monotonic() - t0
            progress = max(step / args.max_steps, elapsed / args.time_budget_s)
            if progress >= 1.0:
                break
            lr = lr_at(progress, args.lr)
            for g in opt.param_groups:
                g["lr"] = lr
            x, w = (t.to(device, non_blocking=True) for t in batches.next(progress))
            with torch.autocast(
                device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"
            ):
                logits = model(input_ids=x[:, :-1], use_cache=False).logits
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

    model.eval()
    checks = check_sets(args.check_problems, args.seed, toy=args.toy)
    hf_check = run_checks(model, checks, device)
    print(
        f"train_tiny: {step} steps in {train_s:.0f}s; HF check "
        f"(n={ {k: len(v) for k, v in checks.items()} }): {hf_check}",
        flush=True,
    )

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    ids = special_ids()
    make_char_tokenizer(out, tasks.ALPHABET, cfg_dict["max_position_embeddings"])
    write_json(
        out / "generation_config.json",
        {
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"],
            "do_sample": False,
        },
    )
    write_json(
        out / "train_log.json",
        {
            "seed": args.seed,
            "steps": step,
            "train_s": round(train_s, 1),
            "params": n_params,
            "schedule": schedule,
            "lr": args.lr,
            "toy": args.toy,
            "torch": torch.__version__,
            "hf_check": hf_check,
            "log": log,
        },
    )
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"train_tiny: saved {out} ({size / 1e6:.1f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
