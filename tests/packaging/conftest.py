"""Fixtures of the build tests (the shared ones live in tests/conftest.py)."""

from pathlib import Path

import pytest

from fork_build import BuildError, upstream


@pytest.fixture(scope="session")
def upstream_sdist() -> Path:
    """The pinned upstream vLLM sdist (cache, local path or PyPI; verified)."""
    try:
        return upstream.fetch("sdist")
    except BuildError as e:
        pytest.fail(f"the pinned upstream vLLM sdist is needed: {e}")
