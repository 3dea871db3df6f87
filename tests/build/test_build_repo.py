"""Repository wiring: README's two commands, .ci/run, pyproject, lint of the frame."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRAME_FILES = ["setup.py", "fork_build", "tests/conftest.py", "tests/build"]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [line for block in blocks for line in block.strip().splitlines()]


def test_readme_has_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    install, tests = commands
    assert install.startswith("pip install . && vllm serve ")
    assert "--attention-backend TRITON_ATTN" in install
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    script = (REPO / ".ci" / "run").read_text()
    match = re.search(r"^TEST_COMMAND='(.*)'$", script, re.M)
    assert match, "TEST_COMMAND not found in .ci/run"
    assert match.group(1) == readme_commands()[1]
    assert '"$rc" -eq 5' in script  # no tests collected is a failure


def test_readme_links_exist():
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)]+)\)", text)
    for name in ("kernels", "performance", "install", "rocm", "upstream-pr", "design"):
        assert f"docs/{name}.md" in links
    assert [link for link in links if not (REPO / link).is_file()] == []


def test_pyproject_backend_and_tools():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    system = config["build-system"]
    assert system == {
        "requires": [],
        "build-backend": "fork_build.backend",
        "backend-path": ["."],
    }
    assert config["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    ruff = config["tool"]["ruff"]
    assert "exclude" not in ruff and "extend-exclude" not in ruff


def test_gitignore_keeps_bundle_and_build_outputs_out():
    ignored = (REPO / ".gitignore").read_text().split()
    assert {".bundle/", "/dist/", "/build/", "__pycache__/"} <= set(ignored)
    tracked = subprocess.run(
        ["git", "check-ignore", "-q", "tests/build/test_build_repo.py"], cwd=REPO
    )
    assert tracked.returncode == 1  # tests/build/ is not ignored


def test_importing_setup_py_does_nothing():
    proc = subprocess.run(
        [sys.executable, "-c", "import setup"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_frame_files_are_ruff_clean(command):
    ruff = shutil.which("ruff")
    assert ruff, "ruff is in requirements-test.txt"
    proc = subprocess.run(
        [ruff, *command, *FRAME_FILES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
