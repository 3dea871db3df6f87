"""Shared plumbing: backend labels, installs, subprocesses with timeouts."""

import os
import sys
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
    with pytest.raises(SystemExit, match="valid: FLASH_ATTN"):
        harness.parse_backends("FLASH_ATTN,TRITON")


def test_installs_default_to_this_python_and_take_a_site(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    got = harness.parse_installs(
        ["fork=/venv/bin/python"], [f"stock={tmp_path}", f"fork={tmp_path}"]
    )
    assert got["stock"].python == sys.executable
    assert got["fork"].python == "/venv/bin/python"
    assert got["fork"].env()["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    assert harness.parse_installs(None, None)["fork"].env()["PYTHONPATH"] == (
        "/elsewhere"
    )
    with pytest.raises(SystemExit, match="INSTALL=PATH"):
        harness.parse_installs(["nightly=/x"], None)


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


def test_environment_records_device_and_vllm_variables(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    monkeypatch.setenv("HOME_UNRELATED_SETTING", "x")
    got = harness.environment()["settings"]
    assert got["CUDA_VISIBLE_DEVICES"] == "1"
    assert got["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    assert "HOME_UNRELATED_SETTING" not in got


def test_late_jit_compiles_are_found_in_a_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "INFO start\n(Worker_TP1 pid=7) WARNING [jit_monitor.py:130] Triton kernel JIT "
        "compilation during inference: _prefix_prefill_kernel. This causes ...\n"
    )
    assert harness.late_jit_compiles_in(log) == ["_prefix_prefill_kernel"]
    assert harness.late_jit_compiles_in(tmp_path / "missing.log") == []


def test_sse_event_reads_one_stream_line():
    assert harness.sse_event(b'data: {"choices": [{"text": "a"}]}\n') == {
        "choices": [{"text": "a"}]
    }
    assert harness.sse_event(b"data: [DONE]\n") == harness.SSE_DONE
    assert harness.sse_event(b"\n") is None
    assert harness.sse_event(b": keep-alive\n") is None
