"""``python3 -m benchmarks.models OUT_DIR [NAME ...]``: write model directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import make_model_dir, model_names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out_dir", type=Path, help="parent folder; one sub-folder per model")
    p.add_argument("names", nargs="*", help=f"models (default all): {model_names()}")
    args = p.parse_args(argv)
    for name in args.names or model_names():
        path = make_model_dir(name, args.out_dir / name)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
