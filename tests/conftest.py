"""Fixtures shared by every test directory.

* `TRITON_INTERPRET=1` (unless set): kernels run in Triton's interpreter on the CPU.
* `patched_vllm_site`: a directory holding stock vLLM 0.26.0's Python files (the
  `*.py` files and the dist-info of the pinned wheel, no compiled extensions)
  patched in place with the fork by the same code as `python setup.py patch`.
  Use it in a subprocess with `PYTHONPATH=<that dir>`; never put it on the pytest
  process's `sys.path` (kernel tests import `vllm.attention.ops.*` from the
  checkout, where the repository's `vllm/` is a namespace package).
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

DIST_INFO_PREFIX = f"vllm-{pins.UPSTREAM_VERSION}.dist-info/"


def extract_python_site(wheel: Path, target: Path) -> Path:
    """Stock vLLM's `*.py` files and dist-info from `wheel` into `target`."""
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n
            for n in zf.namelist()
            if n.endswith(".py") or n.startswith(DIST_INFO_PREFIX)
        ]
        zf.extractall(target, names)
    return target


@pytest.fixture(scope="session")
def upstream_wheel() -> Path:
    """The pinned upstream vLLM wheel (cache, local path or PyPI; verified)."""
    try:
        return upstream.fetch("wheel")
    except BuildError as e:
        pytest.fail(f"the pinned upstream vLLM wheel is needed: {e}")


@pytest.fixture(scope="session")
def stock_vllm_site(upstream_wheel, tmp_path_factory) -> Path:
    """Stock vLLM 0.26.0 Python files, unpatched (read-only for tests)."""
    return extract_python_site(upstream_wheel, tmp_path_factory.mktemp("stock_site"))


@pytest.fixture(scope="session")
def patched_vllm_site(upstream_wheel, tmp_path_factory) -> Path:
    """Stock vLLM 0.26.0 Python files patched with the fork (see module docstring)."""
    target = extract_python_site(upstream_wheel, tmp_path_factory.mktemp("fork_site"))
    site.patch_site(target)
    return target
