"""Reliability suite against a fake OpenAI-compatible ``vllm serve``
(``fake_reliability_site``), started by the suite through the install's Python like
the real one: each scenario passes on a healthy server, and each pass rule fails when
the fake breaks it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.harness import REPO
from benchmarks.reliability import client, run_reliability

SITE = Path(__file__).resolve().parent / "fake_reliability_site"
SMALL = [
    "--model", "llama-3.1-8b", "--duration-s", "1", "--rate", "20",
    "--drain-s", "10", "--sample-s", "0.3", "--settle-s", "0", "--window-s", "0.5",
    "--max-throughput-change", "10", "--max-model-len", "512", "--max-tokens", "16",
    "--num-requests", "12", "--prefix-groups", "1", "--spec-prompt-lens", "64,300",
    "--startup-timeout-s", "20", "--warmup-requests", "3",
]  # fmt: skip


def _run(tmp_path, scenario, backend="TRITON_ATTN-fork", env=None, extra=()):
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_REL_")}
    run_env.pop("PYTHONPATH", None)
    run_env.update(env or {})
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/reliability/run_reliability.py"),
            "--scenario",
            scenario,
            "--backend",
            backend,
            "--out-dir",
            str(out),
            "--site",
            f"stock={SITE}",
            "--site",
            f"fork={SITE}",
            *SMALL,
            *extra,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=run_env,
        timeout=120,
    )
    recs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return r, recs


def test_all_scenarios_pass_on_a_healthy_server(tmp_path):
    r, recs = _run(tmp_path, "all")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(recs) == 6
    for name, rec in recs.items():
        assert rec["pass"] and not rec["reasons"], name
        assert rec["requests"]["failed"] == 0 or name.startswith("length-limits")
        assert rec["commit"] and "gpu" in rec and "driver" in rec, name
        assert all("--host 127.0.0.1" in s["command"] for s in rec["servers"])
    storm = recs["abort-storm-TRITON_ATTN-fork"]
    for name in ("abort-storm", "soak"):  # the warm-up ran before each open loop
        warm = recs[f"{name}-TRITON_ATTN-fork"]["numbers"]["warmup"]
        assert warm["sent"] == warm["completed"] == 3 and not warm["failed"], name
    assert storm["requests"]["cancelled"] > 0 and storm["requests"]["completed"] > 0
    assert storm["numbers"]["samples"] and storm["numbers"]["memory"]
    load = storm["numbers"]["load"]
    # the scenario's requests: the warm-up's and the open loop's
    assert load["sent"] + 3 == storm["requests"]["sent"] and load["sent"] > 0
    assert load["asked_rate"] == 40
    assert load["max_send_lag_s"] < 1 and load["not_sent_at_cap"] == 0
    pre = recs["preemption-TRITON_ATTN-fork"]
    assert pre["numbers"]["preemptions"] > 0
    assert [s["tag"] for s in pre["servers"]] == ["plain", "pressure"]
    # the small cache is sized in blocks of a page size every backend is given
    small = "--block-size 16 --num-gpu-blocks-override 768"
    assert small in pre["servers"][1]["command"]
    assert "--block-size" not in pre["servers"][0]["command"]
    cases = recs["length-limits-TRITON_ATTN-fork"]["numbers"]["cases"]
    assert [c["status"] for c in cases.values()] == [200, 200, 400, 400]
    prefix = recs["prefix-caching-TRITON_ATTN-fork"]
    assert prefix["numbers"]["prefix_lengths"] == [1, 15, 17, 53]
    assert "--no-enable-prefix-caching" in prefix["servers"][1]["command"]
    # the flush needs twice the small cache's tokens, and it evicted: fewer hits
    # after it than on the repeat before it
    flush = prefix["numbers"]["flush"]
    assert flush["requests"] * (flush["prompt_tokens"] + 1) >= 2 * 768 * 16
    hits = prefix["numbers"]["prefix_hits_by_round"]
    assert hits["again"] > hits["evicted"] and hits["again"] > hits["first"]
    spec = recs["spec-decode-TRITON_ATTN-fork"]
    assert '"method": "ngram"' in spec["servers"][1]["command"]
    assert "7 server starts" in r.stdout


def test_consecutive_uses_of_one_configuration_share_a_server(tmp_path):
    r, recs = _run(tmp_path, "all")
    uses = [
        (name, s["tag"], s["started"], s["log"])
        for name in run_reliability.SCENARIOS
        for s in recs[f"{name}-TRITON_ATTN-fork"]["servers"]
    ]
    started = [tag for _, tag, new, _ in uses if new]
    assert started == [
        "chunk-512", "chunk-2048", "plain", "ngram", "plain", "pressure",
        "pressure-no-prefix-caching",
    ]  # fmt: skip
    # abort-storm, soak and spec-decode's reference run on length-limits' server
    logs = {name: log for name, tag, _, log in uses if tag == "plain"}
    assert logs["abort-storm"] == logs["soak"] == logs["length-limits"]
    assert logs["spec-decode"] == logs["length-limits"]
    # counters are per use: the prefix-caching use of the pressure server counts
    # none of preemption's preemptions
    pre = recs["preemption-TRITON_ATTN-fork"]["servers"][1]
    prefix = recs["prefix-caching-TRITON_ATTN-fork"]["servers"][0]
    assert prefix["log"] == pre["log"] and not prefix["started"]
    assert pre["counters"][run_reliability.PREEMPTIONS] == 12  # one per request
    flush = recs["prefix-caching-TRITON_ATTN-fork"]["numbers"]["flush"]["requests"]
    assert prefix["counters"][run_reliability.PREEMPTIONS] == 3 * 4 * 8 + flush


@pytest.mark.parametrize(
    "scenario, env, reason",
    [
        # Several requests fail: the storm cancels some before any answer comes.
        ("abort-storm", {"FAKE_REL_5XX": "3,4,5,6,7,8,9,10"}, "HTTP 5xx"),
        ("abort-storm", {"FAKE_REL_ERROR_LINE": "1"}, "ERROR log lines"),
        ("preemption", {"FAKE_REL_NO_PREEMPT": "1"}, "no preemptions"),
        (
            "preemption",
            {"FAKE_REL_WRONG": "--num-gpu-blocks-override"},
            "identical greedy",
        ),
        ("length-limits", {"FAKE_REL_NO_LENGTH_CHECK": "1"}, "expected 400"),
        ("length-limits", {"FAKE_REL_WRONG": "2048"}, "chunk-2048 vs no chunk"),
        ("prefix-caching", {"FAKE_REL_WRONG": "!--no-enable-prefix-caching"}, "prefix"),
        ("prefix-caching", {"FAKE_REL_NO_EVICT": "1"}, "eviction not shown"),
        (
            "spec-decode",
            {"FAKE_REL_WRONG": "--speculative-config"},
            "ngram vs no speculation",
        ),
        ("soak", {"FAKE_REL_LATE_JIT": "1"}, "Triton compiled while serving"),
        # the 5th completion: the open loop's 2nd, after the 3 of the warm-up
        ("soak", {"FAKE_REL_5XX": "5"}, "non-cancelled requests did not complete"),
        ("soak", {"FAKE_REL_5XX": "1"}, "1 warm-up requests did not complete"),
        ("abort-storm", {"FAKE_REL_5XX": "2"}, "warm-up requests did not complete"),
    ],
)
def test_each_rule_can_fail(tmp_path, scenario, env, reason):
    r, recs = _run(tmp_path, scenario, env=env)
    rec = recs[f"{scenario}-TRITON_ATTN-fork"]
    assert r.returncode == 1 and not rec["pass"], r.stdout[-2000:]
    assert any(reason in x for x in rec["reasons"]), rec["reasons"]


@pytest.mark.parametrize("stop", [True, False])
def test_a_saturated_soak_stops_its_load_only_when_asked(tmp_path, stop):
    # one open request at a time and slow answers: the second arrival finds the
    # client's cap full, which fails the soak; asked to, the load stops there
    env = {"FAKE_REL_TOKEN_S": "0.05"}
    extra = ["--max-in-flight", "1", "--duration-s", "4", "--window-s", "1"]
    r, recs = _run(tmp_path, "soak", env=env,
                   extra=extra + ["--stop-when-saturated"] * stop)  # fmt: skip
    rec = recs["soak-TRITON_ATTN-fork"]
    assert r.returncode == 1 and not rec["pass"], r.stdout[-2000:]
    assert any("in-flight cap full" in x for x in rec["reasons"]), rec["reasons"]
    load, tput = rec["numbers"]["load"], rec["numbers"]["throughput"]
    if stop:
        assert load["stopped_at_s"] < 4 and load["not_sent_at_cap"] == 1
        assert "not_checked" in tput
    else:
        assert load["stopped_at_s"] is None and load["not_sent_at_cap"] > 1
        assert "first_tok_per_s" in tput


@pytest.mark.parametrize(
    "env, fraction", [({}, 1.0), ({"FAKE_REL_WRONG": "TRITON_ATTN"}, 0.0)]
)
def test_agreement_with_the_reference_backend(tmp_path, env, fraction):
    # the reference runs first (whatever the order given); the fork is compared to it
    r, recs = _run(tmp_path, "spec-decode", "TRITON_ATTN-fork,FLASH_ATTN", env)
    vs = recs["spec-decode-TRITON_ATTN-fork"]["agreement_with_reference"]
    assert vs["reference"] == "FLASH_ATTN" and vs["compared"] == 4
    assert vs["fraction"] == fraction
    assert recs["spec-decode-FLASH_ATTN"]["agreement_with_reference"] is None


@pytest.mark.parametrize(
    "env, fraction", [({}, 1.0), ({"FAKE_REL_WRONG": "TRITON_ATTN"}, 0.0)]
)
def test_a_reference_run_later_completes_the_earlier_records(tmp_path, env, fraction):
    # the fork alone in one call, the reference in a later one with the same out-dir
    r, recs = _run(tmp_path, "spec-decode", "TRITON_ATTN-fork", env)
    assert recs["spec-decode-TRITON_ATTN-fork"]["agreement_with_reference"] is None
    r, recs = _run(tmp_path, "spec-decode", "FLASH_ATTN", env)
    assert r.returncode == 0, r.stdout[-2000:]
    vs = recs["spec-decode-TRITON_ATTN-fork"]["agreement_with_reference"]
    assert vs["reference"] == "FLASH_ATTN" and vs["compared"] == 4
    assert vs["fraction"] == fraction
    assert recs["spec-decode-FLASH_ATTN"]["agreement_with_reference"] is None


@pytest.mark.parametrize(
    "env, fraction", [({}, 1.0), ({"FAKE_REL_WRONG": "TRITON_ATTN"}, 0.0)]
)
def test_backends_side_by_side(tmp_path, env, fraction):
    # --together: both backends' servers at once, each with half the GPU memory and
    # half the rate; the open-loop load starts on both at the same moment, also when
    # one server takes longer to come up
    env = {**env, "FAKE_REL_SLOW_START": "FLASH_ATTN"}
    r, recs = _run(
        tmp_path, "abort-storm,spec-decode", "TRITON_ATTN-fork,FLASH_ATTN", env,
        extra=["--together"],
    )  # fmt: skip
    assert len(recs) == 4, r.stdout[-3000:] + r.stderr[-3000:]
    for rec in recs.values():
        assert rec["together"] == ["FLASH_ATTN", "TRITON_ATTN-fork"]
        assert all("--gpu-memory-utilization=0.45" in s["command"]
                   for s in rec["servers"])  # fmt: skip
    storms = [recs[f"abort-storm-{b}"] for b in ("FLASH_ATTN", "TRITON_ATTN-fork")]
    assert [s["numbers"]["rate"] for s in storms] == [20.0, 20.0]  # 2 x 20 / 2
    starts = [s["servers"][0]["load_start_unix"] for s in storms]
    assert all(s["servers"][0]["load_started_together"] for s in storms)
    assert abs(starts[0] - starts[1]) < 0.5
    # servers start one at a time: no two starts overlap
    spans = sorted((s["start_unix"], s["up_unix"]) for rec in recs.values()
                   for s in rec["servers"] if s["started"])  # fmt: skip
    assert len(spans) == 4
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    vs = recs["spec-decode-TRITON_ATTN-fork"]["agreement_with_reference"]
    assert vs["reference"] == "FLASH_ATTN" and vs["fraction"] == fraction
    assert recs["abort-storm-TRITON_ATTN-fork"]["agreement_with_reference"]
    assert r.returncode == 0, r.stdout[-2000:]


def test_side_by_side_backend_whose_server_fails_releases_the_other(tmp_path):
    r, recs = _run(
        tmp_path, "abort-storm", "TRITON_ATTN-fork,FLASH_ATTN",
        {"FAKE_REL_SERVE_FAIL": "TRITON_ATTN"}, extra=["--together"],
    )  # fmt: skip
    fork, ref = recs["abort-storm-TRITON_ATTN-fork"], recs["abort-storm-FLASH_ATTN"]
    assert r.returncode == 1 and "did not come up" in fork["reasons"][0]
    assert ref["pass"], ref["reasons"]
    assert ref["servers"][0]["load_started_together"] is False


def test_side_by_side_needs_two_backends(tmp_path):
    args = ["--out-dir", str(tmp_path), "--model", "llama-3.1-8b", "--together"]
    args += ["--backend", "TRITON_ATTN-fork", "--site", f"fork={SITE}"]
    with pytest.raises(SystemExit) as e:
        run_reliability.main(args)
    assert "two or more in --backend" in str(e.value)


def test_server_that_does_not_come_up_is_reported(tmp_path):
    r, recs = _run(tmp_path, "soak", env={"FAKE_REL_SERVE_FAIL": "1"})
    rec = recs["soak-TRITON_ATTN-fork"]
    assert r.returncode == 1 and rec["reasons"] == [
        "server plain did not come up: fake serve: simulated startup crash"
    ]
    assert "simulated startup crash" in rec["servers"][0]["log_tail"]


def test_sigterm_stops_the_running_server(tmp_path):
    # `timeout` stops the suite with SIGTERM mid-scenario; a server left running
    # would hold the GPU memory every later server start needs.
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_REL_")}
    env.pop("PYTHONPATH", None)
    env["FAKE_REL_PID_DIR"] = str(pids)
    cmd = [
        sys.executable, str(REPO / "benchmarks/reliability/run_reliability.py"),
        "--scenario", "soak", "--backend", "TRITON_ATTN-fork",
        "--out-dir", str(tmp_path / "out"), "--site", f"fork={SITE}",
        *SMALL, "--duration-s", "600",
    ]  # fmt: skip
    suite = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(pids.glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.2)
    (pid_file,) = pids.glob("*.pid")
    server = int(pid_file.read_text())
    time.sleep(1.0)  # the soak's requests are flowing
    suite.terminate()
    try:
        # Leaving may take a metrics scrape in flight (10 s) and the server's stop
        # (kill_group: 15-s graces before and after SIGKILL); 120 s leaves room
        # for a loaded CI host. A suite that ignores SIGTERM never leaves.
        try:
            out, _ = suite.communicate(timeout=120)
        except subprocess.TimeoutExpired as e:
            suite.kill()
            out, _ = suite.communicate()
            raise AssertionError(f"the suite outlived SIGTERM by 120 s:\n{out}") from e
        assert suite.returncode == 128 + signal.SIGTERM, out
        deadline = time.monotonic() + 30
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(server), "the server outlived the suite"
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)


# A SIGTERM that lands in a finalizer: the handler's SystemExit is swallowed there
# ("Exception ignored in"), as when the garbage collector runs an asyncio
# transport's __del__; the process then sleeps on.
SWALLOWED_SIGTERM = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from benchmarks.reliability import run_reliability
signal.signal(signal.SIGTERM, run_reliability._on_sigterm)

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, inside __del__
            pass

Finalized()
time.sleep(30)
"""


