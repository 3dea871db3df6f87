"""The fork's wheel: `pip wheel .` (the PEP 517 backend), contents, install.

Builds from the pinned upstream wheel (cache or PyPI, ~300 MB); the build copies
unchanged members raw, so it takes seconds.
"""

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_build_vllm import run_checks

from fork_build import pins, plan, wheel

REPO = Path(__file__).resolve().parents[2]
FORK_DIST_INFO = f"vllm-{pins.FORK_VERSION}.dist-info"
UPSTREAM_DIST_INFO = f"vllm-{pins.UPSTREAM_VERSION}.dist-info"


def pip(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"pip {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="session")
def fork_wheel(upstream_wheel, tmp_path_factory) -> Path:
    """`pip wheel . --no-deps -w DIR`, as docs/install.md says."""
    out = tmp_path_factory.mktemp("dist")
    pip("wheel", ".", "--no-deps", "--no-cache-dir", "-q", "-w", str(out))
    built = sorted(out.glob("*.whl"))
    assert [p.name for p in built] == [wheel.wheel_name()]
    return built[0]


@pytest.fixture(scope="session")
def installed_target(fork_wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("target")
    pip(
        "install",
        "--no-deps",
        "--no-compile",
        "-q",
        "--target",
        str(target),
        str(fork_wheel),
    )
    return target


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def test_wheel_name_and_dist_info(fork_wheel, upstream_wheel):
    assert fork_wheel.name == (
        f"vllm-{pins.FORK_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
    )
    with zipfile.ZipFile(fork_wheel) as zf, zipfile.ZipFile(upstream_wheel) as up:
        tops = {name.split("/")[0] for name in zf.namelist()}
        assert tops == {"vllm", FORK_DIST_INFO}
        metadata = zf.read(f"{FORK_DIST_INFO}/METADATA").decode()
        upstream_metadata = up.read(f"{UPSTREAM_DIST_INFO}/METADATA").decode()
        assert f"\nVersion: {pins.FORK_VERSION}\n" in metadata
        requires = [ln for ln in metadata.splitlines() if ln.startswith("Requires-")]
        upstream_requires = [
            ln for ln in upstream_metadata.splitlines() if ln.startswith("Requires-")
        ]
        assert requires == upstream_requires and len(requires) > 10
        for leaf in ("entry_points.txt", "top_level.txt"):
            assert zf.read(f"{FORK_DIST_INFO}/{leaf}") == up.read(
                f"{UPSTREAM_DIST_INFO}/{leaf}"
            )


def test_wheel_contents_and_record(fork_wheel, upstream_wheel):
    with zipfile.ZipFile(upstream_wheel) as up:
        names = set(up.namelist())
        changes = plan.compute_changes(
            lambda p: up.read(p) if p in names else None, with_version=True
        )
        upstream_members = {
            n for n in names if not n.startswith(UPSTREAM_DIST_INFO + "/")
        }
    with zipfile.ZipFile(fork_wheel) as zf:
        assert zf.testzip() is None  # every CRC, raw-copied members included
        members = {n for n in zf.namelist() if not n.startswith(FORK_DIST_INFO)}
        assert members == upstream_members | {c.path for c in changes}
        for change in changes:
            assert zf.read(change.path) == change.new, change.path
        for rel, local in plan.overlay_files().items():
            assert zf.read(rel) == local.read_bytes()
        assert b"VLLM_ATTENTION_BACKEND" in zf.read("vllm/envs.py")
        text = zf.read(f"{FORK_DIST_INFO}/RECORD").decode()
        rows = {row[0]: row for row in csv.reader(io.StringIO(text)) if row}
        assert set(rows) == set(zf.namelist())
        assert rows[f"{FORK_DIST_INFO}/RECORD"][1:] == ["", ""]
        for info in zf.infolist():
            if info.file_size < 2_000_000 and not info.filename.endswith("RECORD"):
                data = zf.read(info)
                expected = [record_hash(data), str(len(data))]
                assert rows[info.filename][1:] == expected, info.filename


def test_setup_py_wheel_matches_pip(fork_wheel, tmp_path):
    proc = subprocess.run(
        [sys.executable, "setup.py", "wheel", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    built = tmp_path / fork_wheel.name
    assert built.read_bytes() == fork_wheel.read_bytes()  # reproducible


def test_installed_wheel_imports_as_the_fork(installed_target):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = str(installed_target)
    proc = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"],
        env=env,
        cwd=installed_target,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == pins.FORK_VERSION
    results = run_checks(installed_target, "version", "registry", "cli_version")
    assert results["version"]["metadata"] == pins.FORK_VERSION
    assert results["cli_version"] == pins.FORK_VERSION  # `vllm --version`
    registry = results["registry"]
    assert registry["module_is_ours"] is True
    assert registry["ROCM_ATTN"].endswith("triton_attn.RocmAttentionBackend")


def test_sdist_of_the_fork_builds_standalone(tmp_path):
    """The backend's own sdist holds everything the backend needs."""
    import tarfile

    from fork_build import backend

    name = backend.build_sdist(str(tmp_path))
    root = f"vllm-{pins.FORK_VERSION}"
    assert name == f"{root}.tar.gz"
    with tarfile.open(tmp_path / name) as tar:
        members = set(tar.getnames())
        tar.extractall(tmp_path / "x", filter="data")
    assert f"{root}/PKG-INFO" in members
    assert not [m for m in members if "__pycache__" in m]
    for rel in plan.overlay_files():
        assert f"{root}/{rel}" in members
    proc = subprocess.run(
        [sys.executable, "setup.py", "show"],
        cwd=tmp_path / "x" / root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "edited:  vllm/envs.py" in proc.stdout
