"""Tokenizers made locally (the GPU host has no network and no model repositories).

Two kinds, both ``tokenizers`` models saved as ``tokenizer.json`` plus a
``tokenizer_config.json`` (with a chat template) that ``transformers.AutoTokenizer``
loads offline:

- ``bench``: a word-level tokenizer over generated pseudo-words, split on whitespace.
  Decoding joins tokens with single spaces and every word is one token, so
  decode -> encode round-trips exactly; ``vllm bench serve``'s random dataset then gets
  exactly the prompt lengths it asks for.
- ``char``: one token per character of a small alphabet, decoded by plain concatenation,
  for the tiny accuracy model (digits, operators, recall keys).
- ``whisper``: the word-level vocabulary behind Whisper's control tokens, loaded as
  ``WhisperTokenizer`` (vLLM's Whisper prompts are built from those tokens).

Both add a BOS token in front of every encoded text, like Llama's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# Minimal chat template: role markers then content. Works with both tokenizers (the char
# tokenizer knows the role markers as added special tokens).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]


def pseudo_words(count: int) -> list[str]:
    """``count`` distinct lowercase pseudo-words, shortest first, deterministic."""
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    words: list[str] = []
    frontier = [""]
    while len(words) < count:
        frontier = [w + s for w in frontier for s in syllables]
        words.extend(frontier[: count - len(words)])
    # Distinct by construction only if no two syllable sequences spell the same word;
    # dedupe to be safe and top up with numbered words if anything collided.
    unique = list(dict.fromkeys(words))
    n = 0
    while len(unique) < count:
        unique.append(f"w{n}x")
        n += 1
    return unique[:count]


def special_ids() -> dict[str, int]:
    """Ids of pad/bos/eos/unk: the first entries of every vocabulary made here."""
    return {"pad": 0, "bos": 1, "eos": 2, "unk": 3}


def _save(tok, out_dir: Path, model_max_length: int) -> None:
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", special_ids()["bos"])],
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
            },
            indent=2,
        )
        + "\n"
    )


def make_bench_tokenizer(out_dir: Path, vocab_size: int, model_max_length: int) -> None:
    """Word-level tokenizer with exactly ``vocab_size`` entries (specials included)."""
    n_fixed = len(SPECIAL_TOKENS) + len(ROLE_TOKENS)
    if vocab_size <= n_fixed + 16:
        raise ValueError(f"vocab_size {vocab_size} too small for a bench tokenizer")
    tok, _ = _word_level(SPECIAL_TOKENS + ROLE_TOKENS, vocab_size - n_fixed)
    _save(tok, out_dir, model_max_length)


def _word_level(specials: list[str], words: int):
    """``(tokenizer, vocab)``: ``specials`` (ids 0, 1, ...), then ``words``
    pseudo-words, one token per whitespace-separated word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(specials)}
    for w in pseudo_words(words):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder with an unused prefix joins tokens with single spaces.
    tok.decoder = decoders.WordPiece(prefix="\x00##", cleanup=False)
    tok.add_special_tokens(specials)
    return tok, vocab


def make_char_tokenizer(out_dir: Path, alphabet: str, model_max_length: int) -> None:
    """One token per character of ``alphabet``; ids follow the special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet has repeated characters")
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    for t in ROLE_TOKENS:
        vocab[t] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_special_tokens(ROLE_TOKENS)
    _save(tok, out_dir, model_max_length)


def char_vocab_size(alphabet: str) -> int:
    return len(SPECIAL_TOKENS) + len(alphabet) + len(ROLE_TOKENS)


# Whisper's control tokens (vLLM's prompts: <|startoftranscript|><|en|><|transcribe|>
# <|notimestamps|>; <|endoftext|> ends, pads and begins).
WHISPER_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|fr|>",
    "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
    "<|nospeech|>", "<|notimestamps|>", "<unk>",
]  # fmt: skip


def make_whisper_tokenizer(out_dir: Path, words: int, model_max_length: int) -> dict:
    """Whisper's control tokens, then ``words`` pseudo-words; returns the ids of
    the control tokens by name."""
    tok, vocab = _word_level(WHISPER_SPECIAL_TOKENS, words)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return {t: vocab[t] for t in WHISPER_SPECIAL_TOKENS}
