"""Locating the pinned upstream files: local path, cache, download, hash checks."""

import subprocess
import sys
from pathlib import Path

import pytest

from fork_build import BuildError, pins, upstream

REPO = Path(__file__).resolve().parents[2]
CLOSED_PORT_INDEX = "http://127.0.0.1:9/simple"  # nothing listens: fails at once


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """An empty cache and an index URL that cannot be reached."""
    monkeypatch.setenv("TRITONATTN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITONATTN_INDEX_URL", CLOSED_PORT_INDEX)
    for var in ("TRITONATTN_UPSTREAM_WHEEL", "TRITONATTN_UPSTREAM_SDIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("TRITONATTN_OFFLINE", raising=False)
    return tmp_path


def test_base_is_pinned_in_one_place():
    """The version and hashes of the base appear in fork_build/pins.py only."""
    needles = (pins.UPSTREAM_WHEEL_SHA256, pins.UPSTREAM_SDIST_SHA256, "0.26.0")
    files = [REPO / "setup.py", REPO / "pyproject.toml", REPO / ".ci" / "run"]
    files += sorted((REPO / "fork_build").glob("*.py"))
    offenders = [
        f"{f.relative_to(REPO)}: {n}"
        for f in files
        if f.name != "pins.py" and f.is_file()
        for n in needles
        if n in f.read_text()
    ]
    assert offenders == []
    pinned = (REPO / "fork_build" / "pins.py").read_text()
    assert all(n in pinned for n in needles)


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_no_network_and_no_local_file_names_the_option(no_network, kind):
    with pytest.raises(BuildError) as info:
        upstream.fetch(kind)
    message = str(info.value)
    option, env = upstream.KINDS[kind][2:]
    assert "could not download" in message
    assert option in message and env in message


def test_offline_mode_names_the_option(no_network, monkeypatch):
    monkeypatch.setenv("TRITONATTN_OFFLINE", "1")
    with pytest.raises(BuildError, match="--upstream-wheel"):
        upstream.fetch("wheel")


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_hash_mismatch_is_refused(no_network, monkeypatch, via):
    fake = no_network / pins.UPSTREAM_WHEEL
    fake.write_bytes(b"not the pinned wheel")
    explicit = None
    if via == "argument":
        explicit = fake
    else:
        monkeypatch.setenv("TRITONATTN_UPSTREAM_WHEEL", str(fake))
    with pytest.raises(BuildError) as info:
        upstream.fetch("wheel", explicit)
    assert "sha256 mismatch" in str(info.value)
    assert pins.UPSTREAM_WHEEL_SHA256 in str(info.value)


def test_missing_local_file(no_network):
    with pytest.raises(BuildError, match="not a file"):
        upstream.fetch("sdist", no_network / "nope.tar.gz")


def test_corrupt_cache_entry_is_dropped(no_network):
    cache = no_network / "cache"
    cache.mkdir()
    (cache / pins.UPSTREAM_SDIST).write_bytes(b"truncated")
    with pytest.raises(BuildError, match="could not download"):
        upstream.fetch("sdist")
    assert not (cache / pins.UPSTREAM_SDIST).exists()


def test_local_file_is_used_without_network(upstream_sdist, no_network):
    assert upstream.fetch("sdist", upstream_sdist) == upstream_sdist


def test_cli_reports_error_and_writes_nothing(no_network):
    out = no_network / "dist"
    env = {
        "PATH": "/usr/bin:/bin",
        "TRITONATTN_CACHE_DIR": str(no_network / "cache"),
        "TRITONATTN_INDEX_URL": CLOSED_PORT_INDEX,
    }
    proc = subprocess.run(
        [sys.executable, "setup.py", "wheel", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: could not download the upstream wheel")
    assert "--upstream-wheel" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())
