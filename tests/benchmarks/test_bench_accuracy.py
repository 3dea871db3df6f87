"""Accuracy harness: task generation, scoring, stderr/table/pass logic, the training
loop at toy size, and the per-backend eval orchestration against the fake vLLM."""

import json
import math
import random
import subprocess
import sys

import pytest

from benchmarks.accuracy import eval as acc_eval
from benchmarks.accuracy import tasks
from benchmarks.harness import REPO


def test_addition_answers_are_sums():
    for p in tasks.addition_problems(200, seed=1):
        a, b = p.prompt.split(";")[-1].rstrip("=").split("+")
        assert p.answer == str(int(a) + int(b))
        assert set(p.prompt) <= set(tasks.ALPHABET)


def test_recall_needle_is_far_and_unique():
    """The answer must depend on a record >= 4096 positions back and nowhere closer."""
    tail = tasks.KEY_LEN + len(tasks.SEP)
    for p in tasks.recall_problems(20, seed=2, min_len=4500, max_len=6000):
        key = p.prompt[-tail:][: tasks.KEY_LEN]
        assert p.prompt.endswith(key + tasks.SEP) and set(key) <= set(tasks.KEYS)
        body = p.prompt[:-tail]
        assert body.count(key) == 1
        at = body.index(key)
        assert at == 0 or body[at - 1] == tasks.END  # a whole record
        assert body[at : at + tail + 3] == key + tasks.SEP + p.answer + tasks.END
        assert len(p.prompt) - at == p.distance >= 4096


def test_training_stream_is_consistent():
    """Every key keeps one value within a stream, and records do repeat (at short and
    long distances), so lookups are learnable."""
    rng = random.Random(3)
    for length in (300, 5000):
        s = tasks.training_stream(rng, length)
        assert len(s) == length
        seen, first_at, gaps, pos = {}, {}, [], 0
        for item in s.split(";")[:-1]:
            if "=" in item:
                q, a = item.split("=")
                x, y = q.split("+")
                assert int(a) == int(x) + int(y)
            else:
                key = item[: tasks.KEY_LEN]
                value = item[tasks.KEY_LEN + len(tasks.SEP) :]
                assert set(key) <= set(tasks.KEYS) and len(value) == 2
                assert seen.setdefault(key, value) == value
                if key in first_at:
                    gaps.append(pos - first_at[key])
                first_at.setdefault(key, pos)
            pos += len(item) + 1
        assert len(gaps) >= length // 40
        if length == 5000:
            assert max(gaps) > 2000 and min(gaps) < 200


def test_training_mask_marks_exactly_the_predictable_characters():
    """Weight 1 on a repeated record's value and ';' and on an addition's answer and
    ';'; 0 on keys, new records' values and operands."""
    rng = random.Random(4)
    text, mask = tasks.training_example(rng, 3000)
    assert len(mask) == len(text) == 3000
    pos, seen = 0, {}
    for item in text.split(";")[:-1]:
        m = mask[pos : pos + len(item) + 1]
        if "=" in item:
            q = item.index("=") + 1
            assert m == [0] * q + [1] * (len(item) + 1 - q)
        else:
            key, value = item[: tasks.KEY_LEN], item[tasks.KEY_LEN :]
            if key in seen:
                assert seen[key] == value
                assert m == [0] * tasks.KEY_LEN + [1] * (len(value) + 1)
            else:
                seen[key] = value
                assert m == [0] * (len(item) + 1)
        pos += len(item) + 1
    assert 0.3 < sum(mask) / len(mask) < 0.8


def test_keys_run_out_gracefully():
    """A stream longer than the key set allows falls back to repeats and addition."""
    text, mask = tasks.training_example(random.Random(5), 20000)
    assert len(text) == 20000 and sum(mask) > 0


def test_encode_decode_roundtrip():
    text = "12+3=15;" + tasks.record_item(tasks.KEYS[7], 9)
    assert tasks.decode(tasks.encode(text)) == text
    assert tasks.decode([0, 2]) == "??"
    with pytest.raises(ValueError, match="outside the alphabet"):
        tasks.encode("12 + 3")


def test_score_is_strict():
    assert tasks.score("579", "579;")
    assert tasks.score("579", "579")
    assert not tasks.score("579", "5790;")
    assert not tasks.score("57", "579;")
    assert not tasks.score("07", "7;")


