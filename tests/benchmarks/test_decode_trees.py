"""decode_trees.py on the CPU (interpreter): each tree's own decode kernel and split
choice run in a process of their own, and the record names them per tree."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kernels" / "decode_trees.py"


def _run(*args):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO,
    )  # fmt: skip


def test_two_trees_each_timed_with_its_own_split_choice(tmp_path):
    from vllm.attention.ops.triton_paged_decode_attention_2d import (
        choose_decode_splits,
    )

    out = tmp_path / "ab.json"
    res = _run("--interpret", "--tree", f"a={REPO}", "--tree", f"b={REPO}",
               "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(out.read_text())
    assert [r["tree"] for r in rec["runs"]] == ["a", "b"]
    want = choose_decode_splits(num_seqs=2, num_kv_heads=8, num_sms=132)
    assert rec["summary"][0]["splits"] == {"a": want, "b": want}


def test_a_tree_without_the_kernel_fails_loudly(tmp_path):
    res = _run("--interpret", "--tree", f"empty={tmp_path}")
    assert res.returncode != 0
    assert "tree empty" in res.stderr


def test_bad_point_is_refused():
    res = _run("--points", "4x64:16:int8")
    assert res.returncode != 0 and "bf16 or fp8" in res.stderr
