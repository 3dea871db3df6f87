"""Serving (issue #4) harness: workloads as data, command lines, the seed PRs' result
block, the side-by-side table, and server/bench orchestration against the fake vLLM
(resume, loud failure with the server log tail)."""

import json
import os
import subprocess
import sys

from benchmarks.harness import REPO
from benchmarks.serving import results as sres
from benchmarks.serving.workloads import (
    WORKLOADS,
    bench_command,
    plan_runs,
    serve_command,
)

# The PR column of the seed's Llama-3.1-70B 10000/100 run, as vllm bench serve
# prints it.
SEED_BLOCK = """\
============ Serving Benchmark Result ============
Successful requests:                     300
Benchmark duration (s):                  409.78
Total input tokens:                      3000000
Total generated tokens:                  30000
Request throughput (req/s):              0.73
Output token throughput (tok/s):         73.21
Total Token throughput (tok/s):          7394.28
---------------Time to First Token----------------
Mean TTFT (ms):                          205042.73
Median TTFT (ms):                        203406.19
P99 TTFT (ms):                           400609.81
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          1610.15
Median TPOT (ms):                        2027.83
P99 TPOT (ms):                           2239.19
---------------Inter-token Latency----------------
Mean ITL (ms):                           1610.15
Median ITL (ms):                         80.56
P99 ITL (ms):                            5252.32
----------------End-to-end Latency----------------
Mean E2EL (ms):                          364447.21
Median E2EL (ms):                        404161.34
P99 E2EL (ms):                           409588.24
=================================================="""

SEED_JSON = {
    "completed": 300,
    "duration": 409.78,
    "total_input_tokens": 3000000,
    "total_output_tokens": 30000,
    "request_throughput": 0.73,
    "output_throughput": 73.21,
    "total_token_throughput": 7394.28,
    "request_rate": "inf",
    "mean_ttft_ms": 205042.73,
    "median_ttft_ms": 203406.19,
    "p99_ttft_ms": 400609.81,
    "mean_tpot_ms": 1610.15,
    "median_tpot_ms": 2027.83,
    "p99_tpot_ms": 2239.19,
    "mean_itl_ms": 1610.15,
    "median_itl_ms": 80.56,
    "p99_itl_ms": 5252.32,
    "mean_e2el_ms": 364447.21,
    "median_e2el_ms": 404161.34,
    "p99_e2el_ms": 409588.24,
}


def test_result_block_matches_the_seed():
    got = "\n".join(line.rstrip() for line in sres.result_block(SEED_JSON).splitlines())
    assert got == SEED_BLOCK


def test_workloads_as_declared():
    w = WORKLOADS["sharegpt-like"]
    assert (w.input_len, w.output_len, w.range_ratio, w.num_prompts) == (
        215,
        197,
        0.9,
        1000,
    )
    assert (
        WORKLOADS["random-10k-100"].num_prompts,
        WORKLOADS["random-5k-100"].num_prompts,
    ) == (300, 500)
    assert WORKLOADS["decode-1k-1k"].input_len == WORKLOADS["decode-1k-1k"].output_len
    assert all(w.quick_prompts < w.num_prompts for w in WORKLOADS.values())


def test_plan_first_then_steady_per_rate():
    runs = plan_runs(["sharegpt-like"], quick=False, with_rates=True)
    keys = [r.key for r in runs]
    assert keys == [
        "sharegpt-like-rinf-first",
        "sharegpt-like-rinf-steady",
        "sharegpt-like-r8-first",
        "sharegpt-like-r8-steady",
        "sharegpt-like-r16-first",
        "sharegpt-like-r16-steady",
    ]
    quick = plan_runs(list(WORKLOADS), quick=True, with_rates=False)
    assert len(quick) == 2 * len(WORKLOADS)
    # Quick sizes with rates: one steady pass per rate, after the saturated pair.
    keys = [r.key for r in plan_runs(["sharegpt-like"], quick=True, with_rates=True)]
    assert keys == [
        "sharegpt-like-rinf-first",
        "sharegpt-like-rinf-steady",
        "sharegpt-like-r8-steady",
        "sharegpt-like-r16-steady",
    ]


