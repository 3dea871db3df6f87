"""Shared plumbing of the benchmark scripts (standard library only).

- ``Backend``: one measured configuration: an install (``stock`` vLLM or the ``fork``)
  and an attention backend name.
- ``Install``: how to run one install: a Python executable and, optionally, a site
  directory put first on ``PYTHONPATH``. Given on the command line as
  ``--python stock=/venv-a/bin/python --site fork=/path/to/site`` (both optional; the
  default is the Python running the script with its own environment).
- Provenance recorded with every result: GPU, driver, commit, library versions.
- ``run_logged``: a subprocess in its own process group with a timeout, output to a log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = "FLASH_ATTN"
INSTALLS = ("stock", "fork")
INSTALL_HINT = {
    "fork": "install the fork there with `pip install .` from this repository, or "
    "`python setup.py patch --site-packages DIR` for an existing vLLM 0.33.0 or 0.34.0",
    "stock": "install stock vLLM there with `pip install vllm==0.33.0`",
}


@dataclass(frozen=True)
class Backend:
    name: str  # label in tables, e.g. "TRITON_ATTN-fork"
    install: str  # "stock" | "fork"
    attention_backend: str  # vLLM AttentionBackendEnum name

    def as_dict(self) -> dict:
        return asdict(self)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("FLASH_ATTN", "stock", "FLASH_ATTN"),
        Backend("TRITON_ATTN-fork", "fork", "TRITON_ATTN"),
        Backend("TRITON_ATTN-stock", "stock", "TRITON_ATTN"),
        Backend("ROCM_ATTN-stock", "stock", "ROCM_ATTN"),
    )
}


def pick(kind: str, text: str, known) -> list[str]:
    """Comma-separated names, each one of ``known``; otherwise exit with the list."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    for name in names:
        if name not in known:
            raise SystemExit(f"unknown {kind} {name!r}; valid: {', '.join(known)}")
    if not names:
        raise SystemExit(f"no {kind} given; valid: {', '.join(known)}")
    return names


def parse_backends(text: str) -> list[Backend]:
    return [BACKENDS[n] for n in pick("backend", text, BACKENDS)]


@dataclass(frozen=True)
class Install:
    python: str
    site: str | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.site:
            old = env.get("PYTHONPATH")
            env["PYTHONPATH"] = self.site + (os.pathsep + old if old else "")
        for k in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
            env.setdefault(k, "1")
        return env


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or name not in INSTALLS or not value:
            raise SystemExit(f"{flag} takes INSTALL=PATH with INSTALL in {INSTALLS}")
        out[name] = value
    return out


def parse_installs(pythons: list[str] | None, sites: list[str] | None) -> dict:
    py, site = _pairs(pythons, "--python"), _pairs(sites, "--site")
    return {i: Install(py.get(i, sys.executable), site.get(i)) for i in INSTALLS}


def add_install_args(p) -> None:
    p.add_argument(
        "--python",
        action="append",
        metavar="INSTALL=PATH",
        help="Python executable of an install (stock|fork); default: this Python",
    )
    p.add_argument(
        "--site",
        action="append",
        metavar="INSTALL=DIR",
        help="site directory put first on PYTHONPATH for an install (stock|fork)",
    )


_VERSION_PROBE = (
    "import json, importlib.metadata as m, importlib.util as u\n"
    "def v(n):\n"
    "    try: return m.version(n)\n"
    "    except Exception: return None\n"
    "out = {n: v(n) for n in ('vllm', 'torch', 'triton', 'transformers')}\n"
    "s = u.find_spec('vllm')\n"
    "out['vllm_path'] = s.origin if s else None\n"
    "if s and s.origin and not out['vllm']:  # a site without package metadata\n"
    "    import vllm; out['vllm'] = getattr(vllm, '__version__', None)\n"
    "print(json.dumps(out))"
)


def library_versions(inst: Install | None = None) -> dict:
    """Versions that ``inst``'s Python sees (vLLM is imported only when its package
    metadata is missing)."""
    inst = inst or Install(sys.executable)
    try:
        res = subprocess.run(
            [inst.python, "-c", _VERSION_PROBE],
            env=inst.env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tempfile.gettempdir(),  # not the repository, whose vllm/ is partial
        )
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def require_vllm(name: str, inst: Install) -> dict:
    """``library_versions`` of an install that has vLLM; otherwise exit with one line
    that says how to install it."""
    versions = library_versions(inst)
    if not versions.get("vllm_path"):
        where = inst.python + (f" with PYTHONPATH={inst.site}" if inst.site else "")
        raise SystemExit(
            f"no vLLM for install {name!r} ({where}): {INSTALL_HINT[name]}"
        )
    return versions


