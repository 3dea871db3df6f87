"""Shared plumbing: backend labels, budgets, subprocesses with timeouts."""

import os
import time

import pytest

from benchmarks import harness

ENV = {"PATH": "/usr/bin:/bin"}


def test_parse_backends():
    got = harness.parse_backends("FLASH_ATTN, TRITON_ATTN-fork")
    assert [(b.install, b.attention_backend) for b in got] == [
        ("stock", "FLASH_ATTN"),
        ("fork", "TRITON_ATTN"),
    ]
    with pytest.raises(SystemExit, match="known: FLASH_ATTN"):
        harness.parse_backends("FLASH_ATTN,TRITON")


def test_sites_and_check(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_SITE_FORK", str(tmp_path))
    sites = harness.resolve_sites()
    assert sites["fork"] == str(tmp_path) and sites["stock"] == "/tmp/site"
    fork = harness.BACKENDS["TRITON_ATTN-fork"]
    assert "--site-fork" in harness.site_problem(fork, sites)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    assert harness.site_problem(fork, sites) is None
    assert harness.backend_env(fork, sites)["PYTHONPATH"] == str(tmp_path)


def test_budget():
    assert harness.Budget(None).allows(1e9)
    b = harness.Budget(100.0, margin_s=20.0)
    assert 79.0 < b.remaining() <= 80.0
    assert b.timeout(500.0) <= 80.0 and b.timeout(5.0) == 5.0
    assert not b.allows(90.0)


def test_run_logged_timeout_and_tail(tmp_path, capsys):
    log = tmp_path / "x.log"
    t0 = time.monotonic()
    rc = harness.run_logged(
        ["bash", "-c", "echo started; sleep 30"],
        env=ENV,
        log=log,
        timeout_s=1.0,
        what="t",
    )
    assert rc == 124 and time.monotonic() - t0 < 15
    out = capsys.readouterr().out
    assert "TIMEOUT" in out and "started" in out
    assert (
        harness.run_logged(
            ["bash", "-c", "exit 3"], env=ENV, log=log, timeout_s=10, what="t"
        )
        == 3
    )
    assert "FAILED (exit 3)" in capsys.readouterr().out


def test_run_logged_reaps_leftover_children(tmp_path):
    """A helper process that outlives the leader (like an engine core) must be gone
    when run_logged returns, or the next engine finds the GPU memory taken."""
    pid_file = tmp_path / "pid"
    script = f"(sleep 30 >/dev/null 2>&1 & echo $! > {pid_file}); echo leader-done"
    rc = harness.run_logged(
        ["bash", "-c", script], env=ENV, log=tmp_path / "l.log", timeout_s=10, what="t"
    )
    assert rc == 0
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_run_settings_records_device_and_vllm_variables(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("HOME_UNRELATED_SETTING", "x")
    got = harness.run_settings()
    assert got["CUDA_VISIBLE_DEVICES"] == "1"
    assert got["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    assert got["NCCL_NVLS_ENABLE"] == "0"
    assert "HOME_UNRELATED_SETTING" not in got
