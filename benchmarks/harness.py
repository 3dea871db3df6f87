"""Shared plumbing of the serving, e2e and accuracy harnesses (standard library only).

- ``Backend``: one measured configuration: an install (``stock`` vLLM at
  ``/tmp/site`` or the ``fork`` at ``/tmp/site-fork``, both overridable) and an
  attention backend name. Each backend runs in its own process with its own
  ``PYTHONPATH``.
- Environment facts recorded with every result: GPU, driver, commit, versions.
- ``run_logged``: a subprocess with a hard timeout whose output goes to a log file, and
  whose log tail is printed when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Where the two installs live on the GPU host. Override with --site-stock/--site-fork
# or the environment variables of the same name.
DEFAULT_SITES = {"stock": "/tmp/site", "fork": "/tmp/site-fork"}
SITE_ENV = {"stock": "BENCH_SITE_STOCK", "fork": "BENCH_SITE_FORK"}
BASELINE = "FLASH_ATTN"


@dataclass(frozen=True)
class Backend:
    name: str  # label in tables, e.g. "TRITON_ATTN-fork"
    install: str  # "stock" | "fork"
    attention_backend: str  # vLLM AttentionBackendEnum name

    def site(self, sites: dict[str, str]) -> str:
        return sites[self.install]

    def as_dict(self) -> dict:
        return asdict(self)


# All backends the harnesses know, by label.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("FLASH_ATTN", "stock", "FLASH_ATTN"),
        Backend("TRITON_ATTN-stock", "stock", "TRITON_ATTN"),
        Backend("TRITON_ATTN-fork", "fork", "TRITON_ATTN"),
        Backend("ROCM_ATTN-stock", "stock", "ROCM_ATTN"),
    )
}


def parse_backends(text: str) -> list[Backend]:
    """Comma-separated labels -> backends; unknown labels are an error that lists the
    known ones."""
    out = []
    for label in (s.strip() for s in text.split(",")):
        if not label:
            continue
        if label not in BACKENDS:
            raise SystemExit(f"unknown backend {label!r}; known: {', '.join(BACKENDS)}")
        out.append(BACKENDS[label])
    if not out:
        raise SystemExit("no backends given")
    return out


def resolve_sites(stock: str | None = None, fork: str | None = None) -> dict[str, str]:
    sites = {k: os.environ.get(SITE_ENV[k], v) for k, v in DEFAULT_SITES.items()}
    if stock:
        sites["stock"] = stock
    if fork:
        sites["fork"] = fork
    return sites


def site_problem(backend: Backend, sites: dict[str, str]) -> str | None:
    """Why ``backend``'s install cannot run (printed loudly by the callers, which go
    on with the other backends), or None."""
    site = Path(backend.site(sites))
    if not (site / "vllm" / "__init__.py").is_file():
        return (
            f"{backend.name}: no vLLM at {site} (install {backend.install!r}); "
            f"unpack stock vLLM there or pass --site-{backend.install}"
        )
    return None


def backend_env(backend: Backend, sites: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = backend.site(sites)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def git_commit() -> str:
    env_commit = os.environ.get("BENCH_COMMIT")
    if env_commit:
        return env_commit
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO,
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not sha:
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def gpu_info() -> dict[str, str]:
    try:
        out = (
            subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version",
                    "--format=csv,noheader",
                ],
                check=False,
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.SubprocessError):
        out = []
    if not out:
        return {"gpu": "unknown", "driver": "unknown", "num_gpus": "0"}
    name, _, driver = out[0].partition(",")
    return {"gpu": name.strip(), "driver": driver.strip(), "num_gpus": str(len(out))}


_VERSION_PROBE = (
    "import json, importlib.metadata as m\n"
    "def v(n):\n"
    "    try: return m.version(n)\n"
    "    except Exception: return 'missing'\n"
    "print(json.dumps({n: v(n) for n in ('torch', 'triton', 'vllm', 'transformers')}))"
)


def library_versions(pythonpath: str | None) -> dict[str, str]:
    """Versions seen by a Python process with ``pythonpath`` (no vLLM import: fast)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    try:
        res = subprocess.run(
            [sys.executable, "-c", _VERSION_PROBE],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def environment(pythonpath: str | None = None) -> dict:
    info = {
        "commit": git_commit(),
        "python": sys.version.split()[0],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    info.update(gpu_info())
    info.update(library_versions(pythonpath))
    info["settings"] = run_settings()
    return info


# Environment variables that change what a run does (device choice, vLLM and NCCL
# options): recorded with each result, as the command alone does not say all of it.
RUN_SETTING_PREFIXES = ("VLLM_", "NCCL_", "TORCH_SYMM_MEM_", "CUDA_VISIBLE_DEVICES")


def run_settings() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(RUN_SETTING_PREFIXES)
    }


# What vLLM's JIT monitor (vllm/utils/jit_monitor.py, activated in every worker after
# its warm-up) logs when Triton compiles a kernel while serving: once per kernel and
# process, "Triton kernel JIT compilation during inference: <kernel>. This causes ...".
LATE_JIT_RE = re.compile(
    r"Triton kernel JIT compilation during inference: ([\w.<>]+?)[.(\s]"
)


def late_jit_compiles(lines) -> list[str]:
    """The kernels vLLM's JIT monitor reports as compiled while serving, one entry per
    report (so per kernel and process), in order."""
    return [m.group(1) for line in lines for m in LATE_JIT_RE.finditer(line)]


def late_jit_compiles_in(path: Path) -> list[str]:
    try:
        return late_jit_compiles(path.read_text(errors="replace").splitlines())
    except OSError:
        return []


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


def run_logged(
    cmd: list[str],
    *,
    env: dict[str, str],
    log: Path,
    timeout_s: float,
    what: str,
    cwd: Path | None = None,
) -> int:
    """Run ``cmd`` with output to ``log`` (and echoed live); kill it after
    ``timeout_s``. Returns the exit code (124 on timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"[{what}] $ {shlex.join(cmd)}  (timeout {timeout_s:.0f}s, log {log})",
        flush=True,
    )
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
            print(
                f"[{what}] TIMEOUT after {timeout_s:.0f}s; log tail:\n{tail(log)}",
                flush=True,
            )
            return 124
        reader.join(timeout=10)
        # Engine helper processes may outlive the leader for a moment; the next
        # backend must not start while they still hold GPU memory.
        kill_group(proc)
    if proc.returncode != 0:
        print(
            f"[{what}] FAILED (exit {proc.returncode}); log tail:\n{tail(log)}",
            flush=True,
        )
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
    """End the process group that ``proc`` leads (started with ``start_new_session``):
    SIGTERM, then SIGKILL for whatever lingers after ``grace_s``. Returns once no
    process of the group is left, so the next engine finds the GPU memory free."""
    import signal

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


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def write_json(path: Path, body) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


class Budget:
    """Wall-clock budget of one invocation (``None`` = unlimited): how long the next
    subprocess may run, and whether new work may still start."""

    def __init__(self, seconds: float | None, margin_s: float = 20.0):
        self.t0 = time.monotonic()
        self.seconds = seconds
        self.margin_s = margin_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def remaining(self) -> float:
        if self.seconds is None:
            return float("inf")
        return self.seconds - self.margin_s - self.elapsed()

    def allows(self, needed_s: float = 0.0) -> bool:
        return self.remaining() > needed_s

    def timeout(self, wanted_s: float) -> float:
        return max(1.0, min(wanted_s, self.remaining()))


def gpu_tag() -> str:
    """``-gpu<i>`` when the run is pinned to one GPU of several: two runs side by
    side on a two-GPU host write two result files; no ratio is formed across GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return f"-gpu{visible}" if visible.isdigit() else ""
