"""Turn the junit XML of benchmarks/gpu/kernel_tests.sh into the GPU-test record.

    python3 benchmarks/gpu/junit_to_json.py OUTDIR --commit SHA \
        > benchmarks/results/gpu-tests/<date>-<commit>.json

OUTDIR holds env.json, junit-sampled.xml and junit-full.xml (as fetched from the
device call). The record has the keys issue #3 asks for: commit, gpu, torch, triton,
passed, failed, skipped and the skip reasons, per run and in total.
"""

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

RUNS = {
    "sampled": "junit-sampled.xml",
    "full_matrix": "junit-full.xml",
}


def count(path: Path) -> dict:
    """passed / failed / skipped and skip reasons of one junit file."""
    root = ET.parse(path).getroot()
    passed = failed = 0
    reasons: Counter = Counter()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (skip := case.find("skipped")) is not None:
            reasons[skip.get("message", "")] += 1
        else:
            passed += 1
    return {
        "passed": passed,
        "failed": failed,
        "skipped": sum(reasons.values()),
        "skip_reasons": dict(reasons),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", type=Path)
    p.add_argument("--commit", required=True)
    args = p.parse_args(argv)
    runs = {
        name: count(args.outdir / fname)
        for name, fname in RUNS.items()
        if (args.outdir / fname).is_file()
    }
    # The sampled run skips the full-matrix cases (run separately), so its skips
    # are not counted in the total; its passes and failures are.
    record = {
        "commit": args.commit,
        **json.loads((args.outdir / "env.json").read_text()),
        "command": "bash benchmarks/gpu/kernel_tests.sh $OUT",
        "passed": sum(r["passed"] for r in runs.values()),
        "failed": sum(r["failed"] for r in runs.values()),
        "skipped": runs.get("full_matrix", {}).get("skipped", 0),
        "runs": runs,
    }
    json.dump(record, sys.stdout, indent=1)
    print()
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
