"""e2e (issue #6) harness: workloads, ratios, table, output agreement, and the
per-backend orchestration with resume against the fake vLLM."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.e2e import results as res
from benchmarks.e2e.run_e2e import DEFAULT_BACKENDS
from benchmarks.e2e.workloads import WORKLOADS, make_requests, token_counts
from benchmarks.harness import REPO


def test_workloads_match_the_issue():
    w = WORKLOADS
    assert (
        w["sharegpt"].num_requests,
        w["sharegpt"].input_len,
        w["sharegpt"].output_len,
    ) == (1000, (22, 408), (20, 374))
    assert (w["long10k"].num_requests, w["long10k"].input_len) == (100, (10000, 10000))
    assert (w["decode"].num_requests, w["decode"].output_len) == (256, (1000, 1000))


def test_make_requests_deterministic_and_in_range():
    a = make_requests(WORKLOADS["sharegpt"], 0.05, seed=0)
    b = make_requests(WORKLOADS["sharegpt"], 0.05, seed=0)
    c = make_requests(WORKLOADS["sharegpt"], 0.05, seed=1)
    assert a == b and a != c
    assert len(a) == 50
    for prompt, n_out in a:
        assert 22 <= len(prompt) <= 408 and 20 <= n_out <= 374
        assert all(16 <= t < 32000 for t in prompt)
    n_in, n_out = token_counts(a)
    assert n_in == sum(len(p) for p, _ in a)
    assert len(make_requests(WORKLOADS["long10k"], 0.01, seed=0)) == 8  # minimum


def _rec(backend, tps, workload="sharegpt", pass_="steady", kv="auto"):
    return {
        "workload": workload,
        "backend": backend,
        "install": "stock",
        "pass": pass_,
        "kv_cache_dtype": kv,
        "scale": 1.0,
        "total_tok_per_s": tps,
        "elapsed_s": 1.0,
    }


def test_ratios_pair_only_matching_records():
    recs = res.add_ratios(
        [
            _rec("FLASH_ATTN", 200.0),
            _rec("TRITON_ATTN-fork", 150.0),
            _rec("TRITON_ATTN-fork", 90.0, pass_="first"),  # no baseline first pass
            _rec("TRITON_ATTN-fork", 300.0, kv="fp8"),  # no fp8 baseline
        ]
    )
    got = [r["ratio_to_flash_attn"] for r in recs]
    assert got == [1.0, 0.75, None, None]
    table = res.format_table(recs)
    assert (
        "| sharegpt | steady | auto | TRITON_ATTN-fork | stock | 150 | 0.75x |" in table
    )


def test_agreement():
    base = {"digests": ["a", "b", "c", "d"], "heads": [[1, 2], [1, 2], [3], [4, 5]]}
    ours = {"digests": ["a", "x", "c", "y"], "heads": [[1, 2], [1, 3], [3], [5, 5]]}
    a = res.agreement(ours, base)
    assert a["identical"] == 0.5
    assert a["identical_head"] == 0.5
    assert a["mean_common_prefix"] == (2 + 1 + 1 + 0) / 4
    with pytest.raises(ValueError):
        res.agreement({"digests": ["a"], "heads": [[1]]}, base)


def _run(tmp_path, model_dir, *extra):
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/e2e/run_e2e.py"),
            "--model-dir",
            str(model_dir),
            "--scale",
            "0.01",
            "--work-dir",
            str(tmp_path / "work"),
            "--results-dir",
            str(tmp_path / "res"),
            "--timeout-s",
            "60",
            *extra,
        ],
        env=dict(os.environ),
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_orchestration_schema_and_resume(tmp_path, fake_sites, model_dir_8b):
    r = _run(tmp_path, model_dir_8b, "--workloads", "sharegpt,decode")
    assert r.returncode == 0, r.stdout + r.stderr
    files = list((tmp_path / "res").glob("*.json"))
    assert len(files) == 1 and files[0].name.endswith("-testcommit-s0.01.json")
    body = json.loads(files[0].read_text())
    for key in (
        "commit",
        "gpu",
        "vllm",
        "torch",
        "triton",
        "driver",
        "command",
        "records",
        "scale",
    ):
        assert key in body, key
    assert body["vllm"] == "0.0.fake" and body["scale"] == 0.01
    recs = body["records"]
    num_backends = len(DEFAULT_BACKENDS.split(","))
    assert len(recs) == num_backends * 2 * 2  # backends x workloads x passes
    for r_ in recs:
        for key in (
            "workload",
            "backend",
            "install",
            "kv_cache_dtype",
            "total_tok_per_s",
            "ratio_to_flash_attn",
            "pass",
        ):
            assert key in r_, key
        assert r_["pass"] in ("first", "steady")
        if r_["backend"] == "FLASH_ATTN":
            assert r_["ratio_to_flash_attn"] == 1.0
        if r_["pass"] == "steady":
            assert r_["steady_equals_first"] == 1.0
    # The fake generates the same tokens for every backend.
    assert body["output_agreement"] and all(
        a["identical"] == 1.0 for a in body["output_agreement"]
    )
    assert "| decode | first |" in r.stdout
    # Resume: nothing left to do for these workloads; one more workload runs alone.
    r2 = _run(tmp_path, model_dir_8b, "--workloads", "sharegpt,decode")
    assert r2.stdout.count("skipping") == len(DEFAULT_BACKENDS.split(","))
    r3 = _run(
        tmp_path,
        model_dir_8b,
        "--workloads",
        "sharegpt,long10k",
        "--backends",
        "FLASH_ATTN",
    )
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "--workloads long10k" in r3.stdout


def test_budget_leaves_work_for_a_rerun(tmp_path, fake_sites, model_dir_8b):
    r = _run(tmp_path, model_dir_8b, "--workloads", "sharegpt", "--budget-s", "30")
    assert r.returncode == 1
    assert "budget spent" in r.stdout and "rerun" in r.stdout


def test_missing_install_fails_loudly_but_others_run(
    tmp_path, fake_sites, model_dir_8b, monkeypatch
):
    monkeypatch.setenv("BENCH_SITE_FORK", str(tmp_path / "no-such-site"))
    r = _run(tmp_path, model_dir_8b, "--workloads", "sharegpt")
    assert r.returncode == 1
    assert "FAILED: TRITON_ATTN-fork: no vLLM at" in r.stdout
    body = json.loads(next((tmp_path / "res").glob("*.json")).read_text())
    assert {r_["backend"] for r_ in body["records"]} == {
        "FLASH_ATTN",
        "TRITON_ATTN-stock",
        "ROCM_ATTN-stock",
    }
    assert body["complete"] is False


def test_a_backend_starts_only_with_time_for_a_result():
    from benchmarks.e2e import run_e2e

    # Start-up plus about a minute per full-size workload.
    full = run_e2e.start_allowance(1.0, 3)
    assert full == run_e2e.STARTUP_ALLOWANCE_S + 3 * run_e2e.WORKLOAD_ALLOWANCE_S
    assert run_e2e.start_allowance(0.25, 3) < full
    assert run_e2e.start_allowance(0.25, 1) == (
        run_e2e.STARTUP_ALLOWANCE_S + run_e2e.WORKLOAD_ALLOWANCE_S
    )


def test_across_sittings_median_and_spread():
    def sitting(fa, fork, scale=1.0):
        recs = []
        for backend, tps in (("FLASH_ATTN", fa), ("TRITON_ATTN-fork", fork)):
            recs.append(
                {
                    "workload": "long10k",
                    "pass": "steady",
                    "backend": backend,
                    "install": "stock" if backend == "FLASH_ATTN" else "fork",
                    "kv_cache_dtype": "auto",
                    "scale": scale,
                    "total_tok_per_s": tps,
                }
            )
        return {"records": recs, "commit": "bbb" if fork > 100 else "aaa"}

    bodies = [
        sitting(100, 90),
        sitting(200, 210),
        sitting(50, 50),
        sitting(10, 99, 0.25),
    ]
    table = res.across_sittings(bodies, {"long10k": 1.0})
    row = [line for line in table.splitlines() if "long10k" in line]
    # ratios 0.90, 1.05, 1.00 (the quarter-size run is left out); tok/s 90, 210, 50;
    # the sittings ran two commits, both named
    want = "| auto | long10k | steady | TRITON_ATTN-fork | 3 | 1.00x | 0.90-1.05 | 90 "
    assert row == [want + "| 1.00x | aaa, bbb |"]


# torch's key_averages().table layout as vLLM's profiler writes it (CUDA columns;
# the row limit leaves part of the total unlisted).
PROFILER_TABLE = """\
------------------------------------------  ------------  ------------  ----------
                                      Name     Self CUDA   Self CUDA %  # of Calls
