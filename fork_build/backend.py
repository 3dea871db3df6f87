"""In-tree PEP 517 build backend: `pip install .` / `pip wheel .` build the fork.

The wheel is the pinned upstream vLLM wheel repackaged with the fork's changes
(`fork_build.wheel`). Config settings (`pip ... --config-settings KEY=VALUE`):

* `vllm-version=VERSION`: the vLLM release to build on (same as
  TRITONATTN_VLLM_VERSION; default `fork_build.pins.DEFAULT_VERSION`);
* `upstream-wheel=PATH`: use this local copy of that release's upstream wheel
  (same as TRITONATTN_UPSTREAM_WHEEL); it is verified by sha256 like a download.
"""

from __future__ import annotations

import functools
import tarfile
import tempfile
from pathlib import Path

from fork_build import BuildError, pins, plan, upstream, wheel


def _hook(func):
    """A hook whose refusal is its message alone. pip shows a failed hook's output
    inside its own report; a traceback there would bury the reason under twenty
    lines of backend internals, so a `BuildError` ends the hook's process with
    ``error: <message>`` on stderr and exit code 1 (SystemExit), nothing else."""

    @functools.wraps(func)
    def hook(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except BuildError as e:
            raise SystemExit(f"error: {e}") from None

    return hook


def _target(config_settings) -> pins.Upstream:
    version = (config_settings or {}).get("vllm-version")
    return pins.upstream(version, option=pins.PIP_OPTION)


def _installable_target(config_settings) -> pins.Upstream:
    """The release of a wheel pip is about to install: one whose requirements
    resolve from PyPI (`pins.Upstream.pypi_blocker`)."""
    target = _target(config_settings)
    if target.pypi_blocker:
        from_env = not (config_settings or {}).get("vllm-version")
        default = f" (with {pins.VERSION_ENV} unset)" if from_env else ""
        raise BuildError(
            f"{target.pypi_blocker}, so pip cannot install the fork's wheel of "
            f"it. Instead:\n"
            f"- `pip install .`{default} installs the default, vLLM "
            f"{pins.DEFAULT_VERSION};\n"
            f"- `python setup.py patch --site-packages DIR` patches a vLLM "
            f"{target.version} you already have, in place;\n"
            f"- `{pins.VERSION_ENV}={target.version} python setup.py wheel` builds "
            f"its wheel for an index that has those requirements (docs/install.md)."
        )
    return target


def _upstream_wheel(config_settings) -> Path:
    settings = config_settings or {}
    return upstream.fetch(
        "wheel", _target(settings), settings.get("upstream-wheel"), pip=True
    )


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


@_hook
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    target = _installable_target(config_settings)
    return wheel.write_metadata_dir(
        _upstream_wheel(config_settings), Path(metadata_directory), target
    )


@_hook
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    target = _installable_target(config_settings)
    built = wheel.build_wheel(
        _upstream_wheel(config_settings), Path(wheel_directory), target
    )
    return built.name


# The fork's own sdist: the repository files the backend needs to build the wheel.
SDIST_PATHS = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "requirements-rocm.txt",
    "fork_build",
    "envs_patch",
    "vllm",
)


@_hook
def build_sdist(sdist_directory, config_settings=None):
    release = _target(config_settings)
    name = f"vllm-{release.fork_version}"
    target = Path(sdist_directory) / f"{name}.tar.gz"
    root = plan.REPO_ROOT
    pkg_info = (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {release.fork_version}\n"
        f"Summary: vLLM {release.version} with the TritonAttn attention "
        f"backend\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "PKG-INFO").write_text(pkg_info)
        with tarfile.open(target, "w:gz") as tar:
            tar.add(Path(tmp) / "PKG-INFO", f"{name}/PKG-INFO")
            for rel in SDIST_PATHS:
                tar.add(
                    root / rel,
                    f"{name}/{rel}",
                    filter=lambda t: None if "__pycache__" in t.name else t,
                )
    return target.name
