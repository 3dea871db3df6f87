"""benchmarks/kernels/: the tuners of tune_attention.py (GPU timings faked) and
bench_kernels.py's command line."""

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.kernels import bench_kernels as bk
from benchmarks.kernels import tune_attention as tune
from vllm.attention.ops.tuning import decode_configs as dc
from vllm.attention.ops.tuning import tables
from vllm.attention.ops.tuning.prefill_configs import (
    PREFILL_TABLE,
    PrefillConfig,
    group_class,
    heuristic_prefill_config,
)

REPO = Path(__file__).resolve().parents[2]


def _fake_gpu(monkeypatch, request, *, runner, wrong, time_us):
    """Run the retune without a GPU: ``runner(shape, inputs)`` stands for our kernel
    (its ``output`` is its config), the config ``wrong`` is off the reference, and
    ``time_us`` times a runner."""
    monkeypatch.setattr(bk.ops, "choose_decode_splits", lambda **kw: 1, raising=False)
    monkeypatch.setattr(bk.ops, "decode_wave_rule", lambda **kw: None, raising=False)
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
        "fp8_qk": (False, True),
        "longest_first": (True,),
        "split_head": (False, True),
        "gluon": (False,),
        "overlap_pv": (False, True),
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
    # split_head only where the head size is two powers of two (96 = 64 + 32).
    got = list(tune._candidates(96, torch.bfloat16, 4, 64, space))
    assert [c for c in got if c.split_head] == [
        PrefillConfig(64, 32, 4, 2, False, split_head=True),
        PrefillConfig(64, 32, 4, 2, True, split_head=True),
        PrefillConfig(64, 128, 4, 2, False, split_head=True),
    ]
    # gluon: one candidate per valid tile (128 rows on 4 warps, 64 or 128 keys),
    # with TMA for the launches the portable kernel keeps.
    gluon_space = {
        **space, "block_m": (64, 128), "gluon": (True,), "overlap_pv": (False,)
    }  # fmt: skip
    got = list(tune._candidates(128, torch.bfloat16, 4, 64, gluon_space))
    assert got == [PrefillConfig(128, 128, 4, 2, True, gluon=True)]
    # An fp8 key: the Gluon kernel takes it with q.k on fp8 tensor cores only.
    got = list(tune._candidates(128, torch.float8_e4m3fn, 4, 64, gluon_space))
    assert got == [PrefillConfig(128, 128, 4, 2, True, fp8_qk=True, gluon=True)]
    # Head size 96 on a 16-bit cache: padded and split (split_head), the only
    # head size the Gluon kernel splits; never split on an fp8 cache.
    got = list(tune._candidates(96, torch.bfloat16, 4, 64, gluon_space))
    assert got == [
        PrefillConfig(128, 128, 4, 2, True, gluon=True),
        PrefillConfig(128, 128, 4, 2, True, split_head=True, gluon=True),
    ]
    got = list(tune._candidates(96, torch.float8_e4m3fn, 4, 64, gluon_space))
    assert got == [PrefillConfig(128, 128, 4, 2, True, fp8_qk=True, gluon=True)]
    # 192 rows (three consumer warpgroups) only at head 64 on a 16-bit cache.
    rows_space = {**gluon_space, "block_m": (128, 192)}
    got = list(tune._candidates(128, torch.bfloat16, 4, 64, rows_space))
    assert got == [PrefillConfig(128, 128, 4, 2, True, gluon=True)]
    got = list(tune._candidates(64, torch.bfloat16, 4, 64, rows_space))
    assert [c.block_m for c in got] == [128, 192]
    got = list(tune._candidates(64, torch.float8_e4m3fn, 4, 64, rows_space))
    assert [c.block_m for c in got] == [128]
    # overlap_pv: the Gluon kernel's only (the portable candidates above have
    # none set); a Gluon sweep times each tile with and without it.
    overlap_space = {**gluon_space, "overlap_pv": (False, True)}
    got = list(tune._candidates(128, torch.bfloat16, 4, 64, overlap_space))
    assert [c.overlap_pv for c in got] == [False, True]


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
    heuristic = heuristic_prefill_config(
        head_size=128, group=4, block_size=64, max_query_len=4096
    )
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
    env = {**os.environ, "BENCH_COMMIT": "fake-commit"}
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
        assert provenance["commit"] == "fake-commit" and "driver" in provenance, path
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


