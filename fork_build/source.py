"""Source outputs: the upstream PR patch and the patched source tree (ROCm builds).

Both start from the pinned upstream sdist (`fork_build.upstream.fetch("sdist")`)
and apply the same changes as the wheel (`fork_build.plan`), without the fork's
`vllm/_version.py` (an upstream PR keeps upstream's version; a source build gets
its version from PKG-INFO, which the tree writer sets to the fork version).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from fork_build import BuildError, pins, plan

AUTHOR = "vLLM TritonAttn fork <vllm-tritonattn@users.noreply.github.com>"
SUBJECT = (
    "[Kernel][Attention] Faster Triton attention backend (TRITON_ATTN), "
    "VLLM_ATTENTION_BACKEND"
)


def patch_name(target: pins.Upstream) -> str:
    return f"{pins.NAME}-{target.version}-tritonattn.patch"


def tree_name(target: pins.Upstream) -> str:
    return f"{pins.NAME}-{target.fork_version}"


@contextlib.contextmanager
def _sdist_reader(sdist: Path, target: pins.Upstream):
    """A reader of the sdist's files by tree path (None for a missing file), valid
    inside the ``with`` block."""
    with tarfile.open(sdist, "r:gz") as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}

        def read_upstream(path: str) -> bytes | None:
            member = members.get(f"{target.sdist_root}/{path}")
            if member is None:
                return None
            f = tar.extractfile(member)
            assert f is not None
            return f.read()

        yield read_upstream


def sdist_changes(
    sdist: Path, target: pins.Upstream, *, with_tests: bool = False
) -> list[plan.Change]:
    """The fork's changes against the files of the upstream sdist of `target`;
    `with_tests`: also the fork's tests, placed in upstream's test tree."""
    with _sdist_reader(sdist, target) as read_upstream:
        changes = plan.compute_changes(
            read_upstream, target, with_version=False, source=True
        )
        if with_tests:
            changes += pr_test_changes(read_upstream)
    return changes


# ---------------------------------------------------------------- the PR patch


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _text_lines(change: plan.Change, data: bytes | None) -> list[str]:
    if data is None:
        return []
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        raise BuildError(f"{change.path} is not UTF-8 text (PR patch)") from None


def file_diff(change: plan.Change) -> str:
    """One file's diff in `git diff` format (a/ b/ paths, new files included)."""
    path = change.path
    old_id, new_id = _blob_id(change.old or b""), _blob_id(change.new)
    out = [f"diff --git a/{path} b/{path}\n"]
    if change.old is None:
        out += ["new file mode 100644\n", f"index 0000000..{new_id[:7]}\n"]
        out += ["--- /dev/null\n", f"+++ b/{path}\n"]
    else:
        out += [f"index {old_id[:7]}..{new_id[:7]}\n"]  # mode unchanged
        out += [f"--- a/{path}\n", f"+++ b/{path}\n"]
    old_lines = _text_lines(change, change.old)
    new_lines = _text_lines(change, change.new)
    diff = difflib.unified_diff(old_lines, new_lines, n=3)
    for i, line in enumerate(diff):
        if i < 2:  # difflib's own ---/+++ lines
            continue
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def patch_text(changes: list[plan.Change], target: pins.Upstream) -> str:
    changes = sorted(changes, key=lambda c: c.path)
    body = [f"Changes against vLLM {target.version} (docs/upstream-pr.md):", ""]
    for c in changes:
        body.append(f"  {c.kind:8} {c.path}")
    header = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: {AUTHOR}\n"
        f"Subject: [PATCH] {SUBJECT}\n\n" + "\n".join(body) + "\n---\n\n"
    )
    return header + "".join(file_diff(c) for c in changes) + "-- \n"


