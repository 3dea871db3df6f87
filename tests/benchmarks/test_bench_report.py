"""docs/performance.md generation from results files (synthetic ones here)."""

import json

import pytest

from benchmarks import report
from benchmarks.accuracy.eval import TASK_VERSION
from benchmarks.e2e import results as e2e_res
from benchmarks.serving import results as sres


def _serving_body():
    recs = []
    for backend, tps in (("FLASH_ATTN", 200.0), ("TRITON_ATTN-fork", 180.0)):
        for pass_name in ("first", "steady"):
            bench = {
                "completed": 10,
                "duration": 1.0,
                "total_input_tokens": 100,
                "total_output_tokens": 50,
                "request_throughput": 10.0,
                "output_throughput": 50.0,
                "total_token_throughput": tps,
                "median_ttft_ms": 5.0,
                "mean_ttft_ms": 5.0,
                "p99_ttft_ms": 9.0,
                "median_tpot_ms": 2.0,
                "mean_tpot_ms": 2.0,
                "p99_tpot_ms": 3.0,
            }
            recs.append(
                sres.make_record(
                    bench,
                    backend=backend,
                    install="stock",
                    attention_backend=backend,
                    workload="sharegpt-like",
                    pass_name=pass_name,
                    rate=None,
                    model="llama-3.1-8b",
                    quick=True,
                    command="cmd",
                )
            )
    return {
        "kind": "serving",
        "model": "llama-3.1-8b",
        "mode": "quick",
        "commit": "abc",
        "environment": {"stock": {"gpu": "NVIDIA H200"}},
        "command": "run_serving.py --quick",
        "complete": True,
        "records": recs,
        "server_starts": {
            "FLASH_ATTN": [{"healthy_after_s": 164.2, "late_jit_compiles": []}],
            "TRITON_ATTN-fork": [
                {"healthy_after_s": 150.0, "late_jit_compiles": []},
                {"healthy_after_s": 188.4, "late_jit_compiles": ["_k", "_k"]},
            ],
        },
        "openai_check": {
            "FLASH_ATTN": {"completions": {"ok": True}, "chat": {"ok": True}},
            "TRITON_ATTN-fork": {"completions": {"ok": True}, "chat": {"ok": False}},
        },
    }


def _e2e_body():
    recs = [
        {
            "workload": "decode",
            "backend": b,
            "install": "stock",
            "pass": "steady",
            "kv_cache_dtype": "auto",
            "scale": 0.25,
            "total_tok_per_s": t,
            "elapsed_s": 2.0,
        }
        for b, t in (("FLASH_ATTN", 1000.0), ("TRITON_ATTN-stock", 500.0))
    ]
    return {
        "commit": "abc",
        "gpu": "NVIDIA H200",
        "scale": 0.25,
        "kv_cache_dtype": "auto",
        "command": "run_e2e.py",
        "complete": True,
        "records": e2e_res.add_ratios(recs),
        "output_agreement": [
            {
                "backend": "TRITON_ATTN-stock",
                "workload": "decode",
                "n": 4,
                "identical": 0.5,
                "identical_head": 1.0,
                "mean_common_prefix": 32.0,
            }
        ],
    }


def _acc_body():
    s = {"addition": {"n": 500, "correct": 490, "acc": 0.98, "stderr": 0.00626}}
    return {
        "environment": {"gpu": "NVIDIA H200"},
        "pass": True,
        "backends": {
            "FLASH_ATTN": {"install": "stock", "summary": s},
            "TRITON_ATTN-fork": {"install": "fork", "summary": s},
        },
        "comparison": [
            {
                "backend": "TRITON_ATTN-fork",
                "task": "addition",
                "acc": 0.98,
                "baseline_acc": 0.98,
                "delta": 0.0,
                "baseline_stderr": 0.00626,
                "pass": True,
            }
        ],
    }


@pytest.fixture
def results_dir(tmp_path):
    root = tmp_path / "results"
    for sub, name, body in (
        ("serving", "20260101-abc-llama-3.1-8b-quick.json", _serving_body()),
        ("e2e", "20260101-abc-s0.25.json", _e2e_body()),
        ("accuracy", "summary.json", _acc_body()),
    ):
        (root / sub).mkdir(parents=True)
        (root / sub / name).write_text(json.dumps(body))
    return root


