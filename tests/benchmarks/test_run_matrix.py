"""benchmarks/run_matrix.py against the fake vLLM CLI (tests/benchmarks/fake_site):
order of the runs, prompts per pass, resume, refusals and the record it writes."""

import json
import statistics
from pathlib import Path

import pytest

from benchmarks import run_matrix
from benchmarks.run_matrix import summarize

BACKENDS = "FLASH_ATTN,TRITON_ATTN-fork"


@pytest.fixture
def fake_cli(tmp_path, monkeypatch, site_args):
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))

    def run(
        kind, *extra, runs=3, workloads="sharegpt-like,random-10k-100", count=("4",)
    ):
        out = tmp_path / f"{kind}.json"
        argv = [
            kind,
            "--model", "llama-3.1-8b",
            "--backends", BACKENDS,
            "--workloads", workloads,
            "--runs", str(runs),
            *(["--num-prompts", *count] if count else []),
            *site_args,
            "--work-dir", str(tmp_path / "work"),
            "--out", str(out),
            *extra,
        ]  # fmt: skip
        rc = run_matrix.main(argv)
        lines = log.read_text().splitlines() if log.exists() else []
        calls = [json.loads(x) for x in lines]
        return rc, json.loads(out.read_text()), calls

    return run


def _arg(argv, name):
    return argv[argv.index(name) + 1]


def test_e2e_record_format_and_summary(fake_cli):
    rc, body, _ = fake_cli("e2e")
    for key in ("commit", "gpu", "driver", "versions", "command", "records"):
        assert key in body
    assert set(body["versions"]) == {"stock", "fork"}
    assert body["versions"]["fork"]["vllm"] == "0.0.fake"
    rec = body["records"][0]
    assert {
        "model", "workload", "backend", "install", "kv_cache_dtype", "pass", "run",
        "total_tok_per_s",
    } <= set(rec)  # fmt: skip
    assert {r["install"] for r in body["records"]} == {"stock", "fork"}
    assert len(body["records"]) == 3 * 2 * 2 * 2
    assert len(body["summary"]) == 2 * 2  # workloads x passes, one non-baseline
    for s in body["summary"]:
        ratios = []
        for run in range(3):
            tput = {
                r["backend"]: r["total_tok_per_s"]
                for r in body["records"]
                if (r["workload"], r["pass"], r["run"])
                == (s["workload"], s["pass"], run)
            }
            ratios.append(tput["TRITON_ATTN-fork"] / tput["FLASH_ATTN"])
        assert s["runs"] == 3
        assert s["median_ratio_to_flash_attn"] == round(statistics.median(ratios), 4)
        assert (s["min_ratio"], s["max_ratio"]) == (
            round(min(ratios), 4),
            round(max(ratios), 4),
        )
        assert s["min_ratio"] <= s["median_ratio_to_flash_attn"] <= s["max_ratio"]


def test_rerun_resumes_and_a_failed_step_is_rerun(fake_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "TRITON_ATTN")
    rc, body, _ = fake_cli("e2e", workloads="decode-1k-1k")
    assert rc == 1  # incomplete
    assert {r["backend"] for r in body["records"]} == {"FLASH_ATTN"}
    monkeypatch.delenv("FAKE_VLLM_FAIL")
    before = {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)}
    assert len(before) == 3  # FLASH_ATTN's engines
    rc, body, _ = fake_cli("e2e", workloads="decode-1k-1k")
    assert rc == 0 and len(body["records"]) == 3 * 2 * 2
    after = {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)}
    assert {f: after[f] for f in before} == before  # not run again
    assert sorted(set(after) - set(before)) == [
        f"e2e-TRITON_ATTN-fork-s{1000 + 4 * run}.json" for run in range(3)
    ]