------------------------------------------  ------------  ------------  ----------
     nvjet_tst_192x192_64x4_2x1_v_bz_coopA        1.250s        50.00%        2240
                    _prefix_prefill_kernel     600.000ms        24.00%         320
 void flash::FlashAttnFwdSm90<flash::ke...     100.500ms         4.02%          32
            reshape_and_cache_flash_kernel      20.000ms         0.80%         320
                                  aten::mm       0.000us         0.00%        2240
                   _paged_decode_kernel_2d     250.000us         0.01%          10
               triton_poi_fused_mul_silu_0     400.000ms        16.00%         320
------------------------------------------  ------------  ------------  ----------
Self CPU time total: 60.000ms
Self CUDA time total: 2.500s
"""


def test_profile_table_sums_kernels_by_category():
    from benchmarks.e2e import profile_table

    s = profile_table.summarize(PROFILER_TABLE, top=3)
    assert s["total_ms"] == 2500.0
    cats = s["categories"]
    assert cats["gemm"] == 1250.0
    assert cats["attention"] == 600.0 + 100.5 + 0.25  # ours, FA3's, decode
    assert cats["kv_cache_write"] == 20.0
    # the fused elementwise kernel, plus what the row limit left out of the table
    assert cats["other"] == pytest.approx(400.0 + (2500.0 - 2370.75))
    assert [k["name"] for k in s["kernels"]] == [
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopA",
        "_prefix_prefill_kernel",
        "triton_poi_fused_mul_silu_0",
    ]
    assert s["kernels"][1] == {
        "name": "_prefix_prefill_kernel",
        "category": "attention",
        "self_cuda_ms": 600.0,
        "calls": 320,
    }
    cpu_only = PROFILER_TABLE.replace("Self CUDA", "Self XPU ")
    with pytest.raises(ValueError, match="Self CUDA"):
        profile_table.summarize(cpu_only)
    with pytest.raises(ValueError, match="no profiler table"):
        profile_table.summarize("nothing here")


def test_a_profile_that_writes_no_table_is_not_given_the_previous_ones(tmp_path):
    """vLLM overwrites profiler_out_0.txt at each stop; a stop that writes none must
    raise, not hand back the table the previous workload left."""
    from benchmarks.e2e import run_e2e

    class Silent:  # an engine whose profiler writes nothing
        def start_profile(self):
            pass

        def generate(self, prompts, params, use_tqdm):
            pass

        def stop_profile(self):
            pass

    (tmp_path / "profiler_out_0.txt").write_text(PROFILER_TABLE)
    with pytest.raises(RuntimeError, match="wrote no"):
        run_e2e.profile_workload(Silent(), ["p"], [None], tmp_path)


def test_profile_requests_put_each_backends_kernel_time_in_the_results(
    tmp_path, fake_sites, model_dir_8b, monkeypatch
):
    def run(where, *extra):
        """long10k for FLASH_ATTN and the fork: the run and its results file."""
        r = _run(
            where,
            model_dir_8b,
            "--workloads",
            "long10k",
            "--backends",
            "FLASH_ATTN,TRITON_ATTN-fork",
            *extra,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        (res_file,) = (where / "res").glob("*.json")
        return r, json.loads(res_file.read_text())

    r, body = run(tmp_path, "--profile-requests", "4")
    profiles = body["profiles"]
    assert set(profiles) == {"FLASH_ATTN", "TRITON_ATTN-fork"}
    for backend, top in (
        ("FLASH_ATTN", "void flash::FlashAttnFwdSm90"),
        ("TRITON_ATTN-fork", "_prefix_prefill_kernel"),
    ):
        prof = profiles[backend]["long10k"]
        assert prof["requests"] == 4 and prof["total_ms"] == 46.0
        assert prof["categories"]["attention"] == 12.5
        assert any(k["name"].startswith(top) for k in prof["kernels"])
        # the traces are deleted, the kernel table is kept
        work = tmp_path / "work" / f"profile-{backend}"
        assert (work / "profiler_out_0.txt").is_file()
        assert not list(work.glob("*.pt.trace.json*"))
    assert "long10k profile of 4 requests" in r.stdout
    assert "'profiler_config': {'profiler': 'torch'" in r.stdout  # the fake's kwargs
    # A backend whose profile fails keeps its timed passes; the results say why.
    monkeypatch.setenv("FAKE_VLLM_NO_PROFILE", "TRITON_ATTN")
    _, body = run(tmp_path / "noprof", "--profile-requests", "4")
    monkeypatch.delenv("FAKE_VLLM_NO_PROFILE")
    assert set(body["profiles"]) == {"FLASH_ATTN"}
    assert "wrote no" in body["profile_errors"]["TRITON_ATTN-fork"]["long10k"]
    assert len(body["records"]) == 4  # both backends' first and steady passes
    # Without the option the engine gets no profiler and the results no profiles.
    r2, body = run(tmp_path / "plain")
    assert "profiles" not in body
    assert "profiler_config" not in r2.stdout
