"""A stand-in for vLLM used by tests/benchmarks: the harnesses' plumbing (processes,
PYTHONPATH per install, resume, result files) runs on the CPU against it.

``LLM.generate`` returns deterministic token ids (and top-5 logprobs when asked); for
the accuracy task's character prompts it answers correctly, except that with
``FAKE_VLLM_WRONG=<backend>`` that attention backend answers every 10th problem wrong
and changes a token of every 10th other prompt (the harnesses must then notice).
``FAKE_VLLM_FAIL=<backend>``: the engine of that backend fails to start.
``FAKE_VLLM_LATE_BUILDS=<backend>:<n>``: while generating, a child process (as a
tensor-parallel worker would) logs vLLM's JIT-monitor warning n times.
``FAKE_VLLM_BATCH_VARIANT=1``: a prompt's tokens depend on the batch it is in.
``collective_rpc(fn)`` calls ``fn`` with a worker whose model has two attention
layers served by the engine's backend (or the first one ``v1.attention.backends.
registry`` has not disabled, as vLLM's automatic choice would).
"""

import os
import subprocess
import sys
from dataclasses import dataclass, field


def _named(var):
    """The backend a FAKE_VLLM_* variable names; never equal to "no backend named"."""
    return os.environ.get(var) or object()


# vLLM's JIT monitor (vllm/utils/jit_monitor.py) in warn mode, as a worker logs it.
JIT_MONITOR_LINE = (
    "(Worker_TP1 pid=7) WARNING 11-30 12:00:00 [jit_monitor.py:130] Triton kernel JIT "
    "compilation during inference: _prefix_prefill_kernel. This causes a latency "
    "spike; consider extending warmup to cover this shape/config."
)

__version__ = "0.0.fake"


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    detokenize: bool = True
    stop_token_ids: list = field(default_factory=list)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Completion:
    token_ids: list
    logprobs: list | None = None


@dataclass
class _Output:
    outputs: list


def _solve(ids):
    """Answer an accuracy-task prompt (character ids after BOS), or None."""
    try:
        from benchmarks.accuracy import tasks
    except ImportError:
        return None
    text = tasks.decode(ids[1:])
    if "?" in text:
        return None
    if text.endswith("="):
        a, b = text.split(";")[-1][:-1].split("+")
        return str(int(a) + int(b))
    if text.endswith(tasks.SEP):
        # recall: the value after the key's one earlier occurrence
        key = text[-tasks.KEY_LEN - 1 :]
        at = text[: -tasks.KEY_LEN - 1].find(key)
        return text[at + len(key) : at + len(key) + 2] if at >= 0 else None
    return None