def test_stderr_and_table():
    probs = tasks.addition_problems(4, seed=0)
    gen = [p.answer + ";" for p in probs[:3]] + ["x"]
    s = acc_eval.summarize(probs, gen)
    assert s["addition"]["acc"] == 0.75
    assert math.isclose(s["addition"]["stderr"], math.sqrt(0.75 * 0.25 / 4))
    table = acc_eval.lm_eval_table("FLASH_ATTN", s)
    assert (
        f"|addition|{acc_eval.TASK_VERSION}|exact|0|exact_match|↑|0.7500|±|0.2165|"
        in table
    )


def _res(acc_by_task, n=400, gen=None):
    summary = {
        t: {"n": n, "correct": int(a * n), "acc": a, "stderr": acc_eval.stderr(a, n)}
        for t, a in acc_by_task.items()
    }
    return {"summary": summary, "generated": gen or ["1"] * 10}


def test_compare_pass_and_fail():
    base = _res({"addition": 0.9, "recall": 0.8})
    se = acc_eval.stderr(0.9, 400)  # 0.015
    ok = _res({"addition": 0.9 - se * 0.9, "recall": 0.8})
    bad = _res({"addition": 0.9 - 2 * se, "recall": 0.8}, gen=["1"] * 9 + ["2"])
    rows = acc_eval.compare(
        {"FLASH_ATTN": base, "TRITON_ATTN-fork": ok, "TRITON_ATTN-stock": bad}
    )
    verdict = {(r["backend"], r["task"]): r for r in rows}
    assert verdict[("TRITON_ATTN-fork", "addition")]["pass"]
    assert not verdict[("TRITON_ATTN-stock", "addition")]["pass"]
    assert verdict[("TRITON_ATTN-stock", "*")]["answers_differing"] == 1
    with pytest.raises(ValueError, match="FLASH_ATTN"):
        acc_eval.compare({"TRITON_ATTN-fork": ok})


def test_a_task_the_model_cannot_do_is_flagged_not_informative(tmp_path):
    """Chance-level accuracy on both sides 'passes' the stderr test; the report must
    say that this comparison tests nothing."""
    base = _res({"addition": 0.8, "recall": 0.01})
    fork = _res({"addition": 0.8, "recall": 0.012})
    rows = acc_eval.compare({"FLASH_ATTN": base, "TRITON_ATTN-fork": fork})
    verdict = {r["task"]: r for r in rows if r["task"] != "*"}
    assert verdict["addition"]["informative"] and verdict["recall"]["pass"]
    assert not verdict["recall"]["informative"]
    for name, res in (("FLASH_ATTN", base), ("TRITON_ATTN-fork", fork)):
        (tmp_path / f"{name}.json").write_text(json.dumps(res))
    text = acc_eval.build_report(tmp_path)["text"]
    assert "recall: 0.0120 vs 0.0100" in text and "NOT INFORMATIVE" in text
    assert text.endswith("ACCURACY PASS (not informative: recall)")


class _Oracle:
    """Stand-in model whose argmax is the true next token (or a wrong one)."""

    def __init__(self, wrong=False):
        self.wrong = wrong

    def __call__(self, input_ids, **kwargs):
        import torch

        nxt = torch.roll(input_ids, -1, dims=1) + (1 if self.wrong else 0)
        logits = torch.nn.functional.one_hot(nxt % 80, 80).float()
        return type("O", (), {"logits": logits})()


def test_teacher_forced_accuracy_oracle():
    torch = pytest.importorskip("torch")
    from benchmarks.accuracy.train_tiny import teacher_forced_accuracy

    probs = tasks.addition_problems(10, seed=5)
    dev = torch.device("cpu")
    assert teacher_forced_accuracy(_Oracle(), probs, dev, batch=4) == 1.0
    assert teacher_forced_accuracy(_Oracle(wrong=True), probs, dev, batch=4) == 0.0


def test_train_tiny_toy_cpu(tmp_path):
    """A few optimizer steps at toy size; the saved directory must be a loadable HF
    Llama checkpoint with our tokenizer."""
    pytest.importorskip("transformers")
    from benchmarks.accuracy.train_tiny import main

    out = tmp_path / "m"
    args = ["--device", "cpu", "--toy", "--max-steps", "3", "--out", str(out)]
    assert main([*args, "--check-problems", "8", "--check-every-s", "1e-6"]) == 0
    for f in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "train_log.json",
    ):
        assert (out / f).is_file(), f
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 3 and all(math.isfinite(r["loss"]) for r in log["log"])
    assert set(log["check"]) == {"addition", "recall>=64", "recall>=300"}
    # a check before each step after the first microsecond, and the final one
    assert len(log["checks"]) >= 3 and log["checks"][-1]["check"] == log["check"]
    assert log["seed"] == 1234 and "short_phase_ended_at" in log and "driver" in log
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == 4 + len(tasks.ALPHABET) + 3
    # Loadable the way an inference engine loads it: weights + tokenizer from the dir.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = tok("12+34=", return_tensors="pt").input_ids
    assert ids[0].tolist() == [tasks.BOS_ID] + tasks.encode("12+34=")
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], cfg["vocab_size"])
    assert torch.isfinite(logits).all()


