"""The repository's own wiring, checked by what it does.

- `.ci/run` runs the README's test command, and that command collects every test
  directory (pytest skips some directory names by default, `build` among them).
- The test requirements resolve from plain PyPI on Python 3.11 and 3.12, together
  with the pinned vLLM wheel, without changing its torch pin, from the packages'
  metadata alone (no wheel is downloaded).
- `import setup` does nothing; the repository is ruff-clean (pyproject's rules)
  and passes every pre-commit hook (`pre-commit run --all-files`).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fork_build import pins, upstream

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements-test.txt"
# Wheels of every Linux x86_64 tag a Python 3.12 host can install.
LINUX_PLATFORMS = [
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)),
]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [line for block in blocks for line in block.strip().splitlines()]


def readme_test_command() -> str:
    (command,) = [c for c in readme_commands() if "pytest" in c]
    return command


def test_ci_runs_the_readme_test_command():
    script = (REPO / ".ci" / "run").read_text()
    match = re.search(r"^TEST_COMMAND='(.*)'$", script, re.M)
    assert match, "TEST_COMMAND not found in .ci/run"
    assert match.group(1) == readme_test_command()


def test_every_test_directory_is_collected():
    """Collect with the README command's pytest arguments; every directory under
    tests/ that holds a test module must contribute tests."""
    pytest_args = readme_test_command().split("pytest", 1)[1].split()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *pytest_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Node ids (`path::test`), or `path: count` lines when pytest is run quieter.
    collected = {
        Path(match.group(1)).parent
        for match in re.finditer(r"^(\S+\.py)(::|: \d+$)", proc.stdout, re.M)
    }
    test_dirs = {
        p.parent.relative_to(REPO)
        for p in (REPO / "tests").rglob("test_*.py")
        if "__pycache__" not in p.parts
    }
    assert test_dirs, "no test modules found"
    assert sorted(map(str, test_dirs - collected)) == []


# A dry run reads each candidate's metadata only: from the index's PEP 658 metadata
# files where it lists them, else (fast-deps) from the wheel's METADATA member by
# HTTP range requests. The pip of requirements-test.txt does not download the
# wheels it resolves (older pips download every one, torch's CUDA libraries
# included: several GB per run).
METADATA_ONLY = "--use-feature=fast-deps"
WHEEL_DOWNLOAD = re.compile(r"^\s*(?:Downloading|Using cached) (\S+\.whl)", re.M)


def _dry_run(tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    report = tmp_path / f"{name}.json"
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--isolated",  # no user pip config: plain PyPI, as on a user's machine
        "--dry-run",
        "--ignore-installed",
        METADATA_ONLY,
        "--progress-bar=off",
        "--report",
        str(report),
        "-r",
        str(REQUIREMENTS),
        *args,
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _output(name: str, proc: subprocess.Popen) -> str:
    """pip's output, once it has resolved from metadata alone."""
    output = proc.communicate(timeout=900)[0]
    downloaded = WHEEL_DOWNLOAD.findall(output)
    assert not downloaded, (
        f"{name}: the dry run downloaded whole wheels {downloaded[:5]}; use the pip "
        "that requirements-test.txt pins"
    )
    return output


def _resolved(tmp_path: Path, name: str, proc: subprocess.Popen) -> dict[str, str]:
    output = _output(name, proc)
    assert proc.returncode == 0, f"{name}: pip could not resolve:\n{output[-4000:]}"
    report = json.loads((tmp_path / f"{name}.json").read_text())
    return {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in report["install"]
    }


