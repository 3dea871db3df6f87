"""benchmarks/gpu/junit_to_json.py: counts of a GPU test run from its junit files."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/gpu/junit_to_json.py"

SAMPLED = """<testsuites><testsuite name="pytest">
<testcase name="a"/><testcase name="b"/>
<testcase name="c"><skipped message="full matrix runs on a GPU"/></testcase>
</testsuite></testsuites>"""
FULL = """<testsuites><testsuite name="pytest">
<testcase name="d"/><testcase name="e"><failure message="boom"/></testcase>
<testcase name="f"><skipped message="e4m3fnuz is the ROCm fp8 format"/></testcase>
<testcase name="g"><skipped message="e4m3fnuz is the ROCm fp8 format"/></testcase>
</testsuite></testsuites>"""


def test_counts_and_failure_exit(tmp_path):
    (tmp_path / "junit-sampled.xml").write_text(SAMPLED)
    (tmp_path / "junit-full.xml").write_text(FULL)
    (tmp_path / "env.json").write_text(json.dumps({"gpu": "X", "torch": "t"}))
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--commit", "abc"],
        capture_output=True,
        text=True,
    )
    record = json.loads(run.stdout)
    assert (record["passed"], record["failed"], record["skipped"]) == (3, 1, 2)
    assert record["commit"] == "abc" and record["gpu"] == "X"
    assert record["runs"]["full_matrix"]["skip_reasons"] == {
        "e4m3fnuz is the ROCm fp8 format": 2
    }
    assert run.returncode == 1, "a failed GPU test must make the script fail"
