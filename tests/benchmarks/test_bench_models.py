"""Model configs as data and the locally made tokenizers."""

import json
import random

import pytest

from benchmarks.models import MODEL_CONFIGS, make_model_dir
from benchmarks.models.configs import ACCURACY_MODEL, BENCH_TOKENIZER_VOCAB
from benchmarks.models.tokenizer import make_char_tokenizer, pseudo_words

# Parameter counts published with the models: a config whose dimensions differ
# from the real model's (a typo would silently benchmark another model) counts
# differently.
PUBLISHED_PARAMETERS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
}


def _llama_parameters(c: dict) -> int:
    """Weights of a Llama-architecture config: attention, gated MLP and two norms
    per layer, untied input and output embeddings, the final norm."""
    h, d = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    per_layer = 2 * h * q + 2 * h * kv + 3 * h * c["intermediate_size"] + 2 * h
    return c["num_hidden_layers"] * per_layer + 2 * c["vocab_size"] * h + h


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_llama_configs_have_the_published_parameter_count(name):
    c = MODEL_CONFIGS[name]["config"]
    assert _llama_parameters(c) == PUBLISHED_PARAMETERS[name]
    assert c["rope_scaling"]["rope_type"] == "llama3"
    assert c["max_position_embeddings"] == 131072


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_config_consistency(name):
    c = MODEL_CONFIGS[name]["config"]
    if c["model_type"] == "bert":  # encoder-only: no KV heads, no head_dim field
        assert c["hidden_size"] % c["num_attention_heads"] == 0
        return
    assert c["num_attention_heads"] % c["num_key_value_heads"] == 0
    assert c["head_dim"] * c["num_attention_heads"] in (c["hidden_size"], 4096)
    # decoders: the random datasets draw prompt ids below the tokenizer's size
    assert c["vocab_size"] >= BENCH_TOKENIZER_VOCAB


def test_special_configs():
    assert MODEL_CONFIGS["mistral-7b-sw"]["config"]["sliding_window"] == 4096
    assert (
        MODEL_CONFIGS["gemma-2-9b-softcap"]["config"]["attn_logit_softcapping"] == 50.0
    )
    a = ACCURACY_MODEL
    assert a["num_attention_heads"] // a["num_key_value_heads"] == 4
    assert a["head_dim"] in (64, 128)
    assert a["max_position_embeddings"] >= 8192


def test_pseudo_words_distinct():
    words = pseudo_words(5000)
    assert len(set(words)) == 5000
    assert all(w.isalpha() and w.islower() for w in words)


