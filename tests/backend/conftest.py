# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the backend tests: a vLLM site to import from, and a runner.

The backend is vLLM code, so its tests import real vLLM 0.26.0 with our overlay
on top. They run ``site_checks.py`` in a subprocess whose ``PYTHONPATH`` is that
site (``tests/conftest.py``'s ``patched_vllm_site`` when the frame provides it;
otherwise a site built here from the bundled wheel's Python files plus this
repository's ``vllm/``). The subprocess keeps vLLM's import-time state (loggers,
platform detection, registries) out of the pytest process.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKS = Path(__file__).with_name("site_checks.py")
WHEEL_DIR = Path.home() / ".cache" / "gpu-bundle" / "wheels"


def _build_site(root: Path) -> Path:
    """Stock vLLM's ``*.py`` from the wheel with this repository's ``vllm/`` over it."""
    wheels = sorted(WHEEL_DIR.glob("vllm-0.26.0-*.whl"))
    if not wheels:
        pytest.skip(
            f"no patched_vllm_site fixture and no vLLM 0.26.0 wheel in {WHEEL_DIR}"
        )
    site = root / "site"
    with zipfile.ZipFile(wheels[0]) as wheel:
        for name in wheel.namelist():
            if name.endswith(".py") or name.startswith("vllm-0.26.0.dist-info/"):
                wheel.extract(name, site)
    shutil.copytree(REPO / "vllm", site / "vllm", dirs_exist_ok=True)
    return site


@pytest.fixture(scope="session")
def vllm_site(request, tmp_path_factory) -> Path:
    try:
        return Path(request.getfixturevalue("patched_vllm_site"))
    except pytest.FixtureLookupError:
        return _build_site(tmp_path_factory.mktemp("backend_vllm_site"))


def run_site_checks(site: Path, *names: str, timeout: int = 600) -> dict[str, dict]:
    """Run checks of ``site_checks.py`` (all if no names) in one subprocess.

    Returns ``{name: {"name", "ok", "detail"}}``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env.setdefault("TRITON_INTERPRET", "1")
    env["VLLM_LOGGING_LEVEL"] = "WARNING"
    proc = subprocess.run(
        [sys.executable, str(CHECKS), *names],
        check=False,  # failures are reported per check below
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CHECK "):
            result = json.loads(line[len("CHECK ") :])
            results[result["name"]] = result
    missing = [n for n in names if n not in results]
    assert results and not missing, (
        f"site_checks.py gave no result for {missing or 'any check'} "
        f"(exit {proc.returncode}).\nstderr tail:\n{proc.stderr[-4000:]}"
    )
    return results


@pytest.fixture(scope="session")
def site_results(vllm_site):
    """All checks of site_checks.py, run once per session (one vLLM import)."""
    return run_site_checks(vllm_site)
