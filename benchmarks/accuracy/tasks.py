"""Synthetic, checkable tasks for the tiny accuracy model (pure Python, no torch).

The model reads one character-level stream of items, each ending in ``;``:

- addition: ``123+45=168;`` (operands of 1-3 digits),
- key-value record: ``K07;``: a key, one symbol of ``KEYS`` (512 CJK characters, one
  token each), then a two-digit value.

Within one stream a key keeps its value, and training streams repeat earlier records
densely (any earlier record, so distances span the whole stream): whenever a record
comes back its value can be copied from the key's earlier occurrence. With one-token
keys that is multi-query associative recall (MQAR), the lookup attention layers are
known to learn from such data; the training loss is taken on the predictable
positions only (values of repeated records, addition answers), so the gradient is not
drowned in random characters. Earlier versions (v1: 52 one-letter keys with sparse
repeats, whole-stream loss; v2: four-letter keys ``kqzv:07;``, whole-stream loss)
formed no lookup in 3 GPU minutes (benchmarks/results/NOTES.md). Eval problems:

- ``addition``: a few random items, then ``a+b=``; the answer is ``str(a+b)``.
- ``recall``: a stream of ``context_len`` characters in which the queried key occurs
  exactly once, at least ``min_distance`` (4096) characters before the query; filler is
  addition items and records of other keys (with repeats); the prompt ends with the
  key, the answer is its two digits. This runs long prompts through many KV pages,
  chunked prefill and split-KV decode.

A greedy answer is correct iff the generated characters up to ``;`` equal the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DIGITS = "0123456789"
KEYS = "".join(chr(0x4E00 + i) for i in range(512))
KEY_LEN = 1
SEP = ""
ALPHABET = DIGITS + "+=;" + KEYS
END = ";"


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
    if len(taken) >= len(KEYS) ** KEY_LEN:
        raise ValueError("every key is taken")
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
) -> tuple[str, int, list[int]]:
    """Items until ``length`` characters: new records with probability ``p_new`` (while
    keys are left), repeats of an earlier record of this stream with ``p_repeat``,
    otherwise addition. ``insert`` (one item) goes in once the stream reaches
    ``insert_at`` characters. Returns (stream, position of ``insert`` or -1, mask):
    ``mask[i]`` is 1 where character ``i`` is predictable from what precedes it: the
    value and ``;`` of a repeated record, the answer and ``;`` of an addition."""
    parts: list[str] = []
    mask: list[int] = []
    records: list[str] = []
    size = 0
    inserted_at = -1
    keys_left = len(KEYS) ** KEY_LEN
    while size < length:
        r = rng.random()
        if insert and inserted_at < 0 and size >= insert_at:
            inserted_at = size
            item, known = insert, 0
        elif (r < p_new or (r < p_new + p_repeat and not records)) and len(
            taken
        ) < keys_left:
            item = record_item(new_key(rng, taken), rng.randrange(100))
            records.append(item)
            known = 0
        elif r < p_new + p_repeat and records:
            item = rng.choice(records)
            known = len(item) - KEY_LEN - len(SEP)
        else:
            q, a = addition_item(rng)
            item = q + a + END
            known = len(a) + 1
        parts.append(item)
        mask += [0] * (len(item) - known) + [1] * known
        size += len(item)
    return "".join(parts), inserted_at, mask


def training_example(
    rng: random.Random, length: int, p_new: float = 0.25, p_repeat: float = 0.55
) -> tuple[str, list[int]]:
    """One training stream of exactly ``length`` characters (BOS not included) and its
    loss mask (see ``_filler_stream``).

    Records repeat uniformly from all earlier ones, so lookups over every distance up
    to the stream length are trained; 20% of items are addition."""
    stream, _, mask = _filler_stream(rng, length, set(), p_new, p_repeat)
    return stream[:length], mask[:length]


def training_stream(rng: random.Random, length: int, **kwargs) -> str:
    return training_example(rng, length, **kwargs)[0]


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
    stream, at, _ = _filler_stream(
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


_IDS = {ch: FIRST_CHAR_ID + i for i, ch in enumerate(ALPHABET)}


def encode(text: str) -> list[int]:
    """Character ids of ``text`` (no BOS)."""
    try:
        return [_IDS[ch] for ch in text]
    except KeyError as e:
        raise ValueError(f"text has characters outside the alphabet: {text!r}") from e


def decode(ids: list[int]) -> str:
    """Inverse of ``encode``; ids outside the alphabet become ``?`` (never correct)."""
    out = []
    for i in ids:
        j = i - FIRST_CHAR_ID
        out.append(ALPHABET[j] if 0 <= j < len(ALPHABET) else "?")
    return "".join(out)
