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


def repository_files() -> list[Path]:
    """The repository's files (tracked, or new and not ignored); all of them
    without git."""
    proc = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    if proc.returncode == 0:
        names = [n for n in proc.stdout.decode().split("\0") if n]
        return [REPO / n for n in names if (REPO / n).is_file()]
    skip = {".git", "__pycache__", "build", "dist"}
    return [
        p
        for p in REPO.rglob("*")
        if p.is_file() and not skip & set(p.relative_to(REPO).parts)
    ]


def test_base_is_pinned_in_one_place():
    """The hashes of the supported releases appear in fork_build/pins.py only, and
    no build file but pins.py names a release."""
    pins_py = REPO / "fork_build" / "pins.py"
    hashes = [
        h for r in pins.SUPPORTED.values() for h in (r.wheel_sha256, r.sdist_sha256)
    ]
    files = repository_files()
    assert pins_py in files and REPO / "setup.py" in files
    offenders = [
        f"{f.relative_to(REPO)}: {h}"
        for f in files
        if f != pins_py
        for h in hashes
        if h.encode() in f.read_bytes()
    ]
    assert offenders == []
    # The release versions: free in docs and tests, not in the build's code.
    build_files = [REPO / "setup.py", REPO / "pyproject.toml", REPO / ".ci" / "run"]
    build_files += sorted((REPO / "fork_build").glob("*.py"))
    offenders = [
        f"{f.relative_to(REPO)}: {v}"
        for f in build_files
        if f != pins_py and f.is_file()
        for v in pins.SUPPORTED
        if v in f.read_text()
    ]
    assert offenders == []
    pinned = pins_py.read_text()
    assert all(n in pinned for n in [*hashes, *pins.SUPPORTED])


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_no_network_and_no_local_file_names_the_option(no_network, target, kind):
    with pytest.raises(BuildError) as info:
        upstream.fetch(kind, target)
    message = str(info.value)
    option, env = upstream.KINDS[kind]
    filename, _ = upstream.pinned_file(kind, target)
    assert "could not download" in message and filename in message
    assert option in message and env in message


def test_pinned_files_are_the_release_s(target):
    assert upstream.pinned_file("wheel", target) == (
        target.wheel,
        target.wheel_sha256,
    )
    assert upstream.pinned_file("sdist", target) == (
        target.sdist,
        target.sdist_sha256,
    )
    assert target.wheel.startswith(f"vllm-{target.version}-")
    assert target.sdist == f"{target.sdist_root}.tar.gz"


def test_offline_mode_names_the_option(no_network, target, monkeypatch):
    monkeypatch.setenv("TRITONATTN_OFFLINE", "1")
    with pytest.raises(BuildError, match="--upstream-wheel") as info:
        upstream.fetch("wheel", target)
    assert target.wheel in str(info.value)


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_hash_mismatch_is_refused(no_network, target, monkeypatch, via):
    fake = no_network / target.wheel
    fake.write_bytes(b"not the pinned wheel")
    explicit = None
    if via == "argument":
        explicit = fake
    else:
        monkeypatch.setenv("TRITONATTN_UPSTREAM_WHEEL", str(fake))
    with pytest.raises(BuildError) as info:
        upstream.fetch("wheel", target, explicit)
    assert "sha256 mismatch" in str(info.value)
    assert target.wheel_sha256 in str(info.value)
    assert f"vllm {target.version}" in str(info.value)


def test_another_release_s_file_is_refused(no_network, target, upstream_sdist):
    """The sdist of one supported release is not accepted for another."""
    for other in pins.SUPPORTED.values():
        if other != target:
            with pytest.raises(BuildError, match="sha256 mismatch"):
                upstream.fetch("sdist", other, upstream_sdist)


def test_missing_local_file(no_network, target):
    with pytest.raises(BuildError, match="not a file"):
        upstream.fetch("sdist", target, no_network / "nope.tar.gz")


def test_corrupt_cache_entry_is_dropped(no_network, target):
    cache = no_network / "cache"
    cache.mkdir()
    (cache / target.sdist).write_bytes(b"truncated")
    with pytest.raises(BuildError, match="could not download"):
        upstream.fetch("sdist", target)
    assert not (cache / target.sdist).exists()


def test_local_file_is_used_without_network(upstream_sdist, target, no_network):
    assert upstream.fetch("sdist", target, upstream_sdist) == upstream_sdist


def test_cached_file_is_used_without_network(upstream_sdist, target, no_network):
    cache = no_network / "cache"
    cache.mkdir()
    (cache / target.sdist).symlink_to(upstream_sdist)
    assert upstream.fetch("sdist", target) == cache / target.sdist


def test_cli_reports_error_and_writes_nothing(no_network, target):
    out = no_network / "dist"
    env = {
        "PATH": "/usr/bin:/bin",
        "TRITONATTN_CACHE_DIR": str(no_network / "cache"),
        "TRITONATTN_INDEX_URL": CLOSED_PORT_INDEX,
    }
    proc = subprocess.run(
        [sys.executable, "setup.py", "wheel", "--out", str(out)]
        + ["--vllm-version", target.version],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"error: could not download the upstream wheel {target.wheel} "
    )
    assert "--upstream-wheel" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())
