# SPDX-License-Identifier: Apache-2.0
"""Upstream vLLM's own attention kernel tests' inputs, on our kernels.

The inputs are read from each supported release's test files in its sdist (never
kept here), by parsing the parameter lists of two tests:

* ``tests/kernels/attention/test_prefix_prefill.py::test_contexted_kv_attention``
  (the kernels stock's ROCm backend ran): heads, queries per KV head, head sizes
  (24 among them), dtypes, sliding windows (0: none), KV-cache dtypes; the batch as
  its body builds it (``BS`` requests of 16 to ``MAX_SEQ_LEN`` new tokens over 16 to
  ``MAX_CTX_LEN`` cached ones, the last a decode, pages of ``block_size``).
* ``tests/kernels/attention/test_triton_unified_attention.py``
  (stock's TRITON_ATTN kernel): ``test_triton_unified_attn``'s ``(query, kv)``
  length lists, head pairs, head sizes, page sizes, windows, soft-caps and dtypes,
  and ``test_triton_unified_attn_bf16_query_fp8_kv``'s shapes with an fp8 cache.
  Its fp8 queries are not inputs our kernels take (the backend says so:
  ``supports_quant_query_input`` is False, so vLLM passes 16-bit queries); its
  32768-block caches test index overflow, which ``test_block_offsets_past_int32``
  covers for ours.

Each case runs the one dispatch (``paged_attention``: decodes first, as the
backend orders a batch) against the one reference (``ref_paged_attention``), with
the kernel tests' tolerances. The CPU suite runs one case per upstream test and
feature at an eighth of upstream's lengths; a GPU with ``GPU_FULL=1`` runs every
case at upstream's lengths (``UPSTREAM_TEST_SOURCES``: where the test files are,
on a host without network).
"""

import ast
import io
import os
import random
import tarfile
from functools import cache
from pathlib import Path

import pytest
import torch

from tests.kernels.conftest import (
    FULL_MATRIX_REASON,
    GPU_FULL,
    ON_GPU,
    TOLERANCES,
    assert_close,
    fp8_skip_reason,
    make_paged_batch,
)
from vllm.attention.ops import paged_attention as dispatch
from vllm.attention.ops.reference import ref_paged_attention

PREFIX = "tests/kernels/attention/test_prefix_prefill.py"
UNIFIED = "tests/kernels/attention/test_triton_unified_attention.py"
FP8 = {
    "fp8": torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


# ------------------------------------------------------------------ reading upstream


class _Unknown:
    """A value the reader does not evaluate (devices, ops, platform calls)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return f"<{self.text}>"


def _value(node, names):
    """A literal, a module-level name, ``torch.<dtype>``, or ``_Unknown``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_value(n, names) for n in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and isinstance(getattr(torch, node.attr, None), torch.dtype)
    ):
        return getattr(torch, node.attr)
    if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".fp8_dtype"):
        return "fp8"  # current_platform.fp8_dtype(): the platform's fp8 format
    return _Unknown(ast.unparse(node))


def _parse(source: str, test: str) -> dict:
    """``test``'s parameter lists (``pytest.mark.parametrize``), its keyword
    defaults and the constants its body assigns, by name."""
    tree = ast.parse(source)
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                names[target.id] = _value(node.value, names)
    func = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == test
    )
    params = {}
    for dec in func.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("parametrize"):
            params[dec.args[0].value] = _value(dec.args[1], names)
    args = func.args.args
    for arg, default in zip(
        args[len(args) - len(func.args.defaults) :], func.args.defaults
    ):
        params.setdefault(arg.arg, [_value(default, names)])
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
        ):
            params.setdefault(node.targets[0].id, node.value.value)
    return params


@cache
def _sources() -> dict:
    """{release: {path: source}} of the two test files: inside vLLM's own source
    tree (this module beside upstream's attention tests), the tree's; else every
    supported release's, from ``$UPSTREAM_TEST_SOURCES/<version>/<path>`` where
    that is set (a host without network: the files copied from the sdists), or
    from its sdist."""
    beside = Path(__file__).resolve().parent.parent  # tests/kernels/attention there
    if all((beside / Path(p).name).is_file() for p in (PREFIX, UNIFIED)):
        return {
            "tree": {p: (beside / Path(p).name).read_text() for p in (PREFIX, UNIFIED)}
        }
    from fork_build import BuildError, pins, upstream

    out = {}
    given = os.environ.get("UPSTREAM_TEST_SOURCES")
    for version, release in pins.SUPPORTED.items():
        if given:
            root = Path(given) / version
            out[version] = {p: (root / p).read_text() for p in (PREFIX, UNIFIED)}
            continue
        try:
            sdist = upstream.fetch("sdist", release)
        except BuildError as e:
            pytest.fail(f"the pinned vLLM {version} sdist is needed: {e}")
        files = {}
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                for path in (PREFIX, UNIFIED):
                    if member.name.endswith("/" + path):
                        files[path] = io.TextIOWrapper(
                            tar.extractfile(member), encoding="utf-8"
                        ).read()
        assert set(files) == {PREFIX, UNIFIED}, (version, sorted(files))
        out[version] = files
    return out


