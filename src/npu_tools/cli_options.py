"""The command line's shared options: one meaning per flag, declared once.

Every ``torch-ir`` subcommand that takes weights, inputs, an output or a report adds the option here, so a
flag means the same in every command (docs/usage.md has the table; ``tests/test_cli_options.py`` parses
every subcommand against it):

==========================  ===========================================================================
``--weights FILE``          weights to **read** (``.safetensors``, ``.pt``)
``--save-weights FILE``     weights to **write** (``extract``, ``import-onnx``, ``import-tinygrad``)
``--input NAME=FILE.npy``   an input array, repeatable; ``--input FILE.npz`` gives them all (one array
                            per graph input, by name or in order)
``-o, --output PATH``       the command's output: a file where it writes one, a directory where it writes
                            several (created if its parent exists; never a chain of missing folders)
``--markdown [FILE]``       a Markdown report, to FILE, or to standard output without one (or with ``-``)
``--json FILE``             the same result as JSON
``--seed N``                the seed of what the command draws at random (inputs, weights, sampling)
``--rtol R``, ``--atol A``  comparison tolerances (default: the dtype's)
``--input-shape N=D0,..``   fix an input's dimensions
``--kv-bits BITS``          an LLM's KV cache held quantized (8: int8 codes, a float32 scale per head and
                            position), in the programs ``generate``, ``compile`` and ``cost`` make
==========================  ===========================================================================

Old spellings stay for a release as deprecated aliases (``extract --weights`` for ``--save-weights``,
``bisect --inputs``): they work, and print one warning naming the new spelling.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

#: flag -> its one meaning (the help text every command shows for it, and the docs table's second column)
MEANINGS = {
    "--weights": "weights to read: a .safetensors or .pt file",
    "--save-weights": "write the model's weights to this .safetensors file",
    "--input": "an input array NAME=FILE.npy (repeatable), or FILE.npz holding one array per graph input",
    "--output": "the output",
    "--markdown": "write a Markdown report to FILE (standard output without FILE, or with -)",
    "--json": "also write the result as JSON to FILE",
    "--seed": "seed of what the command draws at random (inputs, weights, sampling)",
    "--rtol": "relative tolerance (default: the dtype's)",
    "--atol": "absolute tolerance (default: the dtype's)",
}


class DeprecatedAlias(argparse.Action):
    """An old spelling: stores into the new option's destination and warns once, naming the new one."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated here; use {self.new}", file=sys.stderr)
        if isinstance(getattr(namespace, self.dest, None), list):
            getattr(namespace, self.dest).append(values)
        else:
            setattr(namespace, self.dest, values)


def weights(p: argparse.ArgumentParser, *, required: bool = False, default_help: str = "") -> None:
    p.add_argument("--weights", metavar="FILE", required=required,
                   help=MEANINGS["--weights"] + (f" ({default_help})" if default_help else ""))


def save_weights(p: argparse.ArgumentParser, *, default_help: str = "") -> None:
    p.add_argument("--save-weights", metavar="FILE", dest="save_weights",
                   help=MEANINGS["--save-weights"] + (f" ({default_help})" if default_help else ""))
    p.add_argument("--weights", dest="save_weights", action=DeprecatedAlias, new="--save-weights",
                   help=argparse.SUPPRESS)


def kv_bits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-bits", type=_kv_bits, default=None, metavar="BITS",
                   help="an LLM: hold the KV cache quantized, 8 = int8 codes with one float32 scale per head and "
                        "position (default: the model's float dtype)")


def _kv_bits(text: str) -> int:
    """``--kv-bits``: one of ``npu_compiler.kvcache.KV_BITS`` (the one list of the widths a cache is held at)."""
    from npu_compiler.kvcache import KV_BITS

    widths = ", ".join(map(str, KV_BITS))
    if not text.strip().isdigit() or int(text) not in KV_BITS:
        raise argparse.ArgumentTypeError(f"{text!r}: the KV cache is quantized to {widths} bits only (int8 codes, a "
                                         "float32 scale per head and position); leave --kv-bits out for the float "
                                         "cache")
    return int(text)


def inputs(p: argparse.ArgumentParser, *, old: str | None = None) -> None:
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz", dest="input",
                   help=MEANINGS["--input"])
    if old:
        p.add_argument(old, dest="input", action=DeprecatedAlias, new="--input", help=argparse.SUPPRESS)


def output(p: argparse.ArgumentParser, what: str, *, directory: bool = False, default: str | None = None) -> None:
    metavar = "DIR" if directory else "FILE"
    p.add_argument("-o", "--output", metavar=metavar, default=default,
                   help=f"{MEANINGS['--output']}: {what}" + (f" (default: {default})" if default else ""))


def markdown(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--markdown", metavar="FILE", nargs="?", const="-", default=None,
                   help=MEANINGS["--markdown"] + (f": {what}" if what else ""))


def json_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help=MEANINGS["--json"])


def seed(p: argparse.ArgumentParser, *, default: int | None = 0) -> None:
    p.add_argument("--seed", type=int, default=default, metavar="N",
                   help=MEANINGS["--seed"] + (f" (default: {default})" if default is not None else ""))


def tolerances(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rtol", type=float, help=MEANINGS["--rtol"])
    p.add_argument("--atol", type=float, help=MEANINGS["--atol"])


__all__ = ["MEANINGS", "DeprecatedAlias", "inputs", "json_file", "kv_bits", "markdown", "output", "save_weights",
           "seed", "tolerances", "weights"]
