"""The anchored edits (envs_patch/) redefine nothing that upstream defines.

An edit that inserts a definition upstream already has (a second `__post_init__`
in a class, a second function of the same name) silently replaces upstream's:
Python keeps the later one, and the file still imports. For every supported
release and every upstream file the fork edits, ruff's F811 (redefinition of an
unused name) runs on the stock and the patched text; the patched file may not have
a redefinition that the stock one does not. The patched text must also compile.
"""

import json
import re
import shutil
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from fork_build import pins, plan

REDEFINED = re.compile(r"^Redefinition of unused `([^`]+)`")


def ruff() -> str:
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not on PATH; install requirements-test.txt")
    return found


def redefinitions(text: str, name: str, out_dir: Path) -> Counter:
    """The names that ruff's F811 finds redefined in `text` (a file called `name`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [ruff(), "check", "--select", "F811", "--no-cache", "--isolated"]
        + ["--output-format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), f"ruff failed on {path}:\n{proc.stderr}"
    names = Counter()
    for finding in json.loads(proc.stdout):
        assert finding["code"] == "F811", finding
        match = REDEFINED.match(finding["message"])
        assert match, f"unexpected F811 message: {finding['message']!r}"
        names[match.group(1)] += 1
    return names


def new_redefinitions(path: str, stock: str, patched: str, tmp: Path) -> list[str]:
    """Names redefined in `patched` more often than in `stock` (not by line)."""
    name = Path(path).name
    before = redefinitions(stock, name, tmp / "stock")
    after = redefinitions(patched, name, tmp / "patched")
    return sorted((after - before).elements())


def patched_text(path: str, stock: str, edits: list[plan.Edit], version: str) -> str:
    new, errors = plan.apply_edits(path, stock, edits, version)
    assert errors == [], errors
    assert new != stock, f"the edits of {path} change nothing"
    return new


def test_a_second_post_init_is_found(tmp_path):
    """The check can fail: an edit that adds a second `__post_init__`."""
    stock = (
        "class Config:\n"
        "    backend: str | None = None\n"
        "\n"
        "    def __post_init__(self) -> None:\n"
        "        self.checked = True\n"
        "\n"
        "    def compute_hash(self) -> str:\n"
        "        return ''\n"
    )
    anchor = "\n    def compute_hash(self) -> str:\n"
    second = plan.Edit(
        "vllm/config/x.py",
        anchor,
        "insert_before",
        "\n    def __post_init__(self) -> None:\n        self.backend = 'env'\n",
        "why",
        "x.toml",
    )
    version = pins.DEFAULT_VERSION
    patched = patched_text("vllm/config/x.py", stock, [second], version)
    compile(patched, "vllm/config/x.py", "exec")  # it compiles: only ruff sees it
    new = new_redefinitions("vllm/config/x.py", stock, patched, tmp_path / "bad")
    assert new == ["__post_init__"]
    # Inserting into upstream's own __post_init__ instead redefines nothing.
    inside = plan.Edit(
        "vllm/config/x.py",
        "    def __post_init__(self) -> None:\n",
        "insert_after",
        "        self.backend = 'env'\n",
        "why",
        "x.toml",
    )
    patched = patched_text("vllm/config/x.py", stock, [inside], version)
    assert new_redefinitions("vllm/config/x.py", stock, patched, tmp_path / "ok") == []


def stock_text(path: str, target, stock_vllm_site: Path, upstream_sdist: Path):
    """Upstream's `path`: build files from the sdist, the rest from the wheel."""
    if path.startswith("vllm/"):
        return (stock_vllm_site / path).read_text(encoding="utf-8")
    with tarfile.open(upstream_sdist, "r:gz") as tar:
        member = tar.extractfile(f"{target.sdist_root}/{path}")
        assert member is not None, path
        return member.read().decode("utf-8")


def test_edits_redefine_nothing(target, stock_vllm_site, upstream_sdist, tmp_path):
    edits = plan.edits_for(target, source=True)
    files = plan.edited_files(target, source=True)
    assert "setup.py" in files and "vllm/config/attention.py" in files
    problems = []
    for i, path in enumerate(files):
        stock = stock_text(path, target, stock_vllm_site, upstream_sdist)
        mine = [e for e in edits if e.file == path]
        patched = patched_text(path, stock, mine, target.version)
        compile(patched, path, "exec")
        new = new_redefinitions(path, stock, patched, tmp_path / str(i))
        if new:
            problems.append(f"vLLM {target.version}, {path}: redefines {new}")
    assert problems == []
