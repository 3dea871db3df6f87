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

GENERATOR = "vllm-tritonattn fork_build"


def upstream_dist_info(target: pins.Upstream) -> str:
    return f"{pins.NAME}-{target.version}.dist-info"


def fork_dist_info(target: pins.Upstream) -> str:
    return f"{pins.NAME}-{target.fork_version}.dist-info"


def wheel_name(target: pins.Upstream) -> str:
    tags = target.wheel.removesuffix(".whl").split("-", 2)[2]
    return f"{pins.NAME}-{target.fork_version}-{tags}.whl"


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def fork_metadata(upstream_metadata: bytes, target: pins.Upstream) -> bytes:
    """Upstream METADATA with the fork version; Requires-Dist stays upstream's."""
    text = upstream_metadata.decode("utf-8")
    pattern = re.compile(r"^Version: .*$", re.M)
    if len(pattern.findall(text)) != 1:
        raise BuildError("upstream METADATA has no single Version: line")
    return pattern.sub(f"Version: {target.fork_version}", text, count=1).encode()


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


def build_wheel(upstream_wheel: Path, out_dir: Path, target: pins.Upstream) -> Path:
    """Write the fork's wheel of vLLM `target` into `out_dir`; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    built = out_dir / wheel_name(target)
    upstream_dist = upstream_dist_info(target)
    with zipfile.ZipFile(upstream_wheel) as src:
        names = set(src.namelist())

        def read_upstream(path: str) -> bytes | None:
            return src.read(path) if path in names else None

        changes = plan.compute_changes(read_upstream, target, with_version=True)
        new_content = {c.path: c.new for c in changes}
        upstream_rows = _upstream_record_rows(src, target)
        record_rows = []
        fd, tmp_name = tempfile.mkstemp(dir=out_dir, prefix=".vllm-wheel-")
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp_name, "w", zipfile.ZIP_DEFLATED) as dst:
                for info in src.infolist():
                    name = info.filename
                    if name.startswith(upstream_dist + "/"):
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
                _write_dist_info(src, dst, record_rows, target)
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, built)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
    return built


def _upstream_record_rows(src: zipfile.ZipFile, target: pins.Upstream):
    """RECORD rows of the upstream wheel by member name (their hashes stay valid
    for the members copied unchanged)."""
    text = src.read(f"{upstream_dist_info(target)}/RECORD").decode("utf-8")
    return {row[0]: tuple(row) for row in csv.reader(io.StringIO(text)) if row}


def _write(dst, name, data, record_rows, like: zipfile.ZipInfo | None = None):
    date_time = like.date_time if like else (2026, 1, 1, 0, 0, 0)
    info = zipfile.ZipInfo(name, date_time=date_time)
    info.external_attr = like.external_attr if like else 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(info, data)
    record_rows.append((name, record_hash(data), str(len(data))))


def _write_dist_info(src, dst, record_rows, target: pins.Upstream) -> None:
    prefix = upstream_dist_info(target) + "/"
    fork_dist = fork_dist_info(target)
    for info in src.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith("/RECORD"):
            continue
        data = src.read(name)
        leaf = name[len(prefix) :]
        if leaf == "METADATA":
            data = fork_metadata(data, target)
        elif leaf == "WHEEL":
            data = fork_wheel_file(data)
        _write(dst, f"{fork_dist}/{leaf}", data, record_rows, info)
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    writer.writerows([*record_rows, (f"{fork_dist}/RECORD", "", "")])
    _write(dst, f"{fork_dist}/RECORD", record.getvalue().encode(), [])


def write_metadata_dir(
    upstream_wheel: Path, metadata_directory: Path, target: pins.Upstream
) -> str:
    """PEP 517 prepare_metadata_for_build_wheel: the fork's .dist-info only."""
    fork_dist = fork_dist_info(target)
    prefix = upstream_dist_info(target) + "/"
    out = metadata_directory / fork_dist
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(upstream_wheel) as src:
        for name in src.namelist():
            if not name.startswith(prefix) or name.endswith("RECORD"):
                continue
            leaf = name[len(prefix) :]
            data = src.read(name)
            if leaf == "METADATA":
                data = fork_metadata(data, target)
            elif leaf == "WHEEL":
                data = fork_wheel_file(data)
            path = out / leaf
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return fork_dist
