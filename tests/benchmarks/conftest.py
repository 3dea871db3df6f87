"""Shared fixtures of the benchmark-harness tests (CPU only, fast).

The harnesses run against ``fake_site/vllm``, a stand-in whose ``serve`` answers
/health, whose ``bench serve`` writes a result file and whose ``LLM`` generates
deterministic tokens, so process handling, resume and result files are tested here and
only the real measurements need the GPU host.
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_SITE = Path(__file__).resolve().parent / "fake_site"
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


@pytest.fixture
def fake_sites(monkeypatch):
    """Both installs point at the fake vLLM."""
    monkeypatch.setenv("BENCH_SITE_STOCK", str(FAKE_SITE))
    monkeypatch.setenv("BENCH_SITE_FORK", str(FAKE_SITE))
    monkeypatch.setenv("BENCH_COMMIT", "testcommit")
    for var in (
        "FAKE_VLLM_WRONG",
        "FAKE_VLLM_SERVE_FAIL",
        "FAKE_VLLM_SOAK_ERROR_EVERY",
    ):
        monkeypatch.delenv(var, raising=False)
    return FAKE_SITE


@pytest.fixture(scope="session")
def model_dir_8b(tmp_path_factory):
    from benchmarks.models import make_model_dir

    return make_model_dir("llama-3.1-8b", tmp_path_factory.mktemp("m") / "llama-3.1-8b")