def test_a_stock_site_without_its_torch_is_named(tmp_path):
    """torch is imported before --stock-site joins sys.path: when it is not the
    stock install's, the kernels run on another torch and Triton than that
    install's, and the bench says so with the command that fixes it."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")  # a regular package, no FA3
    code = (
        "import sys; sys.argv = ['bench']; "
        "import benchmarks.kernels.bench_kernels as b; "
        f"files = b.import_modules({str(site)!r}); print(files['vllm'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
        check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"not from --stock-site {site}" in result.stdout, result.stdout
    assert f"PYTHONPATH={site}" in result.stdout
    assert str(site / "vllm" / "__init__.py") in result.stdout


# ----------------------------------------------------------------------------------
# The kernel matrix (--matrix full), its resume and summary; the held-out check
# ----------------------------------------------------------------------------------

REQUIRED_GROUPS = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}
REQUIRED_HEADS = {64, 80, 96, 112, 128, 192, 256}


def test_matrix_covers_every_group_head_size_page_dtype_and_feature():
    shapes = bk.matrix_shapes()
    keys = [bk.shape_key(s) for s in shapes]
    assert len(keys) == len(set(keys))  # each point once
    for kernel, blocks in (("prefill", {16, 64, 128}), ("decode", {16, 64})):
        mine = [s for s in shapes if s.kernel == kernel]
        for kv in ("bfloat16", "float8_e4m3fn"):
            pairs = {
                (s.num_q_heads // s.num_kv_heads, s.head_size)
                for s in mine
                if s.kv_dtype == kv
            }
            # every group with every head size, for bf16 and fp8 caches alike
            assert pairs == {(g, d) for g in REQUIRED_GROUPS for d in REQUIRED_HEADS}
        assert {s.block_size for s in mine} == blocks
        assert any(s.window for s in mine) and any(s.softcap for s in mine)
        assert any(s.window and s.softcap for s in mine)  # Gemma-2's local layers
        assert all(
            s.query_len == (1 if kernel == "decode" else s.query_len) for s in mine
        )
    prefill = [s for s in shapes if s.kernel == "prefill"]
    fresh = {s.query_len for s in prefill if s.query_len == s.context}
    assert min(fresh) == 512 and max(fresh) == 32768
    chunked = {
        s.context - s.query_len
        for s in prefill
        if s.query_len == 2048 and s.context > 2048
    }
    assert {8192, 16384, 32768} <= chunked and max(chunked) <= 32768
    # the later chunks `vllm serve` (token budget 8192) makes of a 10k and a 32k
    # prompt, for every end-to-end model, on pages of 64
    serving = {(1, 1808, 10000), (1, 8192, 16384), (1, 8192, 24576), (1, 8192, 32768)}
    assert set(bk.MATRIX_PREFILL_SERVING) == serving
    for group, head in bk.MATRIX_SWEEP_SHAPES:
        for kv in ("bfloat16", "float8_e4m3fn"):
            have = {
                (s.batch, s.query_len, s.context)
                for s in prefill
                if (s.num_q_heads // s.num_kv_heads, s.head_size, s.kv_dtype)
                == (group, head, kv)
                and s.block_size == 64
                and not s.window
            }
            assert serving <= have, (group, head, kv)
    decode = [s for s in shapes if s.kernel == "decode"]
    assert {s.batch for s in decode} >= {1, 256}
    assert {s.context for s in decode} >= {1024, 32768}
    assert max(s.context for s in decode) == 32768
    # a model's full length sweep runs at every page size, with both caches
    qwen7 = {
        (s.block_size, s.kv_dtype, s.batch, s.query_len, s.context)
        for s in prefill
        if s.num_q_heads == 56 and s.head_size == 128 and not s.window
    }
    # + the serving chunks and mixed steps on pages of 64
    assert len(qwen7) == 3 * 2 * 7 + 2 * (4 + len(bk.MATRIX_SERVING_STEPS))


def _main(monkeypatch, capsys, *argv) -> str:
    monkeypatch.setattr(sys, "argv", ["bench_kernels.py", *argv])
    bk.main()
    return capsys.readouterr().out


def test_matrix_pruning_options(monkeypatch, capsys):
    out = _main(
        monkeypatch, capsys, "--matrix", "full", "--list", "--kernels", "decode",
        "--groups", "12", "3", "--head-sizes", "80", "--kv-dtypes", "fp8",
    )  # fmt: skip
    lines = out.strip().splitlines()
    points = lines[:-1]
    assert lines[-1] == f"{len(points)} points" and points
    for line in points:
        fields = dict(f.split("=") for f in line.split())
        assert fields["kernel"] == "decode" and fields["head_size"] == "80"
        assert fields["group"] in ("12", "3")
        assert fields["kv_cache_dtype"] == "float8_e4m3fn"
    shapes = bk.matrix_shapes(kernels=("prefill",), block_sizes=(128,))
    assert shapes and {(s.kernel, s.block_size) for s in shapes} == {("prefill", 128)}
    everything = len(bk.matrix_shapes())
    assert (
        len(bk.matrix_shapes(kernels=("decode",)))
        + len(bk.matrix_shapes(kernels=("prefill",)))
        == everything
    )


def test_query_lens_option_keeps_only_those_points(monkeypatch, capsys):
    argv = ["--matrix", "full", "--list", "--kernels", "prefill", "--groups", "1",
            "--head-sizes", "96", "--block-sizes", "64",
            "--kv-dtypes", "bf16"]  # fmt: skip
    every = _main(monkeypatch, capsys, *argv).strip().splitlines()[:-1]
    chunks = _main(monkeypatch, capsys, *argv, "--query-lens", "2048")
    chunks = chunks.strip().splitlines()[:-1]
    q_lens = [dict(f.split("=") for f in line.split())["q_len"] for line in every]
    assert set(q_lens) > {"2048"}  # the selection has other lengths to drop
    assert chunks == [line for line, q in zip(every, q_lens) if q == "2048"]


def test_dtype_option_puts_the_points_in_that_query_dtype(monkeypatch, capsys):
    """--dtype float16: every point's query in fp16, a 16-bit cache with it (an fp8
    cache stays fp8); the same points as bf16 otherwise."""
    argv = ["--matrix", "full", "--list", "--kernels", "prefill", "--groups", "4",
            "--head-sizes", "128", "--block-sizes", "64"]  # fmt: skip

    def points(*extra):
        out = _main(monkeypatch, capsys, *argv, *extra)
        return [dict(f.split("=") for f in line.split())
                for line in out.strip().splitlines()[:-1]]  # fmt: skip

    bf16, fp16 = points(), points("--dtype", "float16")
    assert {p["dtype"] for p in bf16} == {"bfloat16"}
    assert {p["dtype"] for p in fp16} == {"float16"}
    assert {p["kv_cache_dtype"] for p in fp16} == {"float16", "float8_e4m3fn"}
    rename = {"bfloat16": "float16"}
    assert fp16 == [
        {**p, "dtype": "float16", "kv_cache_dtype": rename.get(p["kv_cache_dtype"],
                                                                p["kv_cache_dtype"])}
        for p in bf16
    ]  # fmt: skip


def test_decode_batches_sweep_one_context_many_batches(monkeypatch, capsys):
    out = _main(monkeypatch, capsys, "--decode-batches", "40", "77", "--list",
                "--decode-context", "1000", "--block-sizes", "16")  # fmt: skip
    points = [dict(f.split("=") for f in line.split())
              for line in out.strip().splitlines()[:-1]]  # fmt: skip
    got = {(p["batch"], p["kv_cache_dtype"]) for p in points}
    assert got == {(b, kv) for b in ("40", "77")
                   for kv in ("bfloat16", "float8_e4m3fn")}  # fmt: skip
    assert {(p["kernel"], p["kv_len"], p["block_size"]) for p in points} == {
        ("decode", "1000", "16")
    }


def test_native_sweep_times_each_feature_our_kernels_took_over(monkeypatch, capsys):
    """--native: head size 100, ALiBi-sqrt, non-causal cross-attention and
    fp8_e5m2 points, on both kernels where the feature reaches both."""
    out = _main(monkeypatch, capsys, "--native", "--list")
    points = [dict(f.split("=") for f in line.split())
              for line in out.strip().splitlines()[:-1]]  # fmt: skip
    assert {p["kernel"] for p in points if p["head_size"] == "100"} == {
        "prefill",
        "decode",
    }
    assert {p["kernel"] for p in points if p.get("alibi") == "sqrt"} == {
        "prefill",
        "decode",
    }
    cross = [p for p in points if p.get("causal") == "False"]
    assert [(p["q_len"], p["kv_len"]) for p in cross] == [("4", "1500"), ("512", "512")]
    # Encoder self-attention: the step's K/V as one-key pages in token order.
    (encoder,) = [p for p in points if p.get("kv_from_step") == "True"]
    assert encoder["block_size"] == "1" and encoder["causal"] == "False"
    native = bk.sweep(SimpleNamespace(tiny=False, native=True))
    s = next(s for s in native if s.kv_from_step)
    inp = bk.build_inputs(dataclasses.replace(s, batch=3, query_len=5, context=5),
                          "cpu", rotate=True)  # fmt: skip
    assert inp.block_tables[0].tolist() == [list(range(r * 5, r * 5 + 5))
                                            for r in range(3)]  # fmt: skip
    k, _ = bk.step_kv(inp)
    assert k.shape == (15, 16, 64)
    assert {p["kernel"] for p in points if p["kv_cache_dtype"] == "float8_e5m2"} == {
        "prefill",
        "decode",
    }
    # gpt-oss: sinks (head 64, group 8) in prefill and decode, with a window too.
    sinks = [p for p in points if p.get("sinks") == "True"]
    assert {p["kernel"] for p in sinks} == {"prefill", "decode"}
    assert {(p["head_size"], p["group"]) for p in sinks} == {("64", "8")}
    assert {p["window"] for p in sinks} == {"None", "128"}


@pytest.mark.parametrize("kernel", ["prefill", "decode"])
def test_sinks_reach_our_kernels_and_the_reference(kernel, monkeypatch):
    """A sinks point: our kernels (the interpreter here) and the bench's fp32
    reference take the same sink logits, so they agree; without the sinks the
    reference differs (the check would see a dropped sink)."""
    from tests.kernels.interpreter_compat import install

    install()  # the interpreter's bf16 dot, as in the kernel tests
    # Our kernels on a namespace of this test's own, as import_modules puts them.
    monkeypatch.setattr(bk, "ops", bk._Namespace())
    bk.import_ours()
    q_len = 1 if kernel == "decode" else 7
    shape = bk.Shape(kernel, "m", 2, q_len, 20, 4, 2, 64, 16, sinks=True)
    inp = bk.build_inputs(shape, "cpu", rotate=False)
    sinks = bk.sink_logits(shape, "cpu")
    assert sinks.dtype == torch.bfloat16 and sinks.shape == (4,)
    assert bk.sink_logits(dataclasses.replace(shape, sinks=False), "cpu") is None
    runner = bk.caller_ours(shape, inp)
    runner.run(0)
    checked = bk.reference_rows(shape, inp)
    assert bk.max_abs_err(runner.output, checked) < 2e-2
    plain = bk.reference_rows(dataclasses.replace(shape, sinks=False), inp)
    assert bk.max_abs_err(runner.output, plain) > 5e-2


def test_a_mixed_prefill_batch_reaches_our_kernel_and_the_reference(monkeypatch):
    """A step of chunked serving (sequences of different lengths in one launch):
    the inputs hold each sequence's own query rows and KV length, our kernel (the
    interpreter here) and the fp32 reference agree on both sequences' rows, and
    the work counts each sequence's visible keys."""
    from tests.kernels.interpreter_compat import install

    install()
    monkeypatch.setattr(bk, "ops", bk._Namespace())
    bk.import_ours()
    shape = bk.Shape(
        kernel="prefill", model="m", num_q_heads=4, num_kv_heads=2, head_size=64,
        block_size=16, **bk.mixed_fields([(5, 37), (9, 9)]),
    )  # fmt: skip
    assert (shape.batch, shape.query_len, shape.context) == (2, 9, 37)
    inp = bk.build_inputs(shape, "cpu", rotate=False)
    assert inp.query_start_loc.tolist() == [0, 5, 14]
    assert inp.seq_lens.tolist() == [37, 9]
    assert inp.query.shape[0] == 14
    runner = bk.caller_ours(shape, inp)
    runner.run(0)
    checked = bk.reference_rows(shape, inp)
    assert [(rows.start, rows.stop) for rows, _ in checked] == [(0, 5), (5, 14)]
    assert bk.max_abs_err(runner.output, checked) < 2e-2
    # the first sequence's reference at the second's rows (a wrong offset) fails
    assert bk.max_abs_err(runner.output, [(slice(5, 10), checked[0][1])]) > 5e-2
    pairs = sum(37 - 5 + i + 1 for i in range(5)) + sum(i + 1 for i in range(9))
    assert bk.prefill_flops(shape) == 4 * 64 * 4 * pairs