def test_a_sigterm_swallowed_in_a_finalizer_is_delivered_again():
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", SWALLOWED_SIGTERM, str(REPO)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Exception ignored" in proc.stderr  # the first delivery was swallowed
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert time.monotonic() - t0 < 20  # the second one ended the sleep


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    "flag, value, what",
    [
        ("--scenario", "abort", "unknown scenario 'abort'; valid: length-limits"),
        ("--backend", "FLASH", "unknown backend 'FLASH'; valid: FLASH_ATTN"),
        ("--model", "llama-9b", "unknown model 'llama-9b'; valid: "),
    ],
)
def test_bad_input_is_refused_with_the_valid_names(tmp_path, flag, value, what):
    args = ["--out-dir", str(tmp_path), "--model", "llama-3.1-8b", flag, value]
    with pytest.raises(SystemExit) as e:
        run_reliability.main(args)
    assert what in str(e.value)


def test_install_without_vllm_stops_with_one_line(tmp_path):
    args = ["--out-dir", str(tmp_path), "--model", "llama-3.1-8b"]
    args += ["--site", f"fork={tmp_path}", "--backend", "TRITON_ATTN-fork"]
    with pytest.raises(SystemExit) as e:
        run_reliability.main(args)
    assert "no vLLM for install 'fork'" in str(e.value)


