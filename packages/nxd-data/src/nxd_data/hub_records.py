"""Fine-tuning records made from the columns of a Hugging Face dataset.

The dataset is a hub id (read and cached by `datasets`, so `HF_HUB_OFFLINE` and the cache behave as
usual), a local folder laid out like a hub dataset repository, or one json / jsonl / csv / parquet file.
Each row becomes one record the SFT or preference reader takes:

- `completion`: `{"input": prompt, "output": completion}`, the loss on the completion (and EOS) only;
  with `loss_on_prompt`, `{"input": "", "output": prompt + completion}`, the loss on every token;
- `text`: `{"input": "", "output": prompt}` (language modelling over the text);
- `preference`: `{"prompt", "chosen", "rejected"}` from three columns.

A prompt or completion is a format string over the row's columns (`"{question}\\n"`) or a function
`module:function` / `path/file.py:function` called with the row. The records are written once per
dataset, split and formatting to a json-lines file in the cache, which the usual readers then read.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import string
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from filelock import FileLock

from .errors import DataError
from .files import save_atomically
from .hf_data import hf_datasets

if TYPE_CHECKING:  # datasets loads when a hub dataset is read, not with nxd_data
    import datasets

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
RecordKind = Literal["completion", "text", "preference"]


@dataclass(frozen=True)
class HubDataset:
    """Where the rows come from and which of them are used."""

    path: str
    name: str | None = None
    train_split: str = "train"
    validation_split: str | None = None
    split_ratio: float | None = None
    """When the validation split is missing: the fraction of the training split kept for training, the
    rest validating (a seeded split)."""
    seed: int | None = None
    """Shuffle the rows with this seed before anything else (null: keep the dataset's order)."""
    num_samples: int | None = None
    drop_empty: bool = False
    """Drop rows whose used columns are empty or null (and rows a function formats to nothing)."""
    category: str | None = None
    """Keep only the rows whose `category` column equals this."""


@dataclass(frozen=True)
class RecordForm:
    """How a row becomes a record."""

    kind: RecordKind = "completion"
    prompt_template: str | None = None
    completion_template: str | None = None
    prompt_func: str | None = None
    completion_func: str | None = None
    loss_on_prompt: bool = False
    prompt_column: str = "prompt"
    chosen_column: str = "chosen"
    rejected_column: str = "rejected"


def formatted_splits(source: HubDataset, form: RecordForm, cache_dir: Path, where: str) -> dict[str, Path]:
    """{"train": file, "validation": file (when there is one)} of records (see the module docstring);
    DataError naming `where` (the config key) for every problem."""
    parts = {
        "prompt": _part(form.prompt_template, form.prompt_func, f"{where}.prompt"),
        "completion": _part(form.completion_template, form.completion_func, f"{where}.completion"),
    }
    if form.kind == "completion" and (parts["prompt"] is None or parts["completion"] is None):
        raise DataError(
            f"{where}: expected a prompt and a completion (a template or a function each), found "
            f"{'no prompt' if parts['prompt'] is None else 'no completion'}"
        )
    if form.kind != "completion" and parts["completion"] is not None or form.kind == "preference" and parts["prompt"]:
        raise DataError(
            f"{where}: {form.kind} records take "
            f"{'no completion' if form.kind == 'text' else 'their three columns as they are'}; expected "
            "no template or function for it"
        )
    if form.kind == "text" and parts["prompt"] is None:
        raise DataError(
            f"{where}: expected the text's template or function (prompt_template or prompt_func), found neither"
        )
    splits = _splits(source, where)
    key = hashlib.sha256(
        json.dumps(
            [
                asdict(source),
                asdict(form),
                [part.identity for part in parts.values() if part],
                {name: rows._fingerprint for name, rows in splits.items()},
            ],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:16]
    out = {}
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        path = cache_dir / f"records-{key}-{name}.jsonl"
        with FileLock(f"{path}.lock"):
            if not path.exists():
                records = _records(rows, form, parts, f"{where} ({source.path}, {name})", source.drop_empty)
                save_atomically(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode())
        out[name] = path
    return out


@dataclass(frozen=True)
class _Part:
    """A prompt or completion maker: a template or a function."""

    make: Callable[[Mapping[str, Any]], Any]
    columns: tuple[str, ...] | None
    """The columns a template reads (None for a function)."""
    identity: str
    describe: str


def _part(template: str | None, func: str | None, where: str) -> _Part | None:
    if template is not None and func is not None:
        raise DataError(f"{where}: expected a template or a function, found both ({template!r} and {func!r})")
    if template is not None:
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
        except ValueError as error:
            raise DataError(f"{where}: template {template!r} is not a format string ({error})") from None
        if any(field == "" or field.isdigit() for field in fields):
            raise DataError(f"{where}: template {template!r}: expected every {{...}} to name a column")
        columns = tuple(dict.fromkeys(field.split(".")[0].split("[")[0] for field in fields))
        return _Part(lambda row: template.format_map(row), columns, template, f"template {template!r}")
    if func is not None:
        function = load_function(func, where)
        try:  # the whole file: a helper or constant it reads changes the records too
            source = Path(inspect.getsourcefile(function) or "").read_text(encoding="utf-8")
        except (OSError, TypeError, UnicodeDecodeError):
            source = func
        return _Part(function, None, source, f"function {func}")
    return None


def load_function(spec: str, where: str) -> Callable[[Mapping[str, Any]], Any]:
    """The function `module:function` (imported as Python imports it) or `path/file.py:function` (a file of
    the user's, relative to the working directory) names; DataError when it cannot be loaded."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise DataError(f"{where}: expected module:function or path/file.py:function, found {spec!r}")
    looks_like_file = "/" in module_name or "\\" in module_name or module_name.endswith(".py")
    try:
        if looks_like_file:
            path = Path(module_name if module_name.endswith(".py") else f"{module_name}.py")
            if not path.is_file():
                raise DataError(f"{where}: {spec!r}: no file {path} (relative to {Path.cwd()})")
            module_spec = importlib.util.spec_from_file_location(f"nxd_user_{path.stem}", path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except DataError:
        raise
    except Exception as error:  # the user's module may fail in any way while it is imported
        raise DataError(f"{where}: {spec!r} cannot be imported: {type(error).__name__}: {error}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise DataError(f"{where}: {spec!r}: {module_name} has no function {name}")
    return function


def _splits(source: HubDataset, where: str) -> dict[str, datasets.Dataset]:
    """The training rows and the validation rows (when the source has or makes them)."""
    loaded = _load(source, where)
    if source.train_split not in loaded:
        raise DataError(
            f"{where}.train_split: {source.path} has no split {source.train_split!r}; expected one of "
            f"{', '.join(loaded)}"
        )
    train = loaded[source.train_split]
    validation = loaded.get(source.validation_split) if source.validation_split else None
    if source.seed is not None:
        train = train.shuffle(seed=source.seed)
        validation = validation.shuffle(seed=source.seed) if validation is not None else None
    if source.category is not None:
        train, validation = (
            _of_category(rows, source, where) if rows is not None else None for rows in (train, validation)
        )
    if validation is None and source.split_ratio is not None:
        if len(train) < 2:
            raise DataError(
                f"{where}.split_ratio: {source.path} has {len(train)} training row(s); expected at least 2 to split"
            )
        halves = train.train_test_split(test_size=1 - source.split_ratio, seed=source.seed or 0)
        train, validation = halves["train"], halves["test"]
    if source.num_samples is not None:
        train = train.select(range(min(source.num_samples, len(train))))
        if validation is not None:
            validation = validation.select(range(min(source.num_samples, len(validation))))
    return {"train": train} | ({"validation": validation} if validation is not None else {})


def _load(source: HubDataset, where: str) -> datasets.DatasetDict:
    datasets = hf_datasets(where)

    path = Path(source.path)
    try:
        if path.is_file():
            builder = FILE_BUILDERS.get(path.suffix)
            if builder is None:
                raise DataError(
                    f"{where}: {source.path}: expected a {', '.join(FILE_BUILDERS)} file or a dataset "
                    f"folder, found a {path.suffix or 'suffix-less'} file"
                )
            if builder == "json" and path.read_text(encoding="utf-8").lstrip()[:1] == "[":
                rows = json.loads(path.read_text(encoding="utf-8"))
                if not all(isinstance(row, dict) for row in rows):
                    raise DataError(
                        f"{where}: {source.path}: expected a JSON list of objects (one per row), found "
                        f"{type(next(r for r in rows if not isinstance(r, dict))).__name__} items"
                    )
                return datasets.DatasetDict({source.train_split: datasets.Dataset.from_list(rows)})
            return datasets.load_dataset(builder, data_files={source.train_split: str(path)})
        loaded = datasets.load_dataset(source.path, source.name)
    except DataError:
        raise
    except datasets.exceptions.DatasetGenerationError as error:  # a data file the builder cannot parse
        cause = error.__cause__ or error
        raise DataError(f"{where}: {source.path} cannot be read as a dataset: {_first(cause)}") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: {source.path} cannot be read as a dataset: {_first(error)}") from None
    except (ConnectionError, OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as error:
        raise DataError(_unreachable(source, where, error)) from None
    if not isinstance(loaded, datasets.DatasetDict):
        loaded = datasets.DatasetDict({source.train_split: loaded})
    return loaded


def _first(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _unreachable(source: HubDataset, where: str, error: Exception) -> str:
    first = _first(error)
    if Path(source.path).exists():
        return f"{where}: {source.path} cannot be read as a dataset: {first}"
    return (
        f"{where}: {source.path!r} is not a local folder or file, and the Hugging Face hub did not give it "
        f"({first}); expected a dataset folder laid out like a hub repository, a data file, or a hub id this "
        "machine can reach or has in its cache (HF_HUB_OFFLINE=1 reads the cache only; HF_HOME / "
        "HF_DATASETS_CACHE say where it is)"
    )


def _of_category(rows: datasets.Dataset, source: HubDataset, where: str) -> datasets.Dataset:
    if "category" not in rows.column_names:
        raise DataError(
            f"{where}.category: {source.path} has no category column; columns are {', '.join(rows.column_names)}"
        )
    kept = rows.filter(lambda row: row["category"] == source.category)
    if len(kept) == 0:
        found = sorted({str(value) for value in rows["category"]})
        raise DataError(
            f"{where}.category: no row of {source.path} has category {source.category!r}; found {', '.join(found[:20])}"
        )
    return kept


def _records(
    rows: datasets.Dataset, form: RecordForm, parts: dict[str, _Part | None], where: str, drop_empty: bool
) -> list[dict[str, str]]:
    columns = rows.column_names
    for name, part in parts.items():
        if part is not None and part.columns is not None and (missing := [c for c in part.columns if c not in columns]):
            raise DataError(
                f"{where}: the {name}'s {part.describe} names column(s) {', '.join(missing)}; the "
                f"dataset's columns are {', '.join(columns)}"
            )
    if form.kind == "preference":
        names = (form.prompt_column, form.chosen_column, form.rejected_column)
        if missing := [c for c in names if c not in columns]:
            raise DataError(f"{where}: no column {', '.join(missing)}; the dataset's columns are {', '.join(columns)}")
    used = {c for part in parts.values() if part is not None and part.columns for c in part.columns}
    records = []
    for number, row in enumerate(rows):
        if drop_empty and any(_empty(row[c]) for c in used):
            continue
        if form.kind == "preference":
            record = {
                "prompt": row[form.prompt_column],
                "chosen": row[form.chosen_column],
                "rejected": row[form.rejected_column],
            }
            if drop_empty and any(_empty(value) for value in record.values()):
                continue
            records.append(record)
            continue
        texts = {name: _made(part, row, number, name, where) for name, part in parts.items() if part is not None}
        if drop_empty and any(_empty(text) for text in texts.values()):
            continue
        if form.kind == "text":
            records.append({"input": "", "output": texts["prompt"]})
        elif form.loss_on_prompt:
            records.append({"input": "", "output": texts["prompt"] + texts["completion"]})
        else:
            records.append({"input": texts["prompt"], "output": texts["completion"]})
    if not records:
        dropped = " (rows with empty columns are dropped)" if drop_empty else ""
        raise DataError(f"{where}: no rows left of {len(rows)}{dropped}")
    return records


def _made(part: _Part, row: Mapping[str, Any], number: int, name: str, where: str) -> str:
    try:
        text = part.make(row)
    except Exception as error:  # a template's or the user's function's failure on this row
        raise DataError(
            f"{where}: row {number}: the {name}'s {part.describe} failed: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(text, str):
        raise DataError(
            f"{where}: row {number}: the {name}'s {part.describe} gave {type(text).__name__}; expected a string"
        )
    return text


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())