def test_collect_writes_the_record_from_outputs_without_vllm(
    fake_cli, monkeypatch, tmp_path
):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "TRITON_ATTN")
    rc, partial, _ = fake_cli("e2e", workloads="decode-1k-1k")
    assert rc == 1 and partial["complete"] is False
    outputs = {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)}
    (prov,) = (tmp_path / "work").glob("*/provenance.json")
    assert json.loads(prov.read_text())["versions"] == partial["versions"]
    # Collect: no vLLM in either install, nothing runs, the same record comes out.
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("FAKE_VLLM_FAIL")
    argv = [
        "e2e", "--model", "llama-3.1-8b", "--workloads", "decode-1k-1k",
        "--backends", BACKENDS, "--num-prompts", "4", "--collect",
        "--site", f"stock={empty}", "--site", f"fork={empty}",
        "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "c.json"),
    ]  # fmt: skip
    assert run_matrix.main(argv) == 1
    assert {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)} == outputs
    assert not any("TRITON_ATTN-fork" in f for f in outputs)  # its engines failed
    body = json.loads((tmp_path / "c.json").read_text())
    assert body["complete"] is False and "--collect" in body["collected_by"]
    for key in ("records", "versions", "gpu", "commit", "command"):
        assert body[key] == partial[key]
    prov.unlink()  # outputs without provenance: said so, not guessed
    assert run_matrix.main(argv) == 1
    body = json.loads((tmp_path / "c.json").read_text())
    assert body["gpu"] == body["versions"] == "unknown"
    assert len(body["records"]) == len(partial["records"])


def _e2e_outputs(tmp_path) -> list[dict]:
    files = (tmp_path / "work").glob("*/e2e-*.json")
    outs = [json.loads(f.read_text()) | {"file": f.name} for f in files]
    return sorted((o for o in outs if "results" in o), key=lambda o: o["started_at"])


def test_e2e_one_engine_per_backend_and_run(fake_cli, tmp_path):
    rc, body, calls = fake_cli("e2e")
    assert rc == 0 and calls == []  # no CLI: vllm.LLM in the worker
    assert len(body["records"]) == 3 * 2 * 2 * 2 and body["complete"]
    assert len(body["summary"]) == 2 * 2
    outs = _e2e_outputs(tmp_path)
    engines = [o["spec"]["engine"]["attention_config"]["backend"] for o in outs]
    assert engines == ["FLASH_ATTN", "TRITON_ATTN"] * 3  # interleaved
    for o in outs:
        assert [(r["workload"], r["pass"]) for r in o["results"]] == [
            (w, p)
            for w in ("sharegpt-like", "random-10k-100")
            for p in ("first", "warm")
        ]
        assert [r["engine_fresh"] for r in o["results"]] == [True, False, False, False]
        assert o["spec"]["engine"]["load_format"] == "dummy"
        long = [r for r in o["results"] if r["workload"] == "random-10k-100"]
        assert all(r["prompt_tokens"] == 4 * 10000 for r in long)
        assert all(r["output_tokens"] == 4 * 100 for r in long)
    # same prompts for both backends of a run and pass, fresh ones otherwise
    seeds = {}
    for r in body["records"]:
        seeds.setdefault((r["workload"], r["run"], r["pass"]), set()).add(r["seed"])
    assert all(len(v) == 1 for v in seeds.values())
    assert len({next(iter(v)) for v in seeds.values()}) == 3 * 2
    # the worker ran in the install's Python and the engine got the backend
    logs = list((tmp_path / "work").glob("*/logs/TRITON_ATTN-fork-e2e-run-0.log"))
    assert "fake LLM: backend TRITON_ATTN" in logs[0].read_text()


def test_e2e_resumes_and_redoes_another_matrix(fake_cli, tmp_path):
    fake_cli("e2e", runs=3, workloads="decode-1k-1k")
    before = {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)}
    lost = sorted(before)[2]
    next((tmp_path / "work").glob(f"*/{lost}")).unlink()
    rc, body, _ = fake_cli("e2e", runs=3, workloads="decode-1k-1k")
    assert rc == 0 and len(body["records"]) == 3 * 2 * 2
    after = {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)}
    assert [f for f in after if after[f] != before.get(f)] == [lost]
    # another prompt count is another matrix: every engine runs again
    rc, body, _ = fake_cli("e2e", runs=3, workloads="decode-1k-1k", count=("5",))
    assert {r["num_prompts"] for r in body["records"]} == {5}
    again = {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)}
    assert all(again[f] != after[f] for f in after)
    # collecting with other options reads no outputs and deletes none
    rc, body, _ = fake_cli(
        "e2e", "--collect", runs=3, workloads="decode-1k-1k", count=("6",)
    )
    assert rc == 1 and body["records"] == []
    assert {o["file"]: o["started_at"] for o in _e2e_outputs(tmp_path)} == again


