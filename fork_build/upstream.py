"""Locate, download, verify and cache the pinned upstream vLLM files.

A file is taken from, in this order:

1. a path given on the command line (`--upstream-wheel`, `--upstream-sdist`) or as
   a pip config setting (`--config-settings upstream-wheel=PATH`);
2. the environment variables `TRITONATTN_UPSTREAM_WHEEL`, `TRITONATTN_UPSTREAM_SDIST`;
3. the cache directory (`TRITONATTN_CACHE_DIR`, default `~/.cache/vllm-tritonattn`);
4. a download from the package index (`TRITONATTN_INDEX_URL`, default PyPI's simple
   API), unless `TRITONATTN_OFFLINE=1`; the download is stored in the cache.

Whatever the source, the sha256 must match the pin of the target release in
`fork_build.pins`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from fork_build import BuildError, pins

DEFAULT_INDEX_URL = "https://pypi.org/simple"
DOWNLOAD_TIMEOUT_S = 120

# kind -> (command-line option, environment variable)
KINDS = {
    "wheel": ("--upstream-wheel", "TRITONATTN_UPSTREAM_WHEEL"),
    "sdist": ("--upstream-sdist", "TRITONATTN_UPSTREAM_SDIST"),
}
# The PEP 517 backend's name for a local upstream wheel (pip reads only the wheel).
PIP_SETTING = "--config-settings upstream-wheel"


def pinned_file(kind: str, target: pins.Upstream) -> tuple[str, str]:
    """(file name, sha256) of the `kind` file of `target`."""
    if kind == "wheel":
        return target.wheel, target.wheel_sha256
    return target.sdist, target.sdist_sha256


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    return Path(
        os.environ.get("TRITONATTN_CACHE_DIR")
        or Path.home() / ".cache" / "vllm-tritonattn"
    )


def _how_to_supply(kind: str, target: pins.Upstream, pip: bool) -> str:
    """How to hand over a local copy, in the words of the entry point used."""
    option, env = KINDS[kind]
    filename = pinned_file(kind, target)[0]
    command = (
        f"pip install . {PIP_SETTING}=PATH"
        if pip
        else f"python setup.py ... {option} PATH"
    )
    return f"pass a local copy of {filename}: `{command}`, or {env}=PATH"


def _check_hash(path: Path, kind: str, target: pins.Upstream, origin: str) -> None:
    filename, expected = pinned_file(kind, target)
    actual = sha256_of(path)
    if actual != expected:
        raise BuildError(
            f"sha256 mismatch for the upstream {kind} {path} ({origin}): got "
            f"{actual}, expected {expected} (the PyPI file {filename} of vllm "
            f"{target.version}, pinned in fork_build/pins.py). Use the "
            f"unmodified file from PyPI."
        )


def _index_url_of(kind: str, target: pins.Upstream) -> str:
    """Ask the index (PEP 691 JSON) for the download URL of the pinned file."""
    filename, expected = pinned_file(kind, target)
    index = os.environ.get("TRITONATTN_INDEX_URL", DEFAULT_INDEX_URL).rstrip("/")
    request = urllib.request.Request(
        f"{index}/{pins.NAME}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
        listing = json.load(response)
    for entry in listing.get("files", []):
        if entry.get("filename") == filename:
            listed = entry.get("hashes", {}).get("sha256")
            if listed and listed != expected:
                raise BuildError(
                    f"the index {index} lists {filename} with sha256 {listed}, but "
                    f"fork_build/pins.py pins {expected}; refusing to download."
                )
            return entry["url"]
    raise BuildError(f"the index {index} has no file {filename}")


def _download(kind: str, target: pins.Upstream, dest: Path, pip: bool) -> None:
    filename = pinned_file(kind, target)[0]
    try:
        url = _index_url_of(kind, target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{filename}.")
        tmp = Path(tmp_name)
        try:
            with (
                os.fdopen(fd, "wb") as out,
                urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
            ):
                shutil.copyfileobj(response, out, 1 << 20)
            _check_hash(tmp, kind, target, f"downloaded from {url}")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise BuildError(
            f"could not download the upstream {kind} {filename} ({e}). Without "
            f"network access, {_how_to_supply(kind, target, pip)}."
        ) from None


def fetch(
    kind: str,
    target: pins.Upstream,
    explicit: str | os.PathLike | None = None,
    *,
    pip: bool = False,
) -> Path:
    """A verified local path of the `kind` file ("wheel"/"sdist") of `target`.

    `explicit`: the path given on the command line, or by pip's config setting
    (`pip=True`: messages name pip's setting, not setup.py's option).
    """
    option, env = KINDS[kind]
    if pip:
        option = PIP_SETTING
    filename = pinned_file(kind, target)[0]
    for given, origin in ((explicit, option), (os.environ.get(env), env)):
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise BuildError(f"{origin} names {path}, which is not a file")
            _check_hash(path, kind, target, f"given by {origin}")
            return path
    cached = cache_dir() / filename
    if cached.is_file():
        try:
            _check_hash(cached, kind, target, "cached")
            return cached
        except BuildError:
            cached.unlink()  # a broken cache entry is fetched again below
    if os.environ.get("TRITONATTN_OFFLINE", "") not in ("", "0"):
        raise BuildError(
            f"the upstream {kind} {filename} is not in the cache {cache_dir()} and "
            f"TRITONATTN_OFFLINE is set; {_how_to_supply(kind, target, pip)}."
        )
    _download(kind, target, cached, pip)
    return cached
