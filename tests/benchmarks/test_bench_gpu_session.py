"""benchmarks/gpu_session.sh steps against the fake vLLM: the shell plumbing (paths,
resume state, collection into $OUT) must work before the lead spends GPU time on it."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from benchmarks.e2e.run_e2e import DEFAULT_BACKENDS
from benchmarks.harness import REPO

SCRIPT = REPO / "benchmarks" / "gpu_session.sh"


@pytest.fixture
def session_env(tmp_path, fake_sites):
    env = dict(os.environ)
    env.update(
        OUT=str(tmp_path / "out"),
        STATE=str(tmp_path / "state"),
        MODELS=str(tmp_path / "models"),
        PYTHON=sys.executable,
        STEP_BUDGET_S="400",
        BENCH_SITE_STOCK=str(fake_sites),
        BENCH_SITE_FORK=str(fake_sites),
    )
    return env


@pytest.fixture
def python3_shim(tmp_path):
    """A ``python3`` that only logs its arguments (for the GPU-only kernel work):
    returns (the PATH with it first, the log)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    calls = tmp_path / "calls.log"
    calls.write_text("")
    (shim / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> {calls}\n')
    (shim / "python3").chmod(0o755)
    return f"{shim}:{os.environ['PATH']}", calls


def _step(env, step):
    """Run a step, then unpack its archives as a developer would: results.tgz into
    $OUT/results, logs.tgz into $OUT/logs."""
    r = subprocess.run(
        ["bash", str(SCRIPT), step],
        env=env,
        cwd="/tmp",
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = Path(env["OUT"])
    for name in ("results", "logs"):
        archive = out / f"{name}.tgz"
        if archive.is_file():
            (out / name).mkdir(exist_ok=True)
            with tarfile.open(archive) as tar:
                tar.extractall(out / name, filter="data")
    return r


def test_every_step_returns_few_files(session_env, tmp_path):
    """A device call brings back at most 8 files from $OUT."""
    r = subprocess.run(
        ["bash", str(SCRIPT), "e2e-quick"], env=session_env, cwd="/tmp",
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = [f for f in (tmp_path / "out").rglob("*") if f.is_file()]
    assert sorted(f.name for f in files) == ["logs.tgz", "results.tgz"]


def test_e2e_quick_then_report(session_env, tmp_path):
    r = _step(session_env, "e2e-quick")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "out"
    files = list((out / "results" / "e2e").glob("*.json"))
    assert len(files) == 1
    body = json.loads(files[0].read_text())
    assert body["scale"] == 0.25 and body["complete"]
    assert list((out / "logs").rglob("*.log")), "worker logs are collected"
    assert not list((out / "results").rglob("*.log")), "logs stay out of results"
    r2 = _step(session_env, "e2e-quick")  # resume: nothing left to run
    backends = len(DEFAULT_BACKENDS.split(","))
    assert r2.returncode == 0 and r2.stdout.count("skipping") == backends
    r3 = _step(session_env, "report")
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "| sharegpt | steady |" in (out / "performance.md").read_text()


def test_accuracy_runs_the_trained_model_else_the_committed_one(session_env, tmp_path):
    summary = tmp_path / "out" / "results" / "accuracy" / "summary.json"

    def model_dirs():
        body = json.loads(summary.read_text())
        assert body["pass"]
        return {b["model_dir"] for b in body["backends"].values()}

    committed = SCRIPT.parent / "accuracy" / "model"
    if (committed / "model.safetensors").is_file():  # the repository's checkpoint
        r = _step(session_env, "accuracy")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert model_dirs() == {str(committed)}
        shutil.rmtree(tmp_path / "state" / "results" / "accuracy")
    model = tmp_path / "state" / "accuracy-model"  # one trained in this sitting wins
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("")
    r = _step(session_env, "accuracy")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert model_dirs() == {str(model)}


def test_train_step_with_a_seed_into_its_own_dir(session_env, tmp_path):
    pytest.importorskip("transformers")
    model = tmp_path / "state" / "acc-7"
    env = dict(
        session_env,
        TRAIN_SEED="7",
        ACC_MODEL_DIR=str(model),
        BENCH_COMMIT="abc1234",
        TRAIN_ARGS="--device cpu --toy --max-steps 2 --check-problems 8",
        BENCH_SITE_STOCK="",
    )
    r = _step(env, "train")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (model / "model.safetensors").is_file()
    (log,) = (tmp_path / "out" / "results" / "accuracy").glob(
        "train-*-abc1234-seed7.json"
    )
    assert json.loads(log.read_text())["seed"] == 7
    assert (tmp_path / "out" / "accuracy-model-seed7.tgz").is_file()


def test_an_e2e_sitting_per_gpu_lane(session_env, tmp_path):
    """Two e2e sittings side by side (one per GPU, each with its own STATE) come back
    as separate archives holding separate sittings."""
    for lane in ("0", "1"):
        env = dict(
            session_env,
            LANE=lane,
            CUDA_VISIBLE_DEVICES=lane,
            STATE=str(tmp_path / f"state-gpu{lane}"),
            BENCH_COMMIT="abc1234",
        )
        r = subprocess.run(
            ["bash", str(SCRIPT), "e2e-quick"], env=env, cwd="/tmp",
            capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "out"
    names = sorted(f.name for f in out.iterdir())
    assert names == ["logs-lane0.tgz", "logs-lane1.tgz", "results-lane0.tgz",
                     "results-lane1.tgz"]  # fmt: skip
    for lane in ("0", "1"):
        with tarfile.open(out / f"results-lane{lane}.tgz") as tar:
            (name,) = [n for n in tar.getnames() if n.startswith("./e2e/2")]
        assert name.endswith(f"-abc1234-s0.25-gpu{lane}.json")


def test_unknown_step(session_env):
    r = _step(session_env, "bogus")
    assert r.returncode == 2 and "unknown step" in r.stderr


def test_soak_step(session_env, tmp_path):
    env = dict(session_env, SOAK_S="3", SOAK_ARGS="--concurrency 2 --sample-s 1")
    r = _step(env, "soak")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (result,) = (tmp_path / "out" / "results" / "soak").glob(
        "*-TRITON_ATTN-fork-*.json"
    )
    assert json.loads(result.read_text())["pass"]
    assert list((tmp_path / "out" / "logs" / "soak").glob("*server.log"))


def test_agreement_step_on_a_sliding_window_config(session_env, tmp_path):
    env = dict(
        session_env,
        AGREE_MODEL="mistral-7b-sw",
        AGREE_ARGS="--prompts 10 --tokens 4",
        AGREE_TAG="-sw",
        BENCH_COMMIT="abc1234",
    )
    r = _step(env, "agreement")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (result,) = (tmp_path / "out" / "results" / "agreement").glob(
        "*-abc1234-mistral-7b-sw-sw.json"
    )
    body = json.loads(result.read_text())
    assert body["model"] == "mistral-7b-sw" and body["max_model_len"] == 8192
    assert body["fraction_equal"] == 1.0 and body["commit"] == "abc1234"
    # the device hosts' multicast rule reaches the engines' environment
    assert body["settings"]["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"
    assert body["settings"]["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    again = _step(env, "agreement")  # a rerun reuses both finished sides
    assert again.returncode == 0, again.stdout[-3000:]
    log = tmp_path / "state" / "results" / "agreement" / "mistral-7b-sw-sw.log"
    assert log.read_text().count("reusing") == 2


def test_two_lanes_pin_one_gpu_each_and_report_failure(tmp_path):
    lanes = REPO / "benchmarks" / "gpu" / "two_lanes.sh"
    env = dict(os.environ, OUT=str(tmp_path))
    job = (
        'echo "gpu=$CUDA_VISIBLE_DEVICES order=$CUDA_DEVICE_ORDER lane=$LANE"; '
        'echo "cache=$VLLM_CACHE_ROOT"'
    )
    ok = subprocess.run(
        ["bash", str(lanes), job, job + "; X='a b' && echo $X"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "gpu=0 order=PCI_BUS_ID lane=0" in (tmp_path / "lane0.log").read_text()
    assert "/.cache/vllm-lane0\n" in (tmp_path / "lane0.log").read_text()
    assert "gpu=1 order=PCI_BUS_ID lane=1\n" in (tmp_path / "lane1.log").read_text()
    assert "vllm-lane1\na b" in (tmp_path / "lane1.log").read_text()
    bad = subprocess.run(
        ["bash", str(lanes), job, "exit 3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and "GPU 1 exit 3" in bad.stdout
    assert (
        subprocess.run(
            ["bash", str(lanes), job], capture_output=True, timeout=60, check=False
        ).returncode
        == 2
    )


def test_agreement_step_passes_a_speculative_config_through_agree_args(
    session_env, tmp_path
):
    """The JSON of the sitting guide survives the step's word splitting."""
    spec = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}'
    env = dict(
        session_env,
        AGREE_ARGS=f"--prompts 10 --tokens 4 --backend-speculative {spec}",
        AGREE_TAG="-ngram",
        BENCH_COMMIT="abc1234",
    )
    r = _step(env, "agreement")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (result,) = (tmp_path / "out" / "results" / "agreement").glob("*-ngram.json")
    body = json.loads(result.read_text())
    assert body["backend_speculative"]["config"] == json.loads(spec)


def test_detached_job_outlives_its_calls_process_group(tmp_path):
    """A call's leftover processes are killed (process group): the job runs on."""
    script = REPO / "benchmarks" / "gpu" / "detached.sh"
    lane = tmp_path / "state" / "bs-lane0" / "results"
    (lane / "e2e").mkdir(parents=True)
    (lane / "e2e" / "pass.json").write_text("{}")
    (lane / "e2e" / "server.log").write_text("long")
    env = dict(
        os.environ,
        DETACHED_DIR=str(tmp_path / "jobs"),
        OUT=str(tmp_path / "o"),
        STATE_ROOT=str(tmp_path / "state"),
    )
    marker = tmp_path / "go"
    job = (
        'echo "out=$OUT pwd=$PWD"; test -f benchmarks/gpu/detached.sh || exit 9; '
        f"while [ ! -f {marker} ]; do sleep 0.2; done; echo r > $OUT/r.txt; exit 5"
    )
    # The starting "call": its own process group, killed once the start returned.
    call = subprocess.Popen(
        ["bash", "-c", f"bash {script} start j '{job}' && sleep 60"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert "detached: started j" in call.stdout.readline()
    os.killpg(call.pid, 9)
    call.wait(timeout=10)

    def wait(out, seconds):
        return subprocess.run(
            ["bash", str(script), "wait", "j", str(seconds)],
            env=dict(env, OUT=str(tmp_path / out)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    running = wait("o1", 1)
    assert running.returncode == 75 and "still running" in running.stdout
    # What the lanes have written so far comes back with a wait that returns early.
    with tarfile.open(tmp_path / "o1" / "partial.tgz") as tar:
        names = tar.getnames()
    assert any(n.endswith("bs-lane0/results/e2e/pass.json") for n in names), names
    assert not any(n.endswith(".log") for n in names), names
    again = subprocess.run(
        ["bash", str(script), "start", "j", "true"], env=env, capture_output=True
    )
    assert again.returncode == 2
    marker.touch()
    done = wait("o2", 30)
    assert done.returncode == 5, done.stdout + done.stderr
    assert (tmp_path / "o2" / "r.txt").read_text() == "r\n"
    assert not (tmp_path / "o2" / "partial.tgz").exists()  # the steps packed theirs
    assert (
        f"out={tmp_path}/jobs/j/out pwd={tmp_path}/jobs/j/tree\n"
        in (tmp_path / "o2" / "job.log").read_text()
    )
    gone = subprocess.run(
        ["bash", str(script), "wait", "other"], env=env, capture_output=True
    )
    assert gone.returncode == 2


def test_kernel_work_boxes_every_step_by_the_deadline(tmp_path, python3_shim):
    """kernel_work.sh (the sittings' owed kernel measurements) gives each step at most
    its cap or what is left before UNTIL, skips a step with < 30 s left, hands the
    prefill tuner a budget that ends before its box, and always collects."""
    path, calls = python3_shim
    script = REPO / "benchmarks" / "gpu" / "sittings" / "kernel_work.sh"

    def run(seconds_left, *steps):
        calls.write_text("")
        env = dict(
            os.environ,
            PATH=path,
            STATE=str(tmp_path / "state"),
            OUT=str(tmp_path / "out"),
            BENCH_COMMIT="abc1234",
            UNTIL=str(int(time.time()) + seconds_left),
        )
        r = subprocess.run(
            ["bash", str(script), *steps],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return r, calls.read_text()

    r, log = run(2000)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-k early_convert" in log and "--retune-decode" in log
    assert "-k fast_exp" in log
    assert log.count("tune_prefix_prefill") == 7
    assert log.count("--budget-minutes 2.50") == 4, log  # (240 s box - 90) / 60
    assert log.count("--budget-minutes 3.50") == 3, log  # 300 s boxes
    assert "--groups 8 --block-sizes 64" in log
    assert "--kv-dtypes fp8 --commit abc1234" in log
    assert "--kv-dtypes bf16 --commit abc1234" in log
    assert (tmp_path / "out" / "results.tgz").is_file()
    r, log = run(20)
    assert r.returncode == 0 and log == "", log
    assert r.stderr.count("skipped") == 12 and "[kernel-work]" in r.stdout
    r, log = run(2000, "fp8-sweep")
    assert log.count("python3") == 1 and "--fp8-qk 0 1" in log, log
    r, log = run(2000, "no-such-step")
    assert r.returncode == 2 and "unknown step" in r.stderr


@pytest.mark.parametrize(
    "script, lane_files, kernel_calls",
    [
        (
            "rates",
            (
                {"llama-3.1-8b-quick-rates-gpu0.json"},
                {"llama-3.1-8b-quick-rates-gpu1.json"},
            ),
            (),
        ),
        (
            "full_sizes",
            ({"llama-3.1-8b-gpu0.json"}, {"llama-3.1-8b-gpu1.json"}),
            ("--head-sizes 256 --groups 2 --block-sizes 64 --query-lens 16 64 16384",),
        ),
        (
            "e2e_and_tables",
            ({"gpu0.json", "llama-3.1-8b-fp8.json"}, {"gpu1.json"}),
            ("--retune-decode",),
        ),
        (
            "e2e_bf16_and_fp8",
            ({"gpu0.json"}, {"kvfp8-gpu1.json", "llama-3.1-8b-fp8.json"}),
            (),
        ),
    ],
)
def test_sitting_scripts_run_both_lanes(
    session_env, tmp_path, python3_shim, script, lane_files, kernel_calls
):
    """A sitting script as the device would run it, on the fake vLLM (python3
    shimmed for the kernel work: no GPU here): each lane's results come back as one
    archive, with the files its steps promise."""
    path, calls_log = python3_shim
    env = dict(
        session_env,
        PATH=path,
        STATE_ROOT=str(tmp_path),
        BENCH_COMMIT="abc1234",
        JOB_S="600",
    )
    r = subprocess.run(
        ["bash", str(REPO / f"benchmarks/gpu/sittings/{script}.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = Path(env["OUT"])
    logs = {i: (out / f"lane{i}.log").read_text() for i in (0, 1)}
    assert r.returncode == 0, r.stdout + logs[0][-3000:] + logs[1][-3000:]
    day = time.strftime("%Y-%m-%d", time.gmtime())
    for i in (0, 1):
        with tarfile.open(out / f"results-lane{i}.tgz") as tar:
            names = {Path(n).name for n in tar.getnames()}
        want = {f"{day}-abc1234-{name}" for name in lane_files[i]}
        assert want <= names, (i, names)
    calls = calls_log.read_text()
    assert all(c in calls for c in kernel_calls), calls
    # (the fp8 kernel table goes through gpu_session.sh, which runs $PYTHON)
    assert calls.count("python3 ") == len(kernel_calls), calls
    if script == "full_sizes":
        # GPU 0's three workloads share one server per backend and one file.
        with tarfile.open(out / "results-lane0.tgz") as tar:
            name = next(n for n in tar.getnames() if n.endswith("-gpu0.json"))
            body = json.load(tar.extractfile(name))
        assert {r["workload"] for r in body["records"]} == {
            "random-10k-100",
            "sharegpt-like",
            "decode-1k-1k",
        }
        assert logs[0].count("server healthy") == 2, logs[0][-2000:]


def test_seventy_b_sitting_serves_both_backends_at_tp2(session_env, tmp_path):
    """The 70B sitting script on the fake vLLM: one TP-2 server per backend (its
    start timeout raised for the ~9-minute starts), the workloads WORKLOADS names
    (random-5k-100 only: the one the 974141e sitting left without FLASH_ATTN)."""
    env = dict(
        session_env,
        STATE_ROOT=str(tmp_path),
        BENCH_COMMIT="abc1234",
        JOB_S="600",
        WORKLOADS="random-5k-100",
    )
    r = subprocess.run(
        ["bash", str(REPO / "benchmarks/gpu/sittings/seventy_b.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("--tensor-parallel-size 2") == 2  # one server per backend
    with tarfile.open(Path(env["OUT"]) / "results.tgz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert f"{day}-abc1234-llama-3.1-70b-quick.json" in names, names
    results = tmp_path / "bs-70b" / "results" / "serving"
    body = json.loads(next(results.glob("*-70b-quick.json")).read_text())
    assert body["complete"] and "--startup-timeout-s 1200" in body["command"]
    assert {(rec["workload"], rec["backend"]) for rec in body["records"]} == {
        ("random-5k-100", "FLASH_ATTN"),
        ("random-5k-100", "TRITON_ATTN-fork"),
    }
