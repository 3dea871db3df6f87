"""Greedy agreement driver against the fake vLLM: the two sides, the comparison, the
result keys, and the options reaching the engine."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.agreement import agreement
from benchmarks.harness import REPO

REQUIRED = (
    "reference",
    "backend",
    "prompts",
    "tokens_compared",
    "tokens_equal",
    "fraction_equal",
    "tp",
    "commit",
    "gpu",
)


def _agree(tmp_path, model_dir, fake_site, *extra, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    out = tmp_path / "agree.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.agreement.agreement",
            "--model-dir",
            str(model_dir),
            "--reference-pythonpath",
            str(fake_site),
            "--backend-pythonpath",
            str(fake_site),
            "--prompts",
            "20",
            "--tokens",
            "8",
            "--out",
            str(out),
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())


def test_identical_sides_agree_fully(tmp_path, fake_site, model_dir_8b):
    stdout, body = _agree(
        tmp_path, model_dir_8b, fake_site, "--kv-cache-dtype", "fp8",
        "--gpu-memory-utilization", "0.4",
    )  # fmt: skip
    assert all(k in body for k in REQUIRED)
    assert body["fraction_equal"] == 1.0 and body["tokens_compared"] == 20 * 8
    assert body["kv_cache_dtype"] == "fp8"
    assert stdout.count("'kv_cache_dtype': 'fp8'") == 2  # both engines got it
    assert stdout.count("'gpu_memory_utilization': 0.4") == 2
    assert "backend FLASH_ATTN" in stdout and "backend TRITON_ATTN" in stdout
    # what reproduces it and what it ran on
    assert "--kv-cache-dtype fp8" in body["command"]
    assert set(body["vllm"]) == {"reference", "backend"} and body["vllm"]["backend"]
    assert "driver" in body and isinstance(body["settings"], dict)


def test_a_differing_backend_is_counted(tmp_path, fake_site, model_dir_8b):
    _, body = _agree(
        tmp_path,
        model_dir_8b,
        fake_site,
        env_extra={"FAKE_VLLM_WRONG": "TRITON_ATTN"},
    )
    assert body["prompts_diverged"] == 2  # prompts 0 and 10
    assert body["tokens_equal"] == body["tokens_compared"] - 2
    assert body["fraction_equal"] < 1.0


def test_compiles_while_serving_are_read_from_every_process(
    tmp_path, fake_site, model_dir_8b
):
    """vLLM's JIT-monitor reports are read from the output of the run and of its
    child processes (tensor-parallel workers log there)."""
    _, body = _agree(
        tmp_path,
        model_dir_8b,
        fake_site,
        env_extra={"FAKE_VLLM_LATE_BUILDS": "TRITON_ATTN:3"},
    )
    sides = body["sides"]
    assert sides["TRITON_ATTN"]["late_jit_compiles"] == ["_prefix_prefill_kernel"] * 3
    assert sides["FLASH_ATTN (reference)"]["late_jit_compiles"] == []


def test_compare_counts_near_ties():
    def side(tokens, tops):
        return {"results": [{"tokens": tokens, "top": tops}]}

    close = {"1": -0.70, "2": -0.72}
    far = {"1": -0.1, "2": -3.0}
    ref = side([1, 1], [close, close])
    tie = agreement.compare(ref, side([1, 2], [close, close]))
    assert tie["prompts_diverged"] == 1 and tie["divergences_at_near_ties"] == 1
    wide = agreement.compare(side([1, 1], [far, far]), side([1, 2], [far, far]))
    assert wide["divergences_at_near_ties"] == 0
    assert wide["mean_matching_prefix_tokens"] == 1.0


def test_prompts_mix_lengths_and_share_a_prefix():
    prompts = agreement.make_prompts(100, 3900, 32000)
    lengths = sorted(map(len, prompts))
    assert len(prompts) == 100 and lengths[0] >= 8 and lengths[-1] <= 3900
    assert sum(n > 2048 for n in lengths) >= 5
    shared = [p for p in prompts if len(p) > agreement.SHARED_PREFIX_LEN]
    prefix = shared[0][: agreement.SHARED_PREFIX_LEN]
    assert sum(p[: agreement.SHARED_PREFIX_LEN] == prefix for p in shared) >= 3


def test_work_dir_reuses_a_finished_side_only_for_the_same_run(
    tmp_path, fake_site, model_dir_8b
):
    work = str(tmp_path / "work")
    first, _ = _agree(tmp_path, model_dir_8b, fake_site, "--work-dir", work)
    assert "reusing" not in first
    (tmp_path / "work" / "backend.json").unlink()  # as if the call ended mid-way
    again, body = _agree(tmp_path, model_dir_8b, fake_site, "--work-dir", work)
    assert again.count("reusing") == 1 and "FLASH_ATTN: reusing" in again
    assert body["fraction_equal"] == 1.0
    other, _ = _agree(
        tmp_path,
        model_dir_8b,
        fake_site,
        "--work-dir",
        work,
        "--kv-cache-dtype",
        "fp8",
    )
    assert "reusing" not in other  # another KV dtype is another run


def test_reference_only_keeps_that_side_and_writes_no_result(
    tmp_path, fake_site, model_dir_8b
):
    work = tmp_path / "work"
    out = tmp_path / "agree.json"
    cmd = [
        sys.executable, "-m", "benchmarks.agreement.agreement",
        "--model-dir", str(model_dir_8b), "--prompts", "20", "--tokens", "8",
        "--reference-pythonpath", str(fake_site),
        "--backend-pythonpath", str(fake_site),
        "--work-dir", str(work), "--out", str(out), "--reference-only",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "backend FLASH_ATTN" in r.stdout and "TRITON_ATTN" not in r.stdout
    assert (work / "reference.json").is_file() and not (work / "backend.json").exists()
    assert not out.exists()
    stdout, body = _agree(tmp_path, model_dir_8b, fake_site, "--work-dir", str(work))
    assert "FLASH_ATTN: reusing" in stdout and body["fraction_equal"] == 1.0
    # without a work dir the kept side would be lost: refused
    r = subprocess.run(
        cmd[:-5] + ["--reference-only"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 2 and "--work-dir" in r.stderr


def test_speculative_backend_side_against_plain_greedy(
    tmp_path, fake_site, model_dir_8b
):
    spec = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}'
    stdout, body = _agree(
        tmp_path, model_dir_8b, fake_site, "--backend-speculative", spec
    )
    # only the backend drafts; the reference decodes plainly
    assert stdout.count("'speculative_config': {'method': 'ngram'") == 1
    assert "backend FLASH_ATTN, kwargs" in stdout
    got = body["backend_speculative"]
    assert got["config"]["method"] == "ngram"
    assert got["num_drafts"] == 10 and got["num_draft_tokens"] == 30
    assert body["fraction_equal"] == 1.0


def test_a_speculative_config_that_is_not_json_stops_before_any_engine(capsys):
    with pytest.raises(SystemExit) as e:
        agreement.main(["--backend-speculative", "{method: ngram}"])
    assert e.value.code == 2
    assert "--backend-speculative is not JSON" in capsys.readouterr().err