def _run_eval(tmp_path, model_dir, site_args, extra_env=None, extra_args=()):
    import os

    env = dict(os.environ, **(extra_env or {}))
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/accuracy/eval.py"),
            "--model-dir",
            str(model_dir),
            "--out-dir",
            str(tmp_path / "acc"),
            "--n",
            "20",
            "--timeout-s",
            "60",
            *site_args,
            *extra_args,
        ],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_eval_orchestration_pass_then_resume(tmp_path, site_args):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    r = _run_eval(tmp_path, model_dir, site_args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ACCURACY PASS" in r.stdout
    summary = json.loads((tmp_path / "acc" / "summary.json").read_text())
    assert summary["pass"]
    assert summary["backends"]["FLASH_ATTN"]["summary"]["recall"]["acc"] == 1.0
    r2 = _run_eval(tmp_path, model_dir, site_args)
    assert r2.stdout.count("skipping") == 3


def test_eval_detects_a_wrong_backend(tmp_path, site_args):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    r = _run_eval(tmp_path, model_dir, site_args, {"FAKE_VLLM_WRONG": "TRITON_ATTN"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "ACCURACY FAIL" in r.stdout


def test_short_phase_waits_for_the_lookup():
    from benchmarks.accuracy.train_tiny import CURRICULUM, ShortPhaseGate

    c = CURRICULUM
    passed, failed = {c.gate: 1.0}, {c.gate: 0.0}
    gate = ShortPhaseGate(c)
    assert gate.shapes(0.0) == c.short
    gate.update(c.min_end / 2, passed)  # too early to move on, even if learned
    assert gate.shapes(c.min_end / 2) == c.short and gate.ended_at is None
    gate.update(c.min_end + 0.01, failed)  # not learned yet: stay
    assert gate.shapes(c.min_end + 0.01) == c.short
    gate.update(c.min_end + 0.05, passed)
    assert gate.ended_at == c.min_end + 0.05 and gate.shapes(0.3) == c.long
    gate.update(0.4, failed)  # no way back
    assert gate.shapes(0.4) == c.long
    never = ShortPhaseGate(c)
    assert never.shapes(c.max_end) == c.long  # the bound, even between checks
    assert never.ended_at == c.max_end
    never.update(0.9, passed)  # a later pass does not rewrite when it ended
    assert never.ended_at == c.max_end
    # The long phase trains lookups over 4k+ tokens and positions past 8k.
    assert max(length for length, _ in c.long) > 8192


def test_batch_source_is_deterministic_with_or_without_workers():
    from benchmarks.accuracy.train_tiny import TOY_CURRICULUM as C
    from benchmarks.accuracy.train_tiny import BatchSource

    inline, pooled = BatchSource(9, 0), BatchSource(9, 2)
    try:
        for shapes in (C.short, C.short, C.long, C.long):
            (xa, wa), (xb, wb) = inline.next(shapes), pooled.next(shapes)
            assert xa.tolist() == xb.tolist() and wa.tolist() == wb.tolist()
            assert xa.shape[1] == wa.shape[1] + 1  # BOS + targets
    finally:
        pooled.close()
    assert xa.shape == (1, 257)  # step 3 takes the second long shape


def test_export_is_transformers_llama_exactly():
    """The torch model's weights under HF names give transformers' LlamaForCausalLM
    the same logits: what vLLM loads is what was trained and checked."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from benchmarks.accuracy.train_tiny import build_model, hf_state_dict, model_config

    cfg = model_config(toy=True)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    for p in model.parameters():  # norms away from 1 too
        p.data.add_(0.05 * torch.randn_like(p))
    hf_cfg = transformers.LlamaConfig(**cfg)
    hf_cfg._attn_implementation = "sdpa"
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.load_state_dict(hf_state_dict(model, cfg), strict=True)
    ids = torch.randint(4, cfg["vocab_size"], (2, 300))
    with torch.no_grad():
        ours, theirs = model(input_ids=ids).logits, hf(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
    # and the check scores it like any model with transformers' call convention
    from benchmarks.accuracy.train_tiny import teacher_forced_accuracy

    probs = tasks.addition_problems(2, seed=0)
    assert teacher_forced_accuracy(model, probs, torch.device("cpu"), 2) in (0, 0.5, 1)