def test_serving_steps_continue_one_prompt_beside_the_next():
    steps = bk.serving_steps(10000, 8192, 3)
    assert steps == [
        [(1808, 10000), (6384, 6384)],
        [(3616, 10000), (4576, 4576)],
        [(5424, 10000), (2768, 2768)],
    ]
    assert all(sum(q for q, _ in step) == 8192 for step in steps)
    # a prompt that fits the budget twice: two or more whole prompts a step
    assert bk.serving_steps(3000, 8192, 1) == [
        [(3000, 3000), (3000, 3000), (2192, 2192)]
    ]
    mixed = [s for s in bk.matrix_shapes() if s.seqs]
    assert {s.seqs for s in mixed} == {
        "+".join(f"{q}/{kv}" for q, kv in step) for step in bk.MATRIX_SERVING_STEPS
    }
    assert {s.block_size for s in mixed} == {64}
    keys = {bk.shape_key(s) for s in mixed}
    assert len(keys) == len(mixed)  # each step its own point


def test_fa3_skips_what_it_does_not_take(monkeypatch):
    monkeypatch.setattr(bk.stock, "flash_attn_varlen_func", object(), raising=False)
    base = bk.Shape("prefill", "m", 1, 16, 16, 8, 2, 128, 64)
    for changes, why in (
        ({"alibi": "sqrt"}, "ALiBi"),
        ({"kv_dtype": "float8_e5m2"}, "e4m3"),
        ({"head_size": 100}, "multiples of 8"),
    ):
        with pytest.raises(bk.Skip, match=why):
            bk.caller_fa3(dataclasses.replace(base, **changes), inp=None)


