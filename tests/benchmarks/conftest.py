"""Shared fixtures of the benchmark-script tests (CPU only, fast).

The scripts run against ``fake_site/vllm``, a stand-in whose ``serve`` answers
/health, whose ``bench sweep serve`` writes result files and whose
``LLM`` generates deterministic tokens, so process handling, resume and result files
are tested here and only the real measurements need a GPU.
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_SITE = Path(__file__).resolve().parent / "fake_site"
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


@pytest.fixture
def fake_site(monkeypatch):
    """The fake vLLM's site directory, with a clean environment around it."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for var in (
        "FAKE_VLLM_WRONG",
        "FAKE_VLLM_FAIL",
        "FAKE_VLLM_SERVE_FAIL",
        "FAKE_VLLM_SOAK_ERROR_EVERY",
        "FAKE_VLLM_LATE_BUILDS",
        "FAKE_VLLM_LOG",
    ):
        monkeypatch.delenv(var, raising=False)
    return FAKE_SITE


@pytest.fixture
def site_args(fake_site):
    """Command-line arguments that point both installs at the fake vLLM."""
    return ["--site", f"stock={fake_site}", "--site", f"fork={fake_site}"]


@pytest.fixture(scope="session")
def model_dir_8b(tmp_path_factory):
    from benchmarks.models import make_model_dir

    return make_model_dir("llama-3.1-8b", tmp_path_factory.mktemp("m") / "llama-3.1-8b")
