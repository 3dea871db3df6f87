"""Model configurations for benchmarks and correctness runs, as plain data.

The GPU host has no network and no weights. A "model" here is a directory with the real
``config.json`` dimensions, a ``generation_config.json`` and a tokenizer made locally
(see ``tokenizer.py``); vLLM runs it with ``--load-format dummy``. Only the attention
shapes (heads, KV heads, head size, layers, context length, sliding window, soft-cap)
and the matmul sizes matter for speed, and those are the published ones.

``ACCURACY_MODEL`` is the tiny Llama that ``benchmarks/accuracy/train_tiny.py`` trains;
its directory holds real weights and a character-level tokenizer instead.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

# Word-level benchmark tokenizer size. It must be <= every config's vocab_size (the
# smallest here is Mistral's 32000); the random datasets draw token ids below it.
BENCH_TOKENIZER_VOCAB = 32000

_LLAMA3_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def _llama31(hidden: int, layers: int, heads: int, kv_heads: int, inter: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate_size": inter,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": dict(_LLAMA3_ROPE_SCALING),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    }


def _qwen25(
    hidden: int, layers: int, heads: int, kv_heads: int, inter: int, rms_norm_eps
) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate_size": inter,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        # full attention on every layer (the published config switches its
        # window off)
        "use_sliding_window": False,
        "hidden_act": "silu",
        "rms_norm_eps": rms_norm_eps,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    }


# name -> {"config": HF config.json body (token ids are filled in from the tokenizer),
#          "tokenizer": "bench" | "char",
#          "serving_tp": tensor-parallel size for serving,
#          "note": what the model is for}
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "config": _llama31(4096, 32, 32, 8, 14336),
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Llama-3.1-8B dimensions: the main throughput model "
        "(GQA 4:1, head 128)",
    },
    "llama-3.1-70b": {
        "config": _llama31(8192, 80, 64, 8, 28672),
        "tokenizer": "bench",
        "serving_tp": 2,
        "note": "Llama-3.1-70B dimensions (GQA 8:1), served with tensor parallel 2",
    },
    # meta-llama/Llama-3.1-70B with 40 of its 80 layers: one GPU at TP1.
    "llama-3.1-70b-tp1-40l": {
        "config": _llama31(8192, 40, 64, 8, 28672),
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Llama-3.1-70B per-layer dimensions (64 q / 8 KV heads, head 128) "
        "with only 40 of its 80 layers, so that the bf16 weights (~73 GB) fit one "
        "H200 at TP1 with room for KV cache; NOT the full model: per-token times "
        "are about half the real 70B's",
    },
    # Qwen/Qwen2.5-7B config.json (qkv projections carry a bias in Qwen2 models;
    # the config has no field for it). head_dim = 3584 / 28 = 128.
    "qwen2.5-7b": {
        "config": _qwen25(3584, 28, 28, 4, 18944, rms_norm_eps=1e-6),
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Qwen2.5-7B dimensions: GQA 7:1 (28 q / 4 KV heads), head 128",
    },
    # Qwen/Qwen2.5-14B config.json. head_dim = 5120 / 40 = 128.
    "qwen2.5-14b": {
        "config": _qwen25(5120, 48, 40, 8, 13824, rms_norm_eps=1e-5),
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Qwen2.5-14B dimensions: GQA 5:1 (40 q / 8 KV heads), head 128",
    },
    # microsoft/Phi-3-mini-4k-instruct config.json: no GQA, head 3072 / 32 = 96,
    # and the config's sliding_window of 2047 (kept as published).
    "phi-3-mini-4k": {
        "config": {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "hidden_size": 3072,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "head_dim": 96,
            "intermediate_size": 8192,
            "vocab_size": 32064,
            "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096,
            "sliding_window": 2047,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "embd_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "tie_word_embeddings": False,
            "initializer_range": 0.02,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Phi-3-mini-4k dimensions: 32 q / 32 KV heads (no GQA), head 96, "
        "4k context with the published sliding window of 2047",
    },
    # mistralai/Mistral-7B-v0.1 config.json.
    "mistral-7b-sw": {
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 14336,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Mistral-7B-v0.1 style: sliding window 4096 on every layer",
    },
    # google/gemma-2-9b config.json: 16 q / 8 KV heads of 256 (16 * 256 = 4096,
    # not the hidden size); every other layer uses the 4096-token sliding window.
    "gemma-2-9b-softcap": {
        "config": {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "hidden_size": 3584,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "intermediate_size": 14336,
            "vocab_size": 256000,
            "max_position_embeddings": 8192,
            "sliding_window": 4096,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "query_pre_attn_scalar": 256,
            "rope_theta": 10000.0,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "Gemma-2-9B style: attention logit soft-cap 50, head 256, "
        "alternating sliding-window layers",
    },
    # google-bert/bert-base-uncased config.json: an encoder-only model (12 heads of
    # 64, bidirectional attention, no KV cache), served as an embedding model.
    "bert-base": {
        "config": {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "vocab_size": 30522,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "layer_norm_eps": 1e-12,
            "position_embedding_type": "absolute",
            "initializer_range": 0.02,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "BERT-base dimensions: encoder-only, 12 heads of 64; an embedding "
        "model (pooling runner)",
    },
    # google/embeddinggemma-300m's dimensions: an encoder-only Gemma-3 (3 heads of
    # 256 over one KV head, bidirectional attention; five of every six layers with
    # a window, which vLLM makes two-sided), served as an embedding model.
    "embeddinggemma-300m": {
        "config": {
            "architectures": ["Gemma3TextModel"],
            "model_type": "gemma3_text",
            "hidden_size": 768,
            "intermediate_size": 1152,
            "num_hidden_layers": 24,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "layer_types": [
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                for i in range(24)
            ],
            "sliding_window": 512,
            "use_bidirectional_attention": True,
            "max_position_embeddings": 2048,
            "query_pre_attn_scalar": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "attention_bias": False,
            "vocab_size": 262144,
            "torch_dtype": "bfloat16",
        },
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "EmbeddingGemma-300M dimensions: encoder-only, 3 heads of 256 over "
        "1 KV head, two-sided windows of 512 on 5 of 6 layers; an embedding model",
    },
    # Not a published model: a small Llama-architecture decoder whose head size is
    # 160 (16 q / 4 KV heads), the size FlashInfer does not take, for checking
    # vLLM's automatic choice where FlashAttention is unavailable.
    "decoder-head160": {
        "config": {
            **_llama31(2560, 8, 16, 4, 6912),
            "vocab_size": 32000,
            "max_position_embeddings": 8192,
            "rope_scaling": None,
            "rope_theta": 10000.0,
        },
        "tokenizer": "bench",
        "serving_tp": 1,
        "note": "synthetic small decoder with head size 160 (GQA 4:1, 8 layers)",
    },
}

# Not a published model either: the same decoder with heads of 288, above the 256
# our kernels take, so TRITON_ATTN hands its layers to stock's Triton backend
# (TRITON_UNIFIED_ATTN): the fallback path end to end.
MODEL_CONFIGS["decoder-head288"] = {
    "config": {
        **MODEL_CONFIGS["decoder-head160"]["config"],
        "hidden_size": 2304,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 288,
    },
    "tokenizer": "bench",
    "serving_tp": 1,
    "note": "synthetic small decoder with head size 288 (GQA 4:1, 8 layers): "
    "served through the stock-kernel fallback",
}

# The tiny model trained for the accuracy harness. Head size 128 and 4 query heads per
# KV head, like Llama-3.1-8B; RoPE with max_position_embeddings 16384 so the
# long-context recall problems (5-8k tokens; training streams of 9216) fit.
# vocab_size is set from the character tokenizer.
ACCURACY_MODEL: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 128,
    # 768 keeps the bf16 safetensors (7.4M parameters, 14.8 MB) under the 16 MiB a
    # device call can return per file, and under the 20 MB the repository takes.
    "intermediate_size": 768,
    "max_position_embeddings": 16384,
    "rope_theta": 100000.0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}


# openai/whisper-small's dimensions (an encoder-decoder: a 12-layer audio encoder over
# 1500 frames, a 12-layer decoder with cross-attention; 12 heads of 64), for the
# cross-attention check. Token ids are filled in from the Whisper tokenizer made here
# (``tokenizer.make_whisper_tokenizer``); the feature extractor is Whisper's
# (80 mel bins of 16 kHz audio in 30-second windows).
WHISPER_MODEL: dict[str, Any] = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "d_model": 768,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 12,
    "decoder_attention_heads": 12,
    "encoder_ffn_dim": 3072,
    "decoder_ffn_dim": 3072,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "vocab_size": 51865,
    "activation_function": "gelu",
    "scale_embedding": False,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
WHISPER_FEATURE_EXTRACTOR: dict[str, Any] = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "WhisperProcessor",
    "feature_size": 80,
    "sampling_rate": 16000,
    "hop_length": 160,
    "chunk_length": 30,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
}


def model_names() -> list[str]:
    return sorted(MODEL_CONFIGS)


def model_entry(name: str) -> dict[str, Any]:
    if name not in MODEL_CONFIGS:
        raise KeyError(
            f"unknown model {name!r}; known models: {', '.join(model_names())}"
        )
    return MODEL_CONFIGS[name]


def build_config(name: str, special_ids: dict[str, int]) -> dict[str, Any]:
    """config.json body of ``name`` with bos/eos/pad ids taken from the tokenizer."""
    cfg = copy.deepcopy(model_entry(name)["config"])
    cfg["bos_token_id"] = special_ids["bos"]
    cfg["eos_token_id"] = special_ids["eos"]
    cfg["pad_token_id"] = special_ids["pad"]
    return cfg


def generation_config(special_ids: dict[str, int]) -> dict[str, Any]:
    # Greedy by default; the benchmarks pass their own sampling parameters anyway.
    return {
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "pad_token_id": special_ids["pad"],
        "do_sample": False,
    }


def write_json(path: Path, body: dict[str, Any]) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
