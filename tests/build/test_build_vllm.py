"""The fork's edits inside real vLLM code: env getter, AttentionConfig default,
CLI precedence, registry, version, `vllm serve --help`.

The checks run in one subprocess per site (vllm_checks.py) with PYTHONPATH set to
the `patched_vllm_site` fixture, so vLLM never enters the pytest process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fork_build import pins

CHECKS = Path(__file__).with_name("vllm_checks.py")


def run_checks(site: Path, *names: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(PYTHONPATH=str(site), VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run(
        [sys.executable, str(CHECKS), *names],
        env=env,
        cwd=site,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CHECK "):
            result = json.loads(line[len("CHECK ") :])
            assert result["ok"], f"check {result['name']} failed:\n{result['detail']}"
            results[result["name"]] = result["detail"]
    missing = set(names) - set(results)
    assert results and not missing, (
        f"no result for {sorted(missing) or 'any check'} (exit {proc.returncode})\n"
        f"{proc.stderr[-4000:]}"
    )
    return results


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
    return run_checks(patched_vllm_site, *ALL_BUT_HELP)


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
    text = run_checks(patched_vllm_site, "serve_help")["serve_help"]
    text = " ".join(text.split())
    assert "--attention-backend ATTENTION_BACKEND" in text
    assert "`VLLM_ATTENTION_BACKEND` environment variable is used" in text
