"""Offline end-to-end workloads (issue #6), as data, and their request generation.

Prompts are random token ids with a fixed seed (no tokenizer involved), lengths drawn
integer-uniform from [lo, hi] inclusive. ``scale`` multiplies the request counts so a
short GPU session can run a proportional slice; it is recorded with every result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    num_requests: int
    input_len: tuple[int, int]  # inclusive range
    output_len: tuple[int, int]  # inclusive range
    note: str

    def scaled_requests(self, scale: float, minimum: int = 8) -> int:
        if scale <= 0:
            raise ValueError("scale must be positive")
        return max(minimum, round(self.num_requests * scale))


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        # ShareGPT-like: the mean lengths of the seed PR's ShareGPT run (215 in / 197
        # out per request), spread like `--random-range-ratio 0.9`.
        Workload(
            "sharegpt",
            1000,
            (22, 408),
            (20, 374),
            "mixed prefill/decode, short contexts",
        ),
        Workload(
            "long10k",
            100,
            (10000, 10000),
            (100, 100),
            "prefill-dominated, 10k-token contexts",
        ),
        Workload(
            "decode",
            256,
            (1000, 1000),
            (1000, 1000),
            "decode-dominated, contexts growing to 2k",
        ),
    )
}

# Token ids are drawn from [FIRST_ID, VOCAB_LIMIT): above the special tokens and inside
# the benchmark tokenizer's vocabulary (benchmarks/models: 32000 words).
FIRST_ID = 16
VOCAB_LIMIT = 32000


def parse_workloads(text: str) -> list[Workload]:
    out = []
    for name in (s.strip() for s in text.split(",")):
        if not name:
            continue
        if name not in WORKLOADS:
            raise SystemExit(
                f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}"
            )
        out.append(WORKLOADS[name])
    return out


def make_requests(w: Workload, scale: float, seed: int) -> list[tuple[list[int], int]]:
    """[(prompt token ids, output length)] for ``w`` at ``scale``; deterministic."""
    rng = random.Random(f"{w.name}-{seed}")
    n = w.scaled_requests(scale)
    out = []
    for _ in range(n):
        n_in = rng.randint(*w.input_len)
        n_out = rng.randint(*w.output_len)
        out.append(([rng.randrange(FIRST_ID, VOCAB_LIMIT) for _ in range(n_in)], n_out))
    return out


def token_counts(requests: list[tuple[list[int], int]]) -> tuple[int, int]:
    return sum(len(p) for p, _ in requests), sum(n for _, n in requests)