def _done(t_end, n):
    return client.Result("k", "ok", 200, list(range(n)), t_end=t_end)


def test_throughput_rule():
    steady = [_done(t + 0.5, 10) for t in range(600)]
    tp = run_reliability.throughput_windows(steady, 600, 300)
    assert tp["change"] == 0.0
    slower = [_done(t + 0.5, 10 if t < 300 else 9) for t in range(600)]
    tp = run_reliability.throughput_windows(slower, 600, 300)
    assert tp["change"] == pytest.approx(-0.1)  # > 5%: the soak fails


def test_memory_rule():
    a = run_reliability.parse_args(["--model", "m", "--out-dir", "x"])
    reasons = []
    grow = [{"t": t, "gpu_mib": [1000 + 2 * t]} for t in range(0, 600, 10)]
    assert not run_reliability.memory_flat(grow, a, reasons)["ok"]
    assert "GPU memory grew" in reasons[0]
    assert "+20 MiB at 60 s" in reasons[0] and "running" not in reasons[0]
    assert reasons[0].endswith(
        f"and {54 - run_reliability.MEMORY_STEPS_TOLD} more steps"
    )
    # a step at a new high of the running requests says so
    reasons = []
    step = [
        {"t": t, "gpu_mib": [1000 + 500 * (t >= 80)],
         "vllm:num_requests_running": 269 if t == 80 else 150}
        for t in range(0, 600, 10)
    ]  # fmt: skip
    assert not run_reliability.memory_flat(step, a, reasons)["ok"]
    told = (
        "GPU memory grew 500 MiB after the settle time: +500 MiB at 80 s with 269 "
        "running requests (before it at most 150)"
    )
    assert reasons == [told]
    reasons = []
    flat = [{"t": t, "gpu_mib": [1000]} for t in range(0, 600, 10)]
    assert run_reliability.memory_flat(flat, a, reasons)["ok"] and not reasons
    # no nvidia-smi: recorded as unchecked, not a failure
    assert not run_reliability.memory_flat([{"t": 0, "gpu_mib": []}], a, reasons)[
        "checked"
    ]
    assert not reasons