def test_report_text(results_dir, tmp_path):
    text = report.build(results_dir, tmp_path / "docs" / "performance.md", plots=False)
    assert "| sharegpt-like | inf | steady | TRITON_ATTN-fork | 180 | 0.90x |" in text
    assert (
        "| decode | steady | auto | TRITON_ATTN-stock | stock | 500 | 0.50x |" in text
    )
    assert f"|addition|{TASK_VERSION}|exact|0|exact_match|↑|0.9800|±|0.0063|" in text
    assert "Overall: PASS" in text
    assert text.count("Serving Benchmark Result") == 4
    assert (
        "FLASH_ATTN completions ok, chat ok; TRITON_ATTN-fork completions ok, "
        "chat FAILED" in text
    )
    assert (
        "JIT monitor in the server log): FLASH_ATTN 164 (none); "
        "TRITON_ATTN-fork 150 (none), 188 (_k, _k)" in text
    )


def test_report_empty(tmp_path):
    text = report.build(tmp_path / "none", tmp_path / "performance.md", plots=False)
    assert "No serving results yet" in text and "No e2e results yet" in text


def test_newest_wins(results_dir, tmp_path):
    newer = _serving_body()
    newer["records"][1]["total_token_throughput"] = 400.0  # FA steady
    (results_dir / "serving" / "20270101-def-llama-3.1-8b-quick.json").write_text(
        json.dumps(newer)
    )
    text = report.build(results_dir, tmp_path / "performance.md", plots=False)
    assert "| sharegpt-like | inf | steady | TRITON_ATTN-fork | 180 | 0.45x |" in text


