"""The files of a Hugging Face checkpoint directory: their names, the errors that refuse them, bounded readers.

Shared by the modules that read a checkpoint (:mod:`.hf_checkpoint` and the steps it runs: :mod:`.hf_config`,
:mod:`.hf_weights`, :mod:`.hf_tokenizer`). Every file is read through :func:`read_bytes`: checked to be a regular
file before it is opened, and read with a bound (``torch_ir.limits``); every refusal is a :class:`CheckpointError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import InputNotFoundError, InputReadError, UnsafeInputError, WeightsMismatchError
from ..fileio import read_input

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
ADDED_TOKENS = "added_tokens.json"

#: How many problems one error lists before it gives a count of the rest.
SHOWN = 10


class CheckpointError(InputReadError):
    """A checkpoint directory cannot be used: a file is missing, malformed, or does not fit the others.

    Every problem :func:`~.hf_checkpoint.load_checkpoint` finds is one of these (or a ``LimitExceededError``), so
    one ``except CheckpointError`` covers a bad directory; the message names the directory, the file and the fix.
    """


class CheckpointNotFoundError(CheckpointError, InputNotFoundError):
    """The directory, its ``config.json``, or a shard its index lists does not exist."""


class CheckpointWeightsError(CheckpointError, WeightsMismatchError):
    """The safetensors files do not hold the weights ``config.json`` describes, or cannot be read."""


class UnsafeCheckpointError(CheckpointError, UnsafeInputError):
    """A file of the checkpoint names a path outside the directory."""


@contextmanager
def as_checkpoint_error() -> Iterator[None]:
    """``fileio``'s refusals of a checkpoint's file (missing, not a regular file, unreadable) as CheckpointErrors,
    with the same message, so one ``except CheckpointError`` covers a bad directory."""
    try:
        yield
    except CheckpointError:
        raise
    except InputNotFoundError as e:
        raise CheckpointNotFoundError(str(e)) from None
    except InputReadError as e:
        raise CheckpointError(str(e)) from None


def read_bytes(root: Path, name: str, fix: str) -> bytes:
    """The bytes of ``root/name``: a regular file (checked before it is opened), read with a bound."""
    with as_checkpoint_error():
        return read_input(root / name, f"checkpoint file {name}", fix)


def _parse_json(root: Path, name: str, data: bytes, fix: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {root}: {name} is not valid JSON ({type(e).__name__}: {e}); {fix}") \
            from None


def read_json_object(root: Path, name: str, fix: str) -> dict[str, Any]:
    """The JSON object of ``root/name``; its size is checked before it is read (``torch_ir.limits``)."""
    return parse_json_object(root, name, read_bytes(root, name, fix), fix)


def parse_json_object(root: Path, name: str, data: bytes, fix: str) -> dict[str, Any]:
    value = _parse_json(root, name, data, fix)
    if not isinstance(value, dict):
        raise CheckpointError(f"checkpoint {root}: {name} holds a JSON {type(value).__name__}, not an object; {fix}")
    return value
