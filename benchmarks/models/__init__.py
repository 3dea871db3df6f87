"""Model directories for benchmarks: configs as data plus locally made tokenizers.

CLI: ``python3 -m benchmarks.models DIR [NAME ...]`` writes one directory per model.
"""

from __future__ import annotations

from pathlib import Path

from .configs import (
    BENCH_TOKENIZER_VOCAB,
    MODEL_CONFIGS,
    WHISPER_FEATURE_EXTRACTOR,
    WHISPER_MODEL,
    build_config,
    generation_config,
    model_entry,
    model_names,
    write_json,
)
from .tokenizer import make_bench_tokenizer, make_whisper_tokenizer, special_ids

__all__ = [
    "MODEL_CONFIGS",
    "make_model_dir",
    "make_whisper_dir",
    "model_entry",
    "model_names",
]


def make_model_dir(name: str, out_dir: str | Path) -> Path:
    """Write config.json, generation_config.json and a tokenizer for ``name``.

    The directory is what ``vllm serve DIR --load-format dummy`` needs. Existing files
    are overwritten, so the result depends only on ``name``.
    """
    entry = model_entry(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = special_ids()
    cfg = build_config(name, ids)
    if entry["tokenizer"] != "bench":
        raise ValueError(f"model {name!r} has no benchmark tokenizer")
    vocab = min(BENCH_TOKENIZER_VOCAB, cfg["vocab_size"])
    make_bench_tokenizer(out, vocab, cfg["max_position_embeddings"])
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json", generation_config(ids))
    return out


def make_whisper_dir(out_dir: str | Path) -> Path:
    """A Whisper model directory (``WHISPER_MODEL``'s dimensions) that vLLM serves
    with ``--load-format dummy`` and transformers' ``WhisperProcessor`` loads
    offline: config.json, preprocessor_config.json and a Whisper tokenizer."""
    out = Path(out_dir)
    ids = make_whisper_tokenizer(
        out, BENCH_TOKENIZER_VOCAB, WHISPER_MODEL["max_target_positions"]
    )
    end = ids["<|endoftext|>"]
    cfg = {
        **WHISPER_MODEL,
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "bos_token_id": end,
        "eos_token_id": end,
        "pad_token_id": end,
    }
    write_json(out / "config.json", cfg)
    write_json(out / "preprocessor_config.json", WHISPER_FEATURE_EXTRACTOR)
    return out
