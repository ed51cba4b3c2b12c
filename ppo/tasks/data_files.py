"""A user's dataset: local files and saved Hugging Face `datasets` directories.

`PPOConfig.dataset` names a JSON, JSONL, Parquet or CSV file, or a directory written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``. Both are read with Hugging Face
`datasets` (the optional ``datasets`` extra, ``pip install -e '.[datasets]'``). Nothing is
fetched from the hub: a path that does not exist is an error, never a dataset name.

Implementation details that live here:

- **Splits** (`dataset_split`, `eval_dataset`, `eval_split`): a file is one split,
  ``train`` (what ``load_dataset("json", data_files=...)`` calls it); a saved
  ``DatasetDict`` has named splits. The held-out prompts come from `eval_dataset`, else
  from `eval_split` of `dataset`, else the training prompts are evaluated on.
- **Columns** (`prompt_column`, `answer_column`): a missing column is named with the
  columns the file has; an empty or non-text cell is named by its row (counted from 1).
- **No cache left behind**: a file is prepared in a temporary cache that is removed once
  its rows are read, so a run writes nothing outside its own directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ppo.tasks.gsm8k import TaskDataError

# File suffix -> the `datasets` builder that reads it.
FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError("PPOConfig.dataset is read with Hugging Face datasets, which is not installed: "
                          "pip install -e '.[datasets]' (or pip install datasets)") from None
    return datasets


def read_rows(path: str | Path, split: str = "train") -> list[dict]:
    """The rows of split `split` of the dataset at `path`, as dictionaries.

    Raises `TaskDataError` naming the path for: no such path, an unknown file suffix, an
    empty file, a file `datasets` cannot parse, a directory that is not a saved dataset,
    a split it does not have, and a dataset with no rows.
    """
    path = Path(path)
    if not path.exists():
        raise TaskDataError(f"{path}: no such file or directory (a local dataset file or a directory written by "
                            "save_to_disk; nothing is downloaded)")
    datasets = _datasets()
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as error:  # datasets raises several kinds; name the path
            raise TaskDataError(f"{path}: not a directory written by datasets' save_to_disk "
                                f"({type(error).__name__}: {error})") from None
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise TaskDataError(f"{path}: no split {split!r}; its splits are {sorted(loaded)}")
            table = loaded[split]
        elif split != "train":
            raise TaskDataError(f"{path}: a single saved dataset has no split {split!r}; it is read as 'train'")
        else:
            table = loaded
        rows = table.to_list()
    else:
        builder = FILE_FORMATS.get(path.suffix.lower())
        if builder is None:
            raise TaskDataError(f"{path}: unknown file type {path.suffix!r}; use one of {sorted(FILE_FORMATS)} or a "
                                "directory written by save_to_disk")
        if split != "train":
            raise TaskDataError(f"{path}: a file is one split, 'train', so split {split!r} cannot be read from it; "
                                "name a held-out file in eval_dataset")
        if path.stat().st_size == 0:
            raise TaskDataError(f"{path}: the file is empty")
        with tempfile.TemporaryDirectory(prefix="ppo-dataset-") as cache:
            try:
                table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
            except Exception as error:
                cause = error.__cause__ or error
                raise TaskDataError(f"{path}: cannot be read as {builder} ({type(cause).__name__}: {cause})") from None
            rows = table.to_list()
    if not rows:
        raise TaskDataError(f"{path}: split {split!r} has no rows")
    return rows


def column(rows: list[dict], name: str, path: str | Path, field: str, numbers: bool = False) -> list[str]:
    """Column `name` of `rows` as non-empty strings; `numbers` also takes numeric cells (gold
    answers read from CSV or Parquet), written as text. `field` is the PPOConfig field that
    named the column, for the error."""
    if name not in rows[0]:
        raise TaskDataError(f"{path}: no column {name!r} (PPOConfig.{field}); its columns are {sorted(rows[0])}")
    values = []
    for index, row in enumerate(rows, start=1):
        value = row.get(name)
        if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        if not isinstance(value, str):
            raise TaskDataError(f"{path}: row {index}: column {name!r} holds {type(value).__name__} {value!r}, not text")
        if not value.strip():
            raise TaskDataError(f"{path}: row {index}: column {name!r} is empty")
        values.append(value)
    return values


def train_and_eval_rows(config) -> tuple[tuple[list[dict], str], tuple[list[dict], str] | None]:
    """``((train_rows, where), (eval_rows, where) or None)`` as the config's dataset fields
    say; ``where`` names the file and split for errors."""
    train = (read_rows(config.dataset, config.dataset_split), f"{config.dataset} [{config.dataset_split}]")
    if config.eval_dataset is not None:
        split = config.eval_split or "train"
        return train, (read_rows(config.eval_dataset, split), f"{config.eval_dataset} [{split}]")
    if config.eval_split is not None:
        return train, (read_rows(config.dataset, config.eval_split), f"{config.dataset} [{config.eval_split}]")
    return train, None


def load_prompts(config) -> tuple[list[str], list[str] | None]:
    """Training and held-out prompts (None: evaluate on the training prompts) from `config.dataset`."""
    (train, where), held_out = train_and_eval_rows(config)
    prompts = column(train, config.prompt_column, where, "prompt_column")
    if held_out is None:
        return prompts, None
    return prompts, column(held_out[0], config.prompt_column, held_out[1], "prompt_column")
