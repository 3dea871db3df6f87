"""benchmarks/kernels/bench_kernels.py's decode retune, with the GPU faked."""

from types import SimpleNamespace

import torch

from benchmarks.kernels import bench_kernels as bk
from vllm.attention.ops.tuning import decode_configs as dc
from vllm.attention.ops.tuning import tables


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
        def __init__(self):
            self.config = bk.OVERRIDE_DECODE_CONFIG
            self.output = self.config

        def run(self, i):
            tried.append(self.config)

    def time_us(runner, num_sets, on_gpu):
        speed = {fast_but_wrong: 1.0, best_right: 2.0}
        return speed.get(runner.config, 10.0), "fake"

    _fake_gpu(
        monkeypatch,
        request,
        runner=lambda s, inp: Runner(),
        wrong=fast_but_wrong,
        time_us=time_us,
    )
    shapes = [
        bk.Shape("decode", "m", 64, 1, 8192, 32, 8, 128, 64, kv_dtype=kv)
        for kv in ("float8_e4m3fn", "bfloat16")
    ]
    written = []
    table = bk.retune_decode(
        shapes, SimpleNamespace(), lambda t: written.append(len(t["configs"]))
    )
    assert written == [1, 2]  # after each key: a cut-short run keeps its keys
    chosen = {e["kv_dtype"]: dc.DecodeConfig(**e["config"]) for e in table["configs"]}
    assert chosen["fp8"] == best_right
    # All tie at 10: the config the key had before (here the heuristic's) stays.
    before = dc.get_decode_config(
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
    """With --retune-finalists K every config is timed on the key's heaviest point
    only; the K fastest correct ones and the key's current config are then timed on
    every point, and the winner is the fastest over all points."""
    screen_best = dc.DecodeConfig(32, 4, 2)  # fastest on the big point, slow overall
    overall_best = dc.DecodeConfig(128, 8, 3)  # second on the big point
    wrong = dc.DecodeConfig(128, 2, 1)  # fastest of all on the big point, but wrong
    calls = []  # (config, point batch)

    class Runner:
        def __init__(self, s):
            self.config, self.batch = bk.OVERRIDE_DECODE_CONFIG, s.batch
            self.output = self.config

        def run(self, i):
            calls.append((self.config, self.batch))

    def time_us(runner, num_sets, on_gpu):
        big = {wrong: 0.5, screen_best: 1.0, overall_best: 2.0}
        small = {screen_best: 50.0, overall_best: 3.0}
        table = big if runner.batch == 64 else small
        return table.get(runner.config, 10.0), "fake"

    _fake_gpu(
        monkeypatch,
        request,
        runner=lambda s, inp: Runner(s),
        wrong=wrong,
        time_us=time_us,
    )
    # One bf16 key, three points; the batch-64 point moves the most bytes.
    shapes = [
        bk.Shape("decode", "m", batch, 1, 8192, 32, 8, 128, 64) for batch in (4, 64, 16)
    ]
    table = bk.retune_decode(shapes, SimpleNamespace(retune_finalists=2))
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
