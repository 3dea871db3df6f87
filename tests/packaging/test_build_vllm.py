"""The fork's edits inside real vLLM code: env getter, AttentionConfig default
(with 0.33.0's MiniMax M3 MSA aliases), CLI precedence, registry, version,
`vllm serve --help`; for every supported release.

The checks (edits_in_vllm.py) run through tests/site_runner.py in one subprocess
over the `patched_vllm_site` fixture, so vLLM never enters the pytest process.
"""

from pathlib import Path

import pytest

from tests.site_runner import passed, run_checks

CHECKS = Path(__file__).with_name("edits_in_vllm.py")


def run(site: Path, *names: str) -> dict[str, object]:
    results = run_checks(site, CHECKS, *names)
    return {name: passed(results, name) for name in names}


class SiteResults:
    """The checks' results by name; a failed check fails only the tests that read
    it."""

    def __init__(self, results: dict[str, dict]):
        self.results = results

    def __getitem__(self, name: str):
        return passed(self.results, name)


ALL_BUT_HELP = (
    "version",
    "env_getter",
    "attention_config",
    "msa_alias",
    "registry",
    "engine_args_precedence",
    "cli_version",
)


# The first supported release whose AttentionConfig has the MiniMax M3 MSA aliases.
MSA_ALIAS_SINCE = (0, 33, 0)


@pytest.fixture(scope="session")
def site_results(patched_vllm_site):
    return SiteResults(run_checks(patched_vllm_site, CHECKS, *ALL_BUT_HELP))


def test_version(site_results, target):
    assert site_results["version"] == {
        "module": target.fork_version,
        "metadata": target.fork_version,
    }


def test_vllm_version_command(site_results, target):
    assert site_results["cli_version"] == target.fork_version


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


def test_msa_alias_from_env_as_from_a_flag(site_results, target):
    """0.33.0's AttentionConfig.__post_init__ maps the CUTLASS_MSA / TRITON_MSA
    aliases to `minimax_m3_msa_decode_backend` and leaves `backend` to automatic
    selection; VLLM_ATTENTION_BACKEND must go through the same mapping."""
    result = site_results["msa_alias"]
    release = tuple(int(p) for p in target.version.split("."))
    assert (result is None) is (release < MSA_ALIAS_SINCE)
    if result is None:
        pytest.skip(f"vLLM {target.version} has no CUTLASS_MSA / TRITON_MSA alias")
    # The release's own default decode kernel (it changed between releases).
    auto = result["stock_default"]
    assert auto["backend"] is None and auto["msa_decode"] in ("cutlass", "triton")
    assert result["fork_default"] == auto
    for alias, kernel in (("CUTLASS_MSA", "cutlass"), ("TRITON_MSA", "triton")):
        expected = {"backend": None, "msa_decode": kernel}
        assert result["stock"][alias] == expected, alias
        assert result["explicit"][alias] == expected, alias
        assert result["env"][alias] == expected, alias
    # An explicit backend still wins over the environment's alias.
    assert result["explicit_wins"] == {**auto, "backend": "FLASH_ATTN"}


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
