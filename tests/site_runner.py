"""Run check functions inside a vLLM site, in a subprocess.

Tests that need real vLLM code (stock vLLM with the fork's changes) keep vLLM out
of the pytest process: vLLM sets loggers, platform and registries at import time.
Their checks are plain functions named ``check_*`` in a module that pytest does
not collect; each returns a JSON-serialisable detail or raises. ``run_checks``
runs some or all of them in one ``python site_runner.py MODULE [NAME ...]``
subprocess whose ``PYTHONPATH`` is the site (then this repository, for helpers
under ``tests/``), and returns ``{name: {"ok": bool, "detail": ...}}``; a failed
check's detail is its traceback. A module may define ``setup()``, called once
before its checks.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

# The checkout: the directory that holds the `tests` package this file is in.
REPO = next(p.parent for p in Path(__file__).resolve().parents if p.name == "tests")
PREFIX = "CHECK "


def check_names(module: Path) -> list[str]:
    """The ``check_*`` functions of ``module``, in file order (read, not imported)."""
    tree = ast.parse(module.read_text())
    return [
        node.name.removeprefix("check_")
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")
    ]


def run_checks(
    site: Path, module: Path, *names: str, timeout: int = 600
) -> dict[str, dict]:
    """Run checks of ``module`` (all if no names) in one subprocess over ``site``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    env.setdefault("TRITON_INTERPRET", "1")
    proc = subprocess.run(
        [sys.executable, __file__, str(module), *names],
        check=False,  # each check reports its own failure below
        env=env,
        cwd=site,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith(PREFIX):
            result = json.loads(line[len(PREFIX) :])
            results[result.pop("name")] = result
    missing = [n for n in names or check_names(module) if n not in results]
    assert not missing, (
        f"{module.name} gave no result for {missing} (exit {proc.returncode}).\n"
        f"stderr tail:\n{proc.stderr[-4000:]}"
    )
    return results


def passed(results: dict[str, dict], name: str):
    """The detail of check ``name``; fails the calling test if the check failed."""
    result = results[name]
    assert result["ok"], f"check {name} failed:\n{result['detail']}"
    return result["detail"]


def _main(module_path: str, names: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("site_checks", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "setup"):
        module.setup()
    failed = 0
    for name in names or check_names(Path(module_path)):
        try:
            detail, ok = getattr(module, f"check_{name}")(), True
        except Exception:  # every failure becomes the check's report
            detail, ok = traceback.format_exc(), False
            failed += 1
        print(PREFIX + json.dumps({"name": name, "ok": ok, "detail": detail}))
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2:]))
