"""Source outputs: the upstream PR patch and the patched source tree (ROCm path).

What runs here: the patch applies to the pristine sdist with `git apply`; the
patched tree byte-compiles; our modules import from the patched tree; upstream's
setup.py reads the patched envs.py the way it does during a build, and
setuptools-scm gives the fork version. A ROCm compile of the C++/HIP extensions
needs a ROCm host (docs/rocm.md).
"""

import ast
import compileall
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from fork_build import BuildError, pins, plan, source
from tests import site_runner

REPO = Path(__file__).resolve().parents[2]
# The upstream PR targets the newest supported release (`setup.py pr-patch`).
NEWEST = max(pins.SUPPORTED, key=lambda v: tuple(int(p) for p in v.split(".")))


def setup_py(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != pins.VERSION_ENV}
    proc = subprocess.run(
        [sys.executable, "setup.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="session")
def pristine_tree(target, upstream_sdist, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp(f"pristine_{target.version}")
    with tarfile.open(upstream_sdist) as tar:
        tar.extractall(root, filter="data")
    return root / target.sdist_root


@pytest.fixture(scope="session")
def pr_patch(target, upstream_sdist, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"patch_{target.version}") / source.patch_name(target)
    setup_py("pr-patch", "--vllm-version", target.version, "--out", str(out))
    return out


def git_apply(tree: Path, patch: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "apply", *args, str(patch)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pr_patch_format(pr_patch, target):
    assert pr_patch.name == f"vllm-{target.version}-tritonattn.patch"
    text = pr_patch.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert f"\nChanges against vLLM {target.version} (docs/upstream-pr.md):\n" in text
    for rel in plan.overlay_files():
        assert f"diff --git a/{rel} b/{rel}\n" in text
    added = next(iter(plan.overlay_files()))
    assert (
        f"diff --git a/{added} b/{added}\nnew file mode 100644\nindex 0000000.."
    ) in text
    assert f"--- /dev/null\n+++ b/{added}\n" in text
    for rel in plan.edited_files(target, source=True):
        assert f"--- a/{rel}\n+++ b/{rel}\n" in text
    assert "vllm/_version.py" not in text  # an upstream PR keeps upstream's version


def test_pr_patch_defaults_to_the_newest_release(pr_patch, target, tmp_path):
    """`setup.py pr-patch` without --vllm-version: the newest supported release."""
    out = tmp_path / "default.patch"
    proc = setup_py("pr-patch", "--out", str(out))
    assert f"in a pristine vllm-{NEWEST}" in proc.stdout
    text = out.read_text()
    assert f"\nChanges against vLLM {NEWEST} (docs/upstream-pr.md):\n" in text
    # The same patch as the one written for that release explicitly.
    assert (text == pr_patch.read_text()) is (target.version == NEWEST)


def test_pr_patch_applies_and_compiles(pr_patch, pristine_tree, target, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(pristine_tree, tree, symlinks=True)
    check = git_apply(tree, pr_patch, "--check")
    assert check.returncode == 0, check.stderr
    applied = git_apply(tree, pr_patch)
    assert applied.returncode == 0, applied.stderr
    for rel, local in plan.overlay_files().items():
        assert (tree / rel).read_bytes() == local.read_bytes()
    for rel in plan.edited_files(target, source=True):
        assert (tree / rel).read_bytes() != (pristine_tree / rel).read_bytes(), rel
    assert compileall.compile_dir(tree / "vllm", quiet=1, workers=2)
    assert compileall.compile_file(tree / "setup.py", quiet=1)
    _check_pr_tests(tree)
    # Applying twice must fail: the patch is not silently re-applicable.
    assert git_apply(tree, pr_patch, "--check").returncode != 0


def _ruff(tree: Path, *args: str) -> subprocess.CompletedProcess:
    """Ruff in the upstream tree, so upstream's own configuration applies."""
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not on PATH; install requirements-test.txt")
    return subprocess.run(
        [found, *args, "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _lint_findings(tree: Path, files: list[str]) -> list[str]:
    proc = _ruff(tree, "check", "--output-format", "concise", *files)
    assert proc.returncode in (0, 1), proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith(tuple(files))]


def test_pr_patch_passes_upstreams_lint(pr_patch, pristine_tree, target, tmp_path):
    """What a reviewer's pre-commit says: upstream's ruff rules and formatting, with
    upstream's configuration, on every Python file the patch adds; an edited
    upstream file may not gain a finding its stock text does not have."""
    tree = tmp_path / "tree"
    shutil.copytree(pristine_tree, tree, symlinks=True)
    assert git_apply(tree, pr_patch).returncode == 0
    text = pr_patch.read_text()
    added = sorted(
        line.removeprefix("+++ b/")
        for line, prev in zip(text.splitlines()[1:], text.splitlines())
        if prev == "--- /dev/null" and line.endswith(".py")
    )
    edited = [p for p in plan.edited_files(target, source=True) if p.endswith(".py")]
    assert added and edited
    assert _lint_findings(tree, added) == []
    fmt = _ruff(tree, "format", "--check", *added)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    for rel in edited:
        after = _lint_findings(tree, [rel])
        before = _lint_findings(pristine_tree, [rel])
        strip = [f.split(": ", 1)[1] for f in before]
        assert [f for f in after if f.split(": ", 1)[1] not in strip] == [], rel
        if _ruff(pristine_tree, "format", "--check", rel).returncode == 0:
            assert _ruff(tree, "format", "--check", rel).returncode == 0, rel


def test_pr_kernel_tests_run_in_the_upstream_tree(pr_patch, pristine_tree, tmp_path):
    """The kernel tests that start subprocesses find their modules from where the
    patch puts them (not from this repository's layout), and pass there. Upstream's
    own conftest (it needs all of vLLM's dependencies) is left out by --confcutdir."""
    tree = tmp_path / "tree"
    shutil.copytree(pristine_tree, tree, symlinks=True)
    assert git_apply(tree, pr_patch).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--confcutdir={source.KERNEL_TESTS}", "-k", "compiles_for_hopper",
         source.KERNEL_TESTS],
        cwd=tree,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=2400,  # the compile checks' cold builds (their own guard: 1800 s)
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "\n2 passed" in proc.stdout, proc.stdout[-2000:]


def _check_pr_tests(tree: Path) -> None:
    """The fork's kernel and backend tests are in the upstream tree where upstream
    keeps its own, compile, and every `tests.*` module they import is there."""
    added = [tree / source.BACKEND_TESTS / "test_triton_attn_backend.py"]
    added += [tree / path for path in source.PR_TEST_FILES.values()]
    added += [
        tree / source.KERNEL_TESTS / p.name
        for p in (REPO / "tests/kernels").glob("*.py")
    ]
    assert [p for p in added if not p.is_file()] == []
    for path in added:
        module = ast.parse(path.read_text(), str(path))  # compiles
        imported = [
            name
            for node in ast.walk(module)
            for name in (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if name.startswith("tests.")
        ]
        ours = (
            source.KERNEL_TESTS.replace("/", "."),
            source.BACKEND_TESTS.replace("/", "."),
        )
        for name in imported:
            assert name.startswith(ours), (path, name)  # not upstream's namesakes
            rel = Path(*name.split("."))
            assert (tree / f"{rel}.py").is_file() or (tree / rel).is_dir(), (path, name)


@pytest.fixture(scope="session")
def source_tree(target, upstream_sdist, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"build_{target.version}")
    setup_py("source-tree", "--vllm-version", target.version, "--out", str(out))
    assert [p.name for p in out.iterdir()] == [source.tree_name(target)]
    return out / source.tree_name(target)


def test_source_tree_contents(source_tree, pristine_tree, target):
    assert source_tree.name == f"vllm-{target.fork_version}"
    pkg_info = (source_tree / "PKG-INFO").read_text()
    assert f"\nVersion: {target.fork_version}\n" in pkg_info
    assert (source_tree / "requirements-rocm.txt").read_bytes() == (
        REPO / "requirements-rocm.txt"
    ).read_bytes()
    included = [
        line.split(maxsplit=1)[1]
        for line in (REPO / "requirements-rocm.txt").read_text().splitlines()
        if line.startswith("-r ")
    ]
    assert included, "requirements-rocm.txt includes none of upstream's lists"
    for rel in included:
        assert (source_tree / rel).is_file(), f"requirements-rocm.txt needs {rel}"
    setup_py = (source_tree / "setup.py").read_text()
    assert '"attention/ops/tuning/*.json",' in setup_py
    for rel, local in plan.overlay_files().items():
        assert (source_tree / rel).read_bytes() == local.read_bytes()
    unchanged = "vllm/v1/attention/backends/rocm_attn.py"  # stock file stays
    assert (source_tree / unchanged).read_bytes() == (
        pristine_tree / unchanged
    ).read_bytes()


def test_source_tree_refuses_existing_target(upstream_sdist, source_tree, target):
    with pytest.raises(BuildError, match="exists"):
        source.write_source_tree(upstream_sdist, source_tree.parent, target)


def test_source_tree_builds_the_way_upstream_setup_py_reads_it(source_tree):
    """Byte-compile, import our modules, load envs.py as setup.py does."""
    assert compileall.compile_dir(source_tree / "vllm", quiet=1, workers=2)
    code = (
        "import importlib.util\n"
        "spec = importlib.util.spec_from_file_location('envs', 'vllm/envs.py')\n"
        "envs = importlib.util.module_from_spec(spec); spec.loader.exec_module(envs)\n"
        "assert envs.VLLM_TARGET_DEVICE == 'rocm', envs.VLLM_TARGET_DEVICE\n"
        "assert envs.VLLM_ATTENTION_BACKEND == 'TRITON_ATTN'\n"
        "import vllm.attention.ops.paged_attention as pa\n"
        "import vllm.attention.ops.reference as ref\n"
        "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E\n"
        "print(pa.__file__, ref.__name__, E.ROCM_ATTN.get_path())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(
        PYTHONPATH=str(source_tree),
        VLLM_TARGET_DEVICE="rocm",
        VLLM_ATTENTION_BACKEND="TRITON_ATTN",
        VLLM_LOGGING_LEVEL="WARNING",
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=source_tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    module_file, _, rocm_path = proc.stdout.split()[-3:]
    assert Path(module_file).is_relative_to(source_tree)
    assert rocm_path.endswith("triton_attn.RocmAttentionBackend")


def test_setuptools_scm_reads_the_fork_version(source_tree, target):
    scm = pytest.importorskip(
        "setuptools_scm", reason="setuptools-scm (upstream's build dependency)"
    )
    assert scm.get_version(root=str(source_tree)) == target.fork_version


def test_empty_device_build_of_the_source_tree(source_tree, target, tmp_path):
    """Upstream's setup.py builds a wheel of the tree with VLLM_TARGET_DEVICE=empty
    (Python only: no CUDA/ROCm compile), with upstream's pinned build tools."""
    tools = tmp_path / "build-tools"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(tools)]
        + ["setuptools>=77.0.3,<81", "setuptools-scm>=8", "setuptools-rust>=1.9.0"],
        check=True,
        timeout=600,
    )
    build = tmp_path / "tree"
    shutil.copytree(source_tree, build, symlinks=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(
        PYTHONPATH=str(tools),
        VLLM_TARGET_DEVICE="empty",
        # No Rust toolchain: the optional Rust frontend is skipped, as upstream allows.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
        CARGO="/nonexistent/cargo",
    )
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "bdist_wheel", "-d", str(tmp_path / "dist")],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (built,) = (tmp_path / "dist").glob("*.whl")
    assert built.name.startswith(f"vllm-{target.fork_version}.empty-")
    with zipfile.ZipFile(built) as zf:
        names = set(zf.namelist())
    # Code and tuning tables ship; docs (README.md) stay in the source tree.
    expected = {p for p in plan.overlay_files() if p.endswith((".py", ".json"))}
    assert expected <= names, sorted(expected - names)


def _doc_block(needle: str) -> str:
    """The one shell block of docs/upstream-pr.md that contains `needle`."""
    doc = (REPO / "docs" / "upstream-pr.md").read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", doc, re.S) if needle in b]
    return block


def _run_as_written(block: str, moved: dict[str, str], **kwargs):
    """A doc block run by bash, with the paths in `moved` replaced (each must be
    written in the block)."""
    for written, here in moved.items():
        assert written in block, written
        block = block.replace(written, here)
    return subprocess.run(
        ["bash", "-euc", block], capture_output=True, text=True, **kwargs
    )


# The PR's tests in the documented test plan: a few kernel tests (the whole
# kernel suite runs here under tests/kernels) and every backend check.
TEST_PLAN_SELECTION = "-k 'dispatch or triton_attn_backend'"


def _fresh_venv_with_test_requirements(venv: Path) -> dict[str, str]:
    """A fresh virtual environment that has what the doc installs in it, this
    checkout's test requirements (those of this process, through a .pth file),
    and the environment variables of an activated one."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    (purelib,) = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site_dir,) = venv.glob("lib/python3*/site-packages")
    (site_dir / "test-requirements.pth").write_text(purelib + "\n")
    unset = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (*unset, pins.VERSION_ENV, "PYTEST_ADDOPTS")
    }
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env["PATH"]])
    return env


def test_pr_patch_applies_as_documented(
    pr_patch, upstream_sdist, pristine_tree, target, tmp_path
):
    """docs/upstream-pr.md's commands, run as written (the cache, /tmp/pr and the
    checkout's dist/ moved into this test's folder), patch the unpacked sdist;
    `git am` with the documented option keeps the PR's subject; and the test plan
    runs in the patched tree, in a fresh environment with what the doc installs
    (the PR's backend checks over the installed fork wheel)."""
    if target.version != NEWEST:
        pytest.skip("the documented commands name the newest release")
    proc = _run_as_written(
        _doc_block("git apply"),
        {
            f"~/.cache/vllm-tritonattn/{target.sdist}": str(upstream_sdist),
            "/tmp/pr": str(tmp_path / "pr"),
            f"$PWD/dist/{pr_patch.name}": str(pr_patch),
        },
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tree = tmp_path / "pr" / target.sdist_root
    for rel, local in plan.overlay_files().items():
        assert (tree / rel).read_bytes() == local.read_bytes(), rel
    # The pull request's commit: `git am` with the option the doc names.
    repo = tmp_path / "am" / target.sdist_root
    shutil.copytree(pristine_tree, repo, symlinks=True)
    doc = (REPO / "docs" / "upstream-pr.md").read_text()
    option = re.search(r"`git am (--[\w-]+)`", doc).group(1)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=0"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        done = subprocess.run([*git, *args], cwd=repo, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [*git, "am", option, str(pr_patch)], cwd=repo, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    subject = subprocess.run(
        ["git", "log", "-1", "--format=%s"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    assert subject == source.SUBJECT, subject
    shutil.rmtree(tmp_path / "am")
    # The test plan: the environment the doc makes is this one's, fresh.
    setup = _doc_block("-m venv").strip().splitlines()
    assert setup == [
        "python3 -m venv /tmp/pr/venv && . /tmp/pr/venv/bin/activate",
        "python -m pip install -r requirements-test.txt",
    ]
    env = _fresh_venv_with_test_requirements(tmp_path / "pr" / "venv")
    env["PYTEST_ADDOPTS"] = f"-p no:cacheprovider {TEST_PLAN_SELECTION}"
    proc = _run_as_written(
        _doc_block("pytest"),
        {"/tmp/pr": str(tmp_path / "pr")},
        cwd=REPO,
        env=env,
        timeout=1200,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    kernels, backend = re.findall(r"^=* ?(\d+) passed.*$", proc.stdout, re.M)
    assert int(kernels) > 0, output[-3000:]
    checks = source.PR_TEST_FILES["tests/backend/backend_in_vllm.py"]
    assert int(backend) == len(site_runner.check_names(tree / checks)), output[-3000:]
    # The backend checks ran over the installed vLLM: Python compiled the tree's
    # modules that the kernel tests imported, and none of the tree's vllm/v1.
    assert list((tree / "vllm" / "attention" / "ops").rglob("*.pyc"))
    compiled = sorted((tree / "vllm" / "v1").rglob("*.pyc"))
    assert compiled == [], f"the checks imported the tree's own vllm/: {compiled[:3]}"
