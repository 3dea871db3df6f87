"""benchmarks/kernels/bench_kernels.py's decode retune, with the GPU faked."""

from types import SimpleNamespace

import torch

from benchmarks.kernels import bench_kernels as bk
from vllm.attention.ops.tuning import decode_configs as dc
from vllm.attention.ops.tuning import tables


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
    monkeypatch.setattr(bk, "caller_ours", lambda s, inp: Runner())
    monkeypatch.setattr(
        bk, "max_abs_err", lambda out, ref: 1.0 if out == fast_but_wrong else 0.0
    )
    monkeypatch.setattr(bk, "time_us", time_us)
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
