"""One offline vLLM engine, every workload of a run: the worker of ``run_matrix.py
e2e``. It runs in the install's Python (``python -m benchmarks.offline_worker
SPEC OUT``) and imports nothing of this repository, only vLLM.

``vllm bench throughput`` times one workload and one pass per engine start, and an
8B engine takes one to three minutes to start; this worker starts ``vllm.LLM`` once
and times, for each workload in the spec's order, a first pass and then a warm pass,
each with fresh prompts of the workload's shape (random token ids, lengths drawn as
vLLM's ``random`` dataset draws them: uniform in ``[L(1-r), L(1+r)]``), sampled as
``vllm bench throughput`` samples (temperature 1, ``ignore_eos``).

SPEC (JSON): ``model``, ``engine`` (keyword arguments of ``vllm.LLM``), ``vocab``
(prompt ids are drawn below it), ``workloads``: a list of ``{name, input_len,
output_len, range_ratio, num_prompts, passes: [{pass, seed}]}``. OUT (JSON):
``startup_s`` and ``results``, one per workload and pass (``workload``, ``pass``,
``seed``, ``num_prompts``, ``prompt_tokens``, ``output_tokens``, ``elapsed_s``,
``total_tok_per_s``, ``output_tok_per_s``, ``engine_fresh``: whether it was the
engine's first pass), plus the ``spec`` and ``started_at`` (a Unix time).
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

FIRST_ID = 16  # prompt ids start above the tokenizer's special tokens


def lengths(rng: random.Random, length: int, ratio: float, n: int) -> list[int]:
    lo = max(1, math.floor(length * (1 - ratio)))
    hi = max(lo, math.ceil(length * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def requests(w: dict, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) of each request of one pass."""
    rng = random.Random(seed)
    ins = lengths(rng, w["input_len"], w["range_ratio"], w["num_prompts"])
    outs = lengths(rng, w["output_len"], w["range_ratio"], w["num_prompts"])
    return [
        ([rng.randrange(FIRST_ID, vocab) for _ in range(n_in)], n_out)
        for n_in, n_out in zip(ins, outs)
    ]


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    started_at = time.time()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=spec["model"], **spec["engine"])
    startup_s = time.perf_counter() - start
    results = []
    for w in spec["workloads"]:
        for p in w["passes"]:
            reqs = requests(w, p["seed"], spec["vocab"])
            prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in reqs]
            params = [
                SamplingParams(temperature=1.0, max_tokens=n_out, ignore_eos=True)
                for _, n_out in reqs
            ]
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            prompt_tokens = sum(len(ids) for ids, _ in reqs)
            output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            results.append(
                {
                    "workload": w["name"],
                    "pass": p["pass"],
                    "seed": p["seed"],
                    "num_prompts": len(reqs),
                    "prompt_tokens": prompt_tokens,
                    "output_tokens": output_tokens,
                    "elapsed_s": round(elapsed, 4),
                    "total_tok_per_s": (prompt_tokens + output_tokens) / elapsed,
                    "output_tok_per_s": output_tokens / elapsed,
                    "engine_fresh": not results,
                }
            )
    Path(out_path).write_text(
        json.dumps(
            {
                "spec": spec,
                "started_at": started_at,
                "startup_s": round(startup_s, 1),
                "results": results,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.offline_worker SPEC OUT")
    sys.exit(main(sys.argv[1], sys.argv[2]))