def test_fa3_takes_the_sinks_in_bf16(monkeypatch):
    """FA3 rejects sinks (``s_aux``) in any dtype but bf16: the bench hands it
    the same bf16 logits as our kernel, so a sinks point has an FA3 time."""
    seen = {}

    def flash_attn_varlen_func(**kw):
        seen.update(kw)

    monkeypatch.setattr(
        bk.stock, "flash_attn_varlen_func", flash_attn_varlen_func, raising=False
    )
    shape = bk.Shape("prefill", "m", 1, 16, 16, 4, 2, 64, 16, sinks=True)
    inp = bk.build_inputs(shape, "cpu", rotate=False)
    bk.caller_fa3(shape, inp).run(0)
    assert seen["s_aux"].dtype == torch.bfloat16
    assert torch.equal(seen["s_aux"], bk.sink_logits(shape, "cpu"))
    seen.clear()
    bk.caller_fa3(dataclasses.replace(shape, sinks=False), inp).run(0)
    assert "s_aux" not in seen


def _fake_callers(monkeypatch, measured, *, fail=()):
    """Callers whose times are made up: ours 10 us, fa3 20 us (skipped on fp8),
    stock 5 us; ``fail``: shapes on which ours raises."""

    def caller(name, us):
        def make(s, inp, **kw):
            if name == "ours":
                measured.append(s)
                if s in fail:
                    raise RuntimeError("boom")
            if name == "fa3" and s.kv_dtype != "bfloat16":
                raise bk.Skip("no fp8 here")
            return SimpleNamespace(run=lambda i: None, output=us, note="")

        return make

    for name, us in (("ours", 10.0), ("fa3", 20.0), ("stock_triton", 5.0)):
        monkeypatch.setitem(bk.CALLERS, name, caller(name, us))
    monkeypatch.setattr(
        bk, "build_inputs", lambda s, dev, rotate: SimpleNamespace(num_sets=1)
    )
    monkeypatch.setattr(bk, "reference_rows", lambda s, inp: None)
    monkeypatch.setattr(bk, "max_abs_err", lambda out, ref: 0.0)
    monkeypatch.setattr(bk, "rms_err", lambda out, ref: 0.0)
    monkeypatch.setattr(bk, "time_us", lambda runner, n: (runner.output, "fake"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def test_matrix_run_writes_each_point_and_resumes(monkeypatch, tmp_path):
    measured = []
    bf16 = bk.matrix_shapes(groups=(5,), head_sizes=(112,), kv_dtypes=("bfloat16",))
    fp8 = bk.matrix_shapes(groups=(2,), head_sizes=(64,), kv_dtypes=("float8_e4m3fn",))
    shapes = [s for s in bf16 if s.batch == 1][:4] + fp8[:1]
    fail = {shapes[1]}
    _fake_callers(monkeypatch, measured, fail=fail)
    path = tmp_path / "matrix.json"
    header = {"commit": "abc", "gpu": "Fake GPU", "driver": "1", "versions": {},
              "command": "bench_kernels.py --matrix full"}  # fmt: skip
    args = SimpleNamespace(
        callers=list(bk.CALLERS),
        decode_max_splits=None,
        decode_programs_per_sm=None,
        decode_wave_rule={},
        decode_num_splits=None,
        decode_config={},
        prefill_num_splits=None,
        prefill_config={},
    )

    def run(max_points):
        args.max_points = max_points
        measured.clear()
        return bk.run_matrix(shapes, args, path, header, bk.measure_point)

    assert run(3) == 3 and measured == shapes[:3]
    body = json.loads(path.read_text())
    assert body["commit"] == "abc" and body["gpu"] == "Fake GPU"
    assert all(k in body for k in ("driver", "versions", "command"))
    assert len(body["records"]) == 3
    good = body["records"][0]
    for field in bk.KEY_FIELDS:
        assert good[field] == dict(zip(bk.KEY_FIELDS, bk.shape_key(shapes[0])))[field]
    assert (good["ours_us"], good["fa3_us"], good["stock_triton_us"]) == (10, 20, 5)
    assert good["ratio_vs_fa3"] == 2.0 and good["ratio_vs_stock_triton"] == 0.5
    assert good["tflops" if shapes[0].kernel == "prefill" else "gbps"] > 0
    bad = body["records"][1]
    assert bad["ours_us"] is None and "boom" in bad["ours_us_reason"]
    assert bad["ratio_vs_fa3"] is None and "boom" in bad["ratio_vs_fa3_reason"]
    # Rerun: the failed point again, then the two not measured yet; no others.
    assert run(None) == 3 and measured == [shapes[1], shapes[3], shapes[4]]
    body = json.loads(path.read_text())
    assert len(body["records"]) == 5  # the failed point's record was replaced
    fp8 = body["records"][-1]
    assert fp8["fa3_us"] is None and fp8["ratio_vs_fa3"] is None
    assert "no fp8 here" in fp8["ratio_vs_fa3_reason"]
    # A skip is final: only the still failing point runs again.
    assert run(None) == 1 and measured == [shapes[1]]
    fail.clear()
    assert run(None) == 1 and run(None) == 0
    assert len(body["runs"]) == 2 and len(json.loads(path.read_text())["runs"]) == 5
    # Another commit's file is not extended.
    with pytest.raises(SystemExit, match="commit"):
        bk.run_matrix(shapes, args, path, {**header, "commit": "def"}, bk.measure_point)


def _record(kernel, head, group, ratio, q_len, fa3_skipped=False):
    return {
        "kernel": kernel, "dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
        "group": group, "head_size": head, "block_size": 64, "q_len": q_len,
        "kv_len": 8192, "batch": 1, "window": None, "softcap": None,
        "ratio_vs_fa3": None if fa3_skipped else ratio,
        "ratio_vs_stock_triton": 1.5,
    }  # fmt: skip


def test_summary_worst_and_median(monkeypatch, capsys, tmp_path):
    records = [
        _record("prefill", 128, 4, 0.5, 1),
        _record("prefill", 128, 4, 1.0, 2),
        _record("prefill", 128, 8, 2.0, 3),
        _record("prefill", 64, 4, 0.9, 4),
        _record("decode", 128, 8, 1.2, 1),
        _record("decode", 128, 8, None, 2, fa3_skipped=True),
        _record("decode", 128, 8, 7.0, 3),
    ]
    # a later record of the same point replaces the earlier (a rerun's)
    records.append(_record("decode", 128, 8, 1.4, 3))
    table = bk.summarize(records)
    kernel = {r["kernel"]: r for r in table["kernel"]}
    assert kernel["prefill"]["worst"] == 0.5
    assert kernel["prefill"]["median"] == pytest.approx(0.95)
    assert kernel["prefill"]["points"] == 4 and kernel["prefill"]["missing"] == 0
    assert kernel["decode"]["worst"] == 1.2
    assert kernel["decode"]["median"] == pytest.approx(1.3)
    assert kernel["decode"]["points"] == 3 and kernel["decode"]["missing"] == 1
    heads = {(r["kernel"], r["head_size"]): r for r in table["head_size"]}
    assert heads["prefill", 128]["worst"] == 0.5
    assert heads["prefill", 128]["median"] == 1.0
    assert heads["prefill", 64]["median"] == 0.9
    groups = {(r["kernel"], r["group"]): r for r in table["group"]}
    assert groups["prefill", 4]["median"] == pytest.approx(0.9)
    assert groups["prefill", 8]["worst"] == 2.0
    assert "q1 kv8192" in kernel["prefill"]["worst_point"]
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"records": records}))
    out = _main(monkeypatch, capsys, "--summarize", str(path))
    assert "| prefill | 128 | 3 | 0 | 0.50 | 1.00 |" in out
    assert "| decode | 3 | 1 | 1.20 | 1.30 |" in out
    assert "ours / stock_triton by kernel" in out