def test_e2e_prompts_have_the_random_datasets_shape():
    from benchmarks.offline_worker import FIRST_ID, requests

    w = {"input_len": 215, "output_len": 197, "range_ratio": 0.9, "num_prompts": 300}
    reqs = requests(w, seed=7, vocab=500)
    assert len(reqs) == 300 and reqs == requests(w, seed=7, vocab=500)
    ins = [len(ids) for ids, _ in reqs]
    outs = [n for _, n in reqs]
    assert 21 <= min(ins) < 60 and 370 < max(ins) <= 409
    assert min(outs) >= 19 and max(outs) <= 375
    assert all(FIRST_ID <= t < 500 for ids, _ in reqs for t in ids)
    assert requests(w, seed=8, vocab=500) != reqs
    exact = dict(w, range_ratio=0.0, num_prompts=3)
    assert [(len(i), n) for i, n in requests(exact, 1, 500)] == [(215, 197)] * 3


def test_serve_runs_one_sweep_per_backend_and_run(fake_cli, tmp_path):
    rc, body, calls = fake_cli("serve")
    assert rc == 0
    assert all(c["argv"][:3] == ["bench", "sweep", "serve"] for c in calls)
    serve_cmds = [_arg(c["argv"], "--serve-cmd") for c in calls]
    assert ["--attention-backend FLASH_ATTN" in s for s in serve_cmds] == [
        True,
        False,
    ] * 3
    for c in calls:
        params = json.loads(Path(_arg(c["argv"], "--bench-params")).read_text())
        workloads = ("sharegpt-like", "random-10k-100")
        assert list(params) == [
            f"{w}.{p}" for w in workloads for p in ("first", "warm")
        ]
        seeds = {p["seed"] for k, p in params.items() if k.startswith("sharegpt")}
        assert len(seeds) == 2  # the warm pass does not repeat the first's prompts
    assert len(body["records"]) == 3 * 2 * 2 * 2
    assert {"median_ttft_ms", "total_tok_per_s"} <= set(body["records"][0])
    # A rerun after losing one benchmark's output resumes only that sweep.
    fork_run1 = sorted((tmp_path / "work").glob("*/sweep/TRITON_ATTN-fork-s*"))[1]
    lost = next(fork_run1.glob("BENCH-*"))
    (lost / "run=0.json").unlink()
    rc, body, calls2 = fake_cli("serve")
    assert rc == 0 and len(calls2) == len(calls) + 1
    assert "--resume" in calls2[-1]["argv"]


def test_scale_and_passes_shrink_the_matrix(fake_cli, tmp_path):
    rc, body, _ = fake_cli("e2e", "--scale", "0.1", "--passes", "first", count=())
    assert rc == 0
    outs = _e2e_outputs(tmp_path)
    assert len(outs) == 3 * 2
    for o in outs:
        counts = {w["name"]: w["num_prompts"] for w in o["spec"]["workloads"]}
        assert counts == {"sharegpt-like": 100, "random-10k-100": 10}  # x 0.1
        assert [r["pass"] for r in o["results"]] == ["first", "first"]
    assert len(body["records"]) == 3 * 2 * 1 * 2
    assert {r["pass"] for r in body["records"]} == {"first"}
    assert body["passes"] == ["first"]
    assert body["workloads"]["random-10k-100"]["num_prompts"] == 10
    rc, body, calls = fake_cli("serve", "--passes", "warm,first", runs=3)
    params = json.loads(Path(_arg(calls[-1]["argv"], "--bench-params")).read_text())
    assert list(params)[:2] == ["sharegpt-like.first", "sharegpt-like.warm"]


