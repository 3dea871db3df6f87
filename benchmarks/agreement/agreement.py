# SPDX-License-Identifier: Apache-2.0
"""Greedy-token agreement of two attention backends inside vLLM (run on the GPU).

Each backend runs in its own process: offline ``vllm.LLM`` on a dummy-weight model
directory with real Llama-3.1-8B dimensions (``benchmarks/models``), greedy first
``--tokens`` tokens of ``--prompts`` prompts of mixed lengths (short chats to
~3.9k-token documents, a group sharing a 300-token prefix for prefix-cache hits,
all submitted at once so batches mix decodes and chunked prefills). The two token
streams are compared position by position.

Random weights make the logits nearly flat, so a tiny numerical difference can
flip an argmax: besides the exact agreement the report counts divergences at near
ties (both tokens in each other's top-5 with log-probabilities within
``NEAR_TIE_NATS``), the signature of rounding rather than of a wrong attention.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the worker
can count the Triton kernels of ``vllm.attention.ops`` compiled *after* startup
(expected 0: the backend warms every specialisation up at startup).

Usage, from the repository root, with the fork installed in this Python (or a side's
vLLM site given by ``--reference-pythonpath`` / ``--backend-pythonpath``)::

    python -m benchmarks.agreement.agreement
    # stock TRITON_ATTN (stock site) against ours:
    python -m benchmarks.agreement.agreement --reference TRITON_ATTN \\
        --reference-pythonpath STOCK_SITE --backend-pythonpath FORK_SITE

Writes ``benchmarks/results/agreement/<date>-<commit>[-<ref>-vs-<backend>].json``
with the keys reference, backend, prompts, tokens_compared, tokens_equal,
fraction_equal, tp, commit, gpu (plus details).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "agreement"
DEFAULT_PAIR = ("FLASH_ATTN", "TRITON_ATTN")
TOP_LOGPROBS = 5
NEAR_TIE_NATS = 0.05
# Word ids of the benchmark tokenizer start after its special and role tokens.
FIRST_WORD_ID = 16
SHARED_PREFIX_LEN = 300


def make_prompts(num_prompts: int, max_prompt_len: int, vocab: int, seed: int = 0):
    """Token-id prompts: 40% short (8-64), 30% medium (65-512), 20% long
    (513-2048), 10% very long (up to max_prompt_len); every fifth prompt starts
    with one shared 300-token prefix."""
    rng = random.Random(seed)
    tiers = [
        (0.4, 8, 64),
        (0.3, 65, 512),
        (0.2, 513, 2048),
        (0.1, 2049, max_prompt_len),
    ]
    lengths = []
    for share, lo, hi in tiers:
        lengths += [
            rng.randint(lo, min(hi, max_prompt_len))
            for _ in range(round(share * num_prompts))
        ]
    lengths = (lengths + [rng.randint(8, 64) for _ in range(num_prompts)])[:num_prompts]
    rng.shuffle(lengths)
    prefix = [rng.randrange(FIRST_WORD_ID, vocab) for _ in range(SHARED_PREFIX_LEN)]
    prompts = []
    for i, n in enumerate(lengths):
        body = [rng.randrange(FIRST_WORD_ID, vocab) for _ in range(n)]
        if i % 5 == 0 and n > SHARED_PREFIX_LEN:
            body[:SHARED_PREFIX_LEN] = prefix
        prompts.append(body)
    return prompts


# ----------------------------------------------------------------------------------
# Worker: one backend, one process
# ----------------------------------------------------------------------------------


def _triton_compiles() -> dict[str, int]:
    """Compiled variants per Triton kernel of vllm.attention.ops (this process)."""
    from triton.runtime.jit import JITFunction

    counts = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm.attention.ops") or module is None:
            continue
        for attr, obj in vars(module).items():
            if isinstance(obj, JITFunction) and obj.device_caches:
                n = sum(len(entry[0]) for entry in obj.device_caches.values())
                if n:
                    counts[f"{name}.{attr}"] = n
    return counts


# A guard against a hung engine: a TP-2 side of Llama-3.1-8B takes ~7 min to start.
SIDE_TIMEOUT_S = 3600.0

# vLLM's speculative-decoding counters (``vllm:spec_decode_<name>``) kept per run.
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def run_worker(args) -> None:
    import torch

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.loads(Path(args.prompts_file).read_text())
    speculative = json.loads(args.speculative) if args.speculative else None
    start = time.perf_counter()
    llm = LLM(
        model=args.model_dir,
        load_format="dummy",
        attention_config={"backend": args.backend},
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tp,
        seed=0,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=True,
        kv_cache_dtype=args.kv_cache_dtype,
        speculative_config=speculative,
        # the draft/accept counters are metrics: collected only with stats on
        disable_log_stats=speculative is None,
    )
    startup_s = time.perf_counter() - start
    compiled_at_startup = _triton_compiles()
    params = SamplingParams(
        temperature=0.0,
        max_tokens=args.tokens,
        ignore_eos=True,
        logprobs=TOP_LOGPROBS,
    )
    start = time.perf_counter()
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    generate_s = time.perf_counter() - start
    compiled_after = _triton_compiles()
    results = []
    for out in outputs:
        completion = out.outputs[0]
        top = [
            {str(tok): lp.logprob for tok, lp in step.items()}
            for step in (completion.logprobs or [])
        ]
        results.append({"tokens": list(completion.token_ids), "top": top})
    spec = None
    if speculative is not None:
        counts = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
        spec = {
            "config": speculative,
            **{k: counts.get(f"vllm:spec_decode_{k}") for k in SPEC_COUNTERS},
        }
    newly = {
        k: v - compiled_at_startup.get(k, 0)
        for k, v in compiled_after.items()
        if v != compiled_at_startup.get(k, 0)
    }
    Path(args.out).write_text(
        json.dumps(
            {
                "backend": args.backend,
                "gpu": (
                    torch.cuda.get_device_name()
                    if torch.cuda.is_available()
                    else "none (CPU)"
                ),
                "startup_s": round(startup_s, 1),
                "generate_s": round(generate_s, 1),
                "triton_kernels_compiled_at_startup": compiled_at_startup,
                "triton_kernels_compiled_after_startup": newly,
                "speculative": spec,
                "results": results,
            }
        )
    )


# ----------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------


def _run_side(args, backend, pythonpath, prompts_file, model_dir, out, speculative):
    env = dict(os.environ)
    env.pop("VLLM_ATTENTION_BACKEND", None)  # the explicit backend is the choice
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS"):
        env.setdefault(offline, "1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.agreement.agreement",
        "--worker",
        "--backend",
        backend,
        "--model-dir",
        str(model_dir),
        "--prompts-file",
        str(prompts_file),
        "--out",
        str(out),
        "--tokens",
        str(args.tokens),
        "--max-model-len",
        str(args.max_model_len),
        "--tp",
        str(args.tp),
        "--kv-cache-dtype",
        args.kv_cache_dtype,
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
    ]
    if speculative:
        cmd += ["--speculative", speculative]
    from benchmarks.harness import late_jit_compiles_in, run_logged

    # The run's output, vLLM's worker processes' included (tensor parallel), is shown
    # live and kept next to the side's result: vLLM's JIT monitor reports there any
    # kernel compiled while serving.
    log = Path(out).with_suffix(".log")
    rc = run_logged(
        cmd,
        env=env,
        log=log,
        timeout_s=SIDE_TIMEOUT_S,
        what=f"agreement {backend}",
        cwd=REPO,
    )
    if rc != 0:
        raise subprocess.CalledProcessError(rc, cmd)
    body = json.loads(Path(out).read_text())
    body["late_jit_compiles"] = late_jit_compiles_in(log)
    Path(out).write_text(json.dumps(body))
    return body


def side_key(args, prompts: list, model_dir) -> dict:
    """What a side's output depends on: reused only when all of it is the same."""
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]
    return {
        "prompts_sha256": digest,
        "model_dir": str(model_dir),
        "tokens": args.tokens,
        "max_model_len": args.max_model_len,
        "tp": args.tp,
        "kv_cache_dtype": args.kv_cache_dtype,
    }


