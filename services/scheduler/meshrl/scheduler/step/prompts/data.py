"""Prompt datasets for DATA_LOAD nodes: jsonl, parquet and Hugging Face `datasets` folders,
configurable prompt/answer keys, the tokenizer's chat template, deterministic shuffling
per epoch, and a position that checkpoints save so a resumed run sees the same order.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshrl.common.errors import InvalidArgument, NotFound


@dataclass
class Record:
    index: int
    prompt: str
    answer: str
    response: str | None = None


def _read_rows(path: Path) -> list[dict]:
    if path.is_dir():  # a `datasets.save_to_disk` folder: Arrow stream files + state.json
        import pyarrow as pa

        files = sorted(path.glob("*.arrow"))
        if not files:
            raise InvalidArgument(f"data folder {path} holds no .arrow files; save it with `datasets.save_to_disk`")
        rows: list[dict] = []
        for f in files:
            with pa.memory_map(str(f)) as source:
                rows += pa.ipc.open_stream(source).read_all().to_pylist()
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InvalidArgument(f"{path}:{lineno}: not valid JSON ({exc.msg}); one object per line") from None
        return rows
    raise InvalidArgument(f"data file {path}: unsupported format; use .jsonl, .parquet or a `datasets` folder")


def load_records(path: str | Path, prompt_key: str, answer_key: str, response_key: str | None = None) -> list[Record]:
    p = Path(path)
    if not p.exists():
        raise NotFound(f"data file {p} does not exist; check data.train / data.eval or set data.generator")
    rows = _read_rows(p)
    if not rows:
        raise InvalidArgument(f"data file {p} is empty")
    for key, field in ((prompt_key, "data.prompt_key"), (answer_key, "data.answer_key")):
        if key not in rows[0]:
            raise InvalidArgument(f"{p}: rows have no key '{key}' ({field}); keys present: {sorted(rows[0])}")
    return [
        Record(i, str(r[prompt_key]), str(r[answer_key]), str(r[response_key]) if response_key else None)
        for i, r in enumerate(rows)
    ]


class PromptEncoder:
    """Turns prompt text into token ids with the model's own tokenizer and chat template."""

    def __init__(self, model_path: str, apply_chat_template: bool = True, system_prompt: str | None = None) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.apply_chat_template = apply_chat_template and bool(self.tokenizer.chat_template)
        self.system_prompt = system_prompt

    def encode_prompt(self, text: str) -> list[int]:
        if not self.apply_chat_template:
            return self.tokenizer.encode(text, add_special_tokens=False)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": text})
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def encode_response(self, text: str) -> list[int]:
        """A supervised target: the text followed by the end-of-turn token."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids + [self.tokenizer.eos_token_id]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


@dataclass
class DataPosition:
    epoch: int = 0
    cursor: int = 0
    requeued: list[int] = dataclasses.field(
        default_factory=list
    )  # record indexes put back, taken before the cursor moves

    def to_json(self) -> str:
        data = {"epoch": self.epoch, "cursor": self.cursor}
        if self.requeued:
            data["requeued"] = list(self.requeued)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str | bytes | None) -> DataPosition:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(int(data["epoch"]), int(data["cursor"]), [int(i) for i in data.get("requeued", [])])


class PromptSampler:
    """Deterministic epochs: a permutation seeded by (shuffle_seed, epoch), consumed in order; prompts put back
    (`put_back`: asynchronous training's regenerate policy) come first. Thread-safe: an asynchronous job's
    producer takes batches while its step loop puts prompts back."""

    def __init__(self, records: list[Record], shuffle_seed: int, position: DataPosition | None = None) -> None:
        self.records = records
        self.seed = shuffle_seed
        self.position = position or DataPosition()
        self._lock = threading.Lock()

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.records))

    def put_back(self, indexes: list[int]) -> None:
        """Record indexes to hand out again, before any new one; refuses (InvalidArgument) an unknown index."""
        bad = [i for i in indexes if not 0 <= i < len(self.records)]
        if bad:
            raise InvalidArgument(f"cannot put back record indexes {bad[:5]}: the dataset has {len(self.records)} rows")
        with self._lock:
            self.position.requeued += [int(i) for i in indexes]

    def next_batch(self, size: int) -> list[Record]:
        with self._lock:
            again, self.position.requeued = self.position.requeued[:size], self.position.requeued[size:]
            out: list[Record] = [self.records[i] for i in again]
            while len(out) < size:
                order = self._order(self.position.epoch)
                take = order[self.position.cursor : self.position.cursor + size - len(out)]
                out += [self.records[i] for i in take]
                self.position.cursor += len(take)
                if self.position.cursor >= len(order):
                    self.position = DataPosition(self.position.epoch + 1, 0, self.position.requeued)
            return out