@pytest.mark.parametrize(
    "kind,extra,message",
    [
        ("serve", ["--passes", "warm"], "same server"),
        ("e2e", ["--passes", "warm"], "same engine"),
        ("e2e", ["--passes", "hot"], "valid: first, warm"),
        ("e2e", ["--scale", "0.5", "--num-prompts", "3"], "not both"),
        ("serve", ["--scale", "0"], "positive"),
    ],
)
def test_pass_and_scale_mistakes_are_refused(tmp_path, kind, extra, message):
    argv = [kind, "--model", "llama-3.1-8b", "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit, match=message):
        run_matrix.main([*argv, *extra])


def test_summarize_median_min_max():
    def rec(backend, run, tps):
        return {
            "model": "m", "workload": "w", "kv_cache_dtype": "auto", "pass": "warm",
            "backend": backend, "run": run, "total_tok_per_s": tps,
        }  # fmt: skip

    records = [rec("FLASH_ATTN", r, 100.0) for r in range(3)]
    records += [rec("X", 0, 90.0), rec("X", 1, 120.0), rec("X", 2, 100.0)]
    (s,) = summarize(records)
    assert s["backend"] == "X" and s["runs"] == 3
    assert (s["median_ratio_to_flash_attn"], s["min_ratio"], s["max_ratio"]) == (
        1.0,
        0.9,
        1.2,
    )


@pytest.mark.parametrize(
    "flag,value,valid",
    [
        ("--backends", "FLASH_ATTN,FOO", "TRITON_ATTN-fork"),
        ("--workloads", "sharegpt", "decode-1k-1k"),
        ("--model", "llama-9b", "llama-3.1-70b"),
    ],
)
def test_unknown_names_are_refused_with_the_valid_ones(tmp_path, flag, value, valid):
    argv = ["e2e", "--model", "llama-3.1-8b", "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit) as e:
        run_matrix.main([*argv, flag, value])
    assert f"{value.split(',')[-1]!r}" in str(e.value) and valid in str(e.value)


def test_too_few_runs_and_no_reference_are_refused(tmp_path):
    argv = ["e2e", "--model", "llama-3.1-8b", "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit, match="at least 2"):
        run_matrix.main([*argv, "--runs", "1", "--workloads", "random-10k-100"])
    # the noisy workload needs 3 (the default workloads include it)
    with pytest.raises(SystemExit, match="sharegpt-like .* at least 3"):
        run_matrix.main([*argv, "--runs", "2"])
    with pytest.raises(SystemExit, match="must include FLASH_ATTN"):
        run_matrix.main([*argv, "--backends", "TRITON_ATTN-fork"])


def test_missing_vllm_says_how_to_install_the_fork(tmp_path, fake_site):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = ["e2e", "--model", "llama-3.1-8b", "--out", str(tmp_path / "o.json")]
    argv += ["--site", f"stock={fake_site}", "--site", f"fork={empty}"]
    with pytest.raises(SystemExit) as e:
        run_matrix.main(argv)
    msg = str(e.value)
    assert "\n" not in msg and "'fork'" in msg
    assert "pip install ." in msg and "setup.py patch --site-packages" in msg
    assert not (tmp_path / "o.json").exists()


def test_plot_is_written(fake_cli, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "e2e.png"
    fake_cli("e2e", "--plot", str(png), workloads="decode-1k-1k")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_two_runs_without_sharegpt_and_workloads_that_fit_the_model(fake_cli):
    rc, body, _ = fake_cli("e2e", runs=2, workloads="random-10k-100")
    assert rc == 0 and {r["run"] for r in body["records"]} == {0, 1}
    # a 4096-position model (Phi-3-mini-4k) takes the 3900-token workload only
    with pytest.raises(SystemExit, match="random-10k-100: requests of up to 10100"):
        fake_cli("e2e", "--max-model-len", "4096", runs=2, workloads="random-10k-100")
    rc, body, _ = fake_cli(
        "e2e", "--max-model-len", "4096", runs=2, workloads="random-3900-100"
    )
    assert rc == 0 and body["workloads"]["random-3900-100"]["input_len"] == 3900
