"""selection_checks.py against the fake vLLM: the plumbing of the GPU checks (servers
and engines one after another, what served each layer, the comparisons) and that
each check's verdict fails when the outputs say it should."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "selection_checks.py"


def _run(check, site_args, tmp_path, env_extra=None, extra=()):
    out = tmp_path / f"{check}.json"
    env = {**os.environ, **(env_extra or {})}
    res = subprocess.run(
        [sys.executable, str(SCRIPT), check, *site_args, *extra]
        + [
            "--work-dir",
            str(tmp_path / "work"),
            "--out",
            str(out),
            "--timeout-s",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return res, json.loads(out.read_text())


def test_embed_compares_four_servers(site_args, tmp_path):
    res, rec = _run("embed", site_args, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert rec["verdict"] == "pass"
    assert set(rec["comparisons"]) == {
        "stock-TRITON_ATTN vs stock-auto",
        "fork-TRITON_ATTN vs stock-auto",
        "fork-auto vs stock-auto",
        "fork-TRITON_ATTN vs stock-TRITON_ATTN",
    }
    lines = rec["sides"]["fork-TRITON_ATTN"]["backend_lines"]
    assert any("AttentionBackendEnum.TRITON_ATTN" in line for line in lines)
    assert rec["commit"] and rec["versions"]["fork"]["vllm"]


def test_embed_serves_the_model_asked_for(site_args, tmp_path):
    extra = ("--embed-model", "embeddinggemma-300m")
    res, rec = _run("embed", site_args, tmp_path, extra=extra)
    assert res.returncode == 0, res.stdout + res.stderr
    assert rec["model"] == "embeddinggemma-300m"
    config = tmp_path / "work/embed/models/embeddinggemma-300m/config.json"
    assert json.loads(config.read_text())["use_bidirectional_attention"] is True
    served = rec["sides"]["fork-TRITON_ATTN"]["command"]
    assert "embeddinggemma-300m" in served, served


def test_embed_fails_when_the_fork_differs(site_args, tmp_path):
    res, rec = _run("embed", site_args, tmp_path, {"FAKE_VLLM_WRONG": "TRITON_ATTN"})
    assert res.returncode == 1
    assert rec["verdict"] == "fail"
    assert rec["comparisons"]["fork-auto vs stock-auto"]["min_cosine"] == pytest.approx(
        1
    )


def test_embed_under_load_compares_every_text_on_every_server(site_args, tmp_path):
    extra = ("--load", "24", "--concurrency", "8")
    res, rec = _run("embed", site_args, tmp_path, extra=extra)
    assert res.returncode == 0, res.stdout + res.stderr
    loaded = {k for k in rec["comparisons"] if k.endswith("under load")}
    assert loaded == {
        "stock-TRITON_ATTN vs stock-auto, under load",
        "fork-TRITON_ATTN vs stock-auto, under load",
        "fork-auto vs stock-auto, under load",
    }
    assert all(side["load"]["requests"] == 24 and side["load"]["errors"] == 0
               for side in rec["sides"].values())  # fmt: skip
    # A server whose embeddings differ fails the check under load as well.
    res, rec = _run("embed", site_args, tmp_path,
                    {"FAKE_VLLM_WRONG": "TRITON_ATTN"}, extra=extra)  # fmt: skip
    assert rec["verdict"] == "fail"
    assert (
        rec["comparisons"]["fork-TRITON_ATTN vs stock-auto, under load"]["min_cosine"]
        < 0.999
    )


def test_auto_records_what_served_each_layer(site_args, tmp_path):
    res, rec = _run("auto", site_args, tmp_path, extra=["--num-prompts", "6"])
    assert res.returncode == 0, res.stdout + res.stderr
    # FLASH_ATTN disabled, FLASHINFER refuses: vLLM's choice lands on TRITON_ATTN
    assert [n.split()[0] for n in rec["served_by"]["fork"]] == ["TRITON_ATTN"]
    assert rec["sides"]["fork"]["layer_backends"].popitem()[1] == 2  # both layers
    assert rec["agreement"]["prompts_identical"] == 6


def test_auto_fails_on_another_backend_family(site_args, tmp_path):
    res, rec = _run(
        "auto", site_args, tmp_path, extra=["--num-prompts", "4", "--disable"]
    )
    # nothing disabled: FLASH_ATTN serves, which is not what the check is for
    assert rec["served_by"]["fork"][0].startswith("FLASH_ATTN ")
    assert rec["verdict"] == "fail" and res.returncode == 1


def test_invariance(site_args, tmp_path):
    res, rec = _run("invariance", site_args, tmp_path, extra=["--tokens", "4"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert rec["outputs_compared"] == 8 and rec["outputs_differing"] == []
    assert rec["batches"] == {"batch1": 1, "batch7": 7, "batch64": 64}


def test_invariance_fails_when_outputs_depend_on_the_batch(site_args, tmp_path):
    res, rec = _run(
        "invariance",
        site_args,
        tmp_path,
        {"FAKE_VLLM_BATCH_VARIANT": "1"},
        extra=["--tokens", "4"],
    )
    assert res.returncode == 1 and rec["verdict"] == "fail"
    assert "target: batch1 vs batch7" in rec["outputs_differing"]


def test_whisper_compares_transcriptions_with_flash_attn(site_args, tmp_path):
    extra = ("--num-prompts", "5", "--tokens", "8")
    res, rec = _run("whisper", site_args, tmp_path, extra=extra)
    assert res.returncode == 0, res.stdout + res.stderr
    assert set(rec["agreement"]) == {
        "stock-TRITON_ATTN vs stock-FLASH_ATTN",
        "fork-TRITON_ATTN vs stock-FLASH_ATTN",
    }
    assert rec["agreement"]["fork-TRITON_ATTN vs stock-FLASH_ATTN"]["prompts"] == 5
    assert len(rec["clips_s"]) == 5 and all(1 <= s <= 30 for s in rec["clips_s"])
    assert [n.split()[0] for n in rec["served_by"]["fork-TRITON_ATTN"]] == [
        "TRITON_ATTN"
    ]
    # The decoder prompt is Whisper's control tokens, by the tokenizer's ids.
    spec = json.loads((tmp_path / "work/whisper/whisper-fork-TRITON_ATTN.spec.json")
                      .read_text())  # fmt: skip
    assert spec["jobs"][0]["decoder_prompt"] == [1, 2, 6, 10]


def test_whisper_fails_when_the_forks_engine_fails(site_args, tmp_path):
    extra = ("--num-prompts", "3", "--tokens", "8")
    env = {"FAKE_VLLM_FAIL": "TRITON_ATTN"}
    res, rec = _run("whisper", site_args, tmp_path, env, extra=extra)
    assert res.returncode == 1 and rec["verdict"] == "fail"
    assert rec["agreement"]["fork-TRITON_ATTN vs stock-FLASH_ATTN"] is None
    assert "simulated engine failure" in rec["sides"]["fork-TRITON_ATTN"]["log_tail"]


def test_auto_takes_the_model_and_cache_asked_for(site_args, tmp_path):
    extra = ["--num-prompts", "2", "--model", "decoder-head288"]
    extra += ["--kv-cache-dtype", "fp8_e5m2"]
    res, rec = _run("auto", site_args, tmp_path, extra=extra)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (rec["model"], rec["kv_cache_dtype"]) == ("decoder-head288", "fp8_e5m2")
    spec = json.loads((tmp_path / "work/auto/auto-fork.spec.json").read_text())
    assert spec["engine"]["kv_cache_dtype"] == "fp8_e5m2"
    config = json.loads((Path(spec["model"]) / "config.json").read_text())
    assert config["head_dim"] == 288


WHISPER_RENDER = """
import json, sys
from benchmarks.models import make_whisper_dir
from benchmarks.selection_worker import _job_prompts
from vllm.config import DeviceConfig, ModelConfig, VllmConfig
from vllm.renderers.registry import renderer_from_config

