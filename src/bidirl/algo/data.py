"""Prompt datasets: veRL-style parquet/JSONL loading, user reward hooks, and a resumable cursor.

Why strict validation: a bad row found at step 3,000 of a run wastes the run. Every row is
checked at load time and a :class:`DataError` names the file, where the row is (in a JSONL
file its line, from 1 as editors count; in parquet its row, from 0 as pandas and pyarrow
count: :func:`row_label`), the field and what is allowed.  Bytes that are not UTF-8 are
named by line (or row and column) and byte offset.

Accepted row shape (veRL's)::

    prompt:        list of {"role": str, "content": str}  OR  a plain string (a user turn)
    data_source:   non-empty string (selects the reward function / task)
    reward_model:  {"ground_truth": <any JSON value>, ...}
    extra_info:    optional dict

Why a cursor with plain-dict state: checkpoints must restore exactly which prompts were
already handed out, so a resumed run neither repeats nor skips prompt groups. The order is a
pure function of ``(seed, epoch)``, so the state is just ``(seed, epoch, position)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    """A dataset or reward-hook problem, with the file, row and field in the message."""


@dataclass(frozen=True)
class PromptRow:
    """One validated prompt with what is needed to score its responses."""

    messages: tuple[dict[str, str], ...]
    data_source: str
    ground_truth: Any
    extra_info: dict = field(default_factory=dict)
    index: int = 0
    """Row number in the source file (stable id for audits)."""
    path: str = ""
    """The source file (or ``<task NAME>``), so errors about a row can name where it is."""

    @property
    def label(self) -> str:
        """Where the row is in its file, as a person looks for it: ``line 31`` / ``row 30``."""
        return row_label(self.path, self.index)


_LINE_FORMATS = (".jsonl", ".json")


def row_label(path: str | Path, index: int) -> str:
    """Record ``index`` (0-based) of ``path`` as a person finds it: ``line index+1`` in a JSON
    lines file (one record per line, editors count from 1), ``row index`` elsewhere (parquet
    and built-in tasks, counted from 0 as pandas and pyarrow do)."""
    return f"line {index + 1}" if str(path).lower().endswith(_LINE_FORMATS) else f"row {index}"


def _fail(path: Path, row: int, fieldname: str, problem: str, allowed: str) -> DataError:
    return DataError(f"{path}: {row_label(path, row)}: field '{fieldname}' {problem}; allowed: {allowed}")


def _normalise_messages(raw: Any, path: Path, row: int) -> tuple[dict[str, str], ...]:
    roles = "/".join(_ROLES)
    allowed = f"a non-empty string, or a non-empty list of {{'role': one of {roles}, 'content': str}}"
    if isinstance(raw, str):
        if not raw:
            raise _fail(path, row, "prompt", "is an empty string", allowed)
        return ({"role": "user", "content": raw},)
    if isinstance(raw, np.ndarray):  # pandas hands list columns over as object arrays
        raw = raw.tolist()
    if not isinstance(raw, list | tuple) or not raw:
        raise _fail(path, row, "prompt", f"is {type(raw).__name__} {raw!r:.60}", allowed)
    messages = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise _fail(path, row, f"prompt[{i}]", f"is {type(msg).__name__}", allowed)
        role, content = msg.get("role"), msg.get("content")
        if role not in _ROLES:
            raise _fail(path, row, f"prompt[{i}].role", f"is {role!r}", allowed)
        if not isinstance(content, str):
            raise _fail(path, row, f"prompt[{i}].content", f"is {type(content).__name__}", allowed)
        messages.append({"role": role, "content": content})
    return tuple(messages)


def validate_row(raw: Any, path: Path | str, row: int) -> PromptRow:
    """Check one raw record and turn it into a :class:`PromptRow`."""
    path = Path(path)
    if not isinstance(raw, dict):
        raise _fail(path, row, "<row>", f"is {type(raw).__name__}", "a JSON object / record")
    if "prompt" not in raw:
        raise _fail(path, row, "prompt", "is missing", "a string or a list of chat messages")
    messages = _normalise_messages(raw["prompt"], path, row)
    source = raw.get("data_source")
    if not isinstance(source, str) or not source:
        raise _fail(path, row, "data_source", f"is {source!r:.60}", "a non-empty string")
    reward = raw.get("reward_model")
    if not isinstance(reward, dict) or "ground_truth" not in reward:
        raise _fail(
            path, row, "reward_model.ground_truth", "is missing",
            "reward_model must be an object with a 'ground_truth' key",
        )
    extra = raw.get("extra_info")
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise _fail(path, row, "extra_info", f"is {type(extra).__name__}", "an object or null")
    return PromptRow(messages, source, reward["ground_truth"], dict(extra), row, str(path))


def _read_jsonl(path: Path) -> list[Any]:
    records = []
    offset = 0  # of the line in the file, in bytes
    for row, raw in enumerate(path.read_bytes().splitlines(keepends=True)):  # \n, \r\n, \r: as text mode
        try:
            line = raw.decode("utf-8-sig" if row == 0 else "utf-8")  # a BOM is UTF-8's own marker
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: line {row + 1}: byte 0x{raw[e.start]:02x} at byte offset {offset + e.start} "
                            f"(column {e.start + 1}) is not UTF-8 ({e.reason}); allowed: UTF-8 text, one JSON "
                            "object per line (re-encode the file as UTF-8)") from None
        offset += len(raw)
        if not line.strip():
            raise _fail(path, row, "<line>", "is blank", "one JSON object per line")
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise _fail(path, row, "<line>", f"is not valid JSON ({e.msg})", "one JSON object per line") from None
    return records


def _read_parquet(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read parquet: {e}") from e
    try:
        return table.to_pylist()
    except UnicodeDecodeError:  # a string column holding bytes that are not UTF-8
        raise _bad_utf8_cell(path, table) from None


def _bad_utf8_cell(path: Path, table) -> DataError:
    """The first cell whose text is not UTF-8, named by row, column and byte offset."""
    for name in table.column_names:
        row = 0
        for chunk in table.column(name).chunks:
            for i in range(len(chunk)):
                try:
                    chunk[i].as_py()
                except UnicodeDecodeError as e:
                    return DataError(f"{path}: {row_label(path, row + i)}: column '{name}' has byte "
                                     f"0x{e.object[e.start]:02x} at byte offset {e.start} of its text that is not "
                                     f"UTF-8 ({e.reason}); allowed: UTF-8 strings")
            row += len(chunk)
    return DataError(f"{path}: a string column holds text that is not UTF-8; allowed: UTF-8 strings")


def load_dataset(path: str | Path) -> list[PromptRow]:
    """Load and validate every row of a ``.parquet``, ``.jsonl`` or ``.json`` (JSON lines) file."""
    path = Path(path)
    return [validate_row(rec, path, i) for i, rec in enumerate(read_records(path))]


def read_records(path: str | Path) -> list[Any]:
    """The raw records of a ``.parquet``, ``.jsonl`` or ``.json`` (JSON lines) file, unvalidated
    (``algo/multimodal.py`` reads image rows through it); an empty file is a :class:`DataError`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        records = _read_parquet(path)
    elif suffix in (".jsonl", ".json"):
        records = _read_jsonl(path)
    else:
        raise DataError(f"{path}: unknown dataset format {suffix!r}; allowed: .parquet, .jsonl, .json")
    if not records:
        raise DataError(f"{path}: dataset is empty; allowed: at least one row")
    return records


