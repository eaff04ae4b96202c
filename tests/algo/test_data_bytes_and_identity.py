"""Data files as bytes: text that is not UTF-8 is one line naming where, lines count from 1,
and a fingerprint tells whether a file is still the one a run started with."""

from __future__ import annotations

import json

import pytest

from bidirl.algo.data import DataError, data_changes, data_fingerprint, load_dataset, row_label, save_dataset

ROW = {"prompt": "add 1+2", "data_source": "add", "reward_model": {"ground_truth": "3"}}


def _lines(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_a_non_utf8_jsonl_names_file_line_and_byte_offset(tmp_path):
    path = tmp_path / "latin1.jsonl"
    head = _lines([ROW] * 30)
    bad = json.dumps({**ROW, "prompt": "caf\u00e9"}, ensure_ascii=False).encode("latin-1") + b"\n"
    path.write_bytes(head + bad + _lines([ROW]))
    with pytest.raises(DataError) as info:
        load_dataset(path)
    msg = str(info.value)
    column = bad.index(b"\xe9")
    assert msg.startswith(f"{path}: line 31: byte 0xe9 at byte offset {len(head) + column} (column {column + 1}) "
                          "is not UTF-8")
    assert "\n" not in msg


def test_a_utf8_bom_and_crlf_lines_are_read(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(ROW).encode() + b"\r\n" + json.dumps(ROW).encode() + b"\r\n")
    assert [r.ground_truth for r in load_dataset(path)] == ["3", "3"]


def test_a_non_utf8_parquet_string_names_row_and_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    prompts = pa.array([b"add 1+2", b"caf\xe9 ok"], pa.binary()).view(pa.string())
    table = pa.table({"prompt": prompts, "data_source": ["add", "add"],
                      "reward_model": [{"ground_truth": "3"}, {"ground_truth": "3"}]})
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(DataError) as info:
        load_dataset(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: row 1: column 'prompt' has byte 0xe9 at byte offset 3 of its text") and \
        "not UTF-8" in msg and "\n" not in msg


def test_jsonl_lines_count_from_1_and_parquet_rows_from_0(tmp_path):
    assert row_label("d.jsonl", 30) == "line 31" and row_label("d.JSON", 0) == "line 1"
    assert row_label("d.parquet", 30) == "row 30" and row_label("<task add>", 4) == "row 4"
    path = tmp_path / "d.jsonl"
    path.write_bytes(_lines([ROW] * 30) + b"{not json\n")
    with pytest.raises(DataError, match=r"d.jsonl: line 31: field '<line>' is not valid JSON"):
        load_dataset(path)
    rows = load_dataset(save_dataset([ROW, ROW], tmp_path / "ok.jsonl"))
    assert rows[1].index == 1 and rows[1].label == "line 2"


def test_the_fingerprint_holds_content_rows_and_size(tmp_path):
    jsonl = save_dataset([ROW, {**ROW, "prompt": "add 2+2"}], tmp_path / "a.jsonl")
    parquet = save_dataset([ROW] * 3, tmp_path / "b.parquet")
    fp = data_fingerprint([str(jsonl), str(parquet)])
    assert fp[str(jsonl)]["rows"] == 2 and fp[str(parquet)]["rows"] == 3
    assert fp[str(jsonl)]["bytes"] == jsonl.stat().st_size and len(fp[str(jsonl)]["sha256"]) == 64
    assert data_changes(fp, data_fingerprint([str(jsonl), str(parquet)])) == []
    assert json.loads(json.dumps(fp)) == fp  # goes into a checkpoint's JSON as it is
    no_newline = tmp_path / "c.jsonl"
    no_newline.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW))
    assert data_fingerprint([no_newline])[str(no_newline)]["rows"] == 2


def test_a_file_reordered_in_place_with_the_same_rows_is_a_change(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{**ROW, "prompt": f"add {i}+1"} for i in range(5)]
    save_dataset(rows, path)
    saved = data_fingerprint([str(path)])
    save_dataset(rows[::-1], path)
    now = data_fingerprint([str(path)])
    assert now[str(path)]["rows"] == 5 and now[str(path)]["bytes"] == saved[str(path)]["bytes"]
    (change,) = data_changes(saved, now)
    assert change.startswith(f"{path}: content changed with the same 5 rows (edited or reordered in place")


def test_rows_added_and_files_swapped_are_named(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    save_dataset([ROW] * 4, a)
    save_dataset([ROW], b)
    saved = data_fingerprint([str(a)])
    save_dataset([ROW] * 6, a)
    changes = data_changes(saved, data_fingerprint([str(a), str(b)]))
    assert changes == [f"{a}: 6 rows, was 4", f"{b}: a data file the run did not have"]
    assert data_changes(saved, {}) == [f"{a}: no longer among the data files"]
