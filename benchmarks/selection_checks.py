"""On the GPU: the fork serves what stock serves, on the paths vLLM selects by.

    python benchmarks/selection_checks.py embed --site stock=DIR --site fork=DIR ...
    python benchmarks/selection_checks.py auto --site stock=DIR --site fork=DIR ...
    python benchmarks/selection_checks.py invariance --site fork=DIR ...
    python benchmarks/selection_checks.py whisper --site stock=DIR --site fork=DIR ...

Each check writes one JSON record (``--out``) with provenance and a ``verdict``.

- ``embed``: an encoder-only embedding model (``--embed-model``: ``bert-base`` or
  ``embeddinggemma-300m`` dimensions, dummy or seeded random weights, a tokenizer
  made here) through ``vllm serve``, four servers one after another:
  stock with vLLM's automatic choice (the reference), stock and the fork with
  ``--attention-backend TRITON_ATTN``, the fork with the automatic choice. The same
  texts (one request, mixed lengths) go to each; the record holds each side's
  embeddings against the reference's (largest absolute difference, smallest cosine)
  and the server's lines on which backend served the layers.
- ``auto``: a decoder vLLM chooses the backend for (``--attention-backend`` not
  given) with FLASH_ATTN disabled (``--disable``), as where FlashAttention is not
  installed; stock and the fork, greedy outputs compared, each attention layer's
  backend recorded (``layer.backend`` and its class).
- ``whisper``: an encoder-decoder model (``whisper-small`` dimensions, dummy weights,
  a Whisper tokenizer and feature extractor made here): transcription prompts over
  synthesised audio clips on stock's FLASH_ATTN, stock's TRITON_ATTN and the fork's
  TRITON_ATTN (cross-attention on our kernels), greedy outputs compared.
- ``invariance``: ``VLLM_BATCH_INVARIANT=1`` on the fork: one prompt alone and
  inside batches of 7 and 64 prompts of mixed lengths, greedy; every prompt that
  occurs in more than one batch must get the same tokens and bit-identical log
  probabilities.

Offline engines run ``selection_worker.py`` in the install's Python; servers are
``python -m vllm.entrypoints.cli.main serve``. One engine at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    add_install_args,
    environment,
    free_port,
    parse_installs,
    require_vllm,
    run_logged,
    running_server,
    tail,
    write_json,
)
from benchmarks.models import make_model_dir, make_whisper_dir  # noqa: E402
from benchmarks.models.configs import BENCH_TOKENIZER_VOCAB  # noqa: E402
from benchmarks.models.tokenizer import pseudo_words  # noqa: E402
from benchmarks.offline_worker import FIRST_ID  # noqa: E402

WORKER = REPO / "benchmarks" / "selection_worker.py"
# Server log lines that say which backend served the attention layers.
BACKEND_LINE_WORDS = (
    "attention backend",  # vLLM's automatic choice
    "AttentionBackendEnum",  # a named backend
    "serves",  # the fork's builders: layers per backend
    "do not take",  # the fork's hand-over
)
# Embeddings of the same model within these of the reference's count as the same.
EMBED_MIN_COSINE = 0.999
# Greedy tokens of two Triton backends on dummy weights (near-ties diverge).
MIN_TOKEN_AGREEMENT = 0.95
TRITON_NAMES = ("TRITON_ATTN", "TRITON_UNIFIED_ATTN")


def _env(inst, extra: dict[str, str]) -> dict[str, str]:
    env = inst.env()
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra})
    return env


def _prompts(rng: random.Random, n: int, lo: int, hi: int):
    """``n`` prompts of random token ids, lengths uniform in ``[lo, hi]``."""
    return [
        [
            rng.randrange(FIRST_ID, BENCH_TOKENIZER_VOCAB)
            for _ in range(rng.randint(lo, hi))
        ]
        for _ in range(n)
    ]


def _run_worker(inst, spec: dict, work: Path, name: str, env_extra, timeout_s):
    spec_path, out = work / f"{name}.spec.json", work / f"{name}.out.json"
    write_json(spec_path, spec)
    out.unlink(missing_ok=True)
    rc = run_logged(
        [inst.python, str(WORKER), str(spec_path), str(out)],
        env=_env(inst, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env_extra}),
        log=work / f"{name}.log",
        timeout_s=timeout_s,
        what=name,
        cwd=work,
    )
    lines = _backend_lines(work / f"{name}.log")
    if rc != 0 or not out.exists():
        return {
            "error": f"exit {rc}",
            "log_tail": tail(work / f"{name}.log", 30),
            "backend_lines": lines,
        }
    return {**json.loads(out.read_text()), "backend_lines": lines}


def _backend_lines(log: Path) -> list[str]:
    text = log.read_text(errors="replace") if log.exists() else ""
    seen: list[str] = []
    for line in text.splitlines():
        if any(w in line for w in BACKEND_LINE_WORDS):
            msg = line.split("] ", 1)[-1].strip()
            if msg not in seen:
                seen.append(msg)
    return seen


def _post(port: int, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def _embed_under_load(port: int, texts: list[str], concurrency: int) -> dict:
    """One /v1/embeddings request per text, ``concurrency`` at a time: each text's
    embedding (None where its request failed) and the failures."""

    def one(text):
        try:
            body = _post(port, "/v1/embeddings", {"model": "m", "input": [text]})
            return body["data"][0]["embedding"], None
        except (OSError, KeyError, ValueError, urllib.error.URLError) as e:
            return None, f"{type(e).__name__}: {e}"[:200]

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, texts))
    errors = [err for _, err in results if err is not None]
    return {
        "requests": len(texts),
        "concurrency": concurrency,
        "errors": len(errors),
        "error_examples": errors[:3],
        "embeddings": [emb for emb, _ in results],
    }


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else float("nan")


def _compare_embeddings(ref: list[list[float]], got: list[list[float]]) -> dict:
    return {
        "max_abs_diff": max(abs(x - y) for r, g in zip(ref, got) for x, y in zip(r, g)),
        "min_cosine": min(_cosine(r, g) for r, g in zip(ref, got)),
    }


# Written into the model directory by the stock install's Python when --weights
# random: Hugging Face's own initialisation (normal weights of std 0.02, unit
# LayerNorm gains), seeded, so attention is not flat as under vLLM's dummy loader.
RANDOM_WEIGHTS = (
    "import sys, torch, transformers\n"
    "torch.manual_seed(0)\n"
    "cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])\n"
    "model = transformers.AutoModel.from_config(cfg).to(torch.bfloat16)\n"
    "model.save_pretrained(sys.argv[1])\n"
)


def check_embed(args, installs, work: Path) -> dict:
    name = args.embed_model
    model_dir = make_model_dir(name, work / "models" / name)
    load = ["--load-format", "dummy"]
    if args.weights == "random":
        rc = run_logged(
            [installs["stock"].python, "-c", RANDOM_WEIGHTS, str(model_dir)],
            env=_env(installs["stock"], {}),
            log=work / "weights.log",
            timeout_s=args.timeout_s,
            what="random weights",
            cwd=work,
        )
        if rc != 0:
            raise SystemExit(
                f"could not write random weights: {tail(work / 'weights.log')}"
            )
        load = []
    rng = random.Random(args.seed)
    words = pseudo_words(2000)
    texts = [
        " ".join(rng.choice(words) for _ in range(n))
        for n in [3, 17, 64, 130, 255, 400, 500, 9, 33, 310]
    ]
    # Under load (--load N): N more texts, one request each, --concurrency at a
    # time, on every server; each compared with the reference server's.
    load_texts = [
        " ".join(rng.choice(words) for _ in range(rng.randint(1, 500)))
        for _ in range(args.load)
    ]
    sides = [
        ("stock-auto", "stock", None),
        ("stock-TRITON_ATTN", "stock", "TRITON_ATTN"),
        ("fork-TRITON_ATTN", "fork", "TRITON_ATTN"),
        ("fork-auto", "fork", None),
    ]
    results: dict[str, dict] = {}
    for label, install, backend in sides:
        port = free_port()
        cmd = [
            installs[install].python,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            str(model_dir),
            "--port",
            str(port),
            "--served-model-name",
            "m",
            *load,
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "512",
            "--enforce-eager",
        ] + (["--attention-backend", backend] if backend else [])
        log = work / f"embed-{label}.log"
        t0 = time.monotonic()
        side: dict = {"command": " ".join(cmd[1:]), "install": install}
        with running_server(
            cmd, _env(installs[install], {}), port, log, args.timeout_s
        ) as proc:
            if proc is None:
                side["error"] = "server did not come up"
                side["log_tail"] = tail(log, 30)
            else:
                side["startup_s"] = round(time.monotonic() - t0, 1)
                body = _post(port, "/v1/embeddings", {"model": "m", "input": texts})
                side["embeddings"] = [d["embedding"] for d in body["data"]]
                side["prompt_tokens"] = body.get("usage", {}).get("prompt_tokens")
                if load_texts:
                    side["load"] = _embed_under_load(port, load_texts, args.concurrency)
        side["backend_lines"] = _backend_lines(log)
        results[label] = side
    ref = results["stock-auto"].get("embeddings")
    comparisons = {}
    for label, side in results.items():
        if label != "stock-auto" and ref and side.get("embeddings"):
            comparisons[f"{label} vs stock-auto"] = _compare_embeddings(
                ref, side["embeddings"]
            )
    a = results["stock-TRITON_ATTN"].get("embeddings")
    b = results["fork-TRITON_ATTN"].get("embeddings")
    if a and b:
        comparisons["fork-TRITON_ATTN vs stock-TRITON_ATTN"] = _compare_embeddings(a, b)
    expected = 4
    if load_texts:
        expected += 3
        ref_load = results["stock-auto"].get("load", {}).get("embeddings")
        for label, side in results.items():
            got = side.get("load", {}).get("embeddings")
            if label == "stock-auto" or not (ref_load and got):
                continue
            pairs = [(r, g) for r, g in zip(ref_load, got) if r and g]
            if len(pairs) == len(load_texts):
                comparisons[f"{label} vs stock-auto, under load"] = _compare_embeddings(
                    *zip(*pairs)
                )
    ok = len(comparisons) == expected and all(
        c["min_cosine"] >= EMBED_MIN_COSINE for c in comparisons.values()
    )
    ok = ok and all(side.get("load", {}).get("errors", 0) == 0
                    for side in results.values())  # fmt: skip
    for side in results.values():  # the numbers are in the comparisons
        side.pop("embeddings", None)
        side.get("load", {}).pop("embeddings", None)
    return {
        "check": "embed",
        "model": name,
        "weights": args.weights,
        "texts_words": [len(t.split()) for t in texts],
        "load": {"texts": len(load_texts), "concurrency": args.concurrency},
        "tolerance": {"min_cosine": EMBED_MIN_COSINE},
        "sides": results,
        "comparisons": comparisons,
        "verdict": "pass" if ok else "fail",
    }


def _engine(args, **extra) -> dict:
    engine = {
        "load_format": "dummy",
        "dtype": "bfloat16",
        "max_model_len": args.max_model_len,
        "kv_cache_dtype": args.kv_cache_dtype,
        "seed": 0,
    }
    engine.update(extra)
    return engine


def _agreement(ref: list | None, new: list | None) -> dict | None:
    """Greedy outputs of two sides, prompt by prompt: identical prompts and
    equal tokens (None unless both sides produced them)."""
    if not (ref and new):
        return None
    pairs = list(zip(ref, new))
    return {
        "prompts": len(pairs),
        "prompts_identical": sum(r["token_ids"] == n["token_ids"] for r, n in pairs),
        "tokens_compared": sum(len(r["token_ids"]) for r in ref),
        "tokens_equal": sum(
            x == y for r, n in pairs for x, y in zip(r["token_ids"], n["token_ids"])
        ),
    }


def _agrees(agreement: dict | None) -> bool:
    return bool(agreement) and (
        agreement["tokens_equal"] >= MIN_TOKEN_AGREEMENT * agreement["tokens_compared"]
    )


def check_auto(args, installs, work: Path) -> dict:
    model_dir = make_model_dir(args.model, work / "models" / args.model)
    rng = random.Random(args.seed)
    prompts = _prompts(rng, args.num_prompts, 8, args.max_model_len // 2)
    spec = {
        "model": str(model_dir),
        "engine": _engine(args, enforce_eager=True),
        "disable": args.disable,
        "jobs": [{"name": "greedy", "prompts": prompts, "max_tokens": args.tokens}],
    }
    sides = {
        install: _run_worker(
            installs[install], spec, work, f"auto-{install}", {}, args.timeout_s
        )
        for install in ("stock", "fork")
    }
    ref, new = (sides[i].get("jobs", {}).get("greedy") for i in ("stock", "fork"))
    agreement = _agreement(ref, new)
    for side in sides.values():
        side.pop("jobs", None)
    served = {i: sorted(s.get("layer_backends", {})) for i, s in sides.items()}
    # The fork's layers are ours or stock's kept Triton backend, never another
    # family; the outputs agree as closely as two Triton kernels on dummy weights.
    fork_ok = bool(served["fork"]) and all(
        name.split()[0] in TRITON_NAMES for name in served["fork"]
    )
    agree = _agrees(agreement)
    return {
        "check": "auto",
        "model": args.model,
        "kv_cache_dtype": args.kv_cache_dtype,
        "disabled": args.disable,
        "prompt_len_range": [8, args.max_model_len // 2],
        "tokens_per_prompt": args.tokens,
        "sides": sides,
        "served_by": served,
        "agreement": agreement,
        "verdict": "pass" if fork_ok and agree else "fail",
    }


def check_invariance(args, installs, work: Path) -> dict:
    model_dir = make_model_dir(args.model, work / "models" / args.model)
    rng = random.Random(args.seed)
    target = _prompts(rng, 1, 700, 700)[0]
    others = _prompts(rng, 63, 16, 1500)
    batches = {
        "batch1": [target],
        "batch7": others[:3] + [target] + others[3:6],
        "batch64": others[:40] + [target] + others[40:],
    }
    spec = {
        "model": str(model_dir),
        "engine": _engine(args, attention_backend="TRITON_ATTN"),
        "jobs": [
            {"name": name, "prompts": ps, "max_tokens": args.tokens}
            for name, ps in batches.items()
        ],
    }
    side = _run_worker(
        installs["fork"],
        spec,
        work,
        "invariance-fork",
        {"VLLM_BATCH_INVARIANT": "1"},
        args.timeout_s,
    )
    jobs = side.pop("jobs", None)
    compared, differing = 0, []
    if jobs:
        # Every prompt's output in every batch it occurs in, against its first.
        seen: dict[tuple, tuple[str, dict]] = {}
        for name, ps in batches.items():
            for ids, out in zip(ps, jobs[name]):
                key = tuple(ids)
                if key not in seen:
                    seen[key] = (name, out)
                    continue
                compared += 1
                first_name, first = seen[key]
                if first != out:
                    which = "target" if ids == target else f"other {others.index(ids)}"
                    differing.append(f"{which}: {first_name} vs {name}")
    return {
        "check": "invariance",
        "model": args.model,
        "env": {"VLLM_BATCH_INVARIANT": "1"},
        "batches": {k: len(v) for k, v in batches.items()},
        "tokens_per_prompt": args.tokens,
        "side": side,
        "outputs_compared": compared,
        "outputs_differing": differing,
        "verdict": "pass" if jobs and compared >= 7 and not differing else "fail",
    }


def check_whisper(args, installs, work: Path) -> dict:
    """Whisper (whisper-small dimensions, dummy weights): transcription prompts
    over synthesised clips of 1-30 s, greedy, on stock's FLASH_ATTN (the
    reference), stock's TRITON_ATTN and the fork's TRITON_ATTN, whose decoder
    self-attention and cross-attention over the cached encoder output run on our
    kernels. Each side's outputs against the reference's; every attention layer's
    backend recorded."""
    model_dir = make_whisper_dir(work / "models" / "whisper-small")
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    controls = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
    rng = random.Random(args.seed)
    clips = [
        {"seconds": round(rng.uniform(1.0, 30.0), 2), "seed": k}
        for k in range(args.num_prompts)
    ]
    spec = {
        "model": str(model_dir),
        "engine": _engine(args, enforce_eager=True, max_model_len=448),
        "jobs": [
            {
                "name": "greedy",
                "audio": clips,
                "decoder_prompt": [vocab[t] for t in controls],
                "max_tokens": args.tokens,
            }
        ],
    }
    sides = {}
    for label, install, backend in (
        ("stock-FLASH_ATTN", "stock", "FLASH_ATTN"),
        ("stock-TRITON_ATTN", "stock", "TRITON_ATTN"),
        ("fork-TRITON_ATTN", "fork", "TRITON_ATTN"),
    ):
        engine = {**spec["engine"], "attention_backend": backend}
        side_spec = {**spec, "engine": engine}
        sides[label] = _run_worker(
            installs[install], side_spec, work, f"whisper-{label}", {}, args.timeout_s
        )
    ref = sides["stock-FLASH_ATTN"].get("jobs", {}).get("greedy")
    agreement = {
        f"{label} vs stock-FLASH_ATTN": _agreement(
            ref, side.get("jobs", {}).get("greedy")
        )
        for label, side in sides.items()
        if label != "stock-FLASH_ATTN"
    }
    for side in sides.values():
        side.pop("jobs", None)
    served = {label: sorted(s.get("layer_backends", {})) for label, s in sides.items()}
    fork_ok = bool(served["fork-TRITON_ATTN"]) and any(
        name.split()[0] == "TRITON_ATTN" for name in served["fork-TRITON_ATTN"]
    )
    agree = _agrees(agreement["fork-TRITON_ATTN vs stock-FLASH_ATTN"])
    return {
        "check": "whisper",
        "model": "whisper-small",
        "clips_s": [c["seconds"] for c in clips],
        "tokens_per_prompt": args.tokens,
        "sides": sides,
        "served_by": served,
        "agreement": agreement,
        "verdict": "pass" if fork_ok and agree else "fail",
    }


CHECKS = {
    "embed": check_embed,
    "auto": check_auto,
    "invariance": check_invariance,
    "whisper": check_whisper,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", choices=sorted(CHECKS))
    p.add_argument("--model", default="decoder-head160", help="auto/invariance model")
    p.add_argument(
        "--embed-model",
        choices=("bert-base", "embeddinggemma-300m"),
        default="bert-base",
        help="embed: the encoder-only model (EmbeddingGemma's layers have windows)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="auto/invariance/whisper engines' KV cache (e.g. fp8_e5m2)",
    )
    p.add_argument("--disable", nargs="*", default=["FLASH_ATTN"])
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--weights",
        choices=("dummy", "random"),
        default="dummy",
        help="embed: vLLM's dummy weights, or seeded Hugging Face initialisation "
        "written into the model directory (needs transformers in the stock install)",
    )
    p.add_argument(
        "--load",
        type=int,
        default=0,
        help="embed: also send this many single-text requests (1-500 words), "
        "--concurrency at a time, to every server and compare them",
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--timeout-s", type=float, default=420)
    p.add_argument("--work-dir", type=Path, default=Path("selection-work"))
    p.add_argument("--out", type=Path, required=True)
    add_install_args(p)
    args = p.parse_args(argv)
    installs = parse_installs(args.python, args.site)
    needed = ("fork",) if args.check == "invariance" else ("stock", "fork")
    versions = {i: require_vllm(i, installs[i]) for i in needed}
    work = args.work_dir.resolve() / args.check
    work.mkdir(parents=True, exist_ok=True)
    record = {
        **environment(installs["fork"]),
        "versions": versions,
        "command": " ".join(sys.argv),
    }
    record.update(CHECKS[args.check](args, installs, work))
    write_json(args.out, record)
    print(f"{args.check}: {record['verdict']} -> {args.out}")
    return 0 if record["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