def test_make_model_dir(model_dir_8b):
    cfg = json.loads((model_dir_8b / "config.json").read_text())
    assert cfg["hidden_size"] == 4096
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert 0 <= cfg[key] < BENCH_TOKENIZER_VOCAB
    gen = json.loads((model_dir_8b / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]


def test_bench_tokenizer_roundtrip(model_dir_8b):
    """vllm bench serve's random dataset decodes random ids and re-encodes them: the
    word-level tokenizer must give back exactly the same ids."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir_8b))
    assert tok.vocab_size == BENCH_TOKENIZER_VOCAB
    assert tok.num_special_tokens_to_add() == 1  # BOS, like Llama
    rng = random.Random(0)
    special = set(tok.all_special_ids)
    ids = [
        i
        for i in (rng.randrange(tok.vocab_size) for _ in range(3000))
        if i not in special and i >= 7
    ]
    text = tok.decode(ids)
    assert tok.encode(text, add_special_tokens=False) == ids
    assert tok.encode(text)[0] == tok.bos_token_id
    words = " ".join(text.split()[:6])
    chat = tok.apply_chat_template(
        [{"role": "user", "content": words}], add_generation_prompt=True, tokenize=False
    )
    assert chat.startswith("<|user|>") and chat.rstrip().endswith("<|assistant|>")
    assert tok.unk_token_id not in tok.encode(chat, add_special_tokens=False)


def test_char_tokenizer_matches_task_encoding(tmp_path):
    transformers = pytest.importorskip("transformers")
    from benchmarks.accuracy import tasks

    make_char_tokenizer(tmp_path, tasks.ALPHABET, 16384)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    key = tasks.KEYS[0] * tasks.KEY_LEN
    text = "123+45=168;" + tasks.record_item(key, 7) + tasks.KEYS[-1]
    assert tok.encode(text) == [tasks.BOS_ID] + tasks.encode(text)
    assert tok.decode(tasks.encode(text)) == text


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="known models"):
        make_model_dir("llama-9000", tmp_path)


def test_accuracy_model_fits_what_a_device_call_returns():
    """The trained model's bf16 safetensors must come back from a device call (16 MiB
    per file) to be committed (20 MB): count its parameters from the config."""
    from benchmarks.models.configs import ACCURACY_MODEL

    c = ACCURACY_MODEL
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    from benchmarks.accuracy import tasks
    from benchmarks.models.tokenizer import char_vocab_size

    vocab = char_vocab_size(tasks.ALPHABET)
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    params = c["num_hidden_layers"] * per_layer + 2 * vocab * h + h
    assert params * 2 < 16 * 2**20


# Attention shapes of the end-to-end models, from the public config.json files:
# (q heads, KV heads, head size, sliding window, attention soft-cap).
ATTENTION = {
    "qwen2.5-7b": (28, 4, 128, None, None),
    "qwen2.5-14b": (40, 8, 128, None, None),
    "mistral-7b-sw": (32, 8, 128, 4096, None),
    "gemma-2-9b-softcap": (16, 8, 256, 4096, 50.0),
    "phi-3-mini-4k": (32, 32, 96, 2047, None),
    "llama-3.1-70b": (64, 8, 128, None, None),
    "llama-3.1-70b-tp1-40l": (64, 8, 128, None, None),
    "decoder-head160": (16, 4, 160, None, None),
    "decoder-head288": (8, 2, 288, None, None),
}
# (hidden, layers, intermediate, vocab, max positions) of the added models.
DIMENSIONS = {
    "qwen2.5-7b": (3584, 28, 18944, 152064, 131072),
    "qwen2.5-14b": (5120, 48, 13824, 152064, 131072),
    "phi-3-mini-4k": (3072, 32, 8192, 32064, 4096),
    "llama-3.1-70b-tp1-40l": (8192, 40, 28672, 128256, 131072),
}


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_attention_shapes(name):
    c = MODEL_CONFIGS[name]["config"]
    got = (
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c.get("sliding_window") if c.get("use_sliding_window", True) else None,
        c.get("attn_logit_softcapping"),
    )
    assert got == ATTENTION[name]
    if name in DIMENSIONS:
        dims = (
            c["hidden_size"],
            c["num_hidden_layers"],
            c["intermediate_size"],
            c["vocab_size"],
            c["max_position_embeddings"],
        )
        assert dims == DIMENSIONS[name]


def test_qwen_has_no_active_window_and_70b_tp1_says_it_is_cut():
    for name in ("qwen2.5-7b", "qwen2.5-14b"):
        assert MODEL_CONFIGS[name]["config"]["use_sliding_window"] is False
    entry = MODEL_CONFIGS["llama-3.1-70b-tp1-40l"]
    full = MODEL_CONFIGS["llama-3.1-70b"]["config"]
    assert entry["serving_tp"] == 1 and "40 of its 80 layers" in entry["note"]
    # the same layer as the full model, fewer of them
    same = {k: v for k, v in entry["config"].items() if k != "num_hidden_layers"}
    assert same == {k: v for k, v in full.items() if k != "num_hidden_layers"}
    # the names other code uses stay
    for name in (
        "llama-3.1-8b",
        "llama-3.1-70b",
        "mistral-7b-sw",
        "gemma-2-9b-softcap",
    ):
        assert name in MODEL_CONFIGS


def test_whisper_dir_loads_offline_as_whisper(tmp_path):
    """transformers reads the Whisper directory as vLLM will: WhisperProcessor
    (feature extractor + Whisper tokenizer), the control tokens as single ids,
    80 x 3000 features for a clip, the config's ids from the tokenizer."""
    import numpy as np
    from transformers import AutoConfig, AutoProcessor

    from benchmarks.models import make_whisper_dir

    out = make_whisper_dir(tmp_path / "whisper")
    processor = AutoProcessor.from_pretrained(out)
    assert type(processor).__name__ == "WhisperProcessor"
    assert type(processor.tokenizer).__name__ == "WhisperTokenizer"
    text = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    ids = processor.tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == 4 and len(set(ids)) == 4
    clip = np.zeros(16000 * 3, dtype=np.float32)
    features = processor.feature_extractor(clip, sampling_rate=16000).input_features
    assert np.asarray(features).shape == (1, 80, 3000)
    config = AutoConfig.from_pretrained(out)
    assert config.decoder_start_token_id == ids[0]
    assert config.vocab_size >= len(processor.tokenizer)