def test_command_lines():
    run = plan_runs(["sharegpt-like"], quick=True, with_rates=True)[2]  # rate 8
    assert run.rate == 8
    cmd = bench_command("py", run, "/m", "llama", 8123, "/r", "x.json")
    s = " ".join(cmd)
    for flag in (
        "bench serve",
        "--dataset-name random",
        "--random-input-len 215",
        "--random-output-len 197",
        "--random-range-ratio 0.9",
        "--num-prompts 200",
        "--ignore-eos",
        "--save-result",
        "--percentile-metrics ttft,tpot,itl,e2el",
        "--request-rate 8",
        "--seed 42",
        "--tokenizer /m",
    ):
        assert flag in s, flag
    srv = " ".join(serve_command("py", "/m", "llama", 8123, "TRITON_ATTN", 2))
    for flag in (
        "serve /m",
        "--load-format dummy",
        "--attention-backend TRITON_ATTN",
        "--no-enable-prefix-caching",
        "--tensor-parallel-size 2",
        "--max-model-len 12288",
    ):
        assert flag in srv, flag
    soak = serve_command(
        "py", "/m", "llama", 8123, "TRITON_ATTN", 1, prefix_caching=True
    )
    assert "prefix-caching" not in " ".join(soak)


def _rec(backend, tps, ttft):
    bench = dict(SEED_JSON, total_token_throughput=tps, median_ttft_ms=ttft)
    return sres.make_record(
        bench,
        backend=backend,
        install="stock",
        attention_backend=backend,
        workload="w",
        pass_name="steady",
        rate=None,
        model="m",
        quick=True,
        command="c",
    )


def test_side_by_side_ratios():
    recs = [_rec("TRITON_ATTN-fork", 150.0, 30.0), _rec("FLASH_ATTN", 200.0, 20.0)]
    table = sres.side_by_side(recs)
    assert (
        "| metric | FLASH_ATTN | TRITON_ATTN-fork | TRITON_ATTN-fork / FLASH_ATTN |"
        in table
    )
    assert "| Total token throughput (tok/s) | 200.00 | 150.00 | 0.75x |" in table
    assert "| Median TTFT (ms) | 20.00 | 30.00 | 1.50x |" in table
    ratios = sres.ratio_to_baseline(recs)
    assert [r["ratio"] for r in ratios] == [0.75]


def _run(tmp_path, model_dir, *extra, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/serving/run_serving.py"),
            "--quick",
            "--model-dir",
            str(model_dir),
            "--workloads",
            "sharegpt-like",
            "--work-dir",
            str(tmp_path / "work"),
            "--results-dir",
            str(tmp_path / "res"),
            "--startup-timeout-s",
            "60",
            *extra,
        ],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_orchestration_results_and_resume(tmp_path, fake_sites, model_dir_8b):
    r = _run(tmp_path, model_dir_8b)
    assert r.returncode == 0, r.stdout + r.stderr
    files = list((tmp_path / "res").glob("*-quick.json"))
    assert len(files) == 1
    body = json.loads(files[0].read_text())
    assert body["commit"] == "testcommit" and body["mode"] == "quick"
    assert {b["name"] for b in body["backends"]} == {"FLASH_ATTN", "TRITON_ATTN-fork"}
    assert len(body["records"]) == 2 * 2  # backends x passes
    assert "server healthy" in r.stdout
    # issue #5: each server answered one completion and one chat request
    assert body["openai_check"]["TRITON_ATTN-fork"]["chat"] == {
        "ok": True,
        "text": "hello",
    }
    assert all(
        res["ok"] for b in body["openai_check"].values() for res in b.values()
    ), body["openai_check"]
    assert r.stdout.count("Serving Benchmark Result") == 4
    assert "TRITON_ATTN-fork / FLASH_ATTN" in r.stdout
    # issue #5: the startup time of each server, and no Triton build after warm-up
    for starts in body["server_starts"].values():
        assert len(starts) == 1 and starts[0]["healthy_after_s"] > 0.2, starts
        assert starts[0]["late_jit_compiles"] == []
    r2 = _run(tmp_path, model_dir_8b)
    assert r2.returncode == 0
    assert "server healthy" not in r2.stdout  # nothing left: no server started
    # A steady pass resumed on a new server gets an untimed warm-up pass first.
    work = tmp_path / "work" / "llama-3.1-8b-quick" / "FLASH_ATTN"
    (work / "sharegpt-like-rinf-steady.json").unlink()
    r3 = _run(tmp_path, model_dir_8b)
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "sharegpt-like-rinf-warmup" in r3.stdout
    assert (work / "sharegpt-like-rinf-steady.json").is_file()
    assert not list(work.glob("*warmup*.json"))
    again = json.loads(files[0].read_text())["server_starts"]
    assert len(again["FLASH_ATTN"]) == 2 and len(again["TRITON_ATTN-fork"]) == 1