def _pinned(requirement: str, lines: list[str]) -> str:
    (pin,) = [
        line.split("==", 1)[1].strip()
        for line in lines
        if re.match(rf"^(Requires-Dist: )?{requirement}==", line)
    ]
    return pin


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_requirements_resolve_from_pypi_with_the_pinned_vllm(tmp_path):
    """One environment for the fork and its tests: pip resolves the test
    requirements and the default release's pinned vLLM wheel together (Python
    3.11, this one), and separately for Python 3.12, from PyPI alone, reading only
    the packages' metadata; torch stays vLLM's pin."""
    assert sys.version_info[:2] >= (3, 11)
    upstream_wheel = upstream.fetch("wheel", pins.upstream(pins.DEFAULT_VERSION))
    procs = {
        "with_vllm": _dry_run(tmp_path, "with_vllm", str(upstream_wheel)),
        "py312": _dry_run(
            tmp_path,
            "py312",
            "--python-version",
            "3.12",
            "--only-binary=:all:",
            "--target",
            str(tmp_path / "py312-target"),
            *(f"--platform={p}" for p in LINUX_PLATFORMS),
        ),
    }
    # The default is the newest release that installs from PyPI: every newer one
    # names why it does not (`pypi_blocker`), and that must still hold; once one
    # resolves, it becomes the default.
    default = pins.SUPPORTED[pins.DEFAULT_VERSION]
    assert default.pypi_blocker is None
    newer = {
        release.version: _dry_run(
            tmp_path, release.version, str(upstream.fetch("wheel", release))
        )
        for release in pins.SUPPORTED.values()
        if _release(release.version) > _release(pins.DEFAULT_VERSION)
    }
    assert all(pins.SUPPORTED[v].pypi_blocker for v in newer), newer
    resolved = {name: _resolved(tmp_path, name, proc) for name, proc in procs.items()}
    for version, proc in newer.items():
        output = _output(version, proc)
        assert proc.returncode != 0, (
            f"vLLM {version} now installs from PyPI: make it DEFAULT_VERSION in "
            "fork_build/pins.py (after its GPU checks)"
        )
        assert "No matching distribution found" in output, output[-4000:]
        blocker = pins.SUPPORTED[version].pypi_blocker
        pinned = re.search(r"requires (\S+==\S+),", blocker)
        assert pinned and pinned.group(1) in output, output[-4000:]
    with zipfile.ZipFile(upstream_wheel) as zf:
        (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        vllm_requires = zf.read(metadata).decode().splitlines()
    torch_pin = _pinned("torch", vllm_requires)
    assert _pinned("torch", REQUIREMENTS.read_text().splitlines()) == torch_pin
    for name, versions in resolved.items():
        assert versions["torch"] == torch_pin, (name, versions["torch"])
        assert versions["triton"] == _pinned(
            "triton", REQUIREMENTS.read_text().splitlines()
        ), (name, versions["triton"])
    (version,) = [v[9:] for v in vllm_requires if v.startswith("Version: ")]
    assert resolved["with_vllm"]["vllm"] == version


# Where each documented build command writes when not told (`--out`, `-w`): a
# directory, except for pr-patch (a file; its default is dist/<name>.patch).
DEFAULT_OUTPUT = {
    "setup.py wheel": "dist",
    "setup.py pr-patch": "dist/vllm-tritonattn.patch",
    "setup.py source-tree": "build",
    "pip wheel": "",  # the working directory: the docs must say -w
}
OUTPUT_OPTION = re.compile(r"(?:--out|-w)[ =](\S+)")


def _documented_commands() -> list[tuple[str, str, str]]:
    """(file, line, command) for every line of a shell block of README.md and
    docs/ that runs a build command of `DEFAULT_OUTPUT` (commented-out ones too),
    and every inline code span that runs one with an output option (a span
    without one names the command in prose)."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        spans = re.findall(r"`([^`\n]+)`", prose)
        lines += [span for span in spans if OUTPUT_OPTION.search(span)]
        for line in lines:
            for command in DEFAULT_OUTPUT:
                if re.search(rf"\b{command}\b", line):
                    found.append((doc.name, line.strip(), command))
    return found


def test_documented_build_commands_leave_the_checkout_clean():
    """Each build command the docs show writes outside the checkout or into a
    folder git ignores (dist/, build/): following the docs leaves no untracked
    file in the checkout."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: git decides what is ignored")
    commands = _documented_commands()
    assert any("pr-patch" in line and "--out" in line for _, line, _ in commands)
    leave_files = []
    for doc, line, command in commands:
        outputs = OUTPUT_OPTION.findall(line)
        written = outputs[-1] if outputs else DEFAULT_OUTPUT[command]
        if written.startswith(("/", "~", "$HOME")):
            continue  # outside the checkout
        written = written.removeprefix("$PWD/")
        if written and command != "setup.py pr-patch":
            written += "/a-file"  # what a command writes into that directory
        ignored = written and subprocess.run(
            ["git", "check-ignore", "-q", "--no-index", written],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
        if not ignored or ignored.returncode != 0:
            leave_files.append(f"{doc}: {line}")
    assert leave_files == []


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
def test_repository_is_ruff_clean(command):
    ruff = shutil.which("ruff")
    assert ruff, "ruff is in requirements-test.txt"
    proc = subprocess.run(
        [ruff, *command, "."],  # ruff skips what .gitignore lists
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pre_commit_hooks_pass_on_every_file():
    """`pre-commit run --all-files`, as a contributor runs it (the hooks install
    from PyPI into pre-commit's cache on first use). A hook that fixes a file
    fails the run; the fixed files are left in the checkout to look at."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: pre-commit lists the files with git")
    pre_commit = shutil.which("pre-commit")
    assert pre_commit, "pre-commit is in requirements-test.txt"
    proc = subprocess.run(
        [pre_commit, "run", "--all-files", "--show-diff-on-failure", "--color=never"],
        cwd=REPO,
        env={**os.environ, "SKIP": ""},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
