"""Prompt data: jsonl, parquet and `datasets` folders, key errors, deterministic epochs and positions."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.scheduler.step.prompts.data import DataPosition, PromptSampler, load_records

ROWS = [{"q": f"{i}+1", "a": str(i + 1)} for i in range(10)]


def test_jsonl_parquet_and_arrow_folder_read_the_same(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    folder = tmp_path / "ds"
    folder.mkdir()
    table = pa.Table.from_pylist(ROWS)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    for path in (tmp_path / "d.jsonl", tmp_path / "d.parquet", folder):
        records = load_records(path, "q", "a")
        assert [(r.prompt, r.answer) for r in records] == [(r["q"], r["a"]) for r in ROWS]


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(NotFound, match="does not exist"):
        load_records(tmp_path / "missing.jsonl", "q", "a")
    (tmp_path / "d.jsonl").write_text('{"q": 1, "a": 2}\n{broken\n')
    with pytest.raises(InvalidArgument, match=r"d.jsonl:2: not valid JSON"):
        load_records(tmp_path / "d.jsonl", "q", "a")
    (tmp_path / "k.jsonl").write_text('{"question": 1, "a": 2}\n')
    with pytest.raises(InvalidArgument, match="no key 'q' \\(data.prompt_key\\)"):
        load_records(tmp_path / "k.jsonl", "q", "a")
    (tmp_path / "x.csv").write_text("q,a\n")
    with pytest.raises(InvalidArgument, match="unsupported format"):
        load_records(tmp_path / "x.csv", "q", "a")


def test_epochs_are_deterministic_and_resume_from_a_position(tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    records = load_records(tmp_path / "d.jsonl", "q", "a")
    first = PromptSampler(records, shuffle_seed=7)
    order = [r.index for _ in range(5) for r in first.next_batch(4)]  # 20 rows: two epochs
    assert sorted(order[:10]) == list(range(10)) and order[:10] != order[10:20]
    again = PromptSampler(records, 7)
    assert order == [r.index for _ in range(5) for r in again.next_batch(4)]
    replay = PromptSampler(records, 7)
    replay.next_batch(4)
    saved = DataPosition.from_json(replay.position.to_json())
    resumed = PromptSampler(records, 7, saved)
    assert [r.index for _ in range(4) for r in resumed.next_batch(4)] == order[4:]
