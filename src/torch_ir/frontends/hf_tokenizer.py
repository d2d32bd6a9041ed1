"""A checkpoint's tokenizer: ``tokenizer.json`` loaded from private copies, and every call into it bounded.

The tokenizer is made from private copies of the few files it needs (read with a bound), so transformers cannot
open any other file of the directory. Every call into the tokenizer library (loading, encoding, decoding) ends in
a result or one error naming ``tokenizer.json``: its Rust panics are caught, and a call is abandoned after
``max_tokenizer_seconds`` (see :func:`tokenizer_call` for why a regex can otherwise take hours).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..limits import get_limits, how_to_raise
from .hf_config_checks import entries
from .hf_files import (
    ADDED_TOKENS,
    CONFIG,
    SPECIAL_TOKENS_MAP,
    TOKENIZER,
    TOKENIZER_CONFIG,
    CheckpointError,
    parse_json_object,
    read_bytes,
)

#: The files the tokenizer is made from. ``AutoTokenizer.from_pretrained`` opens a dozen names by itself (these,
#: vocab.json, merges.txt, tokenizer.model, chat templates, ... by class and version); it is given a private
#: directory holding copies of these only. transformers 5 builds a fast tokenizer from tokenizer.json alone (the
#: vocabulary files beside it change nothing), and picks its class by config.json's model_type.
_TOKENIZER_FILES = (TOKENIZER, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, ADDED_TOKENS, CONFIG)

_T = TypeVar("_T")

_TOKENIZER_FIX = (f"replace {TOKENIZER} and {TOKENIZER_CONFIG} with the model's own (tokenizer.save_pretrained(dir) "
                  "writes both), or delete them to load the checkpoint without a tokenizer")


def load_tokenizer(root: Path, config: Any) -> Any | None:
    """The fast tokenizer of ``tokenizer.json`` (None without one), checked against the config's vocabulary.

    transformers loads it from a private directory holding copies of :data:`_TOKENIZER_FILES` (each a regular
    file of the checkpoint, read with a bound): whatever names from_pretrained opens, it finds only those.
    """
    if not os.path.lexists(root / TOKENIZER):
        return None
    files = {name: read_bytes(root, name, _TOKENIZER_FIX) for name in _TOKENIZER_FILES
             if os.path.lexists(root / name)}
    settings = (parse_json_object(root, TOKENIZER_CONFIG, files[TOKENIZER_CONFIG], _TOKENIZER_FIX)
                if TOKENIZER_CONFIG in files else {})
    with tempfile.TemporaryDirectory(prefix="torch_ir_tokenizer_") as private:
        for name, data in files.items():
            (Path(private) / name).write_bytes(data)
        try:
            tokenizer = tokenizer_call(root, "loaded as a tokenizer",
                                       lambda: _tokenizer_from(private, "auto_map" in settings))
        except CheckpointError as e:  # the library's message names the copy; the user knows the original
            raise type(e)(str(e).replace(private, str(root))) from None
    tokenizer.name_or_path = str(root)
    _check_decoder(root, tokenizer)
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        raise CheckpointError(
            f"checkpoint {root}: the tokenizer ({TOKENIZER}) has {len(tokenizer)} tokens but {CONFIG} has "
            f"vocab_size={vocab}: ids up to {len(tokenizer) - 1} cannot be embedded; use the tokenizer that "
            f"belongs to these weights, or the {CONFIG} that does")
    return tokenizer


def _tokenizer_from(directory: str, custom: bool) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if custom:  # tokenizer code of the model's own: never run; tokenizer.json alone describes the tokenizer
        return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    # the class transformers' table gives, as from_pretrained users get
    return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)


def _check_decoder(root: Path, tokenizer: Any) -> None:
    """Refuse a regular expression in the decoder the tokenizer was loaded with: decoding runs every token through
    it while holding the GIL, so its time could not be bounded as encoding's is (:func:`tokenizer_call`). Real
    tokenizers' decoders replace plain strings (``"\u2581"`` -> ``" "``)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return
    for place, name, value in entries(json.loads(decoder.__getstate__())):
        if name == "Regex":
            raise CheckpointError(
                f"checkpoint {root}: {TOKENIZER}: decoder.{place} is the regular expression {json.dumps(value)[:80]}; "
                f"a decoder may only replace plain strings (a regex could take hours on one token); {_TOKENIZER_FIX}")


