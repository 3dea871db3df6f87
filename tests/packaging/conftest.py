"""Fixtures of the build tests (the shared ones live in tests/conftest.py)."""

from pathlib import Path

import pytest

from fork_build import BuildError, upstream


@pytest.fixture(scope="session")
def upstream_sdist(target) -> Path:
    """The release's pinned upstream sdist (cache, local path or PyPI; verified)."""
    try:
        return upstream.fetch("sdist", target)
    except BuildError as e:
        pytest.fail(f"the pinned vLLM {target.version} sdist is needed: {e}")