def test_plots(results_dir, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    doc = tmp_path / "docs" / "performance.md"
    text = report.build(results_dir, doc, plots=True)
    pngs = list((results_dir / "serving" / "plots").glob("*.png"))
    assert [p.name for p in pngs] == ["llama-3.1-8b-quick-sharegpt-like.png"]
    assert pngs[0].stat().st_size > 1000
    assert "![llama-3.1-8b-quick-sharegpt-like](" in text


def _kernel_body(date, ours):
    record = {
        "kernel": "prefill",
        "model": "llama-3.1-8b",
        "block_size": 64,
        "batch": 1,
        "query_len": 8192,
        "context": 8192,
        "kv_dtype": "bfloat16",
        "ours": ours,
        "unit": "TFLOP/s",
        "fa3": 500.0,
        "stock_triton": 80.0,
        "ratio_vs_fa3": ours / 500.0,
        "ratio_vs_stock_triton": ours / 80.0,
        "max_abs_err": {"ours": 1e-4},
    }
    return {
        "date": date,
        "gpu": "NVIDIA H200",
        "commit": "abc",
        "command": "bench_kernels.py",
        "copy_bandwidth_gbs": 4300.0,
        "bf16_dense_peak_tflops": 989.0,
        "records": [record],
    }


def test_kernel_tables_newest_first_with_tuning_and_notes(results_dir, tmp_path):
    """Every kernel file gets its own table (FA3 ratios only compare within one
    sitting), newest first; recorded tuning runs and the hand-written notes show."""
    kernels = results_dir / "kernels"
    kernels.mkdir()
    (kernels / "a-old.json").write_text(json.dumps(_kernel_body("2026-01-01", 300.0)))
    (kernels / "b-new.json").write_text(json.dumps(_kernel_body("2026-02-01", 450.0)))
    (kernels / "c-quick.json").write_text(json.dumps(_kernel_body("2026-03-01", 1.0)))
    tuning = results_dir / "tuning"
    tuning.mkdir()
    key = {"head_size": 128, "group": 4, "block_size": 64, "max_query_len": 16384}
    cfg = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    (tuning / "t.json").write_text(
        json.dumps(
            {
                "gpu": "NVIDIA H200",
                "space": {},
                "records": [
                    {
                        "key": key,
                        "best": {**cfg, "use_tma": True, "fp8_qk": True},
                        "best_timing": {"ms": 1.0, "tflops": 450.0},
                        "previous": cfg,
                        "previous_timing": {"ms": 1.1, "tflops": 416.0},
                        "heuristic": cfg,
                        "heuristic_timing": None,
                    }
                ],
            }
        )
    )
    (results_dir / "NOTES.md").write_text("## What moved the numbers\n\nTMA did.\n")
    text = report.build(results_dir, tmp_path / "performance.md", plots=False)
    assert text.index("### `b-new.json`") < text.index("### `a-old.json`")
    assert "c-quick.json" not in text
    assert "| 450 TFLOP/s | 500.00 |" in text and "| 300 TFLOP/s | 500.00 |" in text
    assert (
        "| 128, 4, 64, 16384 | 64x64 w4 s2 tma fp8_qk | 450 | 64x64 w4 s2 | 416 | - |"
        in text
    )
    assert text.index("TMA did.") < text.index("## Serving")


def test_agreement_and_soak_rows(tmp_path):
    root = tmp_path / "results"
    (root / "agreement").mkdir(parents=True)
    (root / "soak").mkdir()
    (root / "agreement" / "a.json").write_text(
        json.dumps(
            {"reference": "FLASH_ATTN", "backend": "TRITON_ATTN", "tp": 1,
             "prompts": 100, "tokens_equal": 3195, "tokens_compared": 3200,
             "fraction_equal": 0.9984, "model": "gemma-2-9b-softcap",
             "kv_cache_dtype": "auto", "prompts_diverged": 2,
             "divergences_at_near_ties": 2,
             "sides": {"TRITON_ATTN": {"late_jit_compiles": []}}}
        )
    )  # fmt: skip
    soak = {
        "duration_s": 300.0, "concurrency": 48, "pass": False,
        "requests": {"ok": 10, "cancelled": 2, "errors": 1},
        "fixed_request_same_answer": True,
        "memory": {"checked": True, "growth_mib": 0},
    }  # fmt: skip
    (root / "soak" / "s.json").write_text(json.dumps(soak))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    assert (
        "| `a.json` | gemma-2-9b-softcap | auto | FLASH_ATTN | TRITON_ATTN | 1 | 100 "
        "| 3195/3200 | 0.9984 | 2 (2) | none |" in text
    )
    assert "| `s.json` | 5 | 48 | 10 | 2 | 1 | True | 0 MiB | FAIL |" in text


def test_accuracy_shows_the_newest_run_by_its_date_not_its_name(results_dir, tmp_path):
    # files of one day are named by commit hash, which does not sort by time
    old, new = _acc_body(), _acc_body()
    old["environment"]["date_utc"] = "2026-11-30T09:00:00Z"
    new["environment"]["date_utc"] = "2026-11-30T10:42:39Z"
    new["pass"] = False
    acc = results_dir / "accuracy"
    (acc / "summary.json").unlink()
    (acc / "summary-2026-11-30-aaa.json").write_text(json.dumps(new))
    (acc / "summary-2026-11-30-fff.json").write_text(json.dumps(old))
    text = report.build(results_dir, tmp_path / "performance.md", plots=False)
    assert "(summary-2026-11-30-aaa.json;" in text and "Overall: FAIL" in text


def test_agreement_row_names_speculative_decoding_and_its_counters(tmp_path):
    root = tmp_path / "results"
    (root / "agreement").mkdir(parents=True)
    body = {
        "reference": "FLASH_ATTN", "backend": "TRITON_ATTN", "tp": 1, "prompts": 100,
        "tokens_equal": 6400, "tokens_compared": 6400, "fraction_equal": 1.0,
        "backend_speculative": {
            "config": {"method": "ngram", "num_speculative_tokens": 3},
            "num_drafts": 1588, "num_draft_tokens": 4664, "num_accepted_tokens": 4600,
        },
    }  # fmt: skip
    (root / "agreement" / "n.json").write_text(json.dumps(body))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    assert (
        "| TRITON_ATTN + ngram spec. decoding (4600/4664 draft tokens accepted) | 1 |"
        in text
    )


def test_serving_sitting_on_two_gpus_is_one_table_with_same_gpu_ratios(tmp_path):
    root = tmp_path / "results"
    (root / "serving").mkdir(parents=True)
    old = _serving_body()  # an earlier sitting: not shown
    old["environment"]["stock"]["date_utc"] = "2026-11-29T10:00:00Z"
    (root / "serving" / "2026-11-29-abc-llama-3.1-8b-quick.json").write_text(
        json.dumps(old)
    )
    for gpu, fork_tps, fa_tps in ((0, 210.0, 200.0), (1, 90.0, 100.0)):
        body = _serving_body()
        body["commit"], body["gpu_tag"] = "def", f"-gpu{gpu}"
        body["environment"]["stock"]["date_utc"] = f"2026-11-30T1{gpu}:00:00Z"
        for r in body["records"]:
            r["total_token_throughput"] = fork_tps if "fork" in r["backend"] else fa_tps
        if gpu == 1:  # lane 1 ran another backend against its own FLASH_ATTN
            for r in body["records"]:
                if "fork" in r["backend"]:
                    r["backend"] = "ROCM_ATTN"
        name = f"2026-11-30-def-llama-3.1-8b-quick-gpu{gpu}.json"
        (root / "serving" / name).write_text(json.dumps(body))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    assert "all GPUs of the sitting" in text
    assert (
        "| sharegpt-like | inf | steady | TRITON_ATTN-fork | GPU 0 | 210 | 1.05x |"
        in text
    )
    assert "| sharegpt-like | inf | steady | ROCM_ATTN | GPU 1 | 90 | 0.90x |" in text
    assert "quick-gpu0.json" in text and "quick-gpu1.json" in text
    assert "2026-11-29-abc" not in text


def test_e2e_shows_every_gpu_file_of_the_newest_sitting(tmp_path):
    root = tmp_path / "results"
    (root / "e2e").mkdir(parents=True)
    for name, commit, at in (
        ("2026-11-30-fff-s0.25.json", "fff", "T09"),  # an earlier sitting
        ("2026-11-30-bbb-s0.25-gpu0.json", "bbb", "T10"),
        ("2026-11-30-bbb-s0.25-gpu1.json", "bbb", "T10"),
    ):
        body = _e2e_body()
        body["commit"], body["date_utc"] = commit, f"2026-11-30{at}:00:00Z"
        (root / "e2e" / name).write_text(json.dumps(body))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    assert "### scale 0.25 · KV cache auto (2026-11-30-bbb-s0.25-gpu0.json" in text
    assert "### scale 0.25 · KV cache auto (2026-11-30-bbb-s0.25-gpu1.json" in text
    assert "### scale 0.25 · KV cache auto (2026-11-30-fff" not in text


def test_e2e_profiles_show_each_backends_gpu_time_by_category(tmp_path):
    root = tmp_path / "results"
    (root / "e2e").mkdir(parents=True)
    body = _e2e_body()
    cats = {"attention": 300.0, "gemm": 600.0, "kv_cache_write": 10.0, "other": 90.0}
    body["profiles"] = {
        "FLASH_ATTN": {
            "long10k": {"requests": 8, "total_ms": 1000.0, "categories": cats}
        },
        "TRITON_ATTN-fork": {
            "long10k": {
                "requests": 8,
                "total_ms": 1100.0,
                "categories": {**cats, "attention": 400.0},
            }
        },
    }
    (root / "e2e" / "2026-11-30-abc.json").write_text(json.dumps(body))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    head = "| workload | backend | requests | GPU ms | attention ms | gemm ms |"
    assert head in text
    assert "| long10k | FLASH_ATTN | 8 | 1,000 | 300 (30%) | 600 (60%) |" in text
    assert "| long10k | TRITON_ATTN-fork | 8 | 1,100 | 400 (36%) | 600 (55%) |" in text
    # A failed profile is named with its reason.
    body["profile_errors"] = {"TRITON_ATTN-fork": {"decode": "no table"}}
    (root / "e2e" / "2026-11-30-abc.json").write_text(json.dumps(body))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    assert "- no profile of decode for TRITON_ATTN-fork: no table" in text
    # A file without profiles gets no such table.
    del body["profiles"], body["profile_errors"]
    (root / "e2e" / "2026-11-30-abc.json").write_text(json.dumps(body))
    text = report.build(root, tmp_path / "performance.md", plots=False)
    assert "torch profiler" not in text
