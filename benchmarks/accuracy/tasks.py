"""Synthetic, checkable tasks for the tiny accuracy model (pure Python, no torch).

The model reads one character-level stream of items, each ending in ``;``:

- addition: ``123+45=168;`` (operands of 1-3 digits),
- key-value record: ``kqzv:07;`` (a key of ``KEY_LEN`` random lowercase letters, a
  two-digit value).

Within one stream a key keeps its value, and training streams repeat earlier records
often (any earlier record, so distances span the whole stream), so whenever a record
comes back its key's tail and its value are predictable by copying from the earlier
occurrence: the "induction" lookup small transformers learn quickly from repeated
segments. (Version 1 used one-letter keys repeated sparsely; CPU probes and the first
H200 model never learned that lookup, see benchmarks/results/NOTES.md.) Eval problems:

- ``addition``: a few random items, then ``a+b=``; the answer is ``str(a+b)``.
- ``recall``: a stream of ``context_len`` characters in which the queried key occurs
  exactly once, at least ``min_distance`` (4096) characters before the query; filler is
  addition items and records of other keys (with repeats); the prompt ends with
  ``key:``, the answer is the two digits. This runs long prompts through many KV pages,
  chunked prefill and split-KV decode.

A greedy answer is correct iff the generated characters up to ``;`` equal the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DIGITS = "0123456789"
KEYS = "abcdefghijklmnopqrstuvwxyz"
KEY_LEN = 4
ALPHABET = DIGITS + "+=;:" + KEYS
END = ";"
SEP = ":"


@dataclass(frozen=True)
class Problem:
    task: str  # "addition" | "recall"
    prompt: str  # characters after BOS
    answer: str  # expected characters before the closing ";"
    distance: int = 0  # recall: characters between the key's only occurrence and the
    # end of the prompt


def addition_item(rng: random.Random) -> tuple[str, str]:
    """Returns (question "a+b=", answer "c")."""
    a = rng.randrange(10 ** rng.randint(1, 3))
    b = rng.randrange(10 ** rng.randint(1, 3))
    return f"{a}+{b}=", str(a + b)


def record_item(key: str, value: int) -> str:
    return f"{key}{SEP}{value:02d}{END}"


def new_key(rng: random.Random, taken: set[str]) -> str:
    while True:
        key = "".join(rng.choice(KEYS) for _ in range(KEY_LEN))
        if key not in taken:
            taken.add(key)
            return key


def _filler_stream(
    rng: random.Random,
    length: int,
    taken: set[str],
    p_new: float,
    p_repeat: float,
    insert_at: int = -1,
    insert: str = "",
) -> tuple[str, int]:
    """Items until ``length`` characters: new records with probability ``p_new``,
    repeats of an earlier record of this stream with ``p_repeat``, otherwise addition.
    ``insert`` (one item) goes in once the stream reaches ``insert_at`` characters;
    returns (stream, position of ``insert`` or -1)."""
    parts: list[str] = []
    records: list[str] = []
    size = 0
    inserted_at = -1
    while size < length:
        r = rng.random()
        if insert and inserted_at < 0 and size >= insert_at:
            inserted_at = size
            item = insert
        elif r < p_new or (r < p_new + p_repeat and not records):
            item = record_item(new_key(rng, taken), rng.randrange(100))
            records.append(item)
        elif r < p_new + p_repeat:
            item = rng.choice(records)
        else:
            q, a = addition_item(rng)
            item = q + a + END
        parts.append(item)
        size += len(item)
    return "".join(parts), inserted_at


def training_stream(
    rng: random.Random, length: int, p_new: float = 0.25, p_repeat: float = 0.55
) -> str:
    """One training stream of exactly ``length`` characters (BOS not included).

    Records repeat uniformly from all earlier ones, so lookups over every distance up
    to the stream length are trained; 20% of items are addition. Repeats are dense
    (55% of items): with sparse ones (v1) the lookup never formed in 3 GPU minutes."""
    stream, _ = _filler_stream(rng, length, set(), p_new, p_repeat)
    return stream[:length]


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
    """Prompt of about ``context_len`` characters ending in ``key:``; the key occurs
    once before, at least ``min_distance`` characters before the end of the prompt."""
    if context_len < min_distance + 64:
        raise ValueError("context_len must exceed min_distance by at least 64")
    taken: set[str] = set()
    target = new_key(rng, taken)
    value = rng.randrange(100)
    latest = context_len - min_distance - KEY_LEN - 1
    stream, at = _filler_stream(
        rng,
        context_len - KEY_LEN - 1,
        taken,
        p_new=0.25,
        p_repeat=0.55,
        insert_at=rng.randrange(0, max(1, latest)),
        insert=record_item(target, value),
    )
    prompt = stream + target + SEP
    return Problem("recall", prompt, f"{value:02d}", len(prompt) - at)


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