def test_agreement_and_metrics_parsing():
    agree = run_reliability.agreement({"a": [1, 2], "b": [3]}, {"a": [1, 2], "b": [4]})
    assert agree["fraction"] == 0.5 and agree["differing_keys"] == ["b"]
    assert run_reliability.agreement({}, {"a": [1]})["fraction"] is None


@pytest.mark.parametrize(
    "extra, what",
    [
        (["--spec-prompt-lens", "600"], "exceeds --max-model-len 512"),
        (["--pressure-kv-tokens", "256"], "is below --max-model-len 512"),
    ],
)
def test_lengths_no_server_can_hold_are_refused_before_any_start(tmp_path, extra, what):
    r, recs = _run(tmp_path, "all", extra=extra)
    assert r.returncode != 0 and what in r.stderr and not recs


def _samples(cpu_per_s, waiting):
    """Ten metrics samples 10 s apart; ``waiting``: {sample index: queued requests}."""
    return [
        {"t": 10.0 * i, API_CPU: cpu_per_s * 10.0 * i, OPEN_FDS: 2000.0,
         run_reliability.RUNNING: 200.0, run_reliability.WAITING: waiting.get(i, 0.0)}
        for i in range(10)
    ]  # fmt: skip


API_CPU, OPEN_FDS = run_reliability.API_CPU, run_reliability.OPEN_FDS
AT_CAP = {"not_sent_at_cap": 12}
EVERY_OTHER = {i: 40.0 for i in range(1, 10, 2)}


