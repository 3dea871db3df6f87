"""The fork's edits inside real vLLM code: env getter, AttentionConfig default,
CLI precedence, registry, version, `vllm serve --help`.

The checks (edits_in_vllm.py) run through tests/site_runner.py in one subprocess
over the `patched_vllm_site` fixture, so vLLM never enters the pytest process.
"""

from pathlib import Path

import pytest

from fork_build import pins
from tests.site_runner import passed, run_checks

CHECKS = Path(__file__).with_name("edits_in_vllm.py")


def run(site: Path, *names: str) -> dict[str, object]:
    results = run_checks(site, CHECKS, *names)
    return {name: passed(results, name) for name in names}


ALL_BUT_HELP = (
    "version",
    "env_getter",
    "attention_config",
    "registry",
    "engine_args_precedence",
    "cli_version",
)


@pytest.fixture(scope="session")
def site_results(patched_vllm_site):
    return run(patched_vllm_site, *ALL_BUT_HELP)


def test_version(site_results):
    assert site_results["version"] == {
        "module": pins.FORK_VERSION,
        "metadata": pins.FORK_VERSION,
    }


def test_vllm_version_command(site_results):
    assert site_results["cli_version"] == pins.FORK_VERSION


def test_env_getter(site_results):
    assert site_results["env_getter"] == {
        "None": None,
        "''": None,
        "'  '": None,
        "' triton_attn '": "triton_attn",
    }


def test_attention_config_env_default(site_results):
    result = site_results["attention_config"]
    assert result["unset"] is None
    assert result["env"] == result["env_lower"] == "TRITON_ATTN"
    assert result["env_auto"] is None
    assert result["explicit_wins"] == "FLASH_ATTN"


@pytest.mark.parametrize("case", ["bad_env", "bad_explicit"])
def test_invalid_backend_lists_valid_names(site_results, case):
    message = site_results["attention_config"][case]
    assert "Unknown attention backend: 'NOPE_ATTN'" in message
    assert "Valid options are:" in message
    assert "TRITON_ATTN" in message and "FLASH_ATTN" in message
    if case == "bad_env":
        assert "VLLM_ATTENTION_BACKEND='NOPE_ATTN'" in message


def test_cli_flag_wins_over_env(site_results):
    assert site_results["engine_args_precedence"] == {
        "neither": None,
        "env_only": "TRITON_ATTN",
        "cli_only": "FLASH_ATTN",
        "both": "FLASH_ATTN",
        "both_cli_auto": None,
    }


def test_registry_resolves_to_our_backend(site_results):
    result = site_results["registry"]
    module = "vllm.v1.attention.backends.triton_attn"
    assert result["TRITON_ATTN"] == f"{module}.TritonAttentionBackend"
    assert result["ROCM_ATTN"] == f"{module}.RocmAttentionBackend"
    assert result["module_is_ours"] is True
    assert result["triton_class"] == f"{module}.TritonAttentionBackend"
    assert result["rocm_is_alias"] is True


def test_serve_help_documents_the_env_default(patched_vllm_site):
    text = run(patched_vllm_site, "serve_help")["serve_help"]
    text = " ".join(text.split())
    assert "--attention-backend ATTENTION_BACKEND" in text
    assert "`VLLM_ATTENTION_BACKEND` environment variable is used" in text
