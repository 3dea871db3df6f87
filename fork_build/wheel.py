"""Build the fork's wheel by repackaging the pinned upstream vLLM wheel.

The upstream wheel already contains the compiled CUDA extensions for the pinned
torch, so the fork's wheel is that wheel with the fork's changes applied:

* the overlay files and the envs_patch edits (`fork_build.plan`);
* `vllm/_version.py` regenerated with the fork version;
* `vllm-<fork version>.dist-info/` with the upstream METADATA (runtime dependencies
  unchanged) under the new version, and a regenerated RECORD.

Unchanged members are copied as raw compressed bytes (no recompression), so a build
takes seconds although the wheel is ~300 MB.
"""

from __future__ import annotations

import base64
import copy
import csv
import hashlib
import io
import os
import re
import struct
import tempfile
import zipfile
from pathlib import Path

from fork_build import BuildError, pins, plan

UPSTREAM_DIST_INFO = f"vllm-{pins.UPSTREAM_VERSION}.dist-info"
FORK_DIST_INFO = f"vllm-{pins.FORK_VERSION}.dist-info"
GENERATOR = "vllm-tritonattn fork_build"


def wheel_name() -> str:
    tags = pins.UPSTREAM_WHEEL.removesuffix(".whl").split("-", 2)[2]
    return f"vllm-{pins.FORK_VERSION}-{tags}.whl"


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def fork_metadata(upstream_metadata: bytes) -> bytes:
    """Upstream METADATA with the fork version; Requires-Dist stays upstream's."""
    text = upstream_metadata.decode("utf-8")
    pattern = re.compile(r"^Version: .*$", re.M)
    if len(pattern.findall(text)) != 1:
        raise BuildError("upstream METADATA has no single Version: line")
    return pattern.sub(f"Version: {pins.FORK_VERSION}", text, count=1).encode()


def fork_wheel_file(upstream_wheel_file: bytes) -> bytes:
    text = upstream_wheel_file.decode("utf-8")
    text = re.sub(r"^Generator: .*$", f"Generator: {GENERATOR}", text, flags=re.M)
    return text.encode("utf-8")


def _copy_raw(src: zipfile.ZipFile, info: zipfile.ZipInfo, dst: zipfile.ZipFile):
    """Copy one member's compressed bytes from `src` to `dst` without recompressing.

    Uses ZipFile's write-side bookkeeping (`filelist`, `NameToInfo`, `start_dir`,
    `_didModify`), which CPython 3.10-3.13 share; test_wheel checks the result.
    """
    fp = src.fp
    fp.seek(info.header_offset)
    header = fp.read(30)
    if header[:4] != b"PK\x03\x04":
        raise BuildError(f"bad local header for {info.filename} in the upstream wheel")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    fp.seek(info.header_offset + 30 + name_len + extra_len)
    out = copy.copy(info)
    out.flag_bits &= ~0x08  # sizes and CRC go into the local header
    out.extra = b""
    out.header_offset = dst.fp.tell()
    dst.fp.write(out.FileHeader())
    remaining = info.compress_size
    while remaining:
        block = fp.read(min(remaining, 1 << 20))
        if not block:
            raise BuildError(f"upstream wheel truncated in {info.filename}")
        dst.fp.write(block)
        remaining -= len(block)
    dst.filelist.append(out)
    dst.NameToInfo[out.filename] = out
    dst.start_dir = dst.fp.tell()
    dst._didModify = True


def build_wheel(upstream_wheel: Path, out_dir: Path) -> Path:
    """Write the fork's wheel into `out_dir` and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel_name()
    with zipfile.ZipFile(upstream_wheel) as src:
        names = set(src.namelist())

        def read_upstream(path: str) -> bytes | None:
            return src.read(path) if path in names else None

        changes = plan.compute_changes(read_upstream, with_version=True)
        new_content = {c.path: c.new for c in changes}
        upstream_rows = _upstream_record_rows(src)
        record_rows = []
        fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=".vllm-wheel-")
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as dst:
                for info in src.infolist():
                    name = info.filename
                    if name.startswith(UPSTREAM_DIST_INFO + "/"):
                        continue  # rewritten below
                    if name in new_content:
                        _write(dst, name, new_content.pop(name), record_rows, info)
                    else:
                        _copy_raw(src, info, dst)
                        if name not in upstream_rows:
                            raise BuildError(f"{name} is missing in upstream RECORD")
                        record_rows.append(upstream_rows[name])
                for name, data in sorted(new_content.items()):  # added files
                    _write(dst, name, data, record_rows)
                _write_dist_info(src, dst, record_rows)
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, target)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
    return target


def _upstream_record_rows(src: zipfile.ZipFile) -> dict[str, tuple[str, ...]]:
    """RECORD rows of the upstream wheel by member name (their hashes stay valid
    for the members copied unchanged)."""
    text = src.read(f"{UPSTREAM_DIST_INFO}/RECORD").decode("utf-8")
    return {row[0]: tuple(row) for row in csv.reader(io.StringIO(text)) if row}


def _write(dst, name, data, record_rows, like: zipfile.ZipInfo | None = None):
    date_time = like.date_time if like else (2026, 1, 1, 0, 0, 0)
    info = zipfile.ZipInfo(name, date_time=date_time)
    info.external_attr = like.external_attr if like else 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(info, data)
    record_rows.append((name, record_hash(data), str(len(data))))


def _write_dist_info(src, dst, record_rows) -> None:
    prefix = UPSTREAM_DIST_INFO + "/"
    for info in src.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith("/RECORD"):
            continue
        data = src.read(name)
        leaf = name[len(prefix) :]
        if leaf == "METADATA":
            data = fork_metadata(data)
        elif leaf == "WHEEL":
            data = fork_wheel_file(data)
        _write(dst, f"{FORK_DIST_INFO}/{leaf}", data, record_rows, info)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    writer.writerows([*record_rows, (f"{FORK_DIST_INFO}/RECORD", "", "")])
    _write(dst, f"{FORK_DIST_INFO}/RECORD", record.getvalue().encode(), [])


def write_metadata_dir(upstream_wheel: Path, metadata_directory: Path) -> str:
    """PEP 517 prepare_metadata_for_build_wheel: the fork's .dist-info only."""
    target = metadata_directory / FORK_DIST_INFO
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(upstream_wheel) as src:
        for name in src.namelist():
            if not name.startswith(UPSTREAM_DIST_INFO + "/") or name.endswith("RECORD"):
                continue
            leaf = name[len(UPSTREAM_DIST_INFO) + 1 :]
            data = src.read(name)
            if leaf == "METADATA":
                data = fork_metadata(data)
            elif leaf == "WHEEL":
                data = fork_wheel_file(data)
            path = target / leaf
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return FORK_DIST_INFO
