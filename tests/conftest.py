"""Fixtures shared by every test directory.

* `TRITON_INTERPRET=1` (unless set): kernels run in Triton's interpreter on the CPU.
* `target`: each supported vLLM release (`fork_build.pins.SUPPORTED`); every test
  that uses it, or a fixture below, runs once per release.
* `upstream_wheel` / `stock_vllm_site`: that release's pinned wheel, and its
  `*.py` files plus dist-info (no compiled extensions), unpatched.
* `patched_vllm_site`: the same files patched in place with the fork by the same
  code as `python setup.py patch`. Use it in a subprocess with
  `PYTHONPATH=<that dir>` (tests/site_runner.py); never put it on the pytest
  process's `sys.path` (kernel tests import `vllm.attention.ops.*` from the
  checkout, where the repository's `vllm/` is a namespace package).

The vLLM releases' Python code runs on the test environment's torch (the default
release's, 2.14.0) for every release: these tests import vLLM's Python modules on
the CPU and never load its compiled kernels.
"""

import os
import sys
import zipfile
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fork_build import BuildError, pins, site, upstream  # noqa: E402


def extract_python_site(wheel: Path, release: pins.Upstream, out: Path) -> Path:
    """Stock vLLM's `*.py` files and dist-info from `wheel` into `out`."""
    dist_info = f"{pins.NAME}-{release.version}.dist-info/"
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n for n in zf.namelist() if n.endswith(".py") or n.startswith(dist_info)
        ]
        zf.extractall(out, names)
    return out


@pytest.fixture(scope="session", params=list(pins.SUPPORTED), ids="vllm-{}".format)
def target(request) -> pins.Upstream:
    """A supported vLLM release."""
    return pins.SUPPORTED[request.param]


@pytest.fixture(scope="session")
def upstream_wheel(target) -> Path:
    """The release's pinned upstream wheel (cache, local path or PyPI; verified)."""
    try:
        return upstream.fetch("wheel", target)
    except BuildError as e:
        pytest.fail(f"the pinned vLLM {target.version} wheel is needed: {e}")


@pytest.fixture(scope="session")
def stock_vllm_site(target, upstream_wheel, tmp_path_factory) -> Path:
    """The release's stock Python files, unpatched (read-only for tests)."""
    out = tmp_path_factory.mktemp(f"stock_site_{target.version}")
    return extract_python_site(upstream_wheel, target, out)


@pytest.fixture(scope="session")
def patched_vllm_site(target, upstream_wheel, tmp_path_factory) -> Path:
    """The release's Python files patched with the fork (see module docstring)."""
    out = tmp_path_factory.mktemp(f"fork_site_{target.version}")
    extract_python_site(upstream_wheel, target, out)
    site.patch_site(out)
    return out
