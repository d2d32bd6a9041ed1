#!/usr/bin/env python
"""Fuzz the IR JSON loader and the ``.npubin`` loader (and the runtime behind it) with mutated valid files.

    python scripts/fuzz_loaders.py --count 20000 --seed 1

Each iteration takes the small valid model of scripts/make_hostile_corpus.py (its IR document, its
``.npubin`` program and its weights), mutates one of four inputs and feeds it to the toolkit:

==================  ============================================================================================
``ir_doc``          the IR as a dict (values retyped, keys dropped, elements duplicated or swapped, huge or
                    negative numbers, strings, deep lists, ops and tensors renamed) -> ``ir_from_dict``, and when
                    it loads, ``npu_compiler.compile``
``ir_text``         the IR's JSON text (truncated, bytes flipped, junk inserted, duplicate keys, 5,000-digit
                    numbers, NaN tokens, deep nesting) -> ``load_ir`` on a file
``npubin_bytes``    the program's bytes (flipped, truncated, extended, the header length changed) -> ``decode_npubin``
``npubin_header``   the program's header (the dict or the text mutations) re-encoded with a valid checksum ->
                    ``decode_npubin``, and when it loads: ``Executor`` construction, the weights, one run
==================  ============================================================================================

The only allowed outcomes are success (``loaded``, ``compiled``, ``ran``) or a ``TorchIRError`` subclass. Anything
else (a bare ``ValueError``, a ``RecursionError``, a native crash, a hang) is a bug: the table counts it, the first
of each kind is printed with its traceback, and the exit status is 1.

The iterations run in forked worker processes (a batch at a time, each iteration seeded by ``(seed, index)``,
under an address-space limit), so a native crash or a hang is reported with the iteration that caused it
and the run goes on. The same mutators drive tests/hostile/test_fuzz.py through hypothesis.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import math
import os
import random
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

KINDS = ("ir_doc", "ir_text", "npubin_bytes", "npubin_header")
FUZZ_LIMIT_BYTES = 64 << 20  # torch_ir.limits.max_alloc_bytes while fuzzing: a file may not ask for more
WORKER_EXTRA_AS = 3 << 30  # address space a worker may add to what it has when forked

OP_NAMES = [
    "aten.relu.default", "aten.gelu.default", "aten.mean.dim", "aten.linear.default", "aten.conv2d.default",
    "aten.add.Tensor", "aten.repeat.default", "aten.expand.default", "aten.view.default", "aten.cat.default",
    "CONV", "GEMM", "CONV_ADD", "LAYER_NORM", "KV_UPDATE", "aten.from_file.default", "aten.fill_.Scalar",
    "aten.add.out", "aten.copy_.default", "c10d.allreduce_.default", "profiler._record_function_enter.default",
    "aten._assert_async.msg", "builtins.eval.default", "aten.add.__call__", "aten.__class__.default",
    "aten..default", "prim.device.default", "os.system.default", "", "aten.relu.default ", "x" * 300,
]
STRINGS = [
    "", "x", "s0", "s0*2", "9**9**9**9", "Max(1, s0 - 1)", "__import__('os').system('touch PWNED_fuzz')",
    "().__class__.__base__.__subclasses__()", "(lambda: 1)()", "../../escaped", "/etc/passwd", "a/b",
    "float32", "float128", "int64", "bool", "__class__", "NHWC", "NCHW", "relu", "tanh", "none", "output",
    "x" * 5000, "\x00", "\u2215..", "NaN", "1e999",
]
HUGE_INTS = [2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**12, 10**15, 10**30, 10**300]
SMALL_INTS = [-(10**6), -64, -1, 0, 1, 2, 3, 4, 5, 6, 63, 64, 65, 1024]
TAGS = [{"sym": "s0"}, {"sym": "9**9**9**9"}, {"sym": "__import__('os').system('touch PWNED_fuzz')"},
        {"dtype": "float32"}, {"dtype": "__class__"}, {"pickle": "cos\nsystem\n."}, {"float": "nan"},
        {"float": "1e999"}, {"device": "cpu"}, {"memory_format": "channels_last"}, {"layout": "strided"},
        {"dtype": "float32", "sym": "s0"}, {}]


# --------------------------------------------------------------------------------------- JSON mutators


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any type: scalars of every kind, tagged objects, small containers."""
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return rng.choice(SMALL_INTS)
    if kind == 1:
        return rng.choice(HUGE_INTS)
    if kind == 2:
        return rng.choice([0.5, -1.5, 2.5, 1e300, -0.0, float("nan"), float("inf"), float("-inf")])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind in (4, 5):
        return rng.choice(STRINGS + OP_NAMES)
    if kind == 6:
        return copy.deepcopy(rng.choice(TAGS))
    if kind == 7:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 8:
        return {rng.choice(["name", "shape", "dtype", "sym", "x", ""]): random_value(rng, depth + 1)
                for _ in range(rng.randrange(3))}
    return copy.deepcopy(rng.choice([[1, 4], [1, 3, 6, 6], [10**12, 10**12], [-1], ["s0", 4], [2.5], [True]]))


