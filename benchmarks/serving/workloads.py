"""Serving workloads (issue #4) as data, and the command lines built from them.

All workloads use ``vllm bench serve``'s ``random`` dataset (no ShareGPT file on the GPU
host): the "sharegpt-like" one has the ShareGPT means of the seed PR (215 prompt / 197
output tokens per request) with ``--random-range-ratio 0.9``, i.e. prompts of U[22, 408]
tokens (the BOS included) and outputs of U[19, 375]. The two long-prompt workloads are
the seed PR's 70B runs; decode-heavy keeps 1000-token prompts generating 1000 tokens.

``rates``: request rates (req/s) below saturation, run after the saturated pass in full
mode. ``quick_prompts``: prompt count of --quick mode, sized so that two backends fit in
about five minutes with their server starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
BENCH_SEED = 42


@dataclass(frozen=True)
class ServingWorkload:
    name: str
    input_len: int
    output_len: int
    num_prompts: int
    quick_prompts: int
    range_ratio: float = 0.0
    rates: tuple[float, ...] = field(default_factory=tuple)

    def prompts(self, quick: bool) -> int:
        return self.quick_prompts if quick else self.num_prompts


WORKLOADS: dict[str, ServingWorkload] = {
    w.name: w
    for w in (
        ServingWorkload("sharegpt-like", 215, 197, 1000, 200, 0.9, (8.0, 16.0)),
        ServingWorkload("random-10k-100", 10000, 100, 300, 24, 0.0, (0.25,)),
        ServingWorkload("random-5k-100", 5000, 100, 500, 40, 0.0, (0.5,)),
        ServingWorkload("decode-1k-1k", 1000, 1000, 256, 64, 0.0, (1.0,)),
    )
}

# max_model_len of the server: the longest workload (10000 + 100) plus headroom.
SERVER_MAX_MODEL_LEN = 12288


@dataclass(frozen=True)
class Run:
    """One ``vllm bench serve`` invocation."""

    workload: ServingWorkload
    pass_name: (
        str  # "first" (fresh server) | "steady" (after a pass over the same requests)
    )
    rate: float | None  # None = all requests at once (saturation)
    quick: bool

    @property
    def key(self) -> str:
        rate = "inf" if self.rate is None else f"{self.rate:g}"
        return f"{self.workload.name}-r{rate}-{self.pass_name}"


def plan_runs(names: list[str], quick: bool, with_rates: bool) -> list[Run]:
    """The bench passes, in order. Each (workload, rate) gets a "first" pass, which is
    also the untimed warm-up of its "steady" pass over the same requests (same seed).

    Quick mode with rates: a rate gets its "steady" pass only. It runs right after
    the workload's saturated passes, which sent the same requests (same prompt
    count, same seed) to the same server; a server started afresh in between gives
    it a warm-up pass first (run_serving.py)."""
    runs: list[Run] = []
    for name in names:
        if name not in WORKLOADS:
            raise SystemExit(
                f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}"
            )
        w = WORKLOADS[name]
        rates: list[float | None] = [None]
        if with_rates:
            rates += list(w.rates)
        for rate in rates:
            passes = ("steady",) if quick and rate is not None else ("first", "steady")
            for pass_name in passes:
                runs.append(Run(w, pass_name, rate, quick))
    return runs


def serve_command(
    python: str,
    model_dir: str,
    served_name: str,
    port: int,
    attention_backend: str,
    tp: int,
    prefix_caching: bool = False,
) -> list[str]:
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        model_dir,
        "--served-model-name",
        served_name,
        "--load-format",
        "dummy",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(SERVER_MAX_MODEL_LEN),
        "--attention-backend",
        attention_backend,
        "--tensor-parallel-size",
        str(tp),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--seed",
        "0",
    ]
    if not prefix_caching:
        # The steady pass repeats the first pass's prompts; a prefix-cache hit would
        # skip their prefill and hide the attention kernels being measured.
        cmd.append("--no-enable-prefix-caching")
    return cmd


def bench_command(
    python: str,
    run: Run,
    model_dir: str,
    served_name: str,
    port: int,
    result_dir: str,
    result_file: str,
) -> list[str]:
    w = run.workload
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--model",
        served_name,
        "--tokenizer",
        model_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(w.input_len),
        "--random-output-len",
        str(w.output_len),
        "--random-range-ratio",
        f"{w.range_ratio:g}",
        "--num-prompts",
        str(w.prompts(run.quick)),
        "--seed",
        str(BENCH_SEED),
        "--ignore-eos",
        "--percentile-metrics",
        PERCENTILE_METRICS,
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        result_dir,
        "--result-filename",
        result_file,
        "--disable-tqdm",
    ]
    if run.rate is not None:
        cmd += ["--request-rate", f"{run.rate:g}"]
    return cmd
