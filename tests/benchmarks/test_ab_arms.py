"""ab_arms.py with a stand-in bench (no GPU): arms run interleaved round by round,
each with its own tree and options, a rerun resumes, and the record's summary and
pairing are the medians the docstring names."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kernels" / "ab_arms.py"

# A bench that logs its call and writes one record per point. Its ratio to FA3 (and
# ours' throughput / 100) is the tree's SPEED file times 0.9 with "--slow" among its
# options, times the point's own speed; ours' error is twice FA3's. FA3 does not run
# at the third point. "--fail" makes it exit 1.
FAKE_BENCH = """
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
tree = Path(__file__).resolve().parents[2]
with open(os.environ["AB_LOG"], "a") as f:
    f.write(json.dumps({"tree": tree.name, "argv": argv,
                        "commit": os.environ.get("BENCH_COMMIT")}) + "\\n")
if "--fail" in argv and "--out" not in argv:
    sys.exit(1)
if os.environ.get("AB_NOTE"):
    print("note: torch t and Triton tr come from elsewhere")
speed = float((tree / "SPEED").read_text()) * (0.9 if "--slow" in argv else 1.0)
records = []
for i, point_speed in enumerate((1.0, 0.5, 0.25)):
    no_fa3 = i == 2  # a feature FA3 lacks
    records.append({"kernel": "prefill", "q_len": 512 * (i + 1), "kv_len": 512,
                    "group": 4, "head_size": 128,
                    "ratio_vs_fa3": None if no_fa3 else speed * point_speed,
                    "ours": 100.0 * speed * point_speed,
                    "fa3": None if no_fa3 else 100.0, "unit": "TFLOP/s",
                    "max_abs_err": {"ours": 2e-4, "fa3": None if no_fa3 else 1e-4},
                    "rms_err": {"ours": 3e-5, "fa3": None if no_fa3 else 2e-5},
                    "notes": {"ours": "kernel gluon",
                              "fa3": "failed: no sinks" if no_fa3 else ""}})
if "--ours-fails" in argv:  # a fourth point where ours does not run
    records.append({"kernel": "prefill", "q_len": 4096, "kv_len": 4096, "group": 4,
                    "head_size": 128, "ratio_vs_fa3": None, "ours": None,
                    "fa3": 100.0, "notes": {"ours": "failed: no such config",
                                            "fa3": ""}})
data = {"gpu": "FAKE GPU", "driver": "1", "torch": "t", "triton": "tr",
        "versions": {}, "records": records}
if "--out" in argv:
    Path(argv[argv.index("--out") + 1]).write_text(json.dumps(data))
    if "--fail" in argv:  # a run that dies after writing part of its records
        sys.exit(1)
