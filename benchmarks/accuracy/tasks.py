"""Synthetic, checkable tasks for the tiny accuracy model (pure Python, no torch).

The model reads one character-level stream of items, each ending in ``;``:

- addition: ``123+45=168;`` (operands of 1-3 digits),
- key-value pair: ``Q07;`` (a one-letter key, a two-digit value).

Within one stream every key keeps one value, so whenever a key comes back its value is
predictable from its earlier occurrence, however far back. Training streams contain
a few "rare" keys that occur once early and once more near the end, so the model
learns recall over thousands of positions. Eval problems:

- ``addition``: a few random items, then ``a+b=``; the answer is ``str(a+b)``.
- ``recall``: a stream of ``context_len`` tokens in which the queried key occurs exactly
  once, at least ``min_distance`` (4096) tokens before the query; filler is addition
  items and pairs of other keys; the prompt ends with the key, the answer is its two
  digits. This runs long prompts through many KV pages, chunked prefill and split-KV
  decode.

A greedy answer is correct iff the generated characters up to ``;`` equal the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DIGITS = "0123456789"
KEYS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ALPHABET = DIGITS + "+=;" + KEYS
END = ";"


@dataclass(frozen=True)
class Problem:
    task: str  # "addition" | "recall"
    prompt: str  # characters after BOS
    answer: str  # expected characters before the closing ";"
    distance: int = 0  # recall: tokens between the key's only occurrence and the query


def addition_item(rng: random.Random) -> tuple[str, str]:
    """Returns (question "a+b=", answer "c")."""
    a = rng.randrange(10 ** rng.randint(1, 3))
    b = rng.randrange(10 ** rng.randint(1, 3))
    return f"{a}+{b}=", str(a + b)


def pair_item(key: str, value: int) -> str:
    return f"{key}{value:02d}{END}"


def random_dictionary(rng: random.Random) -> dict[str, int]:
    return {k: rng.randrange(100) for k in KEYS}


def training_stream(rng: random.Random, length: int, p_pair: float = 0.5) -> str:
    """One training stream of exactly ``length`` characters (BOS not included).

    4-12 rare keys occur once at random points of the first 55% and once more,
    interleaved with filler, in the last 10%: long-range recall. The other keys repeat
    throughout with consistent values: recall at short and middle distances.
    """
    values = random_dictionary(rng)
    keys = list(KEYS)
    rng.shuffle(keys)
    n_rare = rng.randint(4, 12)
    rare, common = keys[:n_rare], keys[n_rare:]
    place_at = sorted(rng.uniform(0.0, 0.55) * length for _ in rare)
    recall_from = 0.9 * length
    parts: list[str] = []
    size = 0
    n_placed = 0
    to_recall: list[str] = []
    while size < length:
        if n_placed < n_rare and size >= place_at[n_placed]:
            key = rare[n_placed]
            n_placed += 1
            to_recall.append(key)
            item = pair_item(key, values[key])
        elif to_recall and size >= recall_from and rng.random() < 0.5:
            key = to_recall.pop(rng.randrange(len(to_recall)))
            item = pair_item(key, values[key])
        elif rng.random() < p_pair:
            key = rng.choice(common)
            item = pair_item(key, values[key])
        else:
            q, a = addition_item(rng)
            item = q + a + END
        parts.append(item)
        size += len(item)
    return "".join(parts)[:length]


def addition_problems(n: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lead = []
        for _ in range(rng.randint(0, 4)):
            q, a = addition_item(rng)
            lead.append(q + a + END)
        q, a = addition_item(rng)
        out.append(Problem("addition", "".join(lead) + q, a))
    return out


def recall_problem(rng: random.Random, context_len: int, min_distance: int) -> Problem:
    """Prompt of about ``context_len`` characters; the queried key occurs only once,
    at least ``min_distance`` characters before the query."""
    if context_len < min_distance + 64:
        raise ValueError("context_len must exceed min_distance by at least 64")
    values = random_dictionary(rng)
    keys = list(KEYS)
    rng.shuffle(keys)
    target, others = keys[0], keys[1:]
    latest_needle = context_len - min_distance - 4
    needle_at = rng.randrange(0, max(1, latest_needle))
    parts: list[str] = []
    size = 0
    needle_pos = -1
    while size < context_len - 1:
        if needle_pos < 0 and size >= needle_at:
            needle_pos = size
            item = pair_item(target, values[target])
        elif rng.random() < 0.5:
            key = rng.choice(others)
            item = pair_item(key, values[key])
        else:
            q, a = addition_item(rng)
            item = q + a + END
        parts.append(item)
        size += len(item)
    prompt = "".join(parts) + target
    return Problem("recall", prompt, f"{values[target]:02d}", len(prompt) - needle_pos)


def recall_problems(
    n: int,
    seed: int,
    min_len: int = 5000,
    max_len: int = 8192,
    min_distance: int = 4096,
) -> list[Problem]:
    rng = random.Random(seed)
    return [
        recall_problem(rng, rng.randint(min_len, max_len), min_distance)
        for _ in range(n)
    ]


def score(answer: str, generated: str) -> bool:
    """Strict: the text before the first ``;`` (or end) must equal the answer."""
    return generated.split(END, 1)[0] == answer


def max_answer_tokens(problem: Problem) -> int:
    # Answer characters plus the closing ";" (addition sums have at most 4 digits).
    return (4 if problem.task == "addition" else len(problem.answer)) + 1


# Token ids of the character tokenizer (benchmarks/models/tokenizer.py): the special
# tokens come first (pad 0, bos 1, eos 2, unk 3), then ALPHABET in order.
BOS_ID = 1
FIRST_CHAR_ID = 4


def encode(text: str) -> list[int]:
    """Character ids of ``text`` (no BOS)."""
    try:
        return [FIRST_CHAR_ID + ALPHABET.index(ch) for ch in text]
    except ValueError as e:
        raise ValueError(f"text has characters outside the alphabet: {text!r}") from e


def decode(ids: list[int]) -> str:
    """Inverse of ``encode``; ids outside the alphabet become ``?`` (never correct)."""
    out = []
    for i in ids:
        j = i - FIRST_CHAR_ID
        out.append(ALPHABET[j] if 0 <= j < len(ALPHABET) else "?")
    return "".join(out)
