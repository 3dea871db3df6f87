"""The fork's wheel: `pip wheel .` (the PEP 517 backend), contents, install.

Builds from the pinned upstream wheel (cache or PyPI, ~300 MB); the build copies
unchanged members raw, so it takes seconds.
"""

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_build_vllm import run

from fork_build import backend, pins, plan, wheel

REPO = Path(__file__).resolve().parents[2]


def fork_dist_info(target: pins.Upstream) -> str:
    return f"vllm-{target.fork_version}.dist-info"


def upstream_dist_info(target: pins.Upstream) -> str:
    return f"vllm-{target.version}.dist-info"


def pip(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != pins.VERSION_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"pip {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="session")
def fork_wheel(target, upstream_wheel, tmp_path_factory) -> Path:
    """`pip wheel . --no-deps -w DIR`, as docs/install.md says; the default release
    without a config setting, another one with `vllm-version`; a release pip could
    not install from PyPI (`pypi_blocker`) with `setup.py wheel`, which pip refuses
    (test_pip_refuses_a_release_it_could_not_install)."""
    out = tmp_path_factory.mktemp(f"dist_{target.version}")
    if target.pypi_blocker:
        command = ["setup.py", "wheel", "--vllm-version", target.version]
        proc = subprocess.run(
            [sys.executable, *command, "--out", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr
    else:
        choose = []
        if target.version != pins.DEFAULT_VERSION:
            choose = ["--config-settings", f"vllm-version={target.version}"]
        pip("wheel", ".", "--no-deps", "--no-cache-dir", "-q", "-w", str(out), *choose)
    built = sorted(out.glob("*.whl"))
    assert [p.name for p in built] == [wheel.wheel_name(target)]
    return built[0]


@pytest.fixture(scope="session")
def installed_target(target, fork_wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"target_{target.version}")
    pip(
        "install",
        "--no-deps",
        "--no-compile",
        "-q",
        "--target",
        str(out),
        str(fork_wheel),
    )
    return out


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def test_wheel_name_and_dist_info(fork_wheel, upstream_wheel, target):
    assert fork_wheel.name == (
        f"vllm-{target.fork_version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    )
    fork_dist, upstream_dist = fork_dist_info(target), upstream_dist_info(target)
    with zipfile.ZipFile(fork_wheel) as zf, zipfile.ZipFile(upstream_wheel) as up:
        tops = {name.split("/")[0] for name in zf.namelist()}
        assert tops == {"vllm", fork_dist}
        metadata = zf.read(f"{fork_dist}/METADATA").decode()
        upstream_metadata = up.read(f"{upstream_dist}/METADATA").decode()
        assert f"\nVersion: {target.version}\n" in upstream_metadata
        assert f"\nVersion: {target.fork_version}\n" in metadata
        requires = [ln for ln in metadata.splitlines() if ln.startswith("Requires-")]
        upstream_requires = [
            ln for ln in upstream_metadata.splitlines() if ln.startswith("Requires-")
        ]
        assert requires == upstream_requires and len(requires) > 10
        for leaf in ("entry_points.txt", "top_level.txt"):
            assert zf.read(f"{fork_dist}/{leaf}") == up.read(f"{upstream_dist}/{leaf}")


def test_wheel_contents_and_record(fork_wheel, upstream_wheel, target):
    fork_dist, upstream_dist = fork_dist_info(target), upstream_dist_info(target)
    with zipfile.ZipFile(upstream_wheel) as up:
        names = set(up.namelist())
        changes = plan.compute_changes(
            lambda p: up.read(p) if p in names else None, target, with_version=True
        )
        upstream_members = {n for n in names if not n.startswith(upstream_dist + "/")}
    assert {c.path for c in changes if c.kind == "edited"} == set(
        plan.edited_files(target)
    )
    with zipfile.ZipFile(fork_wheel) as zf:
        assert zf.testzip() is None  # every CRC, raw-copied members included
        members = {n for n in zf.namelist() if not n.startswith(fork_dist)}
        assert members == upstream_members | {c.path for c in changes}
        for change in changes:
            assert zf.read(change.path) == change.new, change.path
        for rel, local in plan.overlay_files().items():
            assert zf.read(rel) == local.read_bytes()
        assert b"VLLM_ATTENTION_BACKEND" in zf.read("vllm/envs.py")
        text = zf.read(f"{fork_dist}/RECORD").decode()
        rows = {row[0]: row for row in csv.reader(io.StringIO(text)) if row}
        assert set(rows) == set(zf.namelist())
        assert rows[f"{fork_dist}/RECORD"][1:] == ["", ""]
        for info in zf.infolist():
            if info.file_size < 2_000_000 and not info.filename.endswith("RECORD"):
                data = zf.read(info)
                expected = [record_hash(data), str(len(data))]
                assert rows[info.filename][1:] == expected, info.filename


def test_setup_py_wheel_matches_pip(fork_wheel, target, tmp_path):
    proc = subprocess.run(
        [sys.executable, "setup.py", "wheel", "--out", str(tmp_path)]
        + ["--vllm-version", target.version],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    built = tmp_path / fork_wheel.name
    assert built.read_bytes() == fork_wheel.read_bytes()  # reproducible


def test_installed_wheel_imports_as_the_fork(installed_target, target):
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
    assert proc.stdout.strip().splitlines()[-1] == target.fork_version
    results = run(installed_target, "version", "registry", "cli_version")
    assert results["version"]["metadata"] == target.fork_version
    assert results["cli_version"] == target.fork_version  # `vllm --version`
    registry = results["registry"]
    assert registry["module_is_ours"] is True
    assert registry["ROCM_ATTN"].endswith("triton_attn.RocmAttentionBackend")


def test_backend_metadata_of_the_chosen_release(upstream_wheel, target, tmp_path):
    settings = {"vllm-version": target.version}
    if target.pypi_blocker:
        pytest.skip(f"pip refuses vLLM {target.version}: {target.pypi_blocker}")
    name = backend.prepare_metadata_for_build_wheel(str(tmp_path), settings)
    assert name == fork_dist_info(target)
    metadata = (tmp_path / name / "METADATA").read_text()
    assert f"\nVersion: {target.fork_version}\n" in metadata


def _refusal(hook, directory: Path, settings: dict) -> str:
    """What a backend hook that refuses prints (its SystemExit message): pip shows
    it as the build's output."""
    with pytest.raises(SystemExit) as info:
        hook(str(directory), settings)
    assert isinstance(info.value.code, str), info.value.code
    assert info.value.__suppress_context__  # no chained traceback
    return info.value.code


def test_pip_refuses_a_release_it_could_not_install(tmp_path):
    """`pip install . --config-settings vllm-version=V` for a release whose own
    requirements do not resolve from PyPI stops at once with the reason and what to
    do instead, before anything is built."""
    blocked = [r for r in pins.SUPPORTED.values() if r.pypi_blocker]
    if not blocked:
        pytest.skip("every supported release installs from PyPI")
    for release in blocked:
        settings = {"vllm-version": release.version}
        for build in (backend.prepare_metadata_for_build_wheel, backend.build_wheel):
            message = _refusal(build, tmp_path, settings)
            assert message.startswith(f"error: {release.pypi_blocker}, ")
            default = (
                f"`pip install .` installs the default, vLLM {pins.DEFAULT_VERSION};"
            )
            assert default in message
            assert "setup.py patch --site-packages" in message
            assert "--vllm-version" not in message  # setup.py's option, not pip's
        assert list(tmp_path.iterdir()) == []


def test_backend_refuses_an_unsupported_release(tmp_path):
    message = _refusal(backend.build_wheel, tmp_path, {"vllm-version": "0.30.0"})
    assert message.startswith("error: vLLM 0.30.0 is not supported")
    assert f"supported versions: {', '.join(pins.SUPPORTED)} " in message
    assert "`--config-settings vllm-version=VERSION`" in message
    assert "--vllm-version" not in message
    assert list(tmp_path.iterdir()) == []


def test_backend_names_pips_setting_for_the_upstream_wheel(tmp_path):
    settings = {"upstream-wheel": str(tmp_path / "missing.whl")}
    message = _refusal(backend.build_wheel, tmp_path, settings)
    assert message.startswith("error: --config-settings upstream-wheel names ")
    assert "--upstream-wheel" not in message


def _pip_wheel(settings: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != pins.VERSION_ENV}
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(tmp_path)]
        + [f"--config-settings={s}" for s in settings],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _pip_refusal_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """The build's output inside pip's report of the failed hook."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    (start,) = [
        i
        for i, line in enumerate(lines)
        if re.search(r"\[\d+ lines? of output\]$", line)
    ]
    end = next(i for i in range(start, len(lines)) if "[end of output]" in lines[i])
    return [line.strip() for line in lines[start + 1 : end]]


def test_pips_refusal_is_the_reason_and_the_fix(tmp_path):
    """Through pip itself: a refused release is a few lines of output in pip's
    report, the reason first, in pip's words (its config setting), no traceback."""
    unsupported = _pip_refusal_lines(_pip_wheel(["vllm-version=0.30.0"], tmp_path))
    assert unsupported[0].startswith("error: vLLM 0.30.0 is not supported by this")
    text = " ".join(unsupported)
    assert "`--config-settings vllm-version=VERSION`" in text
    assert "--vllm-version" not in text
    for release in [r for r in pins.SUPPORTED.values() if r.pypi_blocker]:
        proc = _pip_wheel([f"vllm-version={release.version}"], tmp_path)
        lines = _pip_refusal_lines(proc)
        assert lines[0].startswith(f"error: {release.pypi_blocker}, "), lines
        assert len(lines) <= 5, lines
        assert "--vllm-version" not in "\n".join(lines)
    assert list(tmp_path.iterdir()) == []


def test_patching_the_installed_fork_wheel_changes_nothing(installed_target, target):
    """`setup.py patch` over what `pip install .` installed: it says that this is
    the fork's own wheel, that there is nothing to patch, and how to patch in place
    instead; it exits 0 and writes nothing."""

    def state() -> dict[str, tuple[int, int]]:
        return {
            p.relative_to(installed_target).as_posix(): (
                p.stat().st_size,
                p.stat().st_mtime_ns,
            )
            for p in installed_target.rglob("*")
        }

    def patch(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-S", "setup.py", "patch", *flags, "--site-packages"]
            + [str(installed_target)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    before = state()
    proc = patch()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    message = proc.stdout
    assert f"holds vLLM {target.fork_version}, the fork's own wheel" in message
    assert "nothing to patch" in message
    assert f"pip install --force-reinstall --no-deps vllm=={target.version}" in message
    assert "reinstall stock" not in message and "looks patched" not in message
    assert state() == before
    status = patch("--status")
    assert status.returncode == 0, status.stderr
    assert "the fork's own wheel" in status.stdout, status.stdout


def test_sdist_of_the_fork_builds_standalone(target, tmp_path):
    """The backend's own sdist holds everything the backend needs."""
    import tarfile

    name = backend.build_sdist(str(tmp_path), {"vllm-version": target.version})
    root = f"vllm-{target.fork_version}"
    assert name == f"{root}.tar.gz"
    with tarfile.open(tmp_path / name) as tar:
        members = set(tar.getnames())
        tar.extractall(tmp_path / "x", filter="data")
    assert f"{root}/PKG-INFO" in members
    assert not [m for m in members if "__pycache__" in m]
    for rel in plan.overlay_files():
        assert f"{root}/{rel}" in members
    proc = subprocess.run(
        [sys.executable, "setup.py", "show", "--vllm-version", target.version],
        cwd=tmp_path / "x" / root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"fork version: {target.fork_version} ")
    assert "edited:  vllm/envs.py" in proc.stdout
