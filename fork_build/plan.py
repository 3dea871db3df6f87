"""What the fork changes in an upstream vLLM tree, computed before anything is written.

`compute_changes(read_upstream)` takes a function that returns the bytes of an
upstream file (or None when the file does not exist) and returns the full list of
`Change`s: overlay files (new, or replacing an upstream file), upstream files kept
under another name (`KEPT_UPSTREAM_FILES`), upstream files edited by the anchored
edits of `envs_patch/`, and optionally a regenerated `vllm/_version.py`. Every
anchor is checked and every new content is computed here, so a caller that gets
the list back can write it without further failures.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fork_build import BuildError, pins

REPO_ROOT = Path(__file__).resolve().parent.parent
EDIT_MODES = ("insert_after", "insert_before", "replace")

# Overlay files that deliberately replace an upstream file of the same path. Any
# other overlay file that exists upstream is an error (an accidental shadowing).
REPLACED_UPSTREAM_FILES = frozenset({"vllm/v1/attention/backends/triton_attn.py"})
# Upstream files that the overlay replaces and the build keeps, unchanged, under
# another path (upstream path -> kept path): stock's Triton backend, on upstream's
# unified-attention kernel, stays importable as `triton_unified_attn` for the
# upstream modules built on its classes (envs_patch/unified_backend.toml points
# them at it). Read from the release being built; nothing of it is in this
# repository.
KEPT_UPSTREAM_FILES = {
    "vllm/v1/attention/backends/triton_attn.py": (
        "vllm/v1/attention/backends/triton_unified_attn.py"
    ),
}
VERSION_FILE = "vllm/_version.py"


@dataclass(frozen=True)
class Edit:
    """One anchored edit of an upstream file, as declared in envs_patch/*.toml."""

    file: str  # path in the vLLM tree, e.g. "vllm/envs.py"
    anchor: str  # text that must occur exactly once in the upstream file
    mode: str  # one of EDIT_MODES
    text: str  # inserted (or replacing) text
    why: str
    source: str  # the .toml file that declares it, for messages
    source_only: bool = False  # a build file: only in source trees, not installs
    # Supported releases the edit does not apply to, each with the reason. Every
    # other supported release must hold the anchor exactly once; a skipped one
    # must not hold it at all (`apply_edits`), so a new release is checked
    # against every edit before it builds.
    skip: tuple[tuple[str, str], ...] = ()

    def applies_to(self, version: str) -> bool:
        return version not in dict(self.skip)


@dataclass(frozen=True)
class Change:
    path: str  # posix path in the vLLM tree, e.g. "vllm/envs.py"
    old: bytes | None  # upstream content, None for a new file
    new: bytes
    kind: str  # "added", "replaced", "kept", "edited" or "version"


def load_edits(root: Path = REPO_ROOT) -> list[Edit]:
    try:
        import tomllib
    except ImportError:
        raise BuildError("the fork's build needs Python 3.11 or newer") from None
    edits = []
    sources = sorted((root / "envs_patch").glob("*.toml"))
    if not sources:
        raise BuildError(f"no envs_patch/*.toml found under {root}")
    for source in sources:
        with open(source, "rb") as f:
            data = tomllib.load(f)
        for i, item in enumerate(data.get("edit", [])):
            where = f"{source.name} edit #{i + 1}"
            modes = [m for m in EDIT_MODES if m in item]
            known = {"file", "anchor", "why", "source_only", "skip", *EDIT_MODES}
            unknown = set(item) - known
            if len(modes) != 1 or unknown or not item.get("file"):
                raise BuildError(
                    f"{where}: needs `file`, `anchor`, `why` and exactly one of "
                    f"{', '.join(EDIT_MODES)} (unknown keys: {sorted(unknown)})"
                )
            if not item.get("anchor"):
                raise BuildError(f"{where}: empty anchor")
            skip = item.get("skip", {})
            if not isinstance(skip, dict) or not all(
                isinstance(why, str) and why.strip() for why in skip.values()
            ):
                raise BuildError(
                    f"{where}: `skip` must map each release it skips to the reason, "
                    f'e.g. skip = {{ "RELEASE" = "the file does not exist there" }}'
                )
            unknown_releases = sorted(set(skip) - set(pins.SUPPORTED))
            if unknown_releases:
                raise BuildError(
                    f"{where}: `skip` names {unknown_releases}, not a supported "
                    f"release (fork_build/pins.py: {pins.supported_text()})"
                )
            edits.append(
                Edit(
                    file=item["file"],
                    anchor=item["anchor"],
                    mode=modes[0],
                    text=item[modes[0]],
                    why=item.get("why", ""),
                    source=source.name,
                    source_only=bool(item.get("source_only", False)),
                    skip=tuple(sorted(skip.items())),
                )
            )
    return edits


def edits_for(
    target: pins.Upstream, root: Path = REPO_ROOT, *, source: bool = False
) -> list[Edit]:
    """The edits that apply to `target` (in an installed tree, or a source tree)."""
    return [
        e
        for e in load_edits(root)
        if e.applies_to(target.version) and (source or not e.source_only)
    ]


def edited_files(
    target: pins.Upstream, root: Path = REPO_ROOT, *, source: bool = False
) -> list[str]:
    """Upstream files the edits change (in an installed tree, or in a source tree)."""
    return sorted({e.file for e in edits_for(target, root, source=source)})


def apply_edits(
    path: str, text: str, edits: list[Edit], version: str
) -> tuple[str, list[str]]:
    """Apply the edits of `path` to `text`; return (new text, error messages).

    Anchors are looked up in the upstream text, never in partly edited text, so the
    order of the edits does not matter and an edit cannot match text inserted by
    another one. Overlapping anchors are an error.
    """
    errors, spans = [], []
    for edit in edits:
        count = text.count(edit.anchor)
        if count != 1:
            first_line = edit.anchor.strip().splitlines()[0]
            problem = "not found" if count == 0 else f"found {count} times"
            errors.append(
                f"vLLM {version}, {path}: anchor {first_line!r} ({edit.source}) "
                f"{problem}; it must occur exactly once. Update the anchor in "
                f"envs_patch/{edit.source}, or add vLLM {version} to the edit's "
                f"`skip` with the reason."
            )
            continue
        start = text.index(edit.anchor)
        spans.append((start, start + len(edit.anchor), edit))
    spans.sort(key=lambda s: s[0])
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            errors.append(
                f"vLLM {version}, {path}: anchors of {a.source} and {b.source} overlap"
            )
    if errors:
        return text, errors
    out, pos = [], 0
    for start, end, edit in spans:
        out.append(text[pos:start])
        if edit.mode == "insert_after":
            out.append(edit.anchor + edit.text)
        elif edit.mode == "insert_before":
            out.append(edit.text + edit.anchor)
        else:
            out.append(edit.text)
        pos = end
    out.append(text[pos:])
    return "".join(out), []


def skipped_anchor_errors(
    read_upstream: Callable[[str], bytes | None],
    target: pins.Upstream,
    root: Path = REPO_ROOT,
    *,
    source: bool = False,
) -> list[str]:
    """The edits that skip `target` although their anchor is in its tree: a skip
    says the edit cannot apply there, so a present anchor means the skip is stale
    (or the edit was never checked against that release)."""
    errors = []
    for edit in load_edits(root):
        if edit.applies_to(target.version) or (edit.source_only and not source):
            continue
        old = read_upstream(edit.file)
        if old is not None and edit.anchor in old.decode("utf-8"):
            first_line = edit.anchor.strip().splitlines()[0]
            why = dict(edit.skip)[target.version]
            errors.append(
                f"vLLM {target.version}, {edit.file}: anchor {first_line!r} "
                f"({edit.source}) is present, but the edit skips {target.version} "
                f"({why!r}); remove {target.version} from its `skip` so it applies, "
                f"or change the anchor."
            )
    return errors


def overlay_files(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Every file under the repository's vllm/ directory, by tree path."""
    base = root / "vllm"
    files = {}
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or path.suffix == ".pyc" or not path.is_file():
            continue
        files[rel.as_posix()] = path
    if not files:
        raise BuildError(f"no overlay files found under {base}")
    return files


def upstream_version_of(version_py: str) -> tuple[str, str | None]:
    """(version, commit id) from the text of an upstream vllm/_version.py."""
    quoted = r"""['"]([^'"]+)['"]"""
    version = re.search(r"^__version__ = version = " + quoted, version_py, re.M)
    commit = re.search(r"^__commit_id__ = commit_id = " + quoted, version_py, re.M)
    if version is None:
        raise BuildError("cannot read __version__ from vllm/_version.py")
    return version.group(1), commit.group(1) if commit else None


def version_file_text(target: pins.Upstream, commit_id: str | None) -> str:
    release = tuple(int(p) for p in target.version.split("."))
    return (
        "# Generated by the vLLM TritonAttn fork build (fork_build/plan.py).\n"
        f"# Upstream vLLM {target.version} plus the TritonAttn overlay.\n"
        "__all__ = [\n"
        '    "__version__",\n'
        '    "__version_tuple__",\n'
        '    "version",\n'
        '    "version_tuple",\n'
        '    "__commit_id__",\n'
        '    "commit_id",\n'
        "]\n\n"
        f"__version__ = version = {target.fork_version!r}\n"
        f"__version_tuple__ = version_tuple = {(*release, pins.FORK_LOCAL)!r}\n"
        f"__commit_id__ = commit_id = {commit_id!r}\n"
    )


def compute_changes(
    read_upstream: Callable[[str], bytes | None],
    target: pins.Upstream,
    *,
    with_version: bool,
    source: bool = False,
    root: Path = REPO_ROOT,
) -> list[Change]:
    """All changes the fork makes to the vLLM `target` tree read by `read_upstream`.

    `source`: the tree is an upstream source tree (sdist), so the edits of build
    files (`source_only = true`, e.g. setup.py) apply too.
    """
    edits = edits_for(target, root, source=source)
    overlay = overlay_files(root)
    changes, errors = [], []
    for path, local in overlay.items():
        old = read_upstream(path)
        if old is not None and path not in REPLACED_UPSTREAM_FILES:
            errors.append(
                f"overlay file {path} would replace the upstream file of the same "
                f"path; if intended, add it to REPLACED_UPSTREAM_FILES in "
                f"fork_build/plan.py"
            )
        kind = "added" if old is None else "replaced"
        changes.append(Change(path, old, local.read_bytes(), kind))
    for upstream_path, path in KEPT_UPSTREAM_FILES.items():
        if upstream_path not in overlay:
            continue
        kept = read_upstream(upstream_path)
        if path in overlay or read_upstream(path) is not None:
            errors.append(f"{path}: the kept copy of {upstream_path} already exists")
        elif kept is None:
            errors.append(
                f"vLLM {target.version}, {upstream_path}: upstream file not found "
                f"(kept as {path})"
            )
        else:
            changes.append(Change(path, None, kept, "kept"))
    errors.extend(skipped_anchor_errors(read_upstream, target, root, source=source))
    for path in sorted({edit.file for edit in edits}):
        if path in overlay:
            errors.append(f"{path} is both an overlay file and edited by envs_patch/")
            continue
        old = read_upstream(path)
        if old is None:
            errors.append(
                f"vLLM {target.version}, {path}: upstream file not found (edited by "
                f"envs_patch/)"
            )
            continue
        new, problems = apply_edits(
            path,
            old.decode("utf-8"),
            [e for e in edits if e.file == path],
            target.version,
        )
        errors.extend(problems)
        changes.append(Change(path, old, new.encode("utf-8"), "edited"))
    if with_version:
        old = read_upstream(VERSION_FILE)
        if old is None:
            errors.append(f"{VERSION_FILE}: upstream file not found")
        else:
            version, commit = upstream_version_of(old.decode("utf-8"))
            if version != target.version:
                errors.append(
                    f"upstream tree is vLLM {version}, not the {target.version} "
                    f"this build targets"
                )
            new = version_file_text(target, commit).encode("utf-8")
            changes.append(Change(VERSION_FILE, old, new, "version"))
    if errors:
        raise BuildError(
            "cannot apply the fork's changes (nothing was written):\n  "
            + "\n  ".join(errors)
        )
    return changes
