# SPDX-License-Identifier: Apache-2.0
"""The fork serves every layer stock vLLM serves, and names what serves it.

``selection_in_vllm.py`` asks each release's own selector, once in the stock
site and once in the patched one, which backend serves each layer of its grid
(head sizes, dtypes, KV-cache dtypes, attention types, features, block sizes and
a few pairs) on each simulated platform (CUDA SM 8.0 / 8.9 / 9.0; MI300 without
AITER, with AITER installed, with AITER enabled; XPU), automatically and with
each Triton backend named. One test per platform compares the two, for every
(path, layer) that stock serves:

- stock's TRITON_ATTN or ROCM_ATTN: one of the fork's two Triton backends, the
  one the layer needs: TRITON_ATTN (our class, or its ROCM_ATTN alias) where our
  kernels take the layer (``kernel_refusals``, recorded in the fork's site),
  else stock's backend under its own name, TRITON_UNIFIED_ATTN; on XPU always
  TRITON_UNIFIED_ATTN (our kernels are built and tested for CUDA and ROCm);
- another backend X: X, except on ROCm's automatic choice. There ROCM_ATTN is
  the fork's backend, first in ROCm's list, and accepts every layer that our
  kernels or stock's Triton backend take, so it can win over an AITER backend
  (ROCM_AITER_FA, which reports "FLASH_ATTN", or ROCM_AITER_UNIFIED_ATTN) that
  stock picked after its own, narrower ROCM_ATTN refused the layer: the fork may
  give TRITON_ATTN (ours, e.g. attention sinks, head size 112, cross attention)
  or TRITON_UNIFIED_ATTN (e.g. head size 320) instead, again the one the layer
  needs;
- where stock refuses, the fork may refuse or serve.

The TRITON_UNIFIED_ATTN path exists only on the fork: named, it serves every
layer stock's TRITON_ATTN serves by name (CUDA, ROCm; XPU's selector refuses the
names it does not know). Each platform's grid must not be vacuous: some layer
runs on our kernels (CUDA, ROCm; none on XPU), some that stock ran on its Triton
backend is handed to TRITON_UNIFIED_ATTN, some is refused by both. ``pytest -rP``
shows the served backends counted per platform.
"""

from collections import Counter
from pathlib import Path

import pytest

from tests.backend.selection_in_vllm import (
    AUTO,
    KERNELS,
    KERNELS_TAKE,
    OURS_MARK,
    REFUSED,
)
from tests.site_runner import check_names, passed, run_checks

CHECKS = Path(__file__).with_name("selection_in_vllm.py")
PLATFORMS = check_names(CHECKS)
# What stock's Triton backends report as their names.
STOCK_TRITON = {"TRITON_ATTN", "ROCM_ATTN"}
UNIFIED = "TRITON_UNIFIED_ATTN"


@pytest.fixture(scope="session")
def stock_selection(stock_vllm_site):
    """Every platform's sweep in the stock release (one vLLM import)."""
    return run_checks(stock_vllm_site, CHECKS)


@pytest.fixture(scope="session")
def fork_selection(patched_vllm_site):
    """Every platform's sweep in the patched release (one vLLM import)."""
    return run_checks(patched_vllm_site, CHECKS)


def _refused(result: str) -> bool:
    return result.startswith(REFUSED)


def _name(result: str) -> str:
    """The served class's ``get_name()``."""
    return result.split(" ", 1)[0]


def _ours(result: str) -> bool:
    """The fork's TRITON_ATTN (its class or the ROCM_ATTN alias)."""
    return result.endswith(OURS_MARK) and _name(result) == "TRITON_ATTN"