def test_work_formulas_count_only_window_visible_keys():
    for q, ctx, w in ((7, 7, None), (5, 20, 8), (9, 9, 4), (3, 30, 40), (4, 40, 2)):
        s = bk.Shape("prefill", "m", 2, q, ctx, 8, 2, 64, 16, window=w)
        pairs = sum(
            min(ctx - q + i + 1, w or ctx) for i in range(q)
        )  # brute force: the keys query i sees
        assert bk.prefill_flops(s) == 4 * 64 * 8 * 2 * pairs
    # Not causal (cross-attention): every query sees every key.
    cross = bk.Shape("prefill", "m", 2, 4, 1500, 8, 2, 64, 16, causal=False)
    assert bk.prefill_flops(cross) == 4 * 64 * 8 * 2 * 4 * 1500
    d = bk.Shape("decode", "m", 1, 1, 10000, 8, 2, 64, 16, window=4096)
    full = bk.Shape("decode", "m", 1, 1, 4096, 8, 2, 64, 16)
    assert bk.decode_bytes(d) == bk.decode_bytes(full)
    assert bk.stock_window(d) == (4095, 0) and bk.stock_window(full) == (-1, -1)


@pytest.mark.parametrize(
    "name, by_class",
    [
        ("fitted", [(128, 7, 64, "bfloat16")]),
        ("unseen", [(128, 3, 64, "bfloat16"), (128, 6, 64, "fp8")]),
    ],
)
def test_held_out_shapes_are_not_in_the_shipped_table(name, by_class):
    body = json.loads(
        (REPO / "vllm/attention/ops/tuning/prefix_prefill_NVIDIA_H200.json").read_text()
    )
    shipped = {
        (e["head_size"], e["group"], e["block_size"], e["q_dtype"], e["kv_dtype"])
        for e in body["configs"]
    }
    held = tune.HELD_OUT_SETS[name]
    assert len(held) >= 8 and len(set(held)) == len(held)
    table = PREFILL_TABLE.load("NVIDIA H200")
    found = []
    for head, group, block, kv, bucket in held:
        # no entry was tuned on the shape, whatever the bucket
        assert (head, group, block, "bfloat16", kv) not in shipped
        assert bucket in tune.QUERY_LEN_BUCKETS
        key = tune.held_out_key(head, group, block, kv, bucket)
        if key in table:  # held only through its group class
            assert group_class(group) != group
            found.append((head, group, block, kv))
    assert found == by_class
    assert len({h[0] for h in held}) >= 4 and len({h[1] for h in held}) >= 4
    assert {h[2] for h in held} == {16, 64, 128}