model = make_whisper_dir(sys.argv[1])
config = VllmConfig(
    model_config=ModelConfig(model=str(model), max_model_len=448, dtype="bfloat16"),
    device_config=DeviceConfig(device="cpu"),
)
job = {"audio": [{"seconds": 3.5, "seed": 1}, {"seconds": 29.0, "seed": 2}],
       "decoder_prompt": [1, 2, 6, 10]}
rendered = renderer_from_config(config).render_cmpl(_job_prompts(job))
print(json.dumps([
    [len(e["encoder_prompt"]["prompt_token_ids"]),
     e["decoder_prompt"]["prompt_token_ids"]]
    for e in rendered
]))
"""


def test_whisper_prompts_render_in_vllm(stock_vllm_site, tmp_path):
    """The whisper check's prompts, as the worker builds them, through the
    release's own renderer (Whisper's processor on the model directory made
    here): each clip becomes the encoder's 1500 positions, the decoder prompt
    stays Whisper's four control tokens."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(stock_vllm_site), str(repo)])
    res = subprocess.run(
        [sys.executable, "-c", WHISPER_RENDER, str(tmp_path / "whisper")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    rendered = json.loads(res.stdout.strip().splitlines()[-1])
    assert rendered == [[1500, [1, 2, 6, 10]], [1500, [1, 2, 6, 10]]]
