"""One offline vLLM engine for ``selection_checks.py``: greedy outputs plus what
served each attention layer. It runs in the install's Python (``python
benchmarks/selection_worker.py SPEC OUT``) and imports nothing of this repository,
only vLLM. The engine runs in this process (the caller sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a backend the spec disables is disabled
for vLLM's own selection.

SPEC (JSON): ``model``, ``engine`` (keyword arguments of ``vllm.LLM``), ``disable``
(backend names whose ``validate_configuration`` refuses every layer: vLLM's
automatic choice then skips them, as where they are not installed), ``jobs``: a list
of ``{name, prompts: [[token ids]], max_tokens}``, each one ``generate`` call; an
encoder-decoder model's job gives ``audio: [{seconds, seed}]`` (a clip synthesised
here per entry, 16 kHz) and one ``decoder_prompt`` of token ids instead.
OUT (JSON): ``startup_s``, ``layer_backends`` (attention layers per backend name and
class), and per job the greedy ``token_ids`` and their ``logprobs`` of every prompt.
(vLLM's log lines on the backends are read from this process's output by the
caller.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _disable(names: list[str]) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for name in names:
        cls = AttentionBackendEnum[name].get_class()
        reason = f"{name} disabled for this check"
        cls.validate_configuration = classmethod(lambda c, *a, _r=reason, **k: [_r])


def _layer_backends(worker) -> dict[str, int]:
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    counts: dict[str, int] = {}
    for _, module in model.named_modules():
        backend = getattr(module, "attn_backend", None)
        if backend is None or not hasattr(backend, "get_name"):
            continue
        enum = getattr(module, "backend", None)
        key = (
            f"{getattr(enum, 'name', backend.get_name())} "
            f"({backend.__module__}.{backend.__qualname__})"
        )
        counts[key] = counts.get(key, 0) + 1
    return counts


def _audio(seconds: float, seed: int, rate: int = 16000):
    """A reproducible clip: a few tones over noise, amplitude below 1."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    tones = sum(
        0.2 * np.sin(2 * np.pi * f * t + phase)
        for f, phase in zip(rng.uniform(100, 3000, 3), rng.uniform(0, 6.28, 3))
    )
    return (tones + 0.05 * rng.standard_normal(t.size)).astype(np.float32), rate


def _job_prompts(job: dict) -> list:
    from vllm.inputs import TokensPrompt

    if "audio" not in job:
        return [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    return [
        {
            "encoder_prompt": {
                "prompt": "",
                "multi_modal_data": {"audio": _audio(a["seconds"], a["seed"])},
            },
            "decoder_prompt": {"prompt_token_ids": job["decoder_prompt"]},
        }
        for a in job["audio"]
    ]


def main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams

    _disable(spec.get("disable", []))
    start = time.perf_counter()
    llm = LLM(model=spec["model"], **spec["engine"])
    startup_s = time.perf_counter() - start
    try:
        layer_backends = llm.collective_rpc(_layer_backends)[0]
    except Exception as e:  # recorded, not hidden: the outputs still count
        layer_backends = {"error": f"{type(e).__name__}: {e}"}
    jobs = {}
    for job in spec["jobs"]:
        params = SamplingParams(
            temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True, logprobs=1
        )
        outputs = llm.generate(_job_prompts(job), params, use_tqdm=False)
        jobs[job["name"]] = [
            {
                "token_ids": list(o.outputs[0].token_ids),
                "logprobs": [
                    step[tok].logprob
                    for tok, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)
                ],
            }
            for o in outputs
        ]
    Path(out_path).write_text(
        json.dumps(
            {
                "startup_s": round(startup_s, 1),
                "layer_backends": layer_backends,
                "jobs": jobs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python benchmarks/selection_worker.py SPEC OUT")
    sys.exit(main(sys.argv[1], sys.argv[2]))