# ------------------------------------------------------------------ cases


def _prefix_cases(p: dict) -> list[dict]:
    rng = random.Random(0)
    bs, max_new, max_ctx = p["BS"], p["MAX_SEQ_LEN"], p["MAX_CTX_LEN"]
    new = [rng.randint(16, max_new) for _ in range(bs)]
    new[-1] = 1  # the decode
    seqs = [(q, q + rng.randint(16, max_ctx)) for q in new]
    cases = []
    for heads in p["num_heads"]:
        for per_kv in p["num_queries_per_kv"]:
            for head_size in p["head_size"]:
                for dtype in p["dtype"]:
                    for window in p["sliding_window"]:
                        for kv_cache in p["kv_cache_dtype"]:
                            cases.append(dict(
                                test="prefix_prefill", seqs=seqs,
                                num_q_heads=heads, num_kv_heads=heads // per_kv,
                                head_size=head_size, block_size=p["block_size"][0],
                                q_dtype=dtype, cache=kv_cache,
                                window=window or None, soft_cap=None,
                            ))  # fmt: skip
    return cases


def _unified_cases(p: dict, fp8_kv: dict) -> list[dict]:
    cases = []
    for seqs in p["seq_lens"]:
        for heads, kv_heads in p["num_heads"]:
            for head_size in p["head_size"]:
                for block_size in p["block_size"]:
                    base = dict(
                        test="unified", seqs=[tuple(s) for s in seqs],
                        num_q_heads=heads, num_kv_heads=kv_heads,
                        head_size=head_size, block_size=block_size,
                    )  # fmt: skip
                    for dtype in p["dtype"]:
                        for window in p["sliding_window"]:
                            for cap in p["soft_cap"]:
                                # Queries of the model's dtype (q_dtype None).
                                assert None in p["q_dtype"], p["q_dtype"]
                                cases.append(dict(
                                    base, q_dtype=dtype, cache="auto",
                                    window=window, soft_cap=cap,
                                ))  # fmt: skip
                    cases.append(dict(
                        base, test="unified_bf16_query_fp8_kv",
                        q_dtype=torch.bfloat16, cache="fp8", window=None,
                        soft_cap=None,
                    ))  # fmt: skip
    assert fp8_kv["seq_lens"] == p["seq_lens"], "the fp8-cache test's lengths moved"
    return cases


def _key(case: dict) -> tuple:
    return tuple((k, str(v)) for k, v in sorted(case.items()))


@cache
def upstream_cases() -> list[dict]:
    """Every case of both tests in every supported release, each once, with the
    releases that list it."""
    found: dict[tuple, dict] = {}
    for version, files in _sources().items():
        prefix = _parse(files[PREFIX], "test_contexted_kv_attention")
        unified = _parse(files[UNIFIED], "test_triton_unified_attn")
        fp8_kv = _parse(files[UNIFIED], "test_triton_unified_attn_bf16_query_fp8_kv")
        for case in _prefix_cases(prefix) + _unified_cases(unified, fp8_kv):
            found.setdefault(_key(case), dict(case, releases=[]))["releases"].append(
                version
            )
    return list(found.values())