def git_commit() -> str:
    """``$BENCH_COMMIT`` when set (the commit of a copied tree, whose own git
    metadata may be missing or stale), else HEAD of this checkout (``-dirty`` with
    uncommitted changes), else unknown."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    return tree_commit(REPO)


def tree_commit(tree: Path) -> str:
    """HEAD of the checkout at ``tree`` (``-dirty`` with uncommitted changes),
    else unknown."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=tree, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + ("-dirty" if dirty else "")) if sha else "unknown"


def gpu_info() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    lines = out.splitlines()
    if not lines:
        return {"gpu": "unknown", "driver": "unknown", "num_gpus": 0}
    name, _, driver = lines[0].partition(",")
    return {"gpu": name.strip(), "driver": driver.strip(), "num_gpus": len(lines)}


# Environment variables that change what a run does; recorded with each result.
RUN_SETTING_PREFIXES = ("VLLM_", "NCCL_", "TORCH_SYMM_MEM_", "CUDA_VISIBLE_DEVICES")


def environment(inst: Install | None = None) -> dict:
    info = {
        "commit": git_commit(),
        "python": sys.version.split()[0],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info.update(gpu_info())
    info.update(library_versions(inst))
    info["settings"] = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(RUN_SETTING_PREFIXES)
    }
    return info


# What vLLM's JIT monitor logs when Triton compiles a kernel while serving.
LATE_JIT_RE = re.compile(
    r"Triton kernel JIT compilation during inference: ([\w.<>]+?)[.(\s]"
)


def late_jit_compiles(lines) -> list[str]:
    """Kernels vLLM's JIT monitor reports as compiled while serving, in order."""
    return [m.group(1) for line in lines for m in LATE_JIT_RE.finditer(line)]


def late_jit_compiles_in(path: Path) -> list[str]:
    try:
        return late_jit_compiles(path.read_text(errors="replace").splitlines())
    except OSError:
        return []


SSE_DONE = "[DONE]"


def sse_event(raw: bytes):
    """One line of an OpenAI-style server-sent event stream: its JSON event,
    ``SSE_DONE`` at the end of the stream, None for a line that carries no data."""
    line = raw.decode(errors="replace").strip()
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    return SSE_DONE if data == SSE_DONE else json.loads(data)


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def run_logged(
    cmd: list[str],
    *,
    env: dict[str, str],
    log: Path,
    timeout_s: float,
    what: str,
    cwd: Path | None = None,
) -> int:
    """Run ``cmd`` with output to ``log`` (and echoed); kill its process group after
    ``timeout_s``. Returns the exit code (124 on timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{what}] $ {shlex.join(cmd)}  (log {log})", flush=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            cwd=cwd,
            start_new_session=True,
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()
                sys.stdout.write(line)
                sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            reader.join(timeout=5)
            print(f"[{what}] TIMEOUT after {timeout_s:.0f}s:\n{tail(log)}", flush=True)
            return 124
        reader.join(timeout=10)
        # Engine helper processes may outlive the leader; free the GPU first.
        kill_group(proc)
    if proc.returncode != 0:
        print(f"[{what}] FAILED (exit {proc.returncode}):\n{tail(log)}", flush=True)
    return proc.returncode


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def kill_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL what lingers; returns once
    the group is gone."""
    pgid = proc.pid
    if proc.poll() is None or _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        if not _wait_group_gone(pgid, grace_s):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            _wait_group_gone(pgid, grace_s)
    proc.wait(timeout=grace_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(cmd: list[str], env, port: int, log: Path, timeout_s: float):
    """Start ``vllm serve`` (own process group, output to ``log``) and wait for
    /health; yields the process, or None if it did not come up (log tail printed)."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=log.parent,  # not the repository, whose vllm/ is partial
        )
        try:
            t0 = time.monotonic()
            while proc.poll() is None and time.monotonic() - t0 < timeout_s:
                try:
                    url = f"http://127.0.0.1:{port}/health"
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        if resp.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                time.sleep(0.5)
            else:
                print(f"server did not come up:\n{tail(log, 80)}", flush=True)
                yield None
                return
            yield proc
        finally:
            kill_group(proc)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def write_json(path: Path, body) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(path)