def _broken(
    platform: str, path: str, stock: str, fork: str, kernels_take: bool
) -> str | None:
    """Why the fork's result ``fork`` breaks the promise for stock's ``stock``
    (None: it keeps it); ``kernels_take``: our kernels take the layer."""
    if _refused(stock):
        return None
    if _refused(fork):
        return "stock serves this layer, the fork refuses it"
    if stock not in STOCK_TRITON:
        if fork == stock:
            return None
        if not (platform.startswith("rocm") and path == AUTO):
            return f"stock's {stock} must serve it"
        # ROCm's automatic choice: the fork's ROCM_ATTN, first in the list, may
        # take it; then one of the fork's Triton backends serves it (below).
        if not (_ours(fork) or fork == UNIFIED):
            return f"stock's {stock} or the fork's ROCM_ATTN must serve it"
    if platform.startswith("xpu"):
        return None if fork == UNIFIED else f"on XPU {UNIFIED} must serve it"
    if kernels_take:
        return None if _ours(fork) else "our kernels take it, they must serve it"
    return None if fork == UNIFIED else f"our kernels do not, {UNIFIED} must serve it"


def _counts(results: dict[str, str]) -> str:
    counts = Counter("refused" if _refused(r) else r for r in results.values())
    return ", ".join(f"{label} {n}" for label, n in counts.most_common())


@pytest.mark.parametrize("platform", PLATFORMS)
def test_fork_serves_what_stock_serves(stock_selection, fork_selection, platform):
    stock = passed(stock_selection, platform)
    fork = passed(fork_selection, platform)
    missing = sorted(set(stock) - set(fork))
    assert not missing, f"paths and layers the fork's sweep lacks: {missing}"
    layers = sorted({key.split("|", 1)[1] for key in stock})
    named_unified = {layer: fork[f"{UNIFIED}|{layer}"] for layer in layers}
    kernels_take = [
        layer for layer in layers if fork[f"{KERNELS}|{layer}"] == KERNELS_TAKE
    ]
    print(
        f"{platform}: {len(layers)} layers, {len(stock)} (path, layer) in stock; "
        f"our kernels take {len(kernels_take)} layers\n"
        f"  stock: {_counts(stock)}\n"
        f"  fork:  {_counts({k: fork[k] for k in stock})}\n"
        f"  fork, {UNIFIED} named: {_counts(named_unified)}"
    )

    failures = []
    for key, stock_result in stock.items():
        path, layer = key.split("|", 1)
        take = fork[f"{KERNELS}|{layer}"] == KERNELS_TAKE
        why = _broken(platform, path, stock_result, fork[key], take)
        if why:
            failures.append(
                f"{path} / {layer}: stock {stock_result!r}, fork {fork[key]!r} ({why})"
            )
    # Named, stock's backend under its own name serves what stock's TRITON_ATTN
    # served by name (XPU's selector refuses names it does not know).
    if not platform.startswith("xpu"):
        for layer in layers:
            stock_result = stock[f"TRITON_ATTN|{layer}"]
            result = fork[f"{UNIFIED}|{layer}"]
            if not _refused(stock_result) and result != UNIFIED:
                failures.append(
                    f"{UNIFIED} / {layer}: stock TRITON_ATTN {stock_result!r}, fork "
                    f"{result!r} ({UNIFIED} named must serve it)"
                )
    assert not failures, f"{platform}: {len(failures)} broken:\n" + "\n".join(failures)

    # Not vacuous: each kind of outcome occurs on this platform.
    served_by_stock = [k for k, r in stock.items() if not _refused(r)]
    handed_over = [
        k for k in served_by_stock if stock[k] in STOCK_TRITON and fork[k] == UNIFIED
    ]
    refused_by_both = [k for k in stock if _refused(stock[k]) and _refused(fork[k])]
    assert handed_over, f"{platform}: no layer handed to {UNIFIED}"
    assert refused_by_both, f"{platform}: no layer refused by both"
    ours = [k for k in stock if _ours(fork[k])]
    if platform.startswith("xpu"):
        assert not ours, f"{platform}: our kernels must not run on XPU: {ours}"
    else:
        assert ours, f"{platform}: no layer runs on our kernels"