def tokenizer_call(root: Path, action: str, call: Callable[[], _T]) -> _T:
    """``call()``, a call into the tokenizers library, ending in its result or one :class:`CheckpointError` that
    names ``tokenizer.json`` and says it cannot be ``action`` ("loaded as a tokenizer", "used to ...").

    A hostile ``tokenizer.json`` defeats a plain ``try`` two ways:

    * the Rust library panics on some files and texts: ``pyo3_runtime.PanicException`` derives from
      ``BaseException``, which ``except Exception`` misses, and the panic hook first prints to file descriptor 2
      (with ``RUST_BACKTRACE``, a whole backtrace), which would break the command line's one-line error: fd 2 is
      held meanwhile (:class:`_HeldStderr`);
    * a regular expression of its normalizer or pre-tokenizer backtracks catastrophically (``(a+)+$``).
      Oniguruma, the library's regex engine, gives up one match after 10^7 steps (``retry-limit-in-match``:
      the panic above, in 0.2 s), but a search tries every start position, and a text of many near misses
      (``"a" * 21 + "!"`` repeated) costs just under that limit at each: 22 KB took 46 s. No rule on a pattern's
      text tells such regexes from the intricate ones real tokenizers use, so the call itself is bounded: it
      runs in a worker thread, abandoned after ``max_tokenizer_seconds``. Encoding releases the GIL inside the
      library (``encode_batch``), so the deadline holds; the abandoned thread runs on until the library returns
      (a command line exits, which ends it). Decoding holds the GIL, so a decoder may not use a regex at all
      (:func:`_check_decoder`).
    """
    seconds = get_limits().max_tokenizer_seconds
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException; reported by the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=work, name="torch_ir tokenizer", daemon=True)
    with _HeldStderr() as held:
        worker.start()
        worker.join(seconds)
        held.keep = not worker.is_alive() and "error" not in outcome  # a library's warnings survive a success
    if worker.is_alive():
        raise CheckpointError(
            f"checkpoint {root}: {TOKENIZER} could not be {action} within {seconds} s, the limit on one call into a "
            f"tokenizer (max_tokenizer_seconds): a regular expression of it backtracks catastrophically; "
            f"{_TOKENIZER_FIX}; {how_to_raise('max_tokenizer_seconds')}")
    if "error" in outcome:
        e = outcome["error"]
        detail = " ".join(str(e).split())[:300]  # a panic's message spans lines
        raise CheckpointError(f"checkpoint {root}: {TOKENIZER} cannot be {action} ({type(e).__name__}: {detail}); "
                              f"{_TOKENIZER_FIX}")
    return outcome["value"]


class _HeldStderr:
    """File descriptor 2 sent to a temporary file for a ``with`` block; what was written there goes back to stderr
    at the end when ``keep`` is set, and is dropped otherwise (a panic's message: the error says what happened).

    fd 2 belongs to the process, so blocks are serialized; another thread's stderr output in the meantime is
    delayed (or, when the call fails, dropped).
    """

    _lock = threading.Lock()

    def __init__(self) -> None:
        self.keep = False
        self._saved: int | None = None

    def __enter__(self) -> _HeldStderr:
        self._file = tempfile.TemporaryFile()
        self._lock.acquire()
        _flush_stderr()
        try:
            self._saved = os.dup(2)
        except OSError:  # no fd 2 at all (a daemon): nothing to hold
            return self
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._saved is not None:
                _flush_stderr()
                os.dup2(self._saved, 2)
                os.close(self._saved)
                if self.keep:
                    self._replay()
        finally:
            self._file.close()
            self._lock.release()

    def _replay(self) -> None:
        self._file.seek(0)
        while chunk := self._file.read(1 << 16):
            while chunk:
                chunk = chunk[os.write(2, chunk):]


def _flush_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):  # closed or broken: nothing buffered can be saved
        pass
