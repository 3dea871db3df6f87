"""Soak run against the fake vLLM server: load, cancellations, the
verdict's parts, and the memory rule."""

import json
import os
import random
import subprocess
import sys

from benchmarks.harness import REPO
from benchmarks.soak import run_soak


def _soak(tmp_path, model_dir, site_args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    env.pop("PYTHONPATH", None)
    out = tmp_path / "soak"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/soak/run_soak.py"),
            "--model-dir",
            str(model_dir),
            "--duration-s",
            "4",
            "--concurrency",
            "4",
            "--sample-s",
            "1",
            "--settle-s",
            "0",
            "--out-dir",
            str(out),
            *site_args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    files = sorted(out.glob("*-TRITON_ATTN-fork-0min.json"))
    return r, (json.loads(files[-1].read_text()) if files else None)


def test_soak_passes_on_a_healthy_server(tmp_path, site_args, model_dir_8b):
    r, body = _soak(tmp_path, model_dir_8b, site_args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert body["pass"] and body["requests"]["errors"] == 0
    assert body["requests"]["ok"] > 0 and body["requests"]["cancelled"] > 0
    assert body["fixed_request_same_answer"] and body["server_healthy_at_end"]
    assert body["samples"] and "vllm:num_requests_running" in body["samples"][0]
    assert "prefix-caching" not in body["server_command"]


def test_soak_fails_on_request_errors(tmp_path, site_args, model_dir_8b):
    r, body = _soak(
        tmp_path, model_dir_8b, site_args, {"FAKE_VLLM_SOAK_ERROR_EVERY": "7"}
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert not body["pass"] and body["requests"]["errors"] > 0
    assert "HTTP 500" in body["requests"]["error_examples"][0]


def test_memory_growth_rule():
    flat = [{"t": t, "gpu_mib": [1000]} for t in range(0, 300, 10)]
    assert run_soak.memory_verdict(flat, 120, 256)["ok"]
    grow = [{"t": t, "gpu_mib": [1000 + 4 * t]} for t in range(0, 300, 10)]
    v = run_soak.memory_verdict(grow, 120, 256)
    assert not v["ok"] and v["growth_mib"] == 4 * 290 - 4 * 120
    assert not run_soak.memory_verdict([{"t": 0, "gpu_mib": []}], 120, 256)["checked"]


def test_memory_steps_name_the_load():
    # One step at 150 s, where the running requests reach a new high; the rise at
    # 30 s is before the settle time and the fall at 200 s is no step.
    mib = {0: 900, 30: 1000, 150: 1400, 200: 1300}
    running = {0: 0, 30: 100, 150: 250, 200: 80}
    samples = [
        {
            "t": t,
            "gpu_mib": [mib[max(k for k in mib if k <= t)]],
            "vllm:num_requests_running": running.get(t, 90),
        }
        for t in range(0, 300, 10)
    ]
    v = run_soak.memory_verdict(samples, 60, 256)
    assert v["steps"] == [
        {"t": 150, "mib": 400, "running": 250, "running_max_before": 100}
    ]
    assert v["growth_mib"] == 300 and not v["ok"]


def test_same_answer_rule():
    cold, cached = {"text": "a b"}, {"text": "a c"}
    assert run_soak.same_answer([cold, cached], {"text": "a c"})
    assert run_soak.same_answer([cold, cached], {"text": "a b"})
    assert not run_soak.same_answer([cold, cached], {"text": "x"})
    assert not run_soak.same_answer([{"error": "HTTP 500"}] * 2, {"error": "HTTP 500"})


def test_request_mix_fits_the_server():
    rng = random.Random(0)
    prefixes = [[1] * 2048]
    longest = max(len(run_soak.make_request(rng, prefixes)[0]) for _ in range(3000))
    assert longest + run_soak.MAX_OUTPUT_TOKENS <= run_soak.SERVER_MAX_MODEL_LEN
    assert sum(share for share, _, _ in run_soak.LENGTH_MIX) == 1.0


def test_memory_query_limited_to_visible_gpus():
    assert "-i" not in run_soak.nvidia_smi_query(None)
    assert "-i" not in run_soak.nvidia_smi_query("")
    assert run_soak.nvidia_smi_query("1")[-2:] == ["-i", "1"]
    assert run_soak.nvidia_smi_query("0,1")[-2:] == ["-i", "0,1"]


def test_session_gpu_memory(monkeypatch):
    # nvidia-smi lists three processes; two are in session 100 (a server and its
    # engine), one in another server's session.
    listed = "11, 500\n12, 70000\n21, 30000\n"
    sessions = {11: 100, 12: 100, 21: 200}
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=listed, stderr="")

    monkeypatch.setattr(run_soak.subprocess, "run", fake_run)
    monkeypatch.setattr(run_soak, "process_session", sessions.get)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert run_soak.session_gpu_memory_mib(100) == 70500
    assert run_soak.session_gpu_memory_mib(200) == 30000
    assert run_soak.session_gpu_memory_mib(300) is None  # none listed: unknown
    assert calls[0][:2] == ["nvidia-smi", "--query-compute-apps=pid,used_memory"]
    assert calls[0][-2:] == ["-i", "1"]
    listed = "[Not Supported]\n"
    assert run_soak.session_gpu_memory_mib(100) is None


def test_process_session_reads_proc():
    assert run_soak.process_session(os.getpid()) == os.getsid(0)
    assert run_soak.process_session(2**30) is None


def test_memory_verdict_prefers_the_servers_own():
    # The whole GPU grows (another server), the server's own processes do not.
    samples = [
        {"t": t, "gpu_mib": [1000 + 5 * t], "server_gpu_mib": 600}
        for t in range(0, 300, 10)
    ]
    v = run_soak.memory_verdict(samples, 60, 256)
    assert v["source"] == "the server's processes" and v["ok"] and v["growth_mib"] == 0
    samples[-1]["server_gpu_mib"] = None  # one sample without it: the whole GPU
    v = run_soak.memory_verdict(samples, 60, 256)
    assert v["source"] == "the whole GPU" and not v["ok"]
