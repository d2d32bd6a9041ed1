"""Reading a hardware description file: an untrusted file, so a regular file of bounded size, UTF-8, strict
JSON or TOML (no duplicate keys, bounded nesting), every over-long number left unconverted for the field check
of :mod:`.hardware` to refuse by name. The description's rules (fields, ranges) are :mod:`.hardware`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from torch_ir.errors import InputReadError, LimitExceededError, TorchIRError
from torch_ir.fileio import check_regular_file, read_input

try:  # the standard library's from Python 3.11; tomli is the same parser for 3.10
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]

#: A hardware file is a page of text (the presets are about 1 KiB): anything larger is refused unread.
MAX_FILE_BYTES = 1 << 20
#: Digits of the longest number literal read (a valid field needs at most about 15): a longer one is refused
#: before it is converted, so that no file makes Python convert (or refuse, past 4300 digits) a huge integer.
MAX_NUMBER_DIGITS = 100


class HardwareError(TorchIRError, ValueError):
    """A hardware description is missing, unreadable or breaks a rule; the message names the file, the field,
    the rule and the fix."""


def read_description(path: Path, suffix: str, on_long_number: Callable[[str, LongNumber], NoReturn]) -> Any:
    """The parsed JSON or TOML of ``path`` (``suffix`` says which); ``on_long_number(field, number)`` refuses a
    TOML number too long to convert (JSON keeps it as a :class:`LongNumber` for the field check)."""
    if suffix == ".toml" and _toml is None:  # pragma: no cover - Python 3.10 without tomli
        raise HardwareError(f"{path}: reading TOML needs Python 3.11 or the tomli package; fix: pip install tomli, "
                            f"or give the same description as a .json file")
    text = _decode(_read(path), path)
    return _parse_toml(text, path, on_long_number) if suffix == ".toml" else _parse_json(text, path)


def _read(path: Path) -> bytes:
    """The file's bytes: a regular file (a FIFO, a device or a link to one is refused before it is opened) of
    at most ``MAX_FILE_BYTES``, read with that bound."""
    fix = "give the path of a regular .toml or .json hardware file"
    try:
        check_regular_file(path, "hardware file", fix)
        _check_size(path, path.stat().st_size)
        data = read_input(path, "hardware file", fix)
    except (InputReadError, LimitExceededError) as err:
        raise HardwareError(str(err)) from None
    except OSError as err:  # removed or made unreadable between the checks
        raise HardwareError(f"hardware file {path}: cannot be read ({err.strerror or err}); fix: {fix}") from None
    _check_size(path, len(data))  # it grew after it was checked
    return data


def _check_size(path: Path, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise HardwareError(f"hardware file {path}: is {size:,} bytes, over the {MAX_FILE_BYTES:,} bytes a hardware "
                            "description may take (one is about 1 KiB); fix: give the hardware description itself")


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HardwareError(f"hardware file {path}: is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
                            f"{err.start}); fix: save it as UTF-8") from None


def _too_deep(path: Path) -> HardwareError:
    return HardwareError(f"hardware file {path}: is nested too deeply to be a hardware description (it has at "
                         "most three levels of tables); fix: correct the file")


def _parse_json(text: str, path: Path) -> Any:
    """Strict JSON: a duplicate key is refused (json keeps the last one silently); NaN and Infinity are read,
    for the field check to name them; an over-long number is kept unconverted (``LongNumber``)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_json_int, parse_float=_json_float)
    except json.JSONDecodeError as err:
        raise HardwareError(f"hardware file {path}: cannot be read as JSON (line {err.lineno}, column {err.colno}: "
                            f"{err.msg}); fix: correct the syntax") from None
    except _DuplicateKeyError as err:
        raise HardwareError(f"hardware file {path}: key {quote(err.key)} appears twice in one object (JSON "
                            "readers disagree on which one wins); fix: keep one of them") from None
    except RecursionError:
        raise _too_deep(path) from None


def _parse_toml(text: str, path: Path, on_long_number: Callable[[str, LongNumber], NoReturn]) -> Any:
    """TOML (the parser refuses duplicate keys itself); an over-long number is refused, naming its field,
    before the parser would convert it."""
    long = _long_literal(text)
    if long:
        number, name = LongNumber(long.group()), _toml_field_at(text, long.start())
        if name is None:
            raise HardwareError(f"hardware file {path}: line {text.count(chr(10), 0, long.start()) + 1}: {number} is "
                                "longer than any number of a hardware file; fix: correct the value")
        on_long_number(name, number)
    try:
        return _toml.loads(text)
    except _toml.TOMLDecodeError as err:
        raise HardwareError(f"hardware file {path}: cannot be read as TOML ({err}); fix: correct the syntax") from None
    except ValueError as err:  # a value the parser could not convert (its own error names no line)
        raise HardwareError(f"hardware file {path}: cannot be read as TOML ({err}); fix: correct the value") from None
    except RecursionError:
        raise _too_deep(path) from None


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for key, value in pairs:
        if key in table:
            raise _DuplicateKeyError(key)
        table[key] = value
    return table


@dataclass(frozen=True)
class LongNumber:
    """A number literal longer than ``MAX_NUMBER_DIGITS``, left unconverted: the field check refuses it by name."""

    literal: str

    def __str__(self) -> str:
        return f"a number of {sum(c.isdigit() for c in self.literal):,} digits"


#: A run of digits, with TOML's ``_`` between them.
_DIGIT_RUN = re.compile(r"[0-9][0-9_]*")


def _long_literal(text: str) -> re.Match[str] | None:
    """The first run of more than ``MAX_NUMBER_DIGITS`` digits in ``text`` (one linear scan)."""
    for run in _DIGIT_RUN.finditer(text):
        if len(run.group()) > MAX_NUMBER_DIGITS and sum(c.isdigit() for c in run.group()) > MAX_NUMBER_DIGITS:
            return run
    return None


def _json_int(literal: str) -> int | LongNumber:
    return LongNumber(literal) if len(literal) > MAX_NUMBER_DIGITS else int(literal)


def _json_float(literal: str) -> float | LongNumber:
    return LongNumber(literal) if len(literal) > MAX_NUMBER_DIGITS else float(literal)


#: A TOML key before its ``=`` (bare or quoted, dotted).
_TOML_KEY = re.compile(r"([A-Za-z0-9_.\"'-]+)\s*=")


def _toml_field_at(text: str, pos: int) -> str | None:
    """The dotted field a TOML value at ``pos`` belongs to, as far as its line tells (for a message only): the
    last ``[table]`` header above it and the last ``key =`` before it on its line. The text is hostile: the key
    is looked for in the last 200 characters only and headers without a pattern, so that no line of a million
    brackets or letters makes a regular expression backtrack quadratically."""
    line_start = text.rfind("\n", 0, pos) + 1
    keys = _TOML_KEY.findall(text[max(line_start, pos - 200):pos])
    header = next((line.strip().strip("[]").strip() for line in reversed(text[:line_start].splitlines())
                   if line.lstrip().startswith("[")), "")
    name = ".".join(part.strip("\"'") for part in (header, keys[-1] if keys else "") if part)
    return name or None


def quote(name: str) -> str:
    """A field name in double quotes, with any newline or control character escaped and its length bounded
    (an unknown key is the file's text)."""
    text = json.dumps(name)
    return text if len(text) <= 80 else text[:76] + '..."'


__all__ = ["MAX_FILE_BYTES", "MAX_NUMBER_DIGITS", "HardwareError", "LongNumber", "quote", "read_description"]
