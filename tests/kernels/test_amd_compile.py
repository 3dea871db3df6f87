# SPDX-License-Identifier: Apache-2.0
"""MI300 (gfx942) compile check of every kernel kind in the CPU suite: runs
``tests/kernels/amd_compile.py`` (docstring there) in a subprocess without
``TRITON_INTERPRET`` and requires a clean exit and a line for every kernel kind at
every head size, group and dtype pair. About 2 minutes on 2 CPU cores."""

import itertools
from pathlib import Path

import pytest
import triton

# What the module must build, stated here independently of it.
ATTENTION_KINDS = ("prefill", "prefill-split", "decode", "decode-split",
                   "prefill-cross")  # fmt: skip
# Encoder self-attention reads the step's K/V, in the query's dtype.
ENCODER_DTYPE_PAIRS = ("bf16/bf16", "fp16/fp16")
MERGE_KINDS = ("prefill-merge", "decode-merge")
HEAD_SIZES = ("d64", "d100", "d128", "d256")
GROUPS = ("g1", "g4", "g8")
DTYPE_PAIRS = ("bf16/bf16", "bf16/fp8e4m3fnuz", "fp16/fp16", "fp16/fp8e4m3fnuz")


def test_compiles_every_kernel_for_mi300():
    if "amd" not in triton.backends.backends:
        pytest.skip(
            "this Triton has no AMD backend (triton.backends.backends: "
            f"{sorted(triton.backends.backends)})"
        )
    from tests.kernels.hopper_compile import run_compile_module

    result = run_compile_module(Path(__file__).with_name("amd_compile.py"), 900)
    report = result.stdout + result.stderr[-4000:]
    assert result.returncode == 0, report
    built = {
        tuple(line.split()[1:5])
        for line in result.stdout.splitlines()
        if line.startswith("ok ")
    }
    expected = set(itertools.product(ATTENTION_KINDS, HEAD_SIZES, GROUPS, DTYPE_PAIRS))
    expected |= set(
        itertools.product(
            ("prefill-encoder", "prefill-encoder-window"),
            HEAD_SIZES,
            GROUPS,
            ENCODER_DTYPE_PAIRS,
        )
    )
    expected |= {
        (kind, head, group, f"{q}/-")
        for kind, head, group, q in itertools.product(
            MERGE_KINDS, HEAD_SIZES, GROUPS, ("bf16", "fp16")
        )
    }
    expected |= {
        ("cache-write", head, "g-", dtypes)
        for head, dtypes in itertools.product(HEAD_SIZES, DTYPE_PAIRS)
    }
    missing = sorted(expected - built)
    assert not missing, f"no ok line for {missing}\n{report}"
    assert "ok  amd_compile:" in result.stdout, report