def test_unseen_shapes_were_never_timed():
    """No unseen shape is a fitted held-out shape or the key of any committed
    tuning record (a sweep would have timed it) other than the unseen set's own
    held-out records."""
    recorded = set()
    for path in (REPO / "benchmarks/results/tuning").glob("*.json"):
        data = json.loads(path.read_text())
        if "--held-out-set unseen" in data.get("command", ""):
            continue
        for record in data.get("records", []):
            for key in (record.get("key"), record.get("shape")):
                if isinstance(key, dict) and "head_size" in key:
                    recorded.add(
                        (key["head_size"], key["group"], key["block_size"],
                         key["kv_dtype"], key["max_query_len"])
                    )  # fmt: skip
    assert recorded  # the records were read
    unseen = set(tune.UNSEEN_SHAPES)
    assert not unseen & set(tune.HELD_OUT_SHAPES)
    assert not unseen & recorded, unseen & recorded


def test_held_out_records_picked_vs_best_and_resumes(monkeypatch, tmp_path):
    """The picked config is what a launch takes (here the heuristic: no table
    entry); it is always timed, and the record compares it with the best."""
    monkeypatch.setattr(tune, "device_gpu_name", lambda dev: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(tune, "_make_batch", lambda **kw: None)
    monkeypatch.setattr(tune, "_is_correct", lambda config, small, head_size: True)
    monkeypatch.setattr(tune, "_run", lambda batch, config, head_size: config)
    swept = PrefillConfig(64, 32, 4, 1)
    swept_ms = {}  # per head size: the swept config's time; the heuristic's is 1.0
    timed = []

    def do_bench(fn, **kw):
        config = fn()
        timed.append(config)
        return 1.0 if config != swept else swept_ms[current[0]]

    current = [None]
    monkeypatch.setattr(tune.triton.testing, "do_bench", do_bench)
    args = SimpleNamespace(
        record=str(tmp_path / "held.json"), budget_minutes=10.0, commit="abc", jobs=1
    )
    for name in tune.SPACE_FIELDS:
        setattr(args, name, [int(getattr(swept, name))])
    shapes = [(80, 3, 16, "bfloat16", 1024), (192, 12, 64, "fp8", 4096)]
    swept_ms.update({80: 0.5, 192: 0.97})  # the pick 2x and 3% off the best

    def run(todo):
        timed.clear()
        for shape in todo:
            current[0] = shape[0]
            tune.run_held_out(args, [shape])
        return json.loads((tmp_path / "held.json").read_text())

    body = run(shapes)
    assert body["commit"] == "abc" and len(body["records"]) == 2
    first, second = body["records"]
    heuristic = heuristic_prefill_config(
        head_size=80, group=3, block_size=16, max_query_len=1024
    )
    assert first["picked_from"] == "heuristic"
    assert first["picked"] == dataclasses.asdict(heuristic)
    assert first["shape"]["group"] == 3 and first["shape"]["block_size"] == 16
    assert first["key"]["group"] == 4  # the table's group class
    assert first["best"] == dataclasses.asdict(swept)
    assert (first["picked_ms"], first["best_ms"]) == (1.0, 0.5)
    assert first["ratio"] == 2.0 and first["within_5pct"] is False
    assert second["key"]["kv_dtype"] == "fp8"
    assert second["ratio"] == pytest.approx(1 / 0.97, abs=1e-4)
    assert second["best"] != second["picked"] and second["within_5pct"] is True
    assert len(timed) == 4  # heuristic and swept config, per shape
    # Rerun: the finished shapes are skipped.
    body = run(shapes)
    assert timed == [] and len(body["records"]) == 2


def test_precompile_deals_every_candidate_to_exactly_one_job(monkeypatch):
    """--jobs N: each candidate of a key is compiled by exactly one of at most N
    processes, before the timing loop times them all."""
    candidates = [PrefillConfig(64, n, 4, 2) for n in (16, 32, 64, 128)]
    for jobs in (1, 3, 4, 16):
        shares = tune.job_shares(candidates, jobs)
        assert len(shares) == min(jobs, len(candidates)) and all(shares)
        assert sorted(sum(shares, []), key=str) == sorted(candidates, key=str)
    order = []
    monkeypatch.setattr(tune, "_make_batch", lambda **kw: None)
    monkeypatch.setattr(tune, "_is_correct", lambda config, small, head_size: True)
    monkeypatch.setattr(tune, "_run", lambda batch, config, head_size: config)
    monkeypatch.setattr(
        tune.triton.testing,
        "do_bench",
        lambda fn, **kw: order.append(("time", fn())) or 1.0,
    )
    monkeypatch.setattr(
        tune,
        "precompile",
        lambda shape, bucket, configs, jobs: order.append(("compile", set(configs))),
    )
    shape = {
        "head_size": 128,
        "group": 4,
        "block_size": 64,
        "q_dtype": torch.bfloat16,
        "kv_dtype": torch.bfloat16,
    }
    space = {name: (getattr(candidates[2], name),) for name in tune.SPACE_FIELDS}
    tune._tune_one(shape, 4096, None, space, None, jobs=4)
    (first, compiled), *timed = order
    assert first == "compile" and compiled == {config for _, config in timed}
    order.clear()
    tune._tune_one(shape, 4096, None, space, None, jobs=1)
    assert all(kind == "time" for kind, _ in order)


@pytest.mark.parametrize(
    "argv, shapes",
    [([], tune.HELD_OUT_SHAPES), (["--held-out-set", "unseen"], tune.UNSEEN_SHAPES)],
)
def test_held_out_set_chooses_the_shapes(monkeypatch, tmp_path, argv, shapes):
    runs = []
    monkeypatch.setattr(tune, "run_held_out", lambda args, todo: runs.append(todo))
    record = str(tmp_path / "held.json")
    tune.main(["--kernel", "prefill", "--held-out", "--record", record, *argv])
    assert runs == [shapes]


def test_config_options_parse_and_check_fields():
    assert bk.config_field("split_head=true") == ("split_head", True)
    assert bk.config_field("num_stages=3") == ("num_stages", 3)
    for bad in ("split_head", "num_stages=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="FIELD=VALUE"):
            bk.config_field(bad)
    got = bk.config_fields([("split_head", 1), ("num_stages", 3)], PrefillConfig)
    assert got == {"split_head": True, "num_stages": 3}
    assert type(got["split_head"]) is bool
    with pytest.raises(ValueError, match=r"no field \['nope'\]; fields: .*split_head"):
        bk.config_fields([("nope", 1)], PrefillConfig)
    got = bk.config_fields([("early_convert", 1)], dc.DecodeConfig, "--decode-config")
    assert got == {"early_convert": True}
    with pytest.raises(ValueError, match=r"--decode-config: no field \['split_head'\]"):
        bk.config_fields([("split_head", 1)], dc.DecodeConfig, "--decode-config")
    # --decode-wave-rule: numbers of any kind, each as its WaveRule field's type
    assert bk.wave_field("program_overhead=0.15") == ("program_overhead", 0.15)
    assert bk.wave_field("max_splits=64") == ("max_splits", 64)
    with pytest.raises(argparse.ArgumentTypeError, match="FIELD=VALUE"):
        bk.wave_field("max_splits=many")
    got = bk.config_fields(
        [("any_count", 1), ("program_overhead", 0), ("max_splits", 64)],
        dc.WaveRule, "--decode-wave-rule",
    )  # fmt: skip
    assert got == {"any_count": True, "program_overhead": 0.0, "max_splits": 64}
    assert [type(v) for v in got.values()] == [bool, float, int]


def _fake_decode(monkeypatch, batch, **fakes):
    """The decode ops that ``caller_ours`` reaches, faked (``fakes`` by name
    replace the defaults), and a decode point of ``batch`` sequences over an fp8
    cache with its inputs."""
    defaults = {
        "choose_decode_splits": lambda **kw: 2,
        "decode_wave_rule": lambda **kw: None,
        "decode_workspace_shape": lambda **kw: (kw["num_splits"],),
        "WORKSPACE_DTYPE": torch.float32,
        "MAX_DECODE_SPLITS": 64,
        "paged_decode_attention": lambda **kw: None,
        "AttentionInputs": lambda **kw: kw,
        "WaveRule": dc.WaveRule,
        "hardware": SimpleNamespace(num_sms=lambda d: 132),
    }
    for name, value in {**defaults, **fakes}.items():
        monkeypatch.setattr(bk.ops, name, value, raising=False)
    shape = bk.Shape("decode", "m", batch, 1, 8192, 32, 8, 128, 16, kv_dtype="fp8")
    inp = SimpleNamespace(
        query=torch.zeros(batch, 32, 128),
        kv_cache=torch.zeros(1, 2, 8, 16, 128),
        block_tables=[None],
        seq_lens=None,
        softmax_scale=0.1,
        k_scale=None,
        v_scale=None,
    )
    return shape, inp


def test_ours_decode_replaces_fields_of_its_wave_rule(monkeypatch):
    """--decode-wave-rule changes the WaveRule that choose_decode_splits gets (the
    backend's, or --decode-programs-per-sm's); with no rule to change, ours does
    not run at the point and says why."""
    rules = []

    def choose(**kw):
        rules.append(kw["wave"])
        return 2

    backend_rule = dc.WaveRule(programs_per_sm=3, any_count=True)
    shape, inp = _fake_decode(
        monkeypatch,
        4,
        choose_decode_splits=choose,
        decode_wave_rule=lambda **kw: backend_rule,
    )
    bk.caller_ours(shape, inp, decode_wave_fields={"max_splits": 64}).run(0)
    bk.caller_ours(shape, inp, decode_programs_per_sm=4,
                   decode_wave_fields={"any_count": True}).run(0)  # fmt: skip
    bk.caller_ours(shape, inp).run(0)
    assert rules == [
        dataclasses.replace(backend_rule, max_splits=64),
        dc.WaveRule(programs_per_sm=4, any_count=True),
        backend_rule,
    ]
    with pytest.raises(bk.Skip, match="no WaveRule"):
        bk.caller_ours(shape, inp, decode_programs_per_sm=0,
                       decode_wave_fields={"max_splits": 64})  # fmt: skip


def test_ours_prefill_takes_the_picked_config_with_the_given_fields(monkeypatch):
    """--prefill-config replaces fields of the config the launch would pick and
    plans with it; without it the plan picks its own (config=None). The plan is
    made once; a timed call only launches it."""
    picked = PrefillConfig(128, 64, 4, 2, use_tma=True)
    planned, launched = [], []

    def plan_prefill(**kw):
        planned.append(kw["config"])
        return SimpleNamespace(num_splits=1, kernel="triton", config=kw["config"])

    monkeypatch.setattr(
        bk.ops,
        "prefix_prefill",
        SimpleNamespace(
            layer_config=lambda layer, device, max_query_len: picked,
            plan_prefill=plan_prefill,
            PrefillLayer=SimpleNamespace(of=lambda **kw: None),
            AttentionInputs=lambda **kw: kw,
            split_workspace_bound=lambda **kw: 1,
            launch_prefix_prefill=lambda plan, inputs: launched.append(plan),
        ),
        raising=False,
    )
    monkeypatch.setattr(
        bk.ops, "hardware", SimpleNamespace(num_sms=lambda d: 132), raising=False
    )
    shape = bk.Shape("prefill", "m", 1, 16, 16, 2, 1, 96, 64)
    inp = SimpleNamespace(
        query=torch.zeros(16, 2, 96),
        kv_cache=torch.zeros(1, 2, 1, 64, 96),
        block_tables=[None],
        query_start_loc=None,
        seq_lens=None,
        softmax_scale=0.1,
        k_scale=None,
        v_scale=None,
    )
    runner = bk.caller_ours(shape, inp, prefill_config_fields={"split_head": True})
    runner.run(0)
    runner.run(0)
    assert planned == [dataclasses.replace(picked, split_head=True)]
    assert len(launched) == 2  # two timed calls of one plan
    assert "split_head=True" in runner.note
    bk.caller_ours(shape, inp).run(0)
    assert planned[-1] is None


def test_ours_decode_forced_splits_and_config_fields(monkeypatch):
    """--decode-num-splits launches every decode with that split count (and a
    workspace for it) instead of choose_decode_splits' choice; without it the rule
    decides. --decode-config replaces fields of the config the launch would pick
    for its split flag; without it the launch picks its own (config=None). The
    note says which."""
    chosen, launched, configs, picks = [], [], [], []
    picked = dc.DecodeConfig(64, 4, 2)

    def pick(inputs, num_splits):
        picks.append(num_splits > 1)
        return picked

    def launch(**kw):
        launched.append(kw["num_splits"])
        configs.append(kw["config"])

    def choose(**kw):
        chosen.append(kw)
        return 2

    shape, inp = _fake_decode(
        monkeypatch,
        32,
        choose_decode_splits=choose,
        paged_decode_attention=launch,
        config_for=pick,
    )
    forced = bk.caller_ours(shape, inp, decode_num_splits=4)
    forced.run(0)
    assert chosen == [] and launched == [4]
    assert forced.note == "splits=4 (forced)"
    auto = bk.caller_ours(shape, inp)
    auto.run(0)
    assert len(chosen) == 1 and launched == [4, 2]
    assert auto.note == "splits=2 (auto)"
    assert configs == [None, None] and picks == []
    fields = {"early_convert": True}
    changed = bk.caller_ours(shape, inp, decode_config_fields=fields)
    changed.run(0)
    assert picks == [True]  # two splits: the split key's config
    assert configs[-1] == dc.DecodeConfig(64, 4, 2, early_convert=True)
    assert changed.note.endswith("early_convert=True)")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--decode-num-splits", "0"], "must be at least 1"),
        (["--decode-num-splits", "4", "--decode-max-splits", "8"], "would do nothing"),
        (["--decode-num-splits", "4", "--decode-programs-per-sm", "3"], "per-sm"),
        (
            ["--decode-num-splits", "4", "--decode-wave-rule", "max_splits=64"],
            "--decode-wave-rule",
        ),  # fmt: skip
    ],
)
def test_forced_decode_splits_refuse_options_they_override(extra, message):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/kernels/bench_kernels.py"),
         "--callers", "ours", *extra],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr


def test_error_statistics_over_the_checked_rows():
    out = torch.zeros(4, 2, dtype=torch.bfloat16)
    checked = [
        (slice(0, 2), torch.tensor([[3.0, -4.0], [0.0, 0.0]])),
        (slice(2, 4), torch.zeros(2, 2)),
    ]
    assert bk.max_abs_err(out, checked) == 4.0
    assert bk.rms_err(out, checked) == pytest.approx(math.sqrt(25 / 8))
    out[3, 0] = float("nan")
    assert bk.max_abs_err(out, checked) == math.inf