class LLM:
    def __init__(self, model, attention_backend=None, **kwargs):
        self.model = model
        self.attention_backend = attention_backend or kwargs.get(
            "attention_config", {}
        ).get("backend")
        self.kwargs = kwargs
        if _named("FAKE_VLLM_FAIL") == self.attention_backend:
            raise RuntimeError("fake LLM: simulated engine failure")
        print(
            f"fake LLM: backend {self.attention_backend}, kwargs {kwargs}", flush=True
        )
        self.calls = 0

    def start_profile(self, profile_prefix=None):
        self.profiling = True

    def stop_profile(self):
        """Write what vLLM's torch profiler writes: a trace and the kernel table
        (torch's ``key_averages().table`` layout), rows by backend."""
        out = self.kwargs["profiler_config"]["torch_profiler_dir"]
        if _named("FAKE_VLLM_NO_PROFILE") == self.attention_backend:
            return  # as when the profiler could not trace the GPU
        attn = {"FLASH_ATTN": "void flash::FlashAttnFwdSm90<Ktraits, ...>"}.get(
            self.attention_backend, "_prefix_prefill_kernel"
        )
        rows = [
            ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT", "30.000ms", 900),
            (attn, "12.500ms", 320),
            ("reshape_and_cache_flash_kernel", "500.000us", 320),
            ("aten::mm", "0.000us", 900),
            ("triton_poi_fused_mul_silu_0", "2.000ms", 320),
        ]
        rule = "-" * 44 + "  " + "  ".join(["-" * 12] * 3)
        lines = [
            rule,
            f"{'Name':>44}  {'Self CPU':>12}  {'Self CUDA':>12}  {'# of Calls':>12}",
            rule,
        ]
        lines += [
            f"{n[:44]:>44}  {'1.000ms':>12}  {t:>12}  {c:>12}" for n, t, c in rows
        ]
        lines += [
            rule,
            "Self CPU time total: 5.000ms",
            "Self CUDA time total: 46.000ms",
        ]
        with open(os.path.join(out, "profiler_out_0.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(out, "rank0.123.pt.trace.json.gz"), "w") as f:
            f.write("trace")
        self.profiling = False

    def generate(self, prompts, params, use_tqdm=True):
        backend, _, count = os.environ.get("FAKE_VLLM_LATE_BUILDS", "").partition(":")
        if backend == self.attention_backend:
            line = JIT_MONITOR_LINE
            code = f"print({line!r}, flush=True)\n" * int(count)
            subprocess.run([sys.executable, "-c", code], check=True)
        if not isinstance(params, list):
            params = [params] * len(prompts)
        wrong = _named("FAKE_VLLM_WRONG") == self.attention_backend
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            if "decoder_prompt" in p:  # an encoder-decoder prompt (audio, Whisper)
                audio, rate = p["encoder_prompt"]["multi_modal_data"]["audio"]
                ids = p["decoder_prompt"]["prompt_token_ids"] + [len(audio) // rate]
            else:
                ids = p["prompt_token_ids"]
            answer = _solve(ids)
            if answer is not None:
                from benchmarks.accuracy import tasks

                if wrong and i % 10 == 0:
                    answer = "9" + answer
                toks = tasks.encode(answer + ";")[: sp.max_tokens]
            else:
                toks = [(sum(ids) + k) % 1000 for k in range(sp.max_tokens)]
                if os.environ.get("FAKE_VLLM_BATCH_VARIANT") and len(prompts) > 1:
                    toks[-1] += len(prompts)
                if wrong and i % 10 == 0 and len(toks) > 5:
                    toks[5] += 1
            logprobs = None
            if sp.logprobs:
                logprobs = [
                    {t + j: _Logprob(-0.1 * (j + 1)) for j in range(sp.logprobs)}
                    for t in toks
                ]
            outs.append(_Output([_Completion(toks, logprobs)]))
        self.calls += 1
        return outs

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        name = self.attention_backend or next(
            b.name
            for b in AttentionBackendEnum
            if not b.get_class().validate_configuration()
        )
        backend = AttentionBackendEnum[name].get_class()
        layers = [
            ("layers.0.attn", _Layer(backend)),
            ("layers.1.attn", _Layer(backend)),
        ]
        runner = type("Runner", (), {"get_model": lambda self: _Model(layers)})()
        worker = type("Worker", (), {"model_runner": runner})()
        return [method(worker, *args, **(kwargs or {}))]

    def get_metrics(self):
        """Like vLLM: only with stats on; speculative counters only when drafting."""
        if self.kwargs.get("disable_log_stats", True):
            raise AssertionError("Stat logging disabled")
        drafts = 10 * self.calls if self.kwargs.get("speculative_config") else 0
        return [
            _Metric("vllm:spec_decode_num_drafts", drafts),
            _Metric("vllm:spec_decode_num_draft_tokens", 3 * drafts),
            _Metric("vllm:spec_decode_num_accepted_tokens", drafts),
            _Metric("vllm:prompt_tokens", 123),
        ]


class _Metric:
    def __init__(self, name, value):
        self.name, self.value = name, value


class _Layer:
    def __init__(self, backend):
        self.attn_backend = backend


class _Model:
    def __init__(self, layers):
        self.layers = layers

    def named_modules(self):
        yield "", self
        yield from self.layers
