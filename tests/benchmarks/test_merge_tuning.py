"""benchmarks/kernels/merge_tuning.py: recorded sweep winners into a tuning table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kernels import merge_tuning
from vllm.attention.ops.tuning.decode_configs import DECODE_TABLE, DecodeConfig
from vllm.attention.ops.tuning.prefill_configs import PREFILL_TABLE, PrefillConfig

REPO = Path(__file__).resolve().parents[2]
KEY = {
    "head_size": 128,
    "q_dtype": "bfloat16",
    "kv_dtype": "bfloat16",
    "group": 4,
    "block_size": 64,
}


def _prefill_record(path, bucket, config, commit="fake-commit"):
    record = {
        "key": {**KEY, "max_query_len": bucket},
        "best": config,
        "best_timing": {"ms": 1.0},
    }
    path.write_text(
        json.dumps({"gpu": "Fake GPU", "commit": commit, "records": [record]})
    )
    return path


def _parsed(table, path):
    data = json.loads(path.read_text())
    return {
        table.key(**{k: e[k] for k in table.key_fields}): table.config_cls(
            **e["config"]
        )
        for e in data["configs"]
    }, data["provenance"]


def test_prefill_records_replace_and_add_sorted_with_provenance(tmp_path):
    old = PrefillConfig(64, 64, 4, 2, use_tma=True)
    table = tmp_path / "prefix_prefill_Fake_GPU.json"
    entries = [
        PREFILL_TABLE.entry(PREFILL_TABLE.key(**KEY, max_query_len=b), old)
        for b in (16384, 1024)
    ]
    table.write_text(json.dumps({"provenance": {"commit": "old"}, "configs": entries}))
    new = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 2}
    first = _prefill_record(tmp_path / "a.json", 16384, {**new, "use_tma": True})
    later = _prefill_record(
        tmp_path / "b.json", 16384, {**new, "use_tma": True, "num_stages": 3}, "def"
    )
    added = _prefill_record(tmp_path / "c.json", 64, new)
    merge_tuning.merge([first, later, added], table)

    got, provenance = _parsed(PREFILL_TABLE, table)
    key = PREFILL_TABLE.key
    # The later record wins its key; untouched keys keep their entry; new keys added.
    assert got[key(**KEY, max_query_len=16384)] == PrefillConfig(
        128, 64, 4, 3, use_tma=True
    )
    assert got[key(**KEY, max_query_len=1024)] == old
    assert got[key(**KEY, max_query_len=64)] == PrefillConfig(128, 64, 4, 2)
    buckets = [e["max_query_len"] for e in json.loads(table.read_text())["configs"]]
    assert buckets == [64, 1024, 16384]  # sorted by key, as the tuner writes
    # Provenance: every merged record listed once, the latest record's commit.
    assert provenance["records"] == [str(first), str(later), str(added)]
    assert provenance["commit"] == "fake-commit" and provenance["gpu"] == "Fake GPU"


def test_prefill_records_of_retired_fields(tmp_path):
    # Records from before the register cap, lazy rescaling and fp16 exponentials
    # were removed name them: at the value that ran without them they merge as the
    # config without the field; a winner that set one is refused.
    table = tmp_path / "prefix_prefill_Fake_GPU.json"
    tile = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 2}
    retired = {"maxnreg": 0, "lazy_rescale": False, "fast_exp": False}
    merge_tuning.merge(
        [_prefill_record(tmp_path / "a.json", 1024, {**tile, **retired})], table
    )
    got, _ = _parsed(PREFILL_TABLE, table)
    assert got == {PREFILL_TABLE.key(**KEY, max_query_len=1024): PrefillConfig(**tile)}
    for name, value in (("maxnreg", 168), ("lazy_rescale", True), ("fast_exp", True)):
        capped = _prefill_record(tmp_path / "b.json", 1024, {**tile, name: value})
        with pytest.raises(SystemExit, match="retired field"):
            merge_tuning.merge([capped], table)


def test_decode_retune_output_merges_its_winners(tmp_path):
    key = DECODE_TABLE.key(**{**KEY, "kv_dtype": "fp8"}, split=True)
    win = DecodeConfig(128, 2, 2)
    retune = tmp_path / "paged_decode_Fake_GPU.json"
    entry = DECODE_TABLE.entry(key, win)
    retune.write_text(
        json.dumps(
            {
                "provenance": {"gpu": "Fake GPU", "commit": "fake-commit"},
                "configs": [entry],
                "records": [{"entry": entry, "timings": []}],
            }
        )
    )
    table = tmp_path / "shipped.json"
    merge_tuning.merge([retune], table)
    got, provenance = _parsed(DECODE_TABLE, table)
    assert got == {key: win}
    assert provenance["records"] == [str(retune)]
    assert provenance["commit"] == "fake-commit"


def test_refuses_what_is_not_one_table(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"records": [{"x": 1}]}))
    with pytest.raises(SystemExit, match="not a tuning record"):
        merge_tuning.merge([odd], tmp_path / "t.json")
    decode = tmp_path / "d.json"
    entry = DECODE_TABLE.entry(
        DECODE_TABLE.key(**KEY, split=False), DecodeConfig(64, 4, 2)
    )
    decode.write_text(
        json.dumps(
            {
                "provenance": {"gpu": "Fake GPU"},
                "configs": [entry],
                "records": [{"entry": entry}],
            }
        )
    )
    full = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    prefill = _prefill_record(tmp_path / "p.json", 64, full)
    with pytest.raises(SystemExit, match="one table at a time"):
        merge_tuning.merge([decode, prefill], tmp_path / "t.json")


def test_command_line_writes_the_given_table(tmp_path):
    full = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}
    record = _prefill_record(tmp_path / "r.json", 256, full)
    table = tmp_path / "t.json"
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/kernels/merge_tuning.py")]
        + [str(record), "--table", str(table)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "(added)" in r.stdout and table.is_file()