def _scaled(seqs, factor):
    """Lengths divided by ``factor`` (decodes stay decodes; a prefill keeps a
    cached part if it had one)."""
    out = []
    for q, kv in seqs:
        new_q = 1 if q == 1 else max(2, q // factor)
        out.append((new_q, new_q + max(0, kv - q) // factor))
    return out


def _features(case) -> set:
    group = case["num_q_heads"] // case["num_kv_heads"]
    values = (case["head_size"], case["cache"], case["window"], case["soft_cap"], group)
    return {(case["test"], i, v) for i, v in enumerate(values)}


def _cpu_sample(cases):
    """Few cases that together hold every head size, cache dtype, window, soft-cap
    and group of each upstream test (greedy cover), at an eighth of the lengths."""
    left = set().union(*(_features(c) for c in cases))
    picked = []
    while left:
        best = max(cases, key=lambda c: len(_features(c) & left))
        picked.append(best)
        left -= _features(best)
    return [dict(c, seqs=_scaled(c["seqs"], 8)) for c in picked]


def _ids(cases):
    return [
        f"{c['test']}-h{c['num_q_heads']}:{c['num_kv_heads']}-d{c['head_size']}"
        f"-bs{c['block_size']}-{str(c['q_dtype']).split('.')[-1]}-{c['cache']}"
        f"-w{c['window']}-cap{c['soft_cap']}-{len(c['seqs'])}seqs"
        for c in cases
    ]


def _cases():
    cases = upstream_cases()
    if GPU_FULL and ON_GPU:
        return cases
    return _cpu_sample(cases)


# ------------------------------------------------------------------ the run


def _run_case(case):
    cache_dtype = None if case["cache"] == "auto" else FP8[case["cache"]]
    if cache_dtype is not None:
        reason = fp8_skip_reason(cache_dtype)
        if reason:
            pytest.skip(reason)
    # Decodes first, as the backend's builder orders a batch.
    seqs = sorted(case["seqs"], key=lambda s: s[0] != dispatch.DECODE_QUERY_LEN)
    num_decodes = sum(q == dispatch.DECODE_QUERY_LEN for q, _ in seqs)
    batch = make_paged_batch(
        seqs=seqs, num_q_heads=case["num_q_heads"],
        num_kv_heads=case["num_kv_heads"], head_size=case["head_size"],
        block_size=case["block_size"], q_dtype=case["q_dtype"],
        cache_dtype=cache_dtype,
    )  # fmt: skip
    scale = case["head_size"] ** -0.5
    features = dict(sliding_window=case["window"], logits_soft_cap=case["soft_cap"])
    output = torch.full_like(batch.query, float("nan"))
    dispatch.paged_attention(
        query=batch.query, key_cache=batch.key_cache, value_cache=batch.value_cache,
        output=output, block_table=batch.block_table,
        query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens,
        num_decodes=num_decodes, num_decode_tokens=num_decodes,
        max_query_len=batch.max_query_len, softmax_scale=scale,
        k_scale=batch.k_scale, v_scale=batch.v_scale,
        prefill_max_seq_len=max(kv for _, kv in seqs), **features,
    )  # fmt: skip
    expected = ref_paged_attention(
        **batch.ref_kwargs(), softmax_scale=scale, **features
    )
    dtype, atol, rtol = TOLERANCES[case["q_dtype"]]
    assert_close(output, expected, dtype=dtype, atol=atol, rtol=rtol, what=case["test"])


@pytest.mark.parametrize("case", _cases(), ids=_ids(_cases()))
def test_upstream_inputs_match_reference(case):
    _run_case(case)


def test_reads_every_upstream_parameter_it_needs():
    """The reader found upstream's lists (a renamed parameter fails here, not as a
    silently smaller matrix): head size 24, group 64, fp8_e5m2, windows and
    soft-caps among them, and the full matrix's size."""
    cases = upstream_cases()
    assert {c["head_size"] for c in cases} >= {24, 128, 256}
    assert max(c["num_q_heads"] // c["num_kv_heads"] for c in cases) == 64
    assert {c["cache"] for c in cases} >= {"auto", "fp8", "fp8_e5m2"}
    assert {c["window"] for c in cases} >= {None, 16, 64, 2048}
    assert {c["soft_cap"] for c in cases} == {None, 50.0}
    assert all(c["releases"] for c in cases)
    assert len(cases) >= 100, len(cases)
    sample = _cpu_sample(cases)
    assert {c["test"] for c in sample} == {
        "prefix_prefill",
        "unified",
        "unified_bf16_query_fp8_kv",
    }


@pytest.mark.skipif(not (GPU_FULL and ON_GPU), reason=FULL_MATRIX_REASON)
def test_the_full_matrix_runs_at_upstreams_lengths():
    """Under GPU_FULL=1 the parametrised cases are upstream's, unscaled."""
    assert len(_cases()) == len(upstream_cases())
    assert max(kv for c in _cases() for _, kv in c["seqs"]) >= 1024
