"""An example's generated data on disk: the train and held-out sets as JSONL files (one JSON object a line,
keys sorted), each written to a temporary file and moved into place, so a reader never sees half a file.
Used by the examples' `make_data.write_dataset`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"


def write_train_and_eval(out_dir: str | Path, train: Iterable[dict], evals: Iterable[dict]) -> tuple[Path, Path]:
    """Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl from their rows; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / TRAIN_FILE, out / EVAL_FILE)
    for path, rows in zip(paths, (train, evals), strict=True):
        tmp = path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
        tmp.replace(path)
    return paths