def test_compiles_while_serving_are_read_from_the_server_log(
    tmp_path, fake_sites, model_dir_8b
):
    r = _run(
        tmp_path, model_dir_8b, env_extra={"FAKE_VLLM_LATE_BUILDS": "TRITON_ATTN:2"}
    )
    assert r.returncode == 0, r.stdout + r.stderr
    body = json.loads(next((tmp_path / "res").glob("*-quick.json")).read_text())
    late = {
        name: [s["late_jit_compiles"] for s in starts]
        for name, starts in body["server_starts"].items()
    }
    assert late == {
        "FLASH_ATTN": [[]],
        "TRITON_ATTN-fork": [["_prefix_prefill_kernel"] * 2],
    }, late
    assert (
        "Triton compiled while serving: _prefix_prefill_kernel, _prefix_prefill_kernel"
        in r.stdout
    )


def test_server_failure_is_loud(tmp_path, fake_sites, model_dir_8b):
    r = _run(tmp_path, model_dir_8b, env_extra={"FAKE_VLLM_SERVE_FAIL": "TRITON_ATTN"})
    assert r.returncode == 1
    assert "FAILED: server exited with code 3" in r.stdout
    assert "simulated startup crash" in r.stdout  # the server log tail is shown
    assert "INCOMPLETE/FAILED: TRITON_ATTN-fork" in r.stdout


def test_quick_rates_mode(tmp_path, fake_sites, model_dir_8b):
    """--quick --rates: the saturated pair, then one pass per rate, in its own file
    and work folder (the quick run's results are not reused or overwritten)."""
    r = _run(tmp_path, model_dir_8b, "--rates", "--backends", "FLASH_ATTN")
    assert r.returncode == 0, r.stdout + r.stderr
    files = list((tmp_path / "res").glob("*-quick-rates.json"))
    assert len(files) == 1, list((tmp_path / "res").iterdir())
    body = json.loads(files[0].read_text())
    assert body["mode"] == "quick-rates"
    got = [(rec["rate"], rec["pass"]) for rec in body["records"]]
    assert sorted(got, key=str) == sorted(
        [("inf", "first"), ("inf", "steady"), (8.0, "steady"), (16.0, "steady")],
        key=str,
    ), got
    # The saturated passes sent the rates' requests to this server already: no
    # untimed pass of their own (an extra pass per rate cost a sitting its time).
    assert "warmup" not in r.stdout
    assert (tmp_path / "work" / "llama-3.1-8b-quick-rates" / "FLASH_ATTN").is_dir()
    full = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/serving/run_serving.py"),
            "--rates",
            "--model-dir",
            str(model_dir_8b),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert full.returncode != 0 and "--rates is for --quick" in full.stderr


def test_endpoint_failure_is_loud(tmp_path, fake_sites, model_dir_8b):
    """A server that does not answer chat requests is reported (with its log tail)
    and makes the run incomplete, though its benchmark passes still run."""
    r = _run(tmp_path, model_dir_8b, env_extra={"FAKE_VLLM_NO_CHAT": "TRITON_ATTN"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "OpenAI chat request: FAILED" in r.stdout
    assert "an OpenAI-compatible endpoint did not answer" in r.stdout
    body = json.loads(next((tmp_path / "res").glob("*-quick.json")).read_text())
    assert not body["openai_check"]["TRITON_ATTN-fork"]["chat"]["ok"]
    assert body["openai_check"]["FLASH_ATTN"]["chat"]["ok"]
    assert {rec["backend"] for rec in body["records"]} == {
        "FLASH_ATTN",
        "TRITON_ATTN-fork",
    }