def save_dataset(rows: Sequence[dict], path: str | Path) -> Path:
    """Write raw veRL-format rows as parquet or JSONL (chosen by the suffix)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), path)
    else:
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return path


def data_fingerprint(paths: Sequence[str | Path]) -> dict[str, dict[str, int | str]]:
    """What identifies each data file's content, by its path as given: ``{"sha256": hex,
    "rows": records, "bytes": size}``.

    Why a content hash and not only the row count: a run's ledger and cursor count prompts by
    index, so a file reordered or edited in place between a run and its resume keeps its row
    count while the indices now stand for other prompts.  Reads each file once (no parsing:
    JSONL rows are its lines, parquet's come from its footer).  A parquet file whose footer
    cannot be read is a :class:`DataError` naming it.
    """
    out = {}
    for p in paths:
        path = Path(p)
        digest, size, lines, last = hashlib.sha256(), 0, 0, b"\n"
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
                size += len(block)
                lines += block.count(b"\n")
                last = block[-1:]
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq  # lazy: pyarrow only for parquet files

            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except Exception as e:  # pyarrow raises several types for corrupt files (as _read_parquet)
                raise DataError(f"{path}: cannot read parquet: {e}") from None
        else:
            rows = lines + (last != b"\n")  # a last line without its newline is a row too
        out[str(p)] = {"sha256": digest.hexdigest(), "rows": int(rows), "bytes": size}
    return out


def data_changes(saved: dict[str, dict], now: dict[str, dict]) -> list[str]:
    """What differs between two :func:`data_fingerprint` results, one phrase per file (empty:
    the same data): a file gone or added, another row count, or the same rows with other content."""
    changes = []
    for name in sorted(set(saved) | set(now)):
        was, got = saved.get(name), now.get(name)
        if got is None:
            changes.append(f"{name}: no longer among the data files")
        elif was is None:
            changes.append(f"{name}: a data file the run did not have")
        elif was.get("rows") != got.get("rows"):
            changes.append(f"{name}: {got.get('rows')} rows, was {was.get('rows')}")
        elif was.get("sha256") != got.get("sha256"):
            before, after = str(was.get("sha256"))[:12], str(got.get("sha256"))[:12]
            changes.append(f"{name}: content changed with the same {got.get('rows')} rows (edited or reordered "
                           f"in place; sha256 {before}... is now {after}...)")
    return changes


def load_reward_fn(path: str | Path, name: str = "compute_score") -> Callable[..., float]:
    """Import a user's python file and return its reward function.

    The function is called as ``fn(data_source, solution_str, ground_truth, extra_info)``
    (veRL's signature) and must return a number.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: reward file not found")
    module_name = f"bidirl_user_reward_{zlib.crc32(str(path.resolve()).encode())}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise DataError(f"{path}: cannot import as a python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise DataError(f"{path}: importing the reward file failed: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise DataError(f"{path}: no function named {name!r}; callables defined: {public}")
    if not callable(fn):
        raise DataError(f"{path}: {name!r} is {type(fn).__name__}, not a function")
    return fn


@dataclass(frozen=True)
class CursorItem:
    """A prompt handed out by the cursor; ``(epoch, position)`` is its unique id."""

    epoch: int
    position: int
    index: int
    row: Any

    @property
    def uid(self) -> str:
        return f"e{self.epoch}p{self.position}"


class PromptCursor:
    """Deterministic, resumable walk over a dataset, reshuffled every epoch.

    The order in epoch ``e`` is ``np.random.default_rng([seed, e]).permutation(n)`` (or the
    file order when ``shuffle=False``), so ``state_dict()`` only needs the counters.
    """

    def __init__(self, dataset: Sequence[Any], seed: int = 0, shuffle: bool = True):
        if len(dataset) == 0:
            raise DataError("PromptCursor needs a non-empty dataset")
        self._dataset = dataset
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> np.ndarray:
        n = len(self._dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def next(self) -> CursorItem:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._order_for(self.epoch)
        index = int(self._order[self.position])
        item = CursorItem(self.epoch, self.position, index, self._dataset[index])
        self.position += 1
        return item

    def take(self, n: int) -> list[CursorItem]:
        """The next n prompts (crossing epoch boundaries as needed)."""
        return [self.next() for _ in range(n)]

    def state_dict(self) -> dict[str, int | bool]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_prompts": len(self._dataset),
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["num_prompts"]) != len(self._dataset):
            raise DataError(
                f"cursor state is for {state['num_prompts']} prompts but the dataset has "
                f"{len(self._dataset)}; resume with the same dataset"
            )
        self.seed = int(state["seed"])
        self.shuffle = bool(state.get("shuffle", True))
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._order_for(self.epoch)
