"""benchmarks/kernels/: the tuners of tune_attention.py (GPU timings faked) and
bench_kernels.py's command line."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.kernels import bench_kernels as bk
from benchmarks.kernels import tune_attention as tune
from vllm.attention.ops.tuning import decode_configs as dc
from vllm.attention.ops.tuning import tables
from vllm.attention.ops.tuning.prefill_configs import (
    PrefillConfig,
    heuristic_prefill_config,
)

REPO = Path(__file__).resolve().parents[2]


def _fake_gpu(monkeypatch, request, *, runner, wrong, time_us):
    """Run the retune without a GPU: ``runner(shape, inputs)`` stands for our kernel
    (its ``output`` is its config), the config ``wrong`` is off the reference, and
    ``time_us`` times a runner."""
    monkeypatch.setattr(bk.ops, "choose_num_splits", lambda **kw: 1, raising=False)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        # An sm_80 part: no stand-in tables (tables.SAME_ARCHITECTURE).
        lambda i: SimpleNamespace(multi_processor_count=132, major=8, minor=0),
    )
    tables.clear_caches()  # device_gpu_name is memoised per device
    request.addfinalizer(tables.clear_caches)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(
        bk, "build_inputs", lambda s, dev, rotate: SimpleNamespace(num_sets=1)
    )
    monkeypatch.setattr(bk, "reference_rows", lambda s, inp: None)
    monkeypatch.setattr(bk, "caller_ours", runner)
    monkeypatch.setattr(bk, "max_abs_err", lambda out, ref: float(out == wrong))
    monkeypatch.setattr(bk, "time_us", time_us)


def test_retune_decode_skips_wrong_configs_and_sweeps_every_field(monkeypatch, request):
    """Every field of DECODE_CONFIG_SPACE is swept (early_convert only for fp8), and
    a config whose output is wrong is never chosen, however fast."""
    fast_but_wrong = dc.DecodeConfig(32, 2, 1, early_convert=True)
    best_right = dc.DecodeConfig(128, 8, 3, early_convert=True)
    tried = []

    class Runner:
        def __init__(self, config):
            self.config = config
            self.output = self.config

        def run(self, i):
            tried.append(self.config)

    def time_us(runner, num_sets):
        speed = {fast_but_wrong: 1.0, best_right: 2.0}
        return speed.get(runner.config, 10.0), "fake"

    _fake_gpu(
        monkeypatch,
        request,
        runner=lambda s, inp, decode_config: Runner(decode_config),
        wrong=fast_but_wrong,
        time_us=time_us,
    )
    shapes = [
        bk.Shape("decode", "m", 64, 1, 8192, 32, 8, 128, 64, kv_dtype=kv)
        for kv in ("float8_e4m3fn", "bfloat16")
    ]
    written = []
    table = tune.retune_decode(
        bk, shapes, finalists=0, write=lambda t: written.append(len(t["configs"]))
    )
    assert written == [1, 2]  # after each key: a cut-short run keeps its keys
    chosen = {e["kv_dtype"]: dc.DecodeConfig(**e["config"]) for e in table["configs"]}
    assert chosen["fp8"] == best_right
    # All tie at 10: the config the key had before (here the heuristic's) stays.
    before = dc.DECODE_TABLE.lookup(
        gpu_name="Fake GPU",
        head_size=128,
        q_dtype=torch.bfloat16,
        kv_dtype=torch.bfloat16,
        group=4,
        block_size=64,
        split=False,
    )
    assert chosen["bfloat16"] == before and tried[27 * 2] == before
    # Every timing is recorded, the wrong config as failed.
    fp8_record = table["records"][0]
    assert len(fp8_record["timings"]) == 27 * 2
    assert sum("failed" in t for t in fp8_record["timings"]) == 1
    assert fast_but_wrong in tried
    # 27 tiles/warps/stages, twice for fp8 (early_convert), once for bf16.
    assert len(set(tried)) == 27 * 2
    assert not any(c.early_convert for c in tried[27 * 2 :])  # the bf16 key's


def test_retune_decode_times_only_the_finalists_of_a_screening_on_all_points(
    monkeypatch, request
):
    """With --finalists K every config is timed on the key's heaviest point
    only; the K fastest correct ones and the key's current config are then timed on
    every point, and the winner is the fastest over all points."""
    screen_best = dc.DecodeConfig(32, 4, 2)  # fastest on the big point, slow overall
    overall_best = dc.DecodeConfig(128, 8, 3)  # second on the big point
    wrong = dc.DecodeConfig(128, 2, 1)  # fastest of all on the big point, but wrong
    calls = []  # (config, point batch)

    class Runner:
        def __init__(self, s, config):
            self.config, self.batch = config, s.batch
            self.output = self.config

        def run(self, i):
            calls.append((self.config, self.batch))

    def time_us(runner, num_sets):
        big = {wrong: 0.5, screen_best: 1.0, overall_best: 2.0}
        small = {screen_best: 50.0, overall_best: 3.0}
        table = big if runner.batch == 64 else small
        return table.get(runner.config, 10.0), "fake"

    _fake_gpu(
        monkeypatch,
        request,
        runner=lambda s, inp, decode_config: Runner(s, decode_config),
        wrong=wrong,
        time_us=time_us,
    )
    # One bf16 key, three points; the batch-64 point moves the most bytes.
    shapes = [
        bk.Shape("decode", "m", batch, 1, 8192, 32, 8, 128, 64) for batch in (4, 64, 16)
    ]
    table = tune.retune_decode(bk, shapes, finalists=2)
    (entry,) = table["configs"]
    assert dc.DecodeConfig(**entry["config"]) == overall_best
    record = table["records"][0]
    previous = dc.DecodeConfig(**record["previous"])
    assert previous not in (screen_best, overall_best, wrong)
    # Round one: all 27 bf16 configs on the batch-64 point only.
    assert len(record["screen"]) == 27 and "batch=64" in record["screen_point"]
    screened = {c for c, b in calls if b == 64}
    assert len(screened) == 27
    # Round two: the two fastest correct ones and the current config, all points.
    everywhere = {c for c, b in calls if b == 4}
    assert everywhere == {screen_best, overall_best, previous}
    assert wrong not in everywhere
    assert len(record["timings"]) == 3


def test_tuning_sweep_covers_every_config_field_and_skips_no_op_tma():
    """The tuner sweeps exactly PrefillConfig's fields, drops use_tma candidates
    whose tile spans pages (they would time the pointer loads twice) and fp8_qk
    candidates for 16-bit caches (nothing to quantise to)."""
    import dataclasses

    fields = tuple(f.name for f in dataclasses.fields(PrefillConfig))
    assert fields == tune.SPACE_FIELDS
    space = {
        "block_m": (64,),
        "block_n": (32, 128),
        "num_warps": (4,),
        "num_stages": (2,),
        "use_tma": (False, True),
        "maxnreg": (0,),
        "fp8_qk": (False, True),
        "lazy_rescale": (False,),
        "fast_exp": (False,),
    }
    got = list(tune._candidates(128, torch.bfloat16, 4, 64, space))
    assert got == [
        PrefillConfig(64, 32, 4, 2, False),
        PrefillConfig(64, 32, 4, 2, True),
        PrefillConfig(64, 128, 4, 2, False),
    ]
    got = list(tune._candidates(128, torch.float8_e4m3fn, 4, 64, space))
    assert [c for c in got if c.fp8_qk] == [
        PrefillConfig(64, 32, 4, 2, False, fp8_qk=True),
        PrefillConfig(64, 32, 4, 2, True, fp8_qk=True),
        PrefillConfig(64, 128, 4, 2, False, fp8_qk=True),
    ]


def test_tuning_always_times_the_heuristic_and_the_previous_entry(monkeypatch):
    """Whatever the sweep, the config a new table entry replaces (the previous entry,
    else the heuristic) is a candidate, so a restricted sweep cannot install a
    slower config. Timings are faked: no GPU here."""
    shape = {
        "head_size": 128,
        "group": 4,
        "block_size": 64,
        "q_dtype": torch.bfloat16,
        "kv_dtype": torch.float8_e4m3fn,
    }
    heuristic = heuristic_prefill_config(head_size=128, group=4, max_query_len=4096)
    previous = PrefillConfig(64, 32, 4, 2)
    swept = PrefillConfig(64, 64, 4, 2, use_tma=True, fp8_qk=True)
    fake_ms = {swept: 3.0, heuristic: 2.0, previous: 1.0}
    timed = []
    monkeypatch.setattr(tune, "_make_batch", lambda **kw: None)
    monkeypatch.setattr(tune, "_is_correct", lambda config, small, head_size: True)

    def run(batch, config, head_size):
        timed.append(config)
        return config

    monkeypatch.setattr(tune, "_run", run)
    monkeypatch.setattr(tune.triton.testing, "do_bench", lambda fn, **kw: fake_ms[fn()])
    space = {name: (getattr(swept, name),) for name in tune.SPACE_FIELDS}
    best, record = tune._tune_one(
        shape, 4096, None, space, dataclasses.asdict(previous)
    )
    assert set(timed) == {swept, heuristic, previous}
    assert best == previous and record["previous_timing"]["ms"] == 1.0
    assert record["heuristic_timing"]["ms"] == 2.0
    # Without a previous entry the heuristic is what a sweep has to beat.
    timed.clear()
    best, _ = tune._tune_one(shape, 4096, None, space, None)
    assert set(timed) == {swept, heuristic} and best == heuristic


def test_tuning_run_records_its_provenance(tmp_path):
    """A tuning run writes the commit (BENCH_COMMIT on a copied tree) and the driver
    into the table and the record, so a run's files need no hand edits."""
    out, record = tmp_path / "table.json", tmp_path / "record.json"
    env = {**os.environ, "BENCH_COMMIT": "abc1234"}
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/kernels/tune_attention.py"),
            "--kernel",
            "prefill",
            "--untuned",
            "--gpu-name",
            "Test GPU",
            "--head-sizes",
            "64",
            "--groups",
            "2",
            "--out",
            str(out),
            "--record",
            str(record),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for path in (out, record):
        body = json.loads(path.read_text())
        provenance = body.get("provenance", body)
        assert provenance["commit"] == "abc1234" and "driver" in provenance, path
        # ... and where the timed kernels came from (here: this checkout).
        ops_dir = REPO / "vllm" / "attention" / "ops"
        assert provenance["vllm"].endswith(f"kernels from {ops_dir}"), provenance
    table = json.loads(out.read_text())
    assert len(table["configs"]) == 6  # one per query bucket
    # The table's provenance is short structured fields; its record is listed.
    assert table["provenance"]["records"] == [str(record)]
    assert "tune_attention.py --kernel prefill" in table["provenance"]["command"]


def test_bench_kernels_requires_a_stock_site_for_stock_callers():
    """The stock callers need stock vLLM; without --stock-site the command line
    says so in one line instead of assuming a host path."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/kernels/bench_kernels.py"), "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--stock-site DIR" in result.stderr and "--callers ours" in result.stderr