def _reuse_or_run(
    args, backend, pythonpath, prompts_file, model_dir, out, key, speculative=None
):
    key = dict(key, backend=backend, speculative=speculative)
    if out.is_file():
        body = json.loads(out.read_text())
        if body.get("key") == key:
            print(f"[agreement] {backend}: reusing {out}", flush=True)
            return body
    body = _run_side(
        args, backend, pythonpath, prompts_file, model_dir, out, speculative
    )
    body["key"] = key
    out.write_text(json.dumps(body))
    return body


def compare(ref: dict, new: dict) -> dict:
    compared = equal = prefix_total = first_equal = 0
    divergences = near_ties = 0
    for a, b in zip(ref["results"], new["results"], strict=True):
        n = min(len(a["tokens"]), len(b["tokens"]))
        compared += n
        equal += sum(x == y for x, y in zip(a["tokens"][:n], b["tokens"][:n]))
        first_equal += int(n > 0 and a["tokens"][0] == b["tokens"][0])
        prefix = next((i for i in range(n) if a["tokens"][i] != b["tokens"][i]), n)
        prefix_total += prefix
        if prefix < n:
            divergences += 1
            ta, tb = str(a["tokens"][prefix]), str(b["tokens"][prefix])
            top_a, top_b = a["top"][prefix], b["top"][prefix]
            if ta in top_b and tb in top_a:
                gap_a = abs(top_a[ta] - top_a[tb])
                gap_b = abs(top_b[ta] - top_b[tb])
                near_ties += int(max(gap_a, gap_b) < NEAR_TIE_NATS)
    num = len(ref["results"])
    return {
        "tokens_compared": compared,
        "tokens_equal": equal,
        "fraction_equal": round(equal / max(compared, 1), 4),
        "first_token_equal_fraction": round(first_equal / max(num, 1), 4),
        "mean_matching_prefix_tokens": round(prefix_total / max(num, 1), 2),
        "prompts_diverged": divergences,
        "divergences_at_near_ties": near_ties,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", default=DEFAULT_PAIR[0])
    p.add_argument("--backend", default=DEFAULT_PAIR[1])
    p.add_argument(
        "--reference-pythonpath",
        default=None,
        help="PYTHONPATH of the reference process (default: inherited)",
    )
    p.add_argument("--backend-pythonpath", default=None)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help="both sides (e.g. fp8: the fork's fp8 cache against FLASH_ATTN's)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.85,
        help="vLLM's fraction of GPU memory for each side (lower it when other "
        "processes share the GPU)",
    )
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--backend-speculative",
        default=None,
        metavar="JSON",
        help="vLLM speculative_config for the backend side only, e.g. "
        '\'{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}\': '
        "its multi-token verification against the reference's plain greedy decoding",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep each side's output here and reuse a finished side when the run is "
        "repeated with the same prompts and options (a TP-2 side takes ~5 minutes: "
        "the two sides can then span two device calls); default: a temp dir",
    )
    p.add_argument(
        "--reference-only",
        action="store_true",
        help="run (or reuse) the reference side into --work-dir and stop: a later run "
        "with the same options adds the backend side and writes the result",
    )
    # worker mode (internal)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--model-dir",
        help="existing model directory (from `python -m benchmarks.models`); "
        "default: made from --model in a temp dir",
    )
    p.add_argument("--prompts-file", help=argparse.SUPPRESS)
    p.add_argument("--speculative", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    if args.reference_only and args.work_dir is None:
        p.error("--reference-only keeps its side in --work-dir: give one")
    if args.backend_speculative:
        try:  # before the reference side's engine start, not after it
            json.loads(args.backend_speculative)
        except ValueError as e:
            p.error(
                f"--backend-speculative is not JSON ({e}): {args.backend_speculative}"
            )

    from benchmarks.models import make_model_dir
    from benchmarks.models.configs import BENCH_TOKENIZER_VOCAB

    with tempfile.TemporaryDirectory(prefix="agreement_") as tmp:
        tmp = Path(tmp)
        model_dir = args.model_dir or make_model_dir(args.model, tmp / args.model)
        prompts = make_prompts(
            args.prompts, args.max_model_len - args.tokens - 8, BENCH_TOKENIZER_VOCAB
        )
        prompts_file = tmp / "prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        work = args.work_dir or tmp
        work.mkdir(parents=True, exist_ok=True)
        key = side_key(args, prompts, model_dir)
        ref = _reuse_or_run(
            args, args.reference, args.reference_pythonpath, prompts_file, model_dir,
            work / "reference.json", key,
        )  # fmt: skip
        if args.reference_only:
            print(f"[agreement] reference side kept in {work}; no result yet")
            return 0
        new = _reuse_or_run(
            args, args.backend, args.backend_pythonpath, prompts_file, model_dir,
            work / "backend.json", key, args.backend_speculative,
        )  # fmt: skip

    sys.path.insert(0, str(REPO))
    from benchmarks.harness import Install, environment, git_commit, library_versions

    commit = git_commit()
    env = environment(Install(sys.executable, args.backend_pythonpath))
    ref_versions = library_versions(Install(sys.executable, args.reference_pythonpath))
    report = {
        "reference": args.reference,
        "backend": args.backend,
        "prompts": len(prompts),
        **compare(ref, new),
        "tp": args.tp,
        "kv_cache_dtype": args.kv_cache_dtype,
        "backend_speculative": new.get("speculative"),
        "commit": commit,
        "gpu": new["gpu"],
        "model": args.model,
        "tokens_per_prompt": args.tokens,
        "max_model_len": args.max_model_len,
        "prompt_len_min_max": [min(map(len, prompts)), max(map(len, prompts))],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "driver": env["driver"],
        "num_gpus": env["num_gpus"],
        "torch": env.get("torch"),
        "triton": env.get("triton"),
        "vllm": {"reference": ref_versions.get("vllm"), "backend": env.get("vllm")},
        "settings": env["settings"],
        "sides": {
            side["backend"] + ("" if i else " (reference)"): {
                k: side[k]
                for k in (
                    "startup_s",
                    "generate_s",
                    "triton_kernels_compiled_at_startup",
                    "triton_kernels_compiled_after_startup",
                    "late_jit_compiles",
                )
                if k in side
            }
            for i, side in ((0, ref), (1, new))
        },
    }
    out = args.out
    if out is None:
        day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        suffix = (
            ""
            if (args.reference, args.backend) == DEFAULT_PAIR
            else (f"-{args.reference}-vs-{args.backend}")
        )
        suffix += "" if args.model == "llama-3.1-8b" else f"-{args.model}"
        suffix += "" if args.tp == 1 else f"-tp{args.tp}"
        suffix += "" if args.kv_cache_dtype == "auto" else f"-kv{args.kv_cache_dtype}"
        out = RESULTS / f"{day}-{commit}{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "sides"}, indent=2))
    print(f"[agreement] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
