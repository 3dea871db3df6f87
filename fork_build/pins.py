"""The one place that pins the upstream vLLM releases this fork is built on.

Everything else (the wheel build, the in-place patcher, the PR patch and the source
tree) takes an `Upstream` from here: the release and the sha256 of its two PyPI
files. To support another vLLM release, add it to `SUPPORTED`, give the anchored
edits of `envs_patch/` that differ a `versions` list, and run the packaging tests:
each anchor that moved fails naming the version, the file and the anchor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fork_build import BuildError

NAME = "vllm"
# PEP 440 local version of the fork: upstream version + our release counter. Bump
# the counter for every release of the fork on the same upstream base.
FORK_LOCAL = "tritonattn.1"
# Which release `pip install .` and the setup.py commands build when not told.
VERSION_ENV = "TRITONATTN_VLLM_VERSION"


@dataclass(frozen=True)
class Upstream:
    """One supported vLLM release: its PyPI wheel and sdist, with their sha256."""

    version: str
    wheel: str
    wheel_sha256: str
    sdist: str
    sdist_sha256: str
    # Why `pip install` cannot install this release from PyPI today (its own
    # requirements do not resolve there), or None. `pip install .` refuses such a
    # release with this reason; tests/packaging/test_repository.py checks that it
    # still holds, and that the default release has none.
    pypi_blocker: str | None = None

    @property
    def fork_version(self) -> str:
        return f"{self.version}+{FORK_LOCAL}"

    @property
    def sdist_root(self) -> str:
        """The top directory of the sdist."""
        return f"{NAME}-{self.version}"


SUPPORTED: dict[str, Upstream] = {
    u.version: u
    for u in (
        Upstream(
            version="0.34.0",
            wheel="vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
            wheel_sha256=(
                "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2"
            ),
            sdist="vllm-0.34.0.tar.gz",
            sdist_sha256=(
                "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
            ),
            pypi_blocker=(
                "vLLM 0.34.0 requires flashinfer-python==0.7.3, which PyPI does not "
                "have (it has 0.7.2.post1 and 0.7.4)"
            ),
        ),
        Upstream(
            version="0.33.0",
            wheel="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
            wheel_sha256=(
                "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
            ),
            sdist="vllm-0.33.0.tar.gz",
            sdist_sha256=(
                "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
            ),
        ),
    )
}
# The default target: the newest release that installs from PyPI (no
# `pypi_blocker`) and whose GPU checks (kernel tests, serving, greedy agreement
# with FLASH_ATTN, throughput) have passed on the tuned GPU.
DEFAULT_VERSION = "0.33.0"


def supported_text() -> str:
    return ", ".join(SUPPORTED)


# How each entry point is told the release, in its own words for its messages.
SETUP_PY_OPTION = "--vllm-version VERSION"
PIP_OPTION = "--config-settings vllm-version=VERSION"


def upstream(version: str | None = None, *, option: str = SETUP_PY_OPTION) -> Upstream:
    """The pins of `version`; None: `TRITONATTN_VLLM_VERSION`, else the default.

    `option` is how the caller's entry point chooses a release (`SETUP_PY_OPTION`,
    `PIP_OPTION`): an unsupported release is refused in those words.
    """
    from_env = not version and os.environ.get(VERSION_ENV)
    version = version or os.environ.get(VERSION_ENV) or DEFAULT_VERSION
    if version not in SUPPORTED:
        given, choose = (
            (f" ({VERSION_ENV}={version})", f"Set {VERSION_ENV} to one of them")
            if from_env
            else ("", f"Choose one with `{option}`")
        )
        raise BuildError(
            f"vLLM {version} is not supported by this fork{given}; supported "
            f"versions: {supported_text()} (default {DEFAULT_VERSION}). {choose}, "
            f"or leave it out for the default."
        )
    return SUPPORTED[version]
