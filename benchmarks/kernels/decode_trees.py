"""Our decode kernel from several source trees, timed at the same points.

    python benchmarks/kernels/decode_trees.py --stock-site /tmp/site \
        --tree head=. --tree before=/tmp/old-checkout --rounds 2 --out ab.json

A/B of kernel code across checkouts (e.g. before and after a restructure) on one
GPU and one software stack: each (round, tree) runs in its own Python process that
imports stock vLLM from ``--stock-site`` and the tree's ``vllm/attention/ops``
(joined to ``vllm.__path__`` as ``bench_kernels.py`` does), and times
``paged_decode_attention``, the public entry point every tree keeps, with the split
count the tree itself chooses (as its backend would: wave-aware where the tree's
data says). Trees are interleaved per round, in reverse order every other round;
the record holds
every time and each tree's median per point. Points are ``BATCHxCONTEXT:PAGE:KV``
(KV ``bf16`` or ``fp8``), at Llama-3.1-8B's heads (32 query, 8 KV, head 128).
``--interpret`` runs one tiny point on the CPU (a smoke test of the script).
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADS = (32, 8, 128)  # Llama-3.1-8B: query heads, KV heads, head size
DEFAULT_POINTS = [
    "64x8192:64:fp8",
    "64x8192:64:bf16",
    "80x1536:16:bf16",  # the e2e decode workload's batch (77, padded) mid-run
    "80x1536:64:bf16",
    "1x32768:64:bf16",
]


def parse_point(text: str) -> dict:
    shape, page, kv = text.split(":")
    batch, context = (int(x) for x in shape.split("x"))
    if kv not in ("bf16", "fp8"):
        raise SystemExit(f"point {text!r}: KV dtype must be bf16 or fp8")
    return {"batch": batch, "context": context, "block_size": int(page), "kv": kv}


def child(tree: str, stock_site: str | None, points: list[dict], iters: int) -> list:
    """Time every point with ``tree``'s decode kernel; runs in its own process."""
    root = Path(tree).resolve()
    sys.path.insert(0, stock_site or str(root))  # no stock: the tree's namespace
    import torch

    import vllm

    if str(root / "vllm") not in list(vllm.__path__):  # a stock (regular) vllm
        vllm.__path__.insert(0, str(root / "vllm"))
    from vllm.attention.ops import triton_paged_decode_attention_2d as dec

    choose = getattr(dec, "choose_decode_splits", None) or dec.choose_num_splits
    cap = getattr(dec, "MAX_DECODE_SPLITS", None) or dec.MAX_NUM_SPLITS
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    num_sms = 132  # an H200's count off the GPU
    if device == "cuda":
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    hq, hk, d = HEADS
    out = []
    for p in points:
        gen = torch.Generator(device=device).manual_seed(0)
        b, ctx, bs = p["batch"], p["context"], p["block_size"]
        pages = -(-ctx // bs)
        kv_dtype = torch.float8_e4m3fn if p["kv"] == "fp8" else torch.bfloat16
        kv = torch.randn((b * pages, 2, hk, bs, d), device=device, generator=gen)
        kv = kv.to(kv_dtype)
        scale = torch.ones(1, device=device) if p["kv"] == "fp8" else None
        table = torch.randperm(b * pages, device=device, generator=gen)
        table = table.to(torch.int32).view(b, pages)
        query = torch.randn((b, hq, d), device=device, generator=gen).to(torch.bfloat16)
        output = torch.empty_like(query)
        seq_lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
        # The tree's own rule, wave-aware where the tree's data says: a WaveRule
        # (decode_wave_rule), a count of resident programs per SM in trees from
        # before it (decode_programs_per_sm), neither in older trees.
        extra, dev = {}, torch.device(device)
        if hasattr(dec, "decode_wave_rule"):
            extra["wave"] = dec.decode_wave_rule(kv_dtype=kv_dtype, device=dev)
        elif hasattr(dec, "decode_programs_per_sm"):
            extra["programs_per_sm"] = dec.decode_programs_per_sm(
                kv_dtype=kv_dtype, device=dev
            )
        splits = choose(
            num_seqs=b, num_kv_heads=hk, num_sms=num_sms, max_splits=cap, **extra
        )
        workspace = None
        if splits > 1:
            shape = dec.decode_workspace_shape(
                max_num_seqs=b, num_q_heads=hq, head_size=d, num_splits=splits
            )
            workspace = torch.empty(shape, dtype=dec.WORKSPACE_DTYPE, device=device)

        launch = functools.partial(
            dec.paged_decode_attention,
            query=query, key_cache=kv[:, 0], value_cache=kv[:, 1], output=output,
            block_table=table, seq_lens=seq_lens, softmax_scale=d**-0.5,
            k_scale=scale, v_scale=scale, num_splits=splits, workspace=workspace,
        )  # fmt: skip
        launch()
        if device == "cpu":
            out.append({**p, "splits": splits, "us": None})
            continue
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(3):
                launch()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                launch()
        times = []
        for _ in range(iters):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / 10)  # us per launch
        out.append({**p, "splits": splits, "us": statistics.median(times)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--stock-site", help="folder holding stock vLLM (imported as vllm)")
    ap.add_argument("--points", nargs="+", default=DEFAULT_POINTS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument(
        "--interpret", action="store_true", help="one tiny point on the CPU"
    )
    ap.add_argument("--out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        args.points, args.rounds = ["2x40:16:bf16"], 1
    points = [parse_point(t) for t in args.points]
    if args.child:
        print(json.dumps(child(args.child, args.stock_site, points, args.iters)))
        return
    trees = dict(t.split("=", 1) for t in args.tree) or {"head": str(REPO)}
    runs = []
    for rnd in range(args.rounds):
        # Odd rounds (from 0) reversed, as ab_arms.py interleaves its arms.
        order = list(trees.items())
        for name, tree in order[::-1] if rnd % 2 else order:
            cmd = [sys.executable, __file__, "--child", tree]
            cmd += ["--iters", str(args.iters), "--points", *args.points]
            cmd += ["--interpret"] if args.interpret else []
            if args.stock_site:
                cmd += ["--stock-site", args.stock_site]
            t0 = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                print(proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"tree {name} ({tree}) failed")
            for r in json.loads(proc.stdout.strip().splitlines()[-1]):
                runs.append({"round": rnd, "tree": name, **r})
            print(f"round {rnd} {name}: {time.time() - t0:.0f} s", flush=True)
    summary = []
    for text, p in zip(args.points, points):
        row = {"point": text, "splits": {}, "median_us": {}}
        for name in trees:
            mine = [r for r in runs if r["tree"] == name and r["batch"] == p["batch"]
                    and r["context"] == p["context"] and r["kv"] == p["kv"]
                    and r["block_size"] == p["block_size"]]  # fmt: skip
            row["splits"][name] = mine[0]["splits"]
            us = [r["us"] for r in mine if r["us"] is not None]
            row["median_us"][name] = statistics.median(us) if us else None
        summary.append(row)
        print(json.dumps(row))
    record = {"kind": "decode-trees", "trees": trees, "heads": HEADS, "runs": runs,
              "summary": summary, "command": " ".join(sys.argv)}  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
