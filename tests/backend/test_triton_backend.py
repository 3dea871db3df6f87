# SPDX-License-Identifier: Apache-2.0
"""TRITON_ATTN backend inside real vLLM code (backend_in_vllm.py, one subprocess).

Each test reports one check of ``backend_in_vllm.py``:

- registry: TRITON_ATTN resolves to this repository's class; every name stock
  modules import from triton_attn.py exists.
- rocm_alias: ROCM_ATTN resolves to the alias, which warns once and maps back to
  the TRITON_ATTN registry entry.
- capabilities / layout / refuses_stock_subclasses: what vLLM's selector accepts
  and refuses (with reasons that say what to do), the KV-cache layout, and
  TRITON_ATTN_DIFFKV refused at startup.
- builder: decode/prefill split, split-KV plan and workspace on fake
  CommonAttentionMetadata (decode-only, mixed, prefill-only, CUDA-graph padded).
- forward_*: do_kv_cache_update + forward on the CPU (TRITON_INTERPRET=1, tiny
  shapes) against ref_paged_attention on a cache filled by plain indexing.
"""

from pathlib import Path

import pytest

from tests.site_runner import check_names, passed, run_checks

CHECKS = Path(__file__).with_name("backend_in_vllm.py")


@pytest.fixture(scope="session")
def site_results(patched_vllm_site):
    """All checks, run once per session (one vLLM import)."""
    return run_checks(patched_vllm_site, CHECKS)


@pytest.mark.parametrize("name", check_names(CHECKS))
def test_backend(site_results, name):
    print(passed(site_results, name))  # shown with pytest -rP
