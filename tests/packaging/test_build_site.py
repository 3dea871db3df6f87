"""In-place patching of an installed vLLM (`python setup.py patch`), and revert.

Bad inputs use small fake sites: the few upstream files the fork touches, copied
from the pinned wheel, plus the dist-info. One test patches the full Python tree.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fork_build import BuildError, pins, plan, site

REPO = Path(__file__).resolve().parents[2]


def dist_info(target: pins.Upstream) -> str:
    """The dist-info directory of the stock release."""
    return f"vllm-{target.version}.dist-info"


def touched(target: pins.Upstream) -> list[str]:
    """The upstream files of `target` that a fake site needs."""
    return [
        "vllm/__init__.py",
        plan.VERSION_FILE,
        *plan.edited_files(target),
        *sorted(plan.REPLACED_UPSTREAM_FILES),
    ]


def snapshot(root: Path) -> dict[str, str]:
    """sha256 and mode of every file under `root` except bytecode caches."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        + oct(p.stat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="session")
def fake_site_template(target, upstream_wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp(f"fake_site_template_{target.version}")
    info = dist_info(target)
    with zipfile.ZipFile(upstream_wheel) as zf:
        names = [*touched(target), f"{info}/METADATA", f"{info}/RECORD"]
        zf.extractall(root, names)
    return root


@pytest.fixture
def fake_site(fake_site_template, tmp_path) -> Path:
    copy = tmp_path / "site"
    shutil.copytree(fake_site_template, copy)
    return copy


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -S setup.py ...`: no site-packages, stdlib only (as on the GPU host)."""
    return subprocess.run(
        [sys.executable, "-S", "setup.py", *args],
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "TRITONATTN_INDEX_URL": "http://127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_patch_and_revert_restore_bytes(fake_site, target):
    before = snapshot(fake_site)
    proc = run_cli("patch", "--site-packages", str(fake_site))
    assert proc.returncode == 0, proc.stderr
    assert f"patched to {target.fork_version}" in proc.stdout
    patched = snapshot(fake_site)
    overlay = plan.overlay_files()
    for rel, local in overlay.items():
        assert (fake_site / rel).read_bytes() == local.read_bytes()
    version = (fake_site / plan.VERSION_FILE).read_text()
    assert f"__version__ = version = '{target.fork_version}'" in version
    metadata = (fake_site / dist_info(target) / "METADATA").read_text()
    assert f"\nVersion: {target.fork_version}\n" in metadata
    record = (fake_site / dist_info(target) / "RECORD").read_text()
    assert "vllm/attention/ops/reference.py,sha256=" in record
    assert patched != before

    proc = run_cli("patch", "--site-packages", str(fake_site), "--revert")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(fake_site) == before
    assert not (fake_site / "vllm" / "attention").exists()
    assert not (fake_site / site.BACKUP_DIR).exists()


def test_patched_twice_is_refused(fake_site):
    site.patch_site(fake_site)
    state = snapshot(fake_site)
    proc = run_cli("patch", "--site-packages", str(fake_site))
    assert proc.returncode == 1
    assert "already patched" in proc.stderr and "use --revert first" in proc.stderr
    assert snapshot(fake_site) == state


def test_revert_of_unpatched_site_is_refused(fake_site):
    proc = run_cli("patch", "--site-packages", str(fake_site), "--revert")
    assert proc.returncode == 1
    assert "not patched" in proc.stderr and "nothing to revert" in proc.stderr


def test_other_vllm_version_is_refused(fake_site, target):
    version_py = fake_site / plan.VERSION_FILE
    stock = version_py.read_text()
    assert f"__version__ = version = '{target.version}'\n" in stock
    version_py.write_text(stock.replace(f"'{target.version}'", "'0.30.0'", 1))
    before = snapshot(fake_site)
    with pytest.raises(BuildError) as info:
        site.patch_site(fake_site)
    message = str(info.value)
    assert "holds vLLM 0.30.0" in message
    assert f"this fork patches vLLM {', '.join(pins.SUPPORTED)} (" in message
    assert "install one of those there first" in message
    assert snapshot(fake_site) == before
    proc = run_cli("patch", "--site-packages", str(fake_site))
    assert proc.returncode == 1
    assert f"patches vLLM {', '.join(pins.SUPPORTED)} (" in proc.stderr
    assert snapshot(fake_site) == before


def _as_fork_wheel(site_dir: Path, release: str, installed: str) -> None:
    """Make a fake site look like one where `pip install .` put the fork's wheel."""
    version_py = site_dir / plan.VERSION_FILE
    stock = version_py.read_text()
    version_py.write_text(stock.replace(f"'{release}'", f"'{installed}'", 1))


def test_the_fork_wheel_installed_by_pip_is_not_patched(fake_site, target):
    """What `pip install .` installs is the fork already: `patch` says so, names
    what to do to patch in place instead, changes nothing and exits 0; `--status`
    and `--revert` say what it is too."""
    _as_fork_wheel(fake_site, target.version, target.fork_version)
    before = snapshot(fake_site)
    with pytest.raises(site.ForkWheelInstalled):
        site.patch_site(fake_site)
    proc = run_cli("patch", "--site-packages", str(fake_site))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"holds vLLM {target.fork_version}, the fork's own wheel as `pip " in (
        proc.stdout
    )
    assert "nothing to patch" in proc.stdout
    reinstall = f"`pip install --force-reinstall --no-deps vllm=={target.version}`"
    assert reinstall in proc.stdout
    assert "backup manifest" not in proc.stdout
    status = run_cli("patch", "--site-packages", str(fake_site), "--status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.rstrip().endswith(
        f"vLLM {target.fork_version} (the fork's own wheel, as `pip install .` "
        "installs it; nothing to patch)"
    )
    revert = run_cli("patch", "--site-packages", str(fake_site), "--revert")
    assert revert.returncode == 1
    assert "the fork's own wheel" in revert.stderr and reinstall in revert.stderr
    assert snapshot(fake_site) == before