def _retype(value: Any, rng: random.Random) -> Any:
    for _ in range(8):
        new = random_value(rng)
        if type(new) is not type(value):
            return new
    return None if value is not None else 0


def mutate_json(doc: Any, rng: random.Random, names: dict[str, list[str]] | None = None) -> Any:
    """One mutation of a JSON document (a deep copy; ``doc`` is left alone). ``names``: the op-type keys
    ("op_type" for an IR, "kernel" for a program) and the tensor names, renamed to each other and to junk."""
    doc = copy.deepcopy(doc)
    paths = list(_paths(doc))
    path, value = rng.choice(paths)
    op = rng.choice(["retype", "drop", "duplicate", "huge_int", "negative", "string", "nest", "rename_op",
                     "rename_tensor", "swap", "shape", "tag", "empty"])
    if op == "retype":
        return _set(doc, path, _retype(value, rng))
    if op == "drop":
        containers = [(p, v) for p, v in paths if isinstance(v, (dict, list)) and v]
        if containers:
            p, v = rng.choice(containers)
            key = rng.choice(list(v)) if isinstance(v, dict) else rng.randrange(len(v))
            del v[key]
        return doc
    if op == "duplicate":
        lists = [v for _, v in paths if isinstance(v, list) and v]
        dicts = [v for _, v in paths if isinstance(v, dict) and v]
        if lists and (rng.random() < 0.6 or not dicts):
            v = rng.choice(lists)
            v.insert(rng.randrange(len(v) + 1), copy.deepcopy(rng.choice(v)))
        elif dicts:
            v = rng.choice(dicts)
            key = rng.choice(list(v))
            v[rng.choice([key + "_", key.upper(), key + " ", "__" + key])] = copy.deepcopy(v[key])
        return doc
    if op == "huge_int":
        ints = [(p, v) for p, v in paths if isinstance(v, int) and not isinstance(v, bool)]
        p = rng.choice(ints)[0] if ints else path
        return _set(doc, p, rng.choice(HUGE_INTS))
    if op == "negative":
        ints = [(p, v) for p, v in paths if isinstance(v, int) and not isinstance(v, bool)]
        if ints:
            p, v = rng.choice(ints)
            return _set(doc, p, -abs(v) - rng.choice([0, 1, 63]))
        return doc
    if op == "string":
        return _set(doc, path, rng.choice(STRINGS))
    if op == "nest":
        depth = rng.choice([1, 2, 10, 100, 300, 2000])
        wrapped = value
        for _ in range(depth):
            wrapped = [wrapped]
        return _set(doc, path, wrapped)
    keys = names or {}
    if op == "rename_op":
        spots = [p for p, _ in paths if p and p[-1] in keys.get("op_keys", ["op_type", "kernel"])]
        if spots:
            return _set(doc, rng.choice(spots), rng.choice(OP_NAMES))
        return doc
    if op == "rename_tensor":
        spots = [p for p, v in paths if p and (p[-1] == "name" or isinstance(v, str) and v in keys.get("tensors", []))]
        if spots:
            pool = keys.get("tensors", []) + ["ghost", "", "../x", "x" * 200]
            return _set(doc, rng.choice(spots), rng.choice(pool))
        return doc
    if op == "swap":
        lists = [v for _, v in paths if isinstance(v, list) and len(v) > 1]
        if lists:
            v = rng.choice(lists)
            i, j = rng.sample(range(len(v)), 2)
            v[i], v[j] = v[j], v[i]
        return doc
    if op == "shape":
        spots = [p for p, _ in paths if p and p[-1] in ("shape", "offsets", "arena_bytes", "alignment", "dim",
                                                           "stride", "padding", "size", "repeats")]
        if spots:
            return _set(doc, rng.choice(spots), random_value(rng, 2) if rng.random() < 0.3 else
                        [rng.choice(SMALL_INTS + HUGE_INTS[:6]) for _ in range(rng.randrange(6))])
        return doc
    if op == "tag":
        return _set(doc, path, copy.deepcopy(rng.choice(TAGS)))
    return _set(doc, path, rng.choice([{}, [], "", None]))  # "empty"


