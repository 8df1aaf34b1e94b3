"""The small GRPO task the job benches share: a Qwen2-style model built from scratch, the "add one"
prompts of tests/e2e, and the command-line flags that size one step of it.

Benches import it after putting this folder on sys.path (they run as scripts, not as a package).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_task_arguments(g: argparse._ActionsContainer, *, prompts: int, n: int, max_tokens: int) -> None:
    """--hidden / --layers (the model) and --prompts / --n / --max-tokens (one step's shape)."""
    g.add_argument("--hidden", type=int, default=64)
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--prompts", type=int, default=prompts, help="prompts per step")
    g.add_argument("--n", type=int, default=n, help="samples per prompt")
    g.add_argument("--max-tokens", type=int, default=max_tokens)


def make_task(root: Path, hidden: int, layers: int) -> dict[str, str]:
    """A small Qwen2-style model and the 'add one' prompts of tests/e2e."""
    from meshrl.trainer.model_builder import build_small_model

    model = build_small_model(root / "model", hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(256)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": str(model), "train": str(data / "train.jsonl")}