else:
    folder = Path(argv[argv.index("--results-dir") + 1])
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(data))
"""


def _tree(root: Path, name: str, speed: float) -> Path:
    tree = root / name
    bench = tree / "benchmarks" / "kernels" / "bench_kernels.py"
    bench.parent.mkdir(parents=True)
    bench.write_text(FAKE_BENCH)
    (tree / "SPEED").write_text(str(speed))
    return tree


def _run(tmp_path, *args):
    env = {**os.environ, "AB_LOG": str(tmp_path / "calls.log"), "BENCH_COMMIT": "c0"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--work-dir", str(tmp_path / "work"), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def _calls(tmp_path):
    log = tmp_path / "calls.log"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _run_name(call) -> str:
    """ARM-rN of a logged bench call, from its --out file or --results-dir."""
    argv = call["argv"]
    flag = "--out" if "--out" in argv else "--results-dir"
    return Path(argv[argv.index(flag) + 1]).name.removesuffix(".json")


@pytest.mark.parametrize("matrix", [True, False])
def test_interleaved_runs_summary_and_pairing(tmp_path, matrix):
    a, b = _tree(tmp_path, "a", 1.0), _tree(tmp_path, "b", 1.1)
    out = tmp_path / "ab.json"
    bench = ["--matrix", "full"] if matrix else ["--kernels", "prefill"]
    args = ["--arm", f"new={b}", "--arm", f"old={a}", "--arm", f"slow={b}",
            "--arm-args", "slow=--slow --prefill-config block_n=64",
            "--baseline", "old", "--rounds", "2", "--out", str(out),
            "--", *bench]  # fmt: skip
    res = _run(tmp_path, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = _calls(tmp_path)
    # Round by round, arms in order, then in reverse order; each arm's own options,
    # FA3 in every run.
    assert [_run_name(c) for c in calls] == [
        "new-r1", "old-r1", "slow-r1", "slow-r2", "old-r2", "new-r2",
    ]  # fmt: skip
    calls = calls[:3] + calls[3:][::-1]  # round 2 in round 1's order
    assert [c["tree"] for c in calls] == ["b", "a", "b"] * 2
    assert all("--callers" in c["argv"] and c["commit"] == "c0" for c in calls)
    assert "--slow" in calls[2]["argv"] and "--slow" not in calls[0]["argv"]
    assert all("--slow" not in c["argv"] for c in calls if c["tree"] == "a")
    rec = json.loads(out.read_text())
    assert rec["complete"] and rec["gpu"] == "FAKE GPU"
    s = rec["summary"]
    assert s["old"]["median_ratio_vs_fa3"] == 0.75  # points at 1.0 and 0.5
    assert s["old"]["points_without_fa3"] == 1
    assert (
        s["new"]["worst_ratio_vs_fa3"] == 0.55 and s["new"]["best_ratio_vs_fa3"] == 1.1
    )
    assert s["new"]["runs"] == [1, 2] and s["new"]["points"] == 2
    assert s["slow"]["worst_err_ratio_vs_fa3"] == 2.0
    assert s["slow"]["worst_rms_err_ratio_vs_fa3"] == 1.5
    # The point without FA3 pairs the arms' own throughputs.
    assert rec["paired"]["new/old"] == {
        "points": 3, "median": 1.1, "min": 1.1, "max": 1.1, "faster_points": 3,
        "by_throughput": 1,
    }  # fmt: skip
    (no_fa3,) = [p for p in rec["points"] if p["arm"] == "old" and p["q_len"] == 1536]
    assert no_fa3["median_ratio_vs_fa3"] is None
    assert no_fa3["runs"][0]["notes_fa3"] == "failed: no sinks"
    assert rec["paired"]["slow/old"]["median"] == pytest.approx(0.99)
    assert rec["paired"]["slow/old"]["faster_points"] == 0
    assert rec["arms"]["slow"]["extra_args"] == "--slow --prefill-config block_n=64"

    # A rerun resumes: every run is there, nothing runs again.
    res = _run(tmp_path, *args)
    assert res.returncode == 0, res.stderr
    assert len(_calls(tmp_path)) == 6


def test_a_failed_run_leaves_the_record_incomplete(tmp_path):
    a = _tree(tmp_path, "a", 1.0)
    out = tmp_path / "ab.json"
    res = _run(tmp_path, "--arm", f"ok={a}", "--arm", f"bad={a}",
               "--arm-args", "bad=--fail", "--rounds", "1", "--out", str(out),
               "--", "--matrix", "full")  # fmt: skip
    assert res.returncode == 1
    assert "round 1 bad: FAILED" in res.stdout
    rec = json.loads(out.read_text())
    assert not rec["complete"] and rec["summary"]["bad"] == {
        "points": 0,
        "points_without_fa3": 0,
    }
    assert (tmp_path / "work" / "bad-r1.log").exists()
    # Its partial output is gone: a rerun runs it again (and fails again).
    assert not (tmp_path / "work" / "bad-r1.json").exists()
    _run(tmp_path, "--arm", f"ok={a}", "--arm", f"bad={a}",
         "--arm-args", "bad=--fail", "--rounds", "1", "--out", str(out),
         "--", "--matrix", "full")  # fmt: skip
    assert [c["argv"].count("--fail") for c in _calls(tmp_path)] == [0, 1, 1]


def test_dry_run_prints_the_commands(tmp_path):
    a = _tree(tmp_path, "a", 1.0)
    res = _run(tmp_path, "--arm", f"x={a}", "--rounds", "1", "--stock-site", "/s",
               "--dry-run", "--out", str(tmp_path / "o.json"), "--", "--matrix",
               "full", "--callers", "ours", "fa3", "stock_triton")  # fmt: skip
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.splitlines()
    assert "--stock-site /s" in line and "x-r1.json" in line
    assert line.count("--callers") == 1 and "stock_triton" in line
    assert _calls(tmp_path) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--arm", "x"], "expected NAME=VALUE"),
        (["--arm", "x=.", "--arm", "x=."], "given twice"),
        (["--arm", "x=.", "--arm-args", "y=--slow"], "no such arm"),
        (["--arm", "x=.", "--baseline", "y"], "no such arm"),
        (["--arm", "x=/nonexistent"], "has no benchmarks"),
    ],
)
def test_bad_arms_are_refused(tmp_path, args, message):
    res = _run(tmp_path, *args, "--out", str(tmp_path / "o.json"))
    assert res.returncode != 0 and message in res.stderr


def test_an_arm_commit_given_is_recorded_and_passed_to_its_runs(tmp_path):
    """--arm-commit names the commit of a tree git cannot tell (a git archive):
    the record and that arm's runs ($BENCH_COMMIT) get it; the other arms keep
    $BENCH_COMMIT; an unknown arm name stops the script."""
    a, b = _tree(tmp_path, "a", 1.0), _tree(tmp_path, "b", 1.0)
    out = tmp_path / "ab.json"
    arms = ["--arm", f"main={a}", "--arm", f"exp={b}"]
    res = _run(tmp_path, *arms, "--arm-commit", "exp=abc123", "--rounds", "1",
               "--out", str(out), "--", "--matrix", "full")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(out.read_text())
    assert rec["arms"]["exp"]["commit"] == "abc123"
    assert rec["arms"]["main"]["commit"] == "c0"
    assert {c["tree"]: c["commit"] for c in _calls(tmp_path)} == {
        "a": "c0",
        "b": "abc123",
    }
    res = _run(tmp_path, *arms, "--arm-commit", "other=abc", "--out", str(out),
               "--", "--matrix", "full")  # fmt: skip
    assert res.returncode != 0 and "--arm-commit other: no such arm" in res.stderr


def test_a_point_where_ours_did_not_run_is_listed_with_why(tmp_path):
    """A point where our kernel did not run pairs nothing and counts nowhere, but
    the record lists it, per arm and run, with the bench's note."""
    a = _tree(tmp_path, "a", 1.0)
    out = tmp_path / "ab.json"
    res = _run(tmp_path, "--arm", f"main={a}", "--arm", f"exp={a}",
               "--arm-args", "exp=--ours-fails", "--baseline", "main",
               "--rounds", "1", "--out", str(out),
               "--", "--matrix", "full")  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(out.read_text())
    assert (
        rec["summary"]["exp"]["points"] == 2
    )  # the third has no FA3, the fourth no ours
    assert rec["paired"]["exp/main"]["points"] == 3
    (row,) = rec["not_run"]
    assert (row["arm"], row["run"], row["q_len"]) == ("exp", 1, 4096)
    assert row["notes_ours"] == "failed: no such config"
    assert "not run:" in res.stdout


@pytest.mark.parametrize("note", [True, False])
def test_the_bench_notes_reach_the_output_and_the_record(tmp_path, monkeypatch, note):
    # e.g. that the kernels ran on the host's torch and Triton, not --stock-site's
    a = _tree(tmp_path, "a", 1.0)
    if note:
        monkeypatch.setenv("AB_NOTE", "1")
    r = _run(tmp_path, "--rounds", "2", "--arm", f"a={a}", "--out",
             str(tmp_path / "ab.json"), "--", "--matrix", "full")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rec = json.loads((tmp_path / "ab.json").read_text())
    line = "note: torch t and Triton tr come from elsewhere"
    assert rec["notes"] == ([line] if note else [])
    assert (line in r.stdout.splitlines()) == note
    assert '"triton": "tr"' in r.stdout  # the stack line
