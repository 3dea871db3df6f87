# SPDX-License-Identifier: Apache-2.0
"""TRITON_ATTN backend inside real vLLM 0.26.0 code (one subprocess, see conftest).

Each test reports one check of ``site_checks.py``:

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

import importlib.util
from pathlib import Path

import pytest


def _check_names() -> list[str]:
    path = Path(__file__).with_name("site_checks.py")
    spec = importlib.util.spec_from_file_location("_backend_site_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib imports only; vLLM is not imported
    return list(module.CHECKS)


@pytest.mark.parametrize("name", _check_names())
def test_backend(site_results, name):
    result = site_results[name]
    assert result["ok"], f"check {name} failed:\n{result['detail']}"
    print(result["detail"])  # shown with pytest -rP