@pytest.mark.parametrize("waiting", [{}, {3: 113.0}])  # none, one flushed burst
def test_saturation_names_the_api_server_when_the_engine_rarely_queued(waiting):
    server = run_reliability.server_load(_samples(1.0, waiting))
    assert server["api_server_cpu_share_median"] == 1.0
    assert server["max_open_fds"] == 2000.0
    assert server["engine_queued_share"] == len(waiting) / 10
    reasons = []
    run_reliability.saturated(AT_CAP, server, reasons)
    assert "12 arrivals" in reasons[0]
    assert "API server process was saturated" in reasons[0]


@pytest.mark.parametrize("cpu, waiting", [(1.0, EVERY_OTHER), (0.5, {})])
def test_saturation_names_the_engine_otherwise(cpu, waiting):
    server = run_reliability.server_load(_samples(cpu, waiting))
    reasons = []
    run_reliability.saturated(AT_CAP, server, reasons)
    assert "the engine was saturated" in reasons[0]
    reasons = []
    run_reliability.saturated({"not_sent_at_cap": 0}, server, reasons)
    assert reasons == []


def test_server_load_without_process_metrics():
    samples = [{"t": 10.0 * i, run_reliability.WAITING: 0.0} for i in range(3)]
    server = run_reliability.server_load(samples)
    assert server["api_server_cpu_share_median"] is None
    assert server["max_open_fds"] is None
    reasons = []
    run_reliability.saturated(AT_CAP, server, reasons)
    assert "the engine was saturated" in reasons[0]