# The fork's tests, placed where upstream keeps its own, so a reviewer runs them
# with upstream's pytest: kernel tests beside upstream's attention kernel tests,
# the backend checks beside upstream's backend tests (run in a subprocess over the
# installed vLLM by the runner, as in this repository).
KERNEL_TESTS = "tests/kernels/attention/triton_attn"
BACKEND_TESTS = "tests/v1/attention"
PR_TEST_FILES = {  # repository path -> path in the upstream tree
    "tests/site_runner.py": f"{BACKEND_TESTS}/triton_attn_site_runner.py",
    "tests/backend/backend_in_vllm.py": f"{BACKEND_TESTS}/triton_attn_checks.py",
}
BACKEND_TEST_MODULE = '''# SPDX-License-Identifier: Apache-2.0
"""TRITON_ATTN inside the installed vLLM: each check of triton_attn_checks.py,
all run in one subprocess (vLLM's import-time state stays out of pytest).

The installed vLLM is the one Python finds outside this source tree: run from the
tree's root, as `python -m pytest` is, an `import vllm` here would find the
tree's own `vllm/`, which is not built.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.v1.attention.triton_attn_site_runner import (
    check_names,
    passed,
    run_checks,
)

CHECKS = Path(__file__).with_name("triton_attn_checks.py")
FIND_VLLM = "import importlib.util as u; s = u.find_spec('vllm'); print(s and s.origin)"


def installed_vllm() -> Path:
    """The directory that holds the installed vllm package."""
    proc = subprocess.run(
        # -P: without the working directory (this tree, whose vllm/ is not built)
        [sys.executable, "-P", "-c", FIND_VLLM],
        capture_output=True,
        text=True,
        timeout=60,
    )
    origin = proc.stdout.strip()
    if proc.returncode != 0 or origin in ("", "None"):
        pytest.fail(f"no installed vLLM to check (install it first): {proc.stderr}")
    return Path(origin).resolve().parent.parent


@pytest.fixture(scope="module")
def results():
    return run_checks(installed_vllm(), CHECKS)


@pytest.mark.parametrize("name", check_names(CHECKS))
def test_triton_attn_backend(results, name):
    passed(results, name)
'''


def pr_test_changes(read_upstream, root: Path = plan.REPO_ROOT) -> list[plan.Change]:
    """The fork's kernel and backend tests as new files of the upstream tree."""
    files = {
        f"tests/kernels/{p.name}": f"{KERNEL_TESTS}/{p.name}"
        for p in sorted((root / "tests" / "kernels").glob("*.py"))
    }
    files.update(PR_TEST_FILES)
    kernel_package = KERNEL_TESTS.replace("/", ".")
    runner_module = PR_TEST_FILES["tests/site_runner.py"][:-3].replace("/", ".")
    added = {f"{KERNEL_TESTS}/__init__.py": b""}
    for ours, theirs in files.items():
        text = (root / ours).read_text("utf-8")
        text = text.replace("tests.kernels.", f"{kernel_package}.")
        text = text.replace("tests.site_runner", runner_module)
        added[theirs] = text.encode("utf-8")
    added[f"{BACKEND_TESTS}/test_triton_attn_backend.py"] = BACKEND_TEST_MODULE.encode()
    clashes = [path for path in added if read_upstream(path) is not None]
    if clashes:
        raise BuildError(f"the fork's tests would replace upstream files: {clashes}")
    return [plan.Change(path, None, data, "added") for path, data in added.items()]


def write_pr_patch(sdist: Path, out: Path, target: pins.Upstream) -> Path:
    text = patch_text(sdist_changes(sdist, target, with_tests=True), target)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


# ------------------------------------------------------- the patched source tree


def _pkg_info_with_fork_version(data: bytes, target: pins.Upstream) -> bytes:
    text = data.decode("utf-8")
    pattern = re.compile(r"^Version: .*$", re.M)
    if len(pattern.findall(text)) != 1:
        raise BuildError("upstream PKG-INFO has no single Version: line")
    return pattern.sub(f"Version: {target.fork_version}", text, count=1).encode()


def write_source_tree(
    sdist: Path, out_dir: Path, target: pins.Upstream, root: Path = plan.REPO_ROOT
) -> Path:
    """Write the patched upstream source tree to `out_dir/vllm-<fork version>`.

    setuptools-scm takes the version from PKG-INFO in a tree without git, so the
    tree's PKG-INFO carries the fork version; upstream's setup.py then appends its
    device suffix (e.g. `+tritonattn.1.rocm711`).
    """
    name = tree_name(target)
    written = out_dir / name
    if written.exists():
        raise BuildError(f"{written} exists; remove it or choose another --out")
    changes = sdist_changes(sdist, target)  # every anchor checked before any write
    requirements = root / "requirements-rocm.txt"
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{name}.tmp-"))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            tar.extractall(staging, filter="data")
        tree = staging / target.sdist_root
        for c in changes:
            path = tree / c.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(c.new)
        pkg_info = tree / "PKG-INFO"
        pkg_info.write_bytes(_pkg_info_with_fork_version(pkg_info.read_bytes(), target))
        shutil.copy2(requirements, tree / "requirements-rocm.txt")
        os.replace(tree, written)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
