"""A resume reads the data its run began with: a file edited or reordered in place (same row
count) is refused, naming the file and what changed, unless ``--allow-data-change``."""

from __future__ import annotations

import json

import pytest

from bidirl.algo.data import DataError, data_fingerprint
from bidirl.runtime.config import ConfigError, load_config
from bidirl.runtime.run_dir import (
    DATA_FINGERPRINT,
    RESUME_CHANGES,
    check_data_unchanged,
    record_data,
    remove_unstarted,
)

ROWS = [{"prompt": [{"role": "user", "content": f"q{i}"}], "reward_model": {"ground_truth": str(i)}}
        for i in range(5)]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def run(tmp_path):
    data = tmp_path / "train.jsonl"
    _write(data, ROWS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(None, [f"data.files=[{data}]"])
    record_data(run_dir, cfg)
    return run_dir, cfg, data


def test_the_same_data_resumes(run):
    run_dir, cfg, _ = run
    assert json.loads((run_dir / DATA_FINGERPRINT).read_text())[str(cfg.data.files[0])]["rows"] == 5
    assert check_data_unchanged(run_dir, cfg) == []


def test_a_file_reordered_in_place_is_refused_naming_it(run):
    run_dir, cfg, data = run
    _write(data, ROWS[::-1])
    with pytest.raises(ConfigError, match=r"training data changed.*train.jsonl: content changed with the same "
                                          r"5 rows.*--allow-data-change"):
        check_data_unchanged(run_dir, cfg)


def test_a_file_grown_is_refused_with_its_counts(run):
    run_dir, cfg, data = run
    _write(data, ROWS + ROWS[:1])
    with pytest.raises(ConfigError, match=r"train.jsonl: 6 rows, was 5"):
        check_data_unchanged(run_dir, cfg)


def test_an_allowed_change_is_recorded_and_becomes_the_runs(run, capsys):
    run_dir, cfg, data = run
    _write(data, ROWS[::-1])
    changes = check_data_unchanged(run_dir, cfg, allow_change=True)
    assert len(changes) == 1 and "reordered" in changes[0]
    assert "changed training data" in capsys.readouterr().err
    record = json.loads((run_dir / RESUME_CHANGES).read_text().splitlines()[-1])
    assert record["field"] == "data.files" and record["changes"] == changes
    assert check_data_unchanged(run_dir, cfg) == []  # the new fingerprint is the run's now


def test_a_missing_file_on_resume_is_one_line(run):
    run_dir, cfg, data = run
    data.unlink()
    with pytest.raises(ConfigError, match=r"data.files: cannot read .*train.jsonl"):
        check_data_unchanged(run_dir, cfg)


def test_a_run_from_before_fingerprints_is_not_checked(run):
    run_dir, cfg, data = run
    (run_dir / DATA_FINGERPRINT).unlink()
    _write(data, ROWS[::-1])
    assert check_data_unchanged(run_dir, cfg) == []


def test_a_built_in_task_has_nothing_to_fingerprint_and_an_unstarted_run_leaves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(None, [])
    (run_dir / "config.yaml").write_text("x: 1\n")
    record_data(run_dir, cfg)
    assert json.loads((run_dir / DATA_FINGERPRINT).read_text()) == {}
    remove_unstarted(run_dir)
    assert not run_dir.exists()


def test_a_parquet_file_that_is_not_parquet_is_left_to_the_loader(tmp_path):
    """Its footer unreadable: a one-line DataError naming it, never pyarrow's traceback (the
    run writes no fingerprint and the data loader's error ends it)."""
    bad = tmp_path / "garbage.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(DataError, match=f"{bad}: cannot read parquet: "):
        data_fingerprint([bad])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_data(run_dir, load_config(None, [f"data.files=[{bad}]"]))
    assert not (run_dir / DATA_FINGERPRINT).exists()