def test_a_fork_wheel_of_a_release_no_longer_supported_is_refused(fake_site, target):
    _as_fork_wheel(fake_site, target.version, f"0.30.0+{pins.FORK_LOCAL}")
    before = snapshot(fake_site)
    proc = run_cli("patch", "--site-packages", str(fake_site))
    assert proc.returncode == 1
    assert "the fork's wheel of vLLM 0.30.0, a release this checkout" in proc.stderr
    assert snapshot(fake_site) == before


def test_missing_anchor_writes_nothing(fake_site, target):
    envs = fake_site / "vllm" / "envs.py"
    envs.write_text(envs.read_text().replace("VLLM_BATCH_INVARIANT: bool", "X: int"))
    before = snapshot(fake_site)
    with pytest.raises(BuildError) as info:
        site.patch_site(fake_site)
    message = str(info.value)
    assert (
        f"vLLM {target.version}, vllm/envs.py: anchor "
        "'VLLM_BATCH_INVARIANT: bool = False'"
    ) in message
    assert "nothing was written" in message
    assert snapshot(fake_site) == before


def test_file_differing_from_record_is_refused(fake_site, target):
    registry = fake_site / "vllm" / "v1" / "attention" / "backends" / "registry.py"
    registry.write_text(registry.read_text() + "\n# local change\n")
    before = snapshot(fake_site)
    with pytest.raises(
        BuildError, match=f"differ from the vLLM {target.version} wheel"
    ):
        site.patch_site(fake_site)
    assert snapshot(fake_site) == before


def test_not_a_vllm_site(tmp_path):
    with pytest.raises(BuildError, match="no vLLM installation"):
        site.patch_site(tmp_path)


def test_failure_while_writing_rolls_back(fake_site, monkeypatch):
    before = snapshot(fake_site)
    real_write, calls = site._atomic_write, []

    def flaky_write(path, data, mode=0o644):
        calls.append(path)
        if len(calls) == 4:
            raise OSError("disk full (simulated)")
        real_write(path, data, mode)

    monkeypatch.setattr(site, "_atomic_write", flaky_write)
    with pytest.raises(OSError, match="simulated"):
        site.patch_site(fake_site)
    assert len(calls) == 4
    assert snapshot(fake_site) == before
    assert not (fake_site / site.BACKUP_DIR).exists()


def test_revert_refuses_to_lose_later_edits(fake_site):
    site.patch_site(fake_site)
    envs = fake_site / "vllm" / "envs.py"
    envs.write_text(envs.read_text() + "# edited after patching\n")
    with pytest.raises(BuildError, match="changed after patching"):
        site.revert_site(fake_site)


def _compile(directory: Path) -> None:
    compiled = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr


def _bytecode(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.pyc"))
    }


def test_revert_restores_the_installed_bytecode(fake_site):
    """pip compiles every module it installs (and lists the .pyc in RECORD): after
    patch, a run that compiles the fork's modules, and revert, the bytecode is
    stock's again, byte for byte, and none of the fork's is left."""
    _compile(fake_site / "vllm")
    stock = _bytecode(fake_site)
    changed = site.patch_site(fake_site)
    replaced = [rel for rel in changed if rel.endswith(".py")]
    assert all(pyc not in _bytecode(fake_site) for pyc in stock if "envs." in pyc)
    _compile(fake_site / "vllm")
    fork = _bytecode(fake_site)
    assert any(fork.get(pyc) != digest for pyc, digest in stock.items())
    assert len(fork) > len(stock) and replaced
    site.revert_site(fake_site)
    assert _bytecode(fake_site) == stock


def test_full_python_tree(stock_vllm_site, target, tmp_path):
    """The whole Python tree of the wheel: patch, check status, revert."""
    copy = tmp_path / "site"
    shutil.copytree(stock_vllm_site, copy)
    before = snapshot(copy)
    assert site.describe(copy).endswith(
        f"vLLM {target.version} (stock; can be patched)"
    )
    planned, _ = site.plan_site(copy)
    assert planned == target
    changed = site.patch_site(copy)
    assert set(plan.overlay_files()) <= set(changed)
    assert {*plan.edited_files(target), plan.VERSION_FILE} <= set(changed)
    assert site.describe(copy).endswith(f"patched to {target.fork_version}")
    site.revert_site(copy)
    assert snapshot(copy) == before