def mutate_text(text: str, rng: random.Random) -> bytes:
    """One mutation of a JSON text, as bytes (some are not UTF-8)."""
    data = text.encode("utf-8")
    if not data:
        return rng.choice([b"", b"{", b"\xff"])
    op = rng.choice(["truncate", "flip", "junk", "digits", "nan", "dup_key", "deep", "delete", "quote", "bom"])
    if op == "truncate":
        return data[: rng.randrange(len(data) + 1)]
    if op == "flip":
        out = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        return bytes(out)
    if op == "junk":
        i = rng.randrange(len(data) + 1)
        junk = rng.choice([b"\xff", b"\x00", b"\xc3", b",", b"]", b"}", b"{", b'"', b"\\", b"\\u0000", b"\xed\xa0\x80"])
        return data[:i] + junk * rng.randrange(1, 4) + data[i:]
    if op == "digits":
        spots = [i for i in range(1, len(text)) if text[i].isdigit() and not text[i - 1].isalnum()]
        if spots:
            i = rng.choice(spots)
            return (text[:i] + "9" * rng.choice([400, 4301, 5000, 20000]) + text[i:]).encode()
        return data
    if op == "nan":
        spots = [i for i in range(1, len(text)) if text[i].isdigit() and text[i - 1] in ":[,"]
        if spots:
            i = rng.choice(spots)
            j = i
            while j < len(text) and (text[j].isdigit() or text[j] in ".-e"):
                j += 1
            return (text[:i] + rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-0"]) + text[j:]).encode()
        return data
    if op == "dup_key":
        spots = [i for i, ch in enumerate(text) if ch == "{"]
        if spots:
            i = rng.choice(spots)
            key = rng.choice(["name", "shape", "dtype", "op_type", "kernel", "attrs", "params", "nodes", "memory",
                              "ir_version", "model_name", "arena_bytes", "offsets"])
            return (text[: i + 1] + json.dumps(key) + ":" + json.dumps(random_value(rng)) + "," + text[i + 1:]).encode()
        return data
    if op == "deep":
        n = rng.choice([50, 900, 5000, 100_000])
        spots = [i for i, ch in enumerate(text) if ch == ":"]
        if spots:
            i = rng.choice(spots) + 1
            j = i
            depth = 0
            while j < len(text):  # the end of the value after this colon
                if text[j] in "[{":
                    depth += 1
                elif text[j] in "]}":
                    if depth == 0:
                        break
                    depth -= 1
                elif text[j] == "," and depth == 0:
                    break
                elif text[j] == '"':
                    j += 1
                    while j < len(text) and text[j] != '"':
                        j += 2 if text[j] == "\\" else 1
                j += 1
            return (text[:i] + "[" * n + text[i:j] + "]" * n + text[j:]).encode()
        return data
    if op == "delete":
        i = rng.randrange(len(data))
        return data[:i] + data[i + 1:]
    if op == "quote":
        return data.replace(b'"', b"'", rng.randrange(1, 5))
    return b"\xef\xbb\xbf" + data  # "bom"


def mutate_bytes(data: bytes, rng: random.Random, fixed_size: int = 20) -> bytes:
    """One mutation of a binary file (no checksum repair)."""
    op = rng.choice(["flip", "truncate", "extend", "header_len", "magic", "version", "zero"])
    out = bytearray(data)
    if len(out) < 20 and op != "truncate":
        op = "extend"
    if op == "flip":
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
    elif op == "truncate":
        del out[rng.randrange(len(out) + 1):]
    elif op == "extend":
        out += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif op == "header_len":
        out[12:20] = rng.choice([0, 1, len(data), len(data) * 2, 2**63, 2**64 - 1, rng.randrange(2**20)]).to_bytes(
            8, "little")
    elif op == "magic":
        out[rng.randrange(8)] = rng.randrange(256)
    elif op == "version":
        out[8:12] = bytes(rng.randrange(256) for _ in range(4))
    else:
        i = rng.randrange(len(out))
        out[i:i + rng.randrange(1, 64)] = bytes(min(64, len(out) - i))
    return bytes(out)


# ------------------------------------------------------------------------------------------- the targets


def load_generator() -> ModuleType:
    name = "make_hostile_corpus"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("make_hostile_corpus.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Seeds:
    """The valid files every mutation starts from, read once."""

    def __init__(self, directory: Path) -> None:
        gen = load_generator()
        self.dir = directory
        self.ir_text = (directory / gen.BASE_IR).read_text(encoding="utf-8")
        self.ir_doc = json.loads(self.ir_text)
        self.program = (directory / gen.BASE_PROGRAM).read_bytes()
        self.header, self.blob = gen.decode_npubin_parts(self.program)
        self.header_text = json.dumps(self.header, sort_keys=True, separators=(",", ":"))
        self.weights = directory / gen.BASE_WEIGHTS
        self.npubin_bytes = gen.npubin_bytes
        tensors = sorted({t["name"] for t in self.header["tensors"]} | {t["name"] for t in self.header["weight_specs"]})
        self.ir_names = {"op_keys": ["op_type"], "tensors": sorted({
            t["name"] for n in self.ir_doc["nodes"] for t in n["inputs"] + n["outputs"]})}
        self.program_names = {"op_keys": ["kernel"], "tensors": tensors}

    def warm_up(self) -> Seeds:
        """Run the valid program and compile the valid IR once in this process, so that forked workers inherit
        oneDNN's generated kernels instead of generating them again in every child (a second each)."""
        import npu_compiler
        from npu_program.npubin import decode_npubin
        from torch_ir.ir.serialize import ir_from_dict

        run_program(decode_npubin(self.program), self, random.Random(0))
        npu_compiler.compile(ir_from_dict(self.ir_doc))
        return self

    @classmethod
    @contextlib.contextmanager
    def built(cls) -> Iterator[Seeds]:
        """Seeds from a fresh extraction of the model into a temporary directory."""
        with tempfile.TemporaryDirectory(prefix="fuzz_seeds_") as tmp:
            load_generator().build_base(Path(tmp))
            yield cls(Path(tmp))


def make_input(kind: str, seeds: Seeds, rng: random.Random) -> Any:
    """The mutated input of ``kind``: a dict (ir_doc) or bytes."""
    rounds = rng.choice([1, 1, 1, 2, 3])
    if kind == "ir_doc":
        return _mutate_rounds(seeds.ir_doc, rng, rounds, seeds.ir_names)
    if kind == "ir_text":
        return mutate_text(seeds.ir_text, rng)
    if kind == "npubin_bytes":
        data = seeds.program
        for _ in range(rounds):
            data = mutate_bytes(data, rng)
        return data
    if rng.random() < 0.75:
        header = _mutate_rounds(seeds.header, rng, rounds, seeds.program_names)
        try:
            text: str | bytes = json.dumps(header, sort_keys=True, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError):
            text = seeds.header_text
    else:
        text = mutate_text(seeds.header_text, rng)
    return seeds.npubin_bytes(text, seeds.blob)


def _mutate_rounds(doc: Any, rng: random.Random, rounds: int, names: dict[str, list[str]]) -> Any:
    """``rounds`` mutations; a document nested too deeply for the mutators' own recursion is kept as it is."""
    for _ in range(rounds):
        try:
            doc = mutate_json(doc, rng, names)
        except RecursionError:
            break
    return doc


def run_input(kind: str, value: Any, seeds: Seeds, rng: random.Random | None = None) -> str:
    """Feed one mutated input to the toolkit. Returns the outcome (``loaded``, ``compiled``, ``ran``, or the name
    of the TorchIRError subclass raised); any other exception propagates: it is a bug."""
    from torch_ir.errors import TorchIRError
    from torch_ir.limits import limits

    stage = "load"
    try:
        with limits(max_alloc_bytes=FUZZ_LIMIT_BYTES):
            if kind == "ir_doc":
                from npu_compiler import compile as compile_ir
                from torch_ir.ir.serialize import ir_from_dict

                ir = ir_from_dict(value, source="<fuzz>")
                stage = "compile"
                compile_ir(ir)
                return "compiled"
            if kind == "ir_text":
                from torch_ir.ir import load_ir

                with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
                    handle.write(value)
                try:
                    load_ir(handle.name)
                finally:
                    os.unlink(handle.name)
                return "loaded"
            from npu_program.npubin import decode_npubin

            program = decode_npubin(value, "<fuzz>")
            if kind == "npubin_bytes":
                return "loaded"
            stage = "run"
            return run_program(program, seeds, rng or random.Random(0))
    except TorchIRError as e:
        return f"{type(e).__name__}" if stage == "load" else f"{stage}: {type(e).__name__}"


def run_program(program: Any, seeds: Seeds, rng: random.Random) -> str:
    """``Executor`` construction, the seeds' weights, one run with random inputs (when they are small)."""
    import numpy as np

    from npu_runtime import Device, Executor, load_weights

    device = Device()
    executor = Executor(program, device)
    weights = load_weights(seeds.weights, program, device)
    inputs = {}
    for spec in program.input_specs:
        if math.prod(spec.shape) > 1 << 20:
            return "loaded"
        dtype = "float32" if spec.dtype == "bfloat16" else spec.dtype
        inputs[spec.name] = (np.random.default_rng(rng.randrange(2**32)).standard_normal(spec.shape)
                             .astype(dtype))
    executor.run(inputs, weights=weights)
    return "ran"


def one_iteration(seed: int, index: int, seeds: Seeds) -> tuple[str, str]:
    """(kind, outcome) of iteration ``index``; deterministic in (seed, index)."""
    rng = random.Random(f"{seed}:{index}")
    kind = KINDS[index % len(KINDS)]
    value = make_input(kind, seeds, rng)
    return kind, run_input(kind, value, seeds, rng)


# ------------------------------------------------------------------------------------- isolated workers


def _limit_address_space() -> None:
    try:
        size = int(Path("/proc/self/status").read_text().split("VmSize:")[1].split()[0]) << 10
        resource.setrlimit(resource.RLIMIT_AS, (size + WORKER_EXTRA_AS, resource.RLIM_INFINITY))
    except (OSError, ValueError, IndexError):
        pass


def _worker(seed: int, start: int, stop: int, seeds: Seeds, write_fd: int) -> None:
    """A forked child: runs iterations [start, stop), one JSON line per event on ``write_fd``."""
    import torch

    torch.set_num_threads(1)
    _limit_address_space()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
    out = os.fdopen(write_fd, "w", buffering=1)
    for i in range(start, stop):
        out.write(json.dumps({"start": i}) + "\n")
        try:
            kind, outcome = one_iteration(seed, i, seeds)
            out.write(json.dumps({"done": i, "kind": kind, "outcome": outcome}) + "\n")
        except BaseException as e:  # noqa: BLE001 - a bug: reported with its traceback
            kind = KINDS[i % len(KINDS)]
            frames = traceback.extract_tb(e.__traceback__)
            where = next((f for f in reversed(frames) if "/src/" in f.filename), frames[-1])
            out.write(json.dumps({"done": i, "kind": kind, "outcome": f"BUG {type(e).__name__}",
                                  "where": f"{where.filename}:{where.lineno}",
                                  "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))})
                      + "\n")
    out.close()


def run_batches(seed: int, count: int, seeds: Seeds, *, batch: int = 250, timeout: float = 60.0,
                progress: Callable[[int], None] | None = None) -> Iterator[dict[str, Any]]:
    """Run iterations 0..count-1 in forked workers; yields one event per iteration. A worker killed by a signal
    or silent for ``timeout`` seconds reports its current iteration as a crash and the next worker resumes."""
    i = 0
    while i < count:
        stop = min(count, i + batch)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                os.close(read_fd)
                _worker(seed, i, stop, seeds, write_fd)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                status = 1
            os._exit(status)
        os.close(write_fd)
        current, buffer, hung = None, b"", False
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                ready, _, _ = select.select([pipe], [], [], timeout)
                if not ready:
                    hung = True
                    os.kill(pid, signal.SIGKILL)
                    break
                chunk = pipe.read(1 << 16)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = json.loads(line)
                    if "start" in event:
                        current = event["start"]
                    else:
                        current = None
                        yield event
                        if progress:
                            progress(event["done"])
        _, status = os.waitpid(pid, 0)
        if current is not None:  # the worker died inside an iteration
            if hung:
                what = f"HANG (no progress for {timeout:.0f} s)"
            elif os.WIFSIGNALED(status):
                what = f"CRASH {signal.Signals(os.WTERMSIG(status)).name}"
            else:
                what = f"DIED (exit {os.WEXITSTATUS(status)})"
            yield {"done": current, "kind": KINDS[current % len(KINDS)], "outcome": what,
                   "where": f"iteration {current} (seed {seed})", "traceback": ""}
            i = current + 1
        else:
            i = stop


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="iterations (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed; iteration i is reproducible from (seed, i)")
    parser.add_argument("--batch", type=int, default=250, help="iterations per forked worker")
    parser.add_argument("--only", type=int, help="run one iteration in this process, with its full traceback")
    args = parser.parse_args(argv)

    started = time.monotonic()
    with Seeds.built() as seeds:
        seeds.warm_up()
        if args.only is not None:
            print(one_iteration(args.seed, args.only, seeds))
            return 0
        counts: Counter[tuple[str, str]] = Counter()
        bugs: dict[tuple[str, str], dict[str, Any]] = {}
        bug_total = 0
        for event in run_batches(args.seed, args.count, seeds, batch=args.batch):
            counts[(event["kind"], event["outcome"])] += 1
            if event["outcome"].startswith(("BUG", "CRASH", "HANG", "DIED")):
                bug_total += 1
                crashed = not event["outcome"].startswith("BUG")  # one row per kind of crash, all iterations listed
                key = (event["outcome"], "" if crashed else event.get("where", ""))
                entry = bugs.setdefault(key, {**event, "count": 0, "iterations": []})
                entry["count"] += 1
                entry["iterations"].append(event["done"])
    elapsed = time.monotonic() - started

    outcomes = sorted({o for _, o in counts}, key=lambda o: (o.startswith(("BUG", "CRASH", "HANG", "DIED")), o))
    width = max([len(o) for o in outcomes] + [20])
    print(f"fuzz_loaders: {args.count} iterations, seed {args.seed}, {elapsed:.0f} s")
    print(f"{'outcome':{width}s} " + " ".join(f"{k:>13s}" for k in KINDS) + f" {'total':>7s}")
    for outcome in outcomes:
        row = [counts[(k, outcome)] for k in KINDS]
        print(f"{outcome:{width}s} " + " ".join(f"{n:13d}" for n in row) + f" {sum(row):7d}")
    totals = [sum(n for (k, _), n in counts.items() if k == kind) for kind in KINDS]
    print(f"{'total':{width}s} " + " ".join(f"{n:13d}" for n in totals) + f" {sum(totals):7d}")
    if bugs:
        print(f"\n{bug_total} iteration(s) ended outside the toolkit's errors ({len(bugs)} distinct):")
        for (outcome, where), event in bugs.items():
            shown = ", ".join(map(str, event["iterations"][:10])) + (" ..." if len(event["iterations"]) > 10 else "")
            print(f"\n--- {outcome}{' at ' + where if where else ''}: {event['count']} time(s), iterations {shown} "
                  f"({event['kind']}); reproduce: python scripts/fuzz_loaders.py --seed {args.seed} "
                  f"--only {event['done']}")
            if event.get("traceback"):
                print(event["traceback"].rstrip())
        return 1
    print("\nno exception outside the toolkit's errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
