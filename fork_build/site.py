"""Patch an installed stock vLLM (a supported release) in place, offline; revert it.

`patch_site(site)` turns the stock vLLM in `site` (a site-packages directory or a
`pip install --target` directory: the one that contains `vllm/`) into the fork:
the same changes as the wheel (`fork_build.plan`) for the release it finds
installed (one of `fork_build.pins.SUPPORTED`), plus the Version in the
dist-info METADATA and the RECORD rows of every changed file, so `pip uninstall`
and `importlib.metadata` stay right.

It is all-or-nothing: every new content is computed and every anchor checked
before the first write; originals go into `<site>/.vllm-tritonattn-backup/` with a
manifest (sha256 before and after) before any file changes, with the bytecode
that pip compiled for the files the fork replaces (moved out of `__pycache__`,
where it would be stale); each file is written to a temporary file and renamed
over the old one; a failure while writing rolls back. `revert_site(site)` restores
the originals and their bytecode byte for byte.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fork_build import BuildError, pins, plan, wheel

BACKUP_DIR = ".vllm-tritonattn-backup"
MANIFEST = "manifest.json"


class ForkWheelInstalled(BuildError):
    """The site holds the fork's own wheel (`pip install .`), not a stock vLLM:
    nothing to patch. Not a failure: `setup.py patch` says so and exits 0."""


@dataclass(frozen=True)
class _FileChange:
    path: str  # relative to the site directory
    old: bytes | None
    new: bytes


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _installed_version(site: Path) -> str:
    if not (site / "vllm" / "__init__.py").is_file():
        raise BuildError(
            f"no vLLM installation in {site}: {site}/vllm/__init__.py is missing. "
            f"Pass the directory that contains the vllm package (a site-packages "
            f"directory or a `pip install --target` directory)."
        )
    version_py = site / plan.VERSION_FILE
    if not version_py.is_file():
        raise BuildError(f"{version_py} is missing; cannot tell the vLLM version")
    return plan.upstream_version_of(version_py.read_text("utf-8"))[0]


def _fork_wheel_release(version: str) -> str | None:
    """The upstream release of a version that the fork's wheel carries (`X+tritonattn.N`
    -> `X`); None for any other version."""
    release, plus, local = version.partition("+")
    fork = pins.FORK_LOCAL.split(".")[0]
    return release if plus and local.split(".")[0] == fork else None


def _fork_wheel_text(site: Path, version: str) -> str:
    return (
        f"{site} holds vLLM {version}, the fork's own wheel as `pip install .` "
        f"installs it"
    )


def _stock_reinstall(release: str) -> str:
    """The pip command that puts stock vLLM `release` over the fork's wheel (whose
    version satisfies a plain `vllm==release`, so pip would keep it)."""
    return f"pip install --force-reinstall --no-deps vllm=={release}"


def _dist_info(site: Path) -> Path | None:
    found = sorted(site.glob("vllm-*.dist-info"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise BuildError(f"several vLLM dist-info directories in {site}: {names}")
    return found[0] if found else None


def _dist_info_changes(
    dist_info: Path, changes: list[_FileChange], site: Path, target: pins.Upstream
):
    """METADATA with the fork version, RECORD with rows for every changed file."""
    out = []
    metadata = dist_info / "METADATA"
    if metadata.is_file():
        old = metadata.read_bytes()
        new = wheel.fork_metadata(old, target)
        out.append(_FileChange(_rel(metadata, site), old, new))
    record = dist_info / "RECORD"
    if record.is_file():
        old = record.read_bytes()
        rows = [row for row in csv.reader(io.StringIO(old.decode("utf-8"))) if row]
        index = {row[0]: i for i, row in enumerate(rows)}
        for change in [*changes, *out]:
            row = [change.path, wheel.record_hash(change.new), str(len(change.new))]
            if change.path in index:
                rows[index[change.path]] = row
            else:
                rows.insert(len(rows) - 1, row)  # RECORD's own row stays last
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        out.append(_FileChange(_rel(record, site), old, text.getvalue().encode()))
    return out


def _rel(path: Path, site: Path) -> str:
    return path.relative_to(site).as_posix()


def _check_against_record(dist_info, changes: list[_FileChange], site, version: str):
    """Refuse to patch files that differ from what the wheel installed."""
    if dist_info is None or not (dist_info / "RECORD").is_file():
        return
    text = (dist_info / "RECORD").read_text("utf-8")
    recorded = {row[0]: row[1] for row in csv.reader(io.StringIO(text)) if row}
    modified = [
        c.path
        for c in changes
        if c.old is not None
        and recorded.get(c.path, "").startswith("sha256=")
        and recorded[c.path] != wheel.record_hash(c.old)
    ]
    if modified:
        raise BuildError(
            f"these files in {site} differ from the vLLM {version} wheel (RECORD "
            f"hash), so they are not patched: {', '.join(modified)}. Reinstall "
            f"stock vllm=={version} first."
        )


def plan_site(site: Path) -> tuple[pins.Upstream, list[_FileChange]]:
    """The release in `site` and every change for it; raises before any write."""
    site = Path(site).resolve()
    if (site / BACKUP_DIR).exists():
        raise BuildError(
            f"{site} is already patched (found {site / BACKUP_DIR}); use --revert "
            f"first."
        )
    version = _installed_version(site)
    release = _fork_wheel_release(version)
    if release in pins.SUPPORTED:
        raise ForkWheelInstalled(
            f"{_fork_wheel_text(site, version)}: the TritonAttn backend is already "
            f"there, so there is nothing to patch (`pip install .` again updates "
            f"it). To patch a stock vLLM in place instead, which --revert undoes, "
            f"install it first (`{_stock_reinstall(release)}`), then run this again."
        )
    if version not in pins.SUPPORTED:
        hint = (
            "install one of those there first"
            if release is None
            else f"it holds the fork's wheel of vLLM {release}, a release this "
            f"checkout does not build; `pip install .` replaces it with the fork "
            f"of vLLM {pins.DEFAULT_VERSION}"
        )
        raise BuildError(
            f"{site} holds vLLM {version}; this fork patches vLLM "
            f"{pins.supported_text()} ({hint})."
        )
    target = pins.SUPPORTED[version]
    dist_info = _dist_info(site)

    def read_upstream(path: str) -> bytes | None:
        file = site / path
        return file.read_bytes() if file.is_file() else None

    changes = [
        _FileChange(c.path, c.old, c.new)
        for c in plan.compute_changes(read_upstream, target, with_version=True)
    ]
    _check_against_record(dist_info, changes, site, version)
    if dist_info is not None:
        changes += _dist_info_changes(dist_info, changes, site, target)
    return target, changes


def _bytecode_of(site: Path, rel: str) -> list[str]:
    """The compiled files of the module `rel` (a .py path) in `site`."""
    file = site / rel
    if file.suffix != ".py":
        return []
    return sorted(
        _rel(pyc, site)
        for pyc in (file.parent / "__pycache__").glob(f"{file.stem}.*.pyc")
    )


def _atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def patch_site(site: Path) -> list[str]:
    """Patch `site` in place; returns the changed paths."""
    site = Path(site).resolve()
    target, changes = plan_site(site)
    created_dirs = sorted(
        {
            _rel(parent, site)
            for c in changes
            if c.old is None
            for parent in (site / c.path).parents
            if parent != site and site in parent.parents and not parent.exists()
        }
    )
    bytecode = [
        pyc for c in changes if c.old is not None for pyc in _bytecode_of(site, c.path)
    ]
    manifest = {
        "fork_version": target.fork_version,
        "upstream_version": target.version,
        "created_dirs": created_dirs,
        "bytecode": bytecode,
        "files": [
            {
                "path": c.path,
                "action": "added" if c.old is None else "modified",
                "sha256_before": None if c.old is None else _sha256(c.old),
                "sha256_after": _sha256(c.new),
            }
            for c in changes
        ],
    }
    # 1. The backup with its manifest, staged and then renamed into place.
    staging = Path(tempfile.mkdtemp(dir=site, prefix=BACKUP_DIR + ".tmp-"))
    try:
        for c in changes:
            if c.old is not None:
                dest = staging / "files" / c.path
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(site / c.path, dest)
        for pyc in bytecode:
            dest = staging / "bytecode" / pyc
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(site / pyc, dest)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(staging, site / BACKUP_DIR)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # 2. The new files; on any failure put the originals back.
    try:
        for pyc in bytecode:
            (site / pyc).unlink()
        for c in changes:
            target = site / c.path
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
            _atomic_write(target, c.new, mode)
    except BaseException:
        revert_site(site, allow_partial=True)
        raise
    return [c.path for c in changes]


def revert_site(site: Path, *, allow_partial: bool = False) -> list[str]:
    """Restore the files that `patch_site` changed, byte for byte."""
    site = Path(site).resolve()
    backup = site / BACKUP_DIR
    if not (backup / MANIFEST).is_file():
        try:
            version = _installed_version(site)
        except BuildError:
            version = ""
        release = _fork_wheel_release(version)
        note = (
            f" {_fork_wheel_text(site, version)}, not a patch: "
            f"`{_stock_reinstall(release)}` puts stock vLLM back."
            if release
            else ""
        )
        raise BuildError(
            f"{site} is not patched by the fork (no {BACKUP_DIR}/{MANIFEST}); "
            f"nothing to revert.{note}"
        )
    manifest = json.loads((backup / MANIFEST).read_text())
    entries = manifest["files"]
    changed_since = []
    for entry in entries:
        file = site / entry["path"]
        current = _sha256(file.read_bytes()) if file.is_file() else None
        if current not in (entry["sha256_after"], entry["sha256_before"]):
            changed_since.append(entry["path"])
    if changed_since and not allow_partial:
        raise BuildError(
            f"these patched files in {site} changed after patching, so revert would "
            f"lose those changes: {', '.join(changed_since)}. Restore them (or "
            f"reinstall stock vLLM and delete {backup})."
        )
    for entry in entries:
        file = site / entry["path"]
        if entry["action"] == "modified":
            original = backup / "files" / entry["path"]
            fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
            os.close(fd)
            shutil.copy2(original, tmp)
            os.replace(tmp, file)
        else:
            file.unlink(missing_ok=True)
        # Bytecode compiled from the fork's version of the file goes too.
        if file.suffix == ".py":
            for pyc in (file.parent / "__pycache__").glob(f"{file.stem}.*.pyc"):
                pyc.unlink()
    for pyc in manifest.get("bytecode", []):
        if not (site / pyc).exists():
            shutil.copy2(backup / "bytecode" / pyc, site / pyc)
    for rel in sorted(manifest["created_dirs"], key=lambda d: -d.count("/")):
        directory = site / rel
        shutil.rmtree(directory / "__pycache__", ignore_errors=True)
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    shutil.rmtree(backup)
    return [entry["path"] for entry in entries]


def describe(site: Path) -> str:
    """One line on the state of `site`, for `setup.py patch --status`."""
    site = Path(site).resolve()
    if (site / BACKUP_DIR / MANIFEST).is_file():
        manifest = json.loads((site / BACKUP_DIR / MANIFEST).read_text())
        return f"{site}: patched to {manifest['fork_version']}"
    version = _installed_version(site)
    if version in pins.SUPPORTED:
        return f"{site}: vLLM {version} (stock; can be patched)"
    if _fork_wheel_release(version) is not None:
        return (
            f"{site}: vLLM {version} (the fork's own wheel, as `pip install .` "
            f"installs it; nothing to patch)"
        )
    return f"{site}: vLLM {version}"
