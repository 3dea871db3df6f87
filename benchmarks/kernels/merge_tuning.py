"""Merge the winners of recorded GPU sweeps into the shipped tuning tables.

Tuning runs write into copies of the tables; an entry reaches
``vllm/attention/ops/tuning/`` only together with the record that timed it. Each
RECORD is one of:

- a prefill tuner record (``tune_attention.py --kernel prefill --record``):
  ``records`` whose items have the table ``key`` and the ``best`` config;
- a decode tuner output (``tune_attention.py --kernel decode``): a table file whose
  ``records`` hold every timing and whose ``configs`` are the winners.

The table of RECORD's GPU gets each key's winner (replaced or added), its entries
sorted by key as the tuner writes them. Its provenance stays short structured
fields: ``records`` lists every record merged into it, ``commit``, ``triton``,
``torch`` and ``driver`` are the latest record's. Later records win over earlier
ones for a key.

    python3 benchmarks/kernels/merge_tuning.py \\
        benchmarks/results/tuning/RECORD.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from vllm.attention.ops.tuning.decode_configs import DECODE_TABLE  # noqa: E402
from vllm.attention.ops.tuning.prefill_configs import PREFILL_TABLE  # noqa: E402

# Prefill config fields that earlier sweeps recorded and the kernels no longer have
# (a register cap, lazy rescaling, fp16 exponentials), at the value that ran without
# them. Records under benchmarks/results/ keep them.
RETIRED_PREFILL_FIELDS = {"maxnreg": 0, "lazy_rescale": False, "fast_exp": False}


def current_prefill_config(recorded: dict) -> dict | None:
    """A recorded prefill config without its retired fields; None where it set one
    (a config the kernels no longer run)."""
    if any(
        recorded.get(name, default) != default
        for name, default in RETIRED_PREFILL_FIELDS.items()
    ):
        return None
    return {k: v for k, v in recorded.items() if k not in RETIRED_PREFILL_FIELDS}


def table_text(provenance: dict, configs: list[dict]) -> str:
    """A table file's text: the provenance first, then one entry per line (so that
    a retuned entry is a one-line diff)."""
    lines = ",\n".join("  " + json.dumps(entry) for entry in configs)
    return (
        '{\n "provenance": '
        + json.dumps(provenance)
        + ',\n "configs": [\n'
        + lines
        + "\n ]\n}\n"
    )


def winners(body: dict):
    """(table kind, {key: config}) of one record file."""
    records = body.get("records") or []
    if records and all("key" in r and "best" in r for r in records):
        table = PREFILL_TABLE
        pairs = [(r["key"], current_prefill_config(r["best"])) for r in records]
        if any(config is None for _, config in pairs):
            raise SystemExit(
                "a record's winner sets a retired field "
                f"({', '.join(RETIRED_PREFILL_FIELDS)}); the kernels no longer run it"
            )
    elif records and "configs" in body and all("entry" in r for r in records):
        table = DECODE_TABLE
        pairs = [
            ({k: e[k] for k in table.key_fields}, e["config"]) for e in body["configs"]
        ]
    else:
        raise SystemExit(
            "not a tuning record: expected a prefill tuner record (records with "
            "'key' and 'best') or a decode retune output (records with 'entry')"
        )
    return table, {table.key(**k): table.config_cls(**c) for k, c in pairs}


def _field(body: dict, name: str):
    """A record's top-level field (prefill records), else its provenance's (decode
    retune files)."""
    return body.get(name) or body.get("provenance", {}).get(name)


def merge(record_paths: list[Path], table_path: Path | None = None) -> Path:
    """Merge the records (all of one kind and GPU) into their table; return its path."""
    bodies = [json.loads(p.read_text()) for p in record_paths]
    parsed = [winners(b) for b in bodies]
    kinds = {table.kind for table, _ in parsed}
    gpus = {_field(b, "gpu") for b in bodies}
    if len(kinds) != 1 or len(gpus) != 1 or None in gpus:
        raise SystemExit(
            f"merge one table at a time: these records are of kinds {sorted(kinds)} "
            f"and GPUs {sorted(map(str, gpus))}"
        )
    table = parsed[0][0]
    path = table_path or table.path(gpus.pop())
    data = json.loads(path.read_text()) if path.is_file() else {"configs": []}
    entries = {
        table.key(**{k: e[k] for k in table.key_fields}): e for e in data["configs"]
    }
    provenance = data.get("provenance", {})
    merged = list(provenance.get("records", []))
    for record_path, body, (_, best) in zip(record_paths, bodies, parsed):
        for key, config in best.items():
            old = entries.get(key, {}).get("config")
            entries[key] = table.entry(key, config)
            change = "added" if old is None else f"was {old}"
            print(f"{key}: {entries[key]['config']} ({change})")
        try:
            shown = record_path.resolve().relative_to(REPO)
        except ValueError:
            shown = record_path
        if str(shown) not in merged:
            merged.append(str(shown))
        for name in ("gpu", "commit", "triton", "torch", "driver"):
            if _field(body, name) is not None:
                provenance[name] = _field(body, name)
    provenance["records"] = merged
    path.write_text(table_text(provenance, [entries[k] for k in sorted(entries)]))
    print(f"wrote {path} ({len(entries)} entries)")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("records", nargs="+", type=Path, help="record files, oldest first")
    p.add_argument(
        "--table",
        type=Path,
        help="table file to update (default: the shipped one of the records' GPU)",
    )
    args = p.parse_args()
    merge(args.records, args.table)


if __name__ == "__main__":
    main()
