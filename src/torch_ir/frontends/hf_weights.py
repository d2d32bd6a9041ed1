"""A checkpoint's weight files: which safetensors files hold the weights, their headers, their tensors.

Weights are read from safetensors only: ``pytorch_model.bin`` pickles are refused with the command that converts
them, since unpickling can run code. The shard index may only name plain file names inside the directory, every
file is checked to be a regular file before safetensors opens it by name, and every tensor's size is checked
against ``torch_ir.limits`` before it is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import LimitExceededError
from ..fileio import check_regular_file
from ..limits import check_alloc, check_shape
from .hf_files import (
    INDEX,
    SHOWN,
    WEIGHTS,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWeightsError,
    UnsafeCheckpointError,
    as_checkpoint_error,
    read_json_object,
)

#: Bytes per element of each safetensors dtype code; a tensor of another code is refused.
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_CODES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F16", "BF16", "F32", "F64"}
_CONVERT_HINT = ("convert it to safetensors where the file is trusted: "
                 "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir) writes model.safetensors "
                 "(pickled weights can run code when they are loaded, so torch_ir never opens them)")


@dataclass(frozen=True)
class Stored:
    """One tensor as a safetensors header describes it (no data read)."""

    file: Path
    shape: tuple[int, ...]
    code: str  # safetensors dtype code: "F32", "BF16", ...


def weight_files(root: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files, in the order ``from_pretrained`` looks: one file first, then a shard index."""
    if os.path.lexists(root / WEIGHTS):
        _check_weights_file(root / WEIGHTS)
        return [root / WEIGHTS], None
    if os.path.lexists(root / INDEX):
        return _shards(root)
    raise _no_weights(root)


def _shards(root: Path) -> tuple[list[Path], dict[str, str]]:
    fix = f"download {INDEX} again, or save the model with save_pretrained(dir), which writes it"
    index = read_json_object(root, INDEX, fix)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"checkpoint {root}: {INDEX} has no \"weight_map\" object (tensor name -> shard file); {fix}")
    bad = [(k, v) for k, v in weight_map.items() if not isinstance(v, str)]
    if bad:
        raise CheckpointError(
            f"checkpoint {root}: {INDEX} maps {bad[0][0]!r:.80} to {bad[0][1]!r:.80}, not a file name; {fix}")
    names = sorted(set(weight_map.values()))
    files = [_shard_path(root, name) for name in names]
    missing = [name for name, file in zip(names, files) if not os.path.lexists(file)]
    if missing:
        shown = ", ".join(missing[:SHOWN]) + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
        raise CheckpointNotFoundError(
            f"checkpoint {root}: {INDEX} lists shard(s) that are not in the directory: {shown}; download the "
            f"missing shard(s): every one of the {len(names)} files the index names is needed")
    for file in files:
        _check_weights_file(file)
    return files, dict(weight_map)


def _shard_path(root: Path, name: str) -> Path:
    """``root/name`` for a plain file name; anything that could point elsewhere is refused.

    A plain name can only be a file in the directory itself (which may be a symlink: the Hugging Face cache
    links each snapshot's files to its blobs, and the user chose that directory).
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or Path(name).is_absolute():
        raise UnsafeCheckpointError(
            f"checkpoint {root}: {INDEX} names shard {name!r:.200}, which is not a plain file name in the "
            "directory; shards are read only from the checkpoint directory itself (no ../, no absolute paths): "
            "use an index written by save_pretrained")
    if not name.endswith(".safetensors"):
        hint = _CONVERT_HINT if name.endswith((".bin", ".pt", ".pth")) else "list the .safetensors shards"
        raise CheckpointError(f"checkpoint {root}: {INDEX} names shard {name!r:.200}, which is not a "
                              f".safetensors file; only safetensors weights are read: {hint}")
    return root / name


def _no_weights(root: Path) -> CheckpointError:
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        names = []
    pickles = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt", ".bin.index.json"))]
    if pickles:
        return CheckpointError(
            f"checkpoint {root}: the weights are {', '.join(pickles[:3])}, a PyTorch pickle format this loader "
            f"does not read; {_CONVERT_HINT}")
    other = [n for n in names if n.endswith(".safetensors")]
    found = (f"; the directory has {', '.join(other[:3])}: if that is the model, rename it to {WEIGHTS} (one "
             f"file) or write the {INDEX} that lists the shards" if other else "")
    return CheckpointNotFoundError(
        f"checkpoint {root}: no weights: neither {WEIGHTS} nor {INDEX} is in the directory{found}; copy the "
        "model's safetensors files beside its config.json (save_pretrained writes them)")


def _check_weights_file(file: Path) -> None:
    """Refuse a weights file that is not a regular file (safetensors opens it by name and maps it: a FIFO would
    block, a device never end). Its size is not an allocation: each tensor's size is checked when it is read."""
    fix = "download it again, or save the weights with save_pretrained"
    try:
        with as_checkpoint_error():
            check_regular_file(file, f"checkpoint weights file {file.name}", fix)
    except LimitExceededError:
        pass  # over max_alloc_bytes as a whole, which is fine for a file that is mapped, never read whole


@contextmanager
def opened(file: Path, root: Path) -> Iterator[Any]:
    """``safe_open`` a weights file, its failures (bad header, truncated file) as CheckpointWeightsError."""
    from safetensors import SafetensorError, safe_open

    _check_weights_file(file)  # again: state_dict() opens the files long after load_checkpoint checked them
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointWeightsError(
            f"checkpoint {root}: {file.name} is not a readable safetensors file ({type(e).__name__}: {e}); "
            "download it again, or save the weights with save_pretrained") from None
    with handle:
        yield handle


def _header(handle: Any, key: str, file: Path, root: Path) -> Stored:
    view = handle.get_slice(key)
    code = str(view.get_dtype())
    if code not in _ITEMSIZE:
        raise CheckpointWeightsError(
            f"checkpoint {root}: {key} in {file.name} has safetensors dtype {code}, which is not read here; save "
            "the weights in float32, float16 or bfloat16")
    shape = tuple(view.get_shape())
    check_shape(list(shape), _ITEMSIZE[code], f"checkpoint {root}: {key} in {file.name}")
    return Stored(file, shape, code)


def scan_headers(files: list[Path], root: Path) -> tuple[dict[str, Stored], list[str]]:
    """Every tensor's file, shape and dtype code, from the headers only; a key in two files is a problem."""
    stored: dict[str, Stored] = {}
    problems = []
    for file in files:
        with opened(file, root) as handle:
            for key in handle.keys():
                entry = _header(handle, key, file, root)
                if key in stored:
                    problems.append(f"{key} is in both {stored[key].file.name} and {file.name}")
                stored[key] = entry
    return stored, problems


def read_tensor(handle: Any, key: str, file: Path, root: Path, dtype: torch.dtype | None) -> torch.Tensor:
    """The tensor ``key`` of an :func:`opened` file, its size checked first; floats cast to ``dtype`` if given."""
    entry = _header(handle, key, file, root)  # sizes checked before the tensor exists
    if dtype is not None and entry.code in FLOAT_CODES:
        check_alloc(dtype.itemsize * _numel(entry.shape), f"checkpoint {root}: {key} in {file.name} as {dtype}")
    try:
        tensor = handle.get_tensor(key)
    except Exception as e:  # a dtype this torch lacks, a read error: name the tensor and the file
        raise CheckpointWeightsError(
            f"checkpoint {root}: {key} in {file.name} cannot be read ({type(e).__name__}: {e}); download the "
            "file again") from None
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count
