#!/usr/bin/env python
"""Build a corpus of hostile IR JSON, ``.npubin`` program and weights files.

Every file starts from one small valid model (a conv + linear network extracted on the meta device),
its compiled program and its safetensors weights, and breaks one rule in a way an attacker would:
symbolic-size expressions that try to run code, ops and kernels with side effects, model names that
walk out of the working directory, programs whose header asks for a petabyte or overlaps two live
tensors, JSON that is nested 100,000 deep, pickled weights, ... Each file comes with a :class:`Case`
that says how to feed it to the toolkit (the Python API call and the ``torch-ir`` command lines) and
what must happen: the exact toolkit error class and a regex for its message, or success.

    python scripts/make_hostile_corpus.py OUTDIR      # writes the files and OUTDIR/cases.json

or, from Python (tests/hostile does this)::

    cases = build_corpus(directory)                     # list[Case]

In a case's command lines, ``{dir}`` stands for the corpus directory. The ``verify`` lines use the
model spec ``make_hostile_corpus:tiny_factory``: run them with ``scripts/`` on ``PYTHONPATH``.

API kinds (``Case.api``):

=================  ==========================================================================================
``load_ir``        ``torch_ir.load_ir(file)``
``ir_executor``    ``torch_ir.IRExecutor(load_ir(file), "{dir}/tiny.safetensors").run([x])``
``compile``        ``npu_compiler.compile(load_ir(file))``
``program_load``   ``npu_compiler.CompiledProgram.load(file)``
``executor``       ``Executor(CompiledProgram.load(file), Device())``, then one ``run`` with the weights
``load_weights``   ``npu_runtime.load_weights(file, CompiledProgram.load("{dir}/tiny.npubin"))``
``nan_compare``    the weights file through ``IRExecutor`` and through the runtime: NaN in exactly the same places
``default_output`` ``load_ir`` and ``compile`` succeed, and ``torch_ir.naming.default_output(model_name, ...)``
                   is one plain file name in the working directory
``cli``            no API call: only the command lines
=================  ==========================================================================================

``error`` is the exception class name the API call must raise (None: it must succeed); the command lines
must exit with their ``code`` (2 for bad input, with one stderr line ``torch-ir <command>: error: ...``).
``isolate`` marks a case whose file reaches the runtime's native kernels (the test runs it in a forked child,
so that a crash is reported as one rather than ending the test run). ``escape`` marks a file that tries to
create a marker file (a name starting with ``PWNED``); ``big_alloc``
one that asks for a large allocation (the test checks peak memory); ``limit_bytes`` lowers
``torch_ir.limits.max_alloc_bytes`` for the case, so that a file-driven allocation of a few hundred
MiB must be refused as one of terabytes would be by default.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import pickle
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MARKER = "PWNED"
HERE = Path(__file__).resolve().parent
MAGIC = b"NPUBIN\0\0"
FIXED = struct.Struct("<8sHHQ")  # magic, major, minor, header length
#: The .npubin format version the corpus' programs are written in (``npu_program.npubin.FORMAT_VERSION``); a 1.x
#: file (``V1``) holds the IR's tagged attributes as params, which the reader upgrades.
VERSION, V1 = (2, 0), (1, 3)
ALIGNMENT = 64
DIGEST_BYTES = 32
MiB = 1 << 20

#: Name of this module when imported by path, so that ``torch-ir verify make_hostile_corpus:tiny_factory`` finds
#: the reference model in-process.
MODULE_NAME = "make_hostile_corpus"
VERIFY_SPEC = f"{MODULE_NAME}:tiny_factory"

BASE_API_KINDS = ("load_ir", "ir_executor", "compile", "program_load", "executor", "load_weights", "nan_compare",
                  "default_output", "cli")

#: The second pass's families, one module each beside this script (``scripts/hostile_<family>.py``). Each has
#: ``build(b: _Builder) -> None``, which adds its cases, and ``API: dict[str, Callable[[Case, Path], None]]``,
#: the API calls of the kinds its cases name (``"<family>.<kind>"``; ``Path`` is the corpus directory).
FAMILIES = ("hostile_native", "hostile_checkpoints", "hostile_hardware", "hostile_outputs")

def family_modules() -> list[Any]:
    """The second pass's family modules, imported from beside this script."""
    import importlib

    sys.modules.setdefault(MODULE_NAME, sys.modules[__name__])  # families import Case & co. from here
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return [importlib.import_module(name) for name in FAMILIES]


def extra_api() -> dict[str, Callable[..., None]]:
    """Every family's API kinds: name -> ``call(case, corpus_dir)``."""
    calls: dict[str, Callable[..., None]] = {}
    for module in family_modules():
        calls.update(module.API)
    return calls


def api_kinds() -> tuple[str, ...]:
    return BASE_API_KINDS + tuple(extra_api())


# Base artifacts every case is derived from (written first, not cases themselves).
BASE_IR, BASE_PROGRAM, BASE_WEIGHTS, BASE_INPUT, SECRET = (
    "tiny.json", "tiny.npubin", "tiny.safetensors", "x.npy", "secret.txt")
SECRET_TEXT = "TOP SECRET: a file a hostile IR must never read\n" * 3


@dataclass
class CliCall:
    """One ``torch-ir`` command line (``{dir}`` = the corpus directory) and the exit code it must give (or the
    codes it may give, where refusing and succeeding are both safe, e.g. ``inspect`` of an odd but inert IR)."""

    argv: list[str]
    code: int | list[int] = 2

    @property
    def codes(self) -> list[int]:
        return list(self.code) if isinstance(self.code, list) else [self.code]


@dataclass
class Case:
    id: str
    category: str
    description: str
    files: list[str]
    api: str
    error: str | None
    message: str = ""
    cli: list[CliCall] = field(default_factory=list)
    escape: bool = False
    big_alloc: bool = False
    limit_bytes: int | None = None
    #: run in a forked child: a kernel given hostile parameters may crash the process natively (SIGFPE, SIGSEGV)
    isolate: bool = False
    weights: str = BASE_WEIGHTS
    program: str = BASE_PROGRAM

    @property
    def file(self) -> str:
        return self.files[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ the model


def _tiny_class() -> type:
    import torch
    from torch import nn

    class Tiny(nn.Module):
        """conv -> relu -> global mean -> gelu -> linear: five nodes, four weights."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, 5)

        def forward(self, x):
            return self.fc(nn.functional.gelu(torch.relu(self.conv(x)).mean((2, 3))))

    return Tiny


INPUT_SHAPE = (1, 3, 6, 6)


def tiny_factory():
    """The reference model as a ``package.module:factory`` spec (``torch-ir verify``): (model, example args)."""
    import torch

    return _tiny_class()(), (torch.randn(*INPUT_SHAPE),)


def real_model():
    import torch

    torch.manual_seed(0)
    return _tiny_class()().eval()


def example_input():
    import numpy as np

    return np.random.default_rng(0).standard_normal(INPUT_SHAPE).astype(np.float32)


# ------------------------------------------------------------------------------------ .npubin helpers


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def decode_npubin_parts(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header dict, blob) of a valid ``.npubin`` file."""
    _, _, _, header_len = FIXED.unpack_from(data)
    header = json.loads(data[FIXED.size:FIXED.size + header_len].decode("utf-8"))
    blob = data[_align(FIXED.size + header_len):len(data) - DIGEST_BYTES]
    return header, blob


def npubin_bytes(header: dict[str, Any] | bytes | str, blob: bytes = b"", *, magic: bytes = MAGIC,
                 major: int = VERSION[0], minor: int = VERSION[1], header_len: int | None = None,
                 checksum: bool = True) -> bytes:
    """A ``.npubin`` file around ``header`` (a dict, or raw JSON text for what ``json.dumps`` cannot write),
    with a valid SHA-256 trailer unless ``checksum=False``; ``header_len`` overrides the declared length."""
    if isinstance(header, dict):
        header = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    raw = header.encode("utf-8") if isinstance(header, str) else header
    fixed = FIXED.pack(magic, major, minor, len(raw) if header_len is None else header_len)
    body = fixed + raw + bytes(_align(len(fixed) + len(raw)) - len(fixed) - len(raw)) + blob
    digest = hashlib.sha256(body).digest()
    return body + (digest if checksum else bytes(b ^ 0xFF for b in digest))


# -------------------------------------------------------------------------------------------- builder


class _Builder:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.cases: list[Case] = []
        self.ids: set[str] = set()
        self.extra_kinds = set(extra_api())

    # -- paths and markers

    def path(self, name: str) -> Path:
        return self.dir / name

    def marker(self, case_id: str, relative: bool = False) -> str:
        """A marker file an escape would create: absolute in the corpus directory, or relative (in the cwd)."""
        name = f"{MARKER}_{case_id}"
        return name if relative else str(self.dir / name)

    def add(self, case: Case) -> Case:
        assert case.id not in self.ids, case.id
        assert case.api in BASE_API_KINDS or case.api in self.extra_kinds, case.api
        self.ids.add(case.id)
        self.cases.append(case)
        return case

    # -- writers

    def write_json_text(self, name: str, text: str | bytes) -> str:
        data = text.encode("utf-8") if isinstance(text, str) else text
        self.path(name).write_bytes(data)
        return name

    def write_ir(self, name: str, doc: Any, replace: dict[str, str] | None = None) -> str:
        """Write ``doc`` as JSON; each ``replace`` key (a placeholder string value) becomes raw JSON text."""
        text = json.dumps(doc, indent=None, allow_nan=True)
        for placeholder, raw in (replace or {}).items():
            quoted = json.dumps(placeholder)
            assert quoted in text, placeholder
            text = text.replace(quoted, raw)
        return self.write_json_text(name, text)

    def write_program(self, name: str, header: dict[str, Any] | bytes | str, blob: bytes = b"", **kw: Any) -> str:
        self.path(name).write_bytes(npubin_bytes(header, blob, **kw))
        return name


# -------------------------------------------------------------------------------------------- IR docs


def _node(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in doc["nodes"] if n["name"] == name)


def _tensor_everywhere(doc: dict[str, Any], tensor: str, **changes: Any) -> None:
    """Change a tensor's fields wherever the document mentions it, so the integrity checks still agree."""
    def visit(t: dict[str, Any]) -> None:
        if t.get("name") == tensor:
            t.update(changes)

    for key in ("graph_inputs", "graph_outputs", "weights", "constants"):
        for t in doc.get(key, []):
            visit(t)
    for n in doc["nodes"]:
        for t in n["inputs"] + n["outputs"]:
            visit(t)


def _ir_cli(*, load_fails: bool = True, executes: bool = False, compiles: bool = False) -> list[CliCall]:
    """Command lines for an IR case. A file refused on load fails every command; one refused only when run
    fails ``verify`` (and ``inspect``, which only describes it, succeeds); one refused by the compiler fails
    ``compile``."""
    f = "{dir}/" + "{file}"
    verify = CliCall(["verify", VERIFY_SPEC, "--ir", f])
    if load_fails:
        return [CliCall(["inspect", f]), verify, CliCall(["compile", f]), CliCall(["normalize", f])]
    calls = [CliCall(["inspect", f], 0)]
    if executes:
        calls.append(verify)
    if compiles:
        calls.append(CliCall(["compile", f]))
    return calls


def _program_cli(runs: bool = False) -> list[CliCall]:
    f = "{dir}/" + "{file}"
    code = 0 if runs else 2
    return [CliCall(["run", f, "--weights", "{dir}/" + BASE_WEIGHTS, "--input", "x={dir}/" + BASE_INPUT], code),
            CliCall(["profile", f, "--weights", "{dir}/" + BASE_WEIGHTS, "--input", "x={dir}/" + BASE_INPUT,
                     "--runs", "1"], code)]


def _weights_cli() -> list[CliCall]:
    f = "{dir}/" + "{file}"
    return [CliCall(["run", "{dir}/" + BASE_PROGRAM, "--weights", f, "--input", "x={dir}/" + BASE_INPUT])]


def _fill(calls: list[CliCall], file: str) -> list[CliCall]:
    return [CliCall([a.replace("{file}", file) for a in c.argv], c.code) for c in calls]


# ------------------------------------------------------------------------------------ case families


SYM_RULE = r"symbolic size"


def _code_execution_ir(b: _Builder, base: dict[str, Any]) -> None:
    """``{"sym": ...}`` expressions and shape strings that try to run code: refused when the file is loaded."""
    m = b.marker
    escapes = {
        "subclasses": "().__class__.__base__.__subclasses__()",
        "import_system": "__import__('os').system('touch {marker}')",
        "lambda": "(lambda: __import__('os').system('touch {marker}'))()",
        "attribute": "s0.__class__",
        "dunder_builtins": "__builtins__['eval']('1')",
        "subscript": "[1, 2][0]",
        "string": "'a' * 10",
        "eval_call": "eval(\"__import__('os').system('touch {marker}')\")",
        "exec_call": "exec('import os; os.system(\"touch {marker}\")')",
        "open_call": "open('{secret}').read()",
        "getattr_call": "getattr(s0, 'bit_length')()",
        "keyword_arg": "Max(s0, key=1)",
        "fstring": "f\"{{__import__('os').system('touch {marker}')}}\"",
        "walrus": "(y := 3) + y",
        "comprehension": "[c for c in ().__class__.__mro__[1].__subclasses__()]",
        "generator": "sum(x for x in [1])",
        "starred": "Max(*[1, 2])",
        "compare": "s0 < 3",
        "boolop": "s0 and __import__('os')",
        "ifexp": "1 if s0 else __import__('os')",
        "float_const": "2.5 * s0",
        "bytes_const": "b'x'",
        "none_const": "None",
        "call_of_call": "floor(1)(2)",
        "max_no_args": "Max()",
        "floor_two_args": "floor(1, 2)",
        "too_long": "1+" * 3000 + "1",
        "deep_parens": "(" * 999 + "1" + ")" * 999,
        "deep_unary": "-" * 1999 + "1",
        "syntax_error": "1 +* 2",
        "null_byte": "1\x00+1",
        "semicolon": "1; __import__('os').system('touch {marker}')",
        "newline_stmt": "1\nimport os",
    }
    places = ["symbol_expr", "node_attr", "shape"]
    for i, (name, template) in enumerate(sorted(escapes.items())):
        place = places[i % 3] if name not in ("import_system", "lambda", "subclasses") else None
        targets = places if place is None else [place]
        for where in targets:
            cid = f"ce_{where}_{name}"
            expr = template.format(marker=m(cid, relative=(i % 2 == 1)), secret=b.path(SECRET))
            doc = copy.deepcopy(base)
            if where == "symbol_expr":
                doc["symbols"]["s9"] = {"min": None, "max": None, "expr": {"sym": expr}}
            elif where == "node_attr":
                _node(doc, "mean")["attrs"]["dim"] = [{"sym": expr}, 3]
            else:
                _tensor_everywhere(doc, "x", shape=[1, 3, expr, 6])
            file = b.write_ir(f"{cid}.json", doc)
            b.add(Case(cid, "code_execution", f"symbolic size {expr[:60]!r} in {where}", [file], "load_ir",
                       "UnsafeInputError", SYM_RULE, _fill(_ir_cli(), file), escape="touch" in expr))

    # Inside the grammar but not evaluable within bounds: refused when evaluated (at run time), never computed.
    huge = {"pow_tower": "9**9**9**9", "pow_big_exponent": "2**100000", "product_overflow": "99999999999*99999999999",
            "pow_negative_exponent": "2**-1", "div_zero": "1/0", "mod_zero": "Mod(1, 0)",
            "floordiv_zero": "FloorDiv(1, 0)"}
    for name, expr in huge.items():
        cid = f"ce_symbol_expr_eval_{name}"
        doc = copy.deepcopy(base)
        doc["symbols"]["s9"] = {"min": None, "max": None, "expr": {"sym": expr}}
        file = b.write_ir(f"{cid}.json", doc)
        b.add(Case(cid, "code_execution", f"symbols.s9.expr {expr!r}: parses, must be refused when evaluated",
                   [file], "ir_executor", "UnsafeInputError", SYM_RULE,
                   _fill(_ir_cli(load_fails=False, executes=True), file)))
    cid = "ce_symbol_expr_unbound_name"
    doc = copy.deepcopy(base)
    doc["symbols"]["s9"] = {"min": None, "max": None, "expr": {"sym": "zz * 2"}}
    file = b.write_ir(f"{cid}.json", doc)
    b.add(Case(cid, "code_execution", "symbols.s9.expr names a symbol nothing binds", [file], "ir_executor",
               "IRValidationError", r"zz", _fill(_ir_cli(load_fails=False, executes=True), file)))
    cid = "ce_node_attr_eval_pow_tower"
    doc = copy.deepcopy(base)
    _node(doc, "mean")["attrs"]["dim"] = [{"sym": "9**9**9**9"}, 3]
    file = b.write_ir(f"{cid}.json", doc)
    b.add(Case(cid, "code_execution", "node attribute {'sym': '9**9**9**9'}: refused when the node runs", [file],
               "ir_executor", "ExecutionError", SYM_RULE, _fill(_ir_cli(load_fails=False, executes=True), file)))


def _dangerous_ops_ir(b: _Builder, base: dict[str, Any]) -> None:
    """Nodes naming ops with side effects: the reference executor must refuse to bind them."""
    secret = str(b.path(SECRET))

    def case(cid: str, op: str, attrs: dict[str, Any], error: str, message: str, inputs: list[str] | None = None,
             escape: bool = False, description: str = "") -> None:
        doc = copy.deepcopy(base)
        node = _node(doc, "relu")
        node["op_type"] = op
        node["attrs"] = attrs
        if inputs is not None:
            conv = next(t for t in _node(doc, "conv2d")["outputs"])
            node["inputs"] = [copy.deepcopy(conv) for _ in inputs]
        file = b.write_ir(f"{cid}.json", doc)
        b.add(Case(cid, "dangerous_op", description or f"node 'relu' runs {op}", [file], "ir_executor", error,
                   message, _fill(_ir_cli(load_fails=False, executes=True), file), escape=escape))

    unsafe = "UnsafeInputError"
    case("op_from_file", "aten.from_file.default", {"filename": secret, "shared": False, "size": 144}, unsafe,
         r"from_file.*files", inputs=[], description="aten.from_file reading a secret file next to the IR")
    case("op_from_file_shared", "aten.from_file.default", {"filename": b.marker("op_from_file_shared"),
                                                           "shared": True, "size": 144},
         unsafe, r"from_file", inputs=[], escape=True,
         description="aten.from_file with shared=True on a path that does not exist (would create/map it)")
    case("op_fill_", "aten.fill_.Scalar", {"value": 7.0}, unsafe, r"in-place|writes to an argument", inputs=["c"])
    case("op_add_out", "aten.add.out", {"alpha": 1}, unsafe, r"out=|writes to an argument", inputs=["a", "b", "o"])
    case("op_copy_", "aten.copy_.default", {}, unsafe, r"writes to an argument", inputs=["a", "b"])
    case("op_normal_", "aten.normal_.default", {"mean": 0.0, "std": 1.0}, unsafe, r"writes to an argument",
         inputs=["a"])
    case("op_c10d_allreduce", "c10d.allreduce_.default", {}, unsafe, r"c10d", inputs=["a"])
    case("op_c10d_barrier", "c10d.barrier.default", {}, unsafe, r"c10d", inputs=["a"])
    case("op_c10d_functional", "_c10d_functional.all_reduce.default", {"reduce_op": "sum", "group_name": "0"},
         unsafe, r"_c10d_functional", inputs=["a"])
    case("op_profiler_enter", "profiler._record_function_enter_new.default", {"name": "x", "args": None}, unsafe,
         r"profiler", inputs=[])
    case("op_assert_async", "aten._assert_async.msg", {"assert_msg": "boom"}, unsafe, r"returns nothing",
         inputs=["a"])
    case("op_save", "aten.save.default", {"filename": b.marker("op_save")}, unsafe, r"returns nothing|save",
         inputs=["a"], escape=True)
    case("op_print", "aten._print.default", {"s": "printed by a hostile IR"}, unsafe, r"_print|files", inputs=[])
    case("op_set_", "aten.set_.source_Storage", {}, unsafe, r"set_|files|argument", inputs=["a", "b"])
    case("op_manual_seed", "aten.manual_seed.default", {"seed": 1}, unsafe, r"returns nothing|manual_seed",
         inputs=[])
    case("op_sym_constrain_range", "aten.sym_constrain_range.default", {"size": 1, "min": 0, "max": 1}, unsafe,
         r"returns nothing", inputs=[])
    case("op_mkldnn_namespace", "mkldnn._convolution_pointwise.default",
         {"padding": [1, 1], "stride": [1, 1], "dilation": [1, 1], "groups": 1, "attr": "none", "scalars": [],
          "algorithm": None}, unsafe, r"mkldnn", inputs=["a", "b", "c"])
    case("op_returns_no_tensor", "prim.device.default", {}, unsafe, r"namespace 'prim'", inputs=["a"],
         description="prim.device returns a Device, no tensor: TorchScript's prim namespace is denied")
    unsupported = "UnsupportedOpError"
    for cid, op in [("op_nonexistent", "aten.definitely_not_an_op.default"),
                    ("op_builtins_eval", "builtins.eval.default"),
                    ("op_os_system", "os.system.default"),
                    ("op_dunder_call", "aten.add.__call__"),
                    ("op_dunder_init", "aten.add.__init__"),
                    ("op_packet_method", "aten.add.overloads"),
                    ("op_dunder_class", "aten.__class__.default"),
                    ("op_torch_ops_method", "load_library.x.default"),
                    ("op_four_parts", "aten.relu.default.extra"),
                    ("op_two_parts", "aten.relu"),
                    ("op_trailing_space", "aten.relu.default "),
                    ("op_inner_space", "aten.re lu.default"),
                    ("op_empty_part", "aten..default"),
                    ("op_torch_prefix", "torch.ops.aten.relu.default"),
                    ("op_slash", "aten/relu.default"),
                    ("op_nul", "aten.relu.default\x00")]:
        escape = cid in ("op_builtins_eval", "op_os_system")
        attrs = {"command": f"touch {b.marker(cid)}"} if escape else {}
        case(cid, op, attrs, unsupported, r"no implementation|not an op|unsupported", inputs=["a"], escape=escape,
             description=f"op type {op!r} names no op")


def _paths_ir(b: _Builder, base: dict[str, Any]) -> None:
    """Model names that would walk out of the working directory as default output names."""
    names = {
        "dotdot_escaped": "../escaped",
        "dotdot_deep": "../../../../../../../../tmp/escaped",
        "abs_path": "/abs/path/x",
        "abs_into_parent": str(b.dir.parent / "abs_escaped"),
        "subdir": "a/b",
        "dotdot": "..",
        "dot": ".",
        "empty": "",
        "long_5000": "m" * 5000,
        "long_slashes": "../" * 1500 + "x",
        "home": "~/escaped",
        "backslash": "..\\..\\escaped",
        "nul_byte": "a\x00b",
        "newline": "line1\nline2",
        "hidden": ".bashrc",
        "dash": "-o",
        "unicode_slash": "a\u2215b\uff0f..",
        "space_dots": " .. ",
    }
    for name, model_name in names.items():
        cid = f"path_{name}"
        doc = copy.deepcopy(base)
        doc["model_name"] = model_name
        file = b.write_ir(f"{cid}.json", doc)
        b.add(Case(cid, "path_traversal", f"model_name {model_name[:40]!r}: default outputs stay in the cwd", [file],
                   "default_output", None, "",
                   [CliCall(["compile", "{dir}/" + file], 0), CliCall(["normalize", "{dir}/" + file], 0)]))


def _ir_json(b: _Builder, base: dict[str, Any], base_text: str) -> None:
    """IR documents that break the format: refused on load (or where noted) with IRValidationError."""
    invalid = "IRValidationError"

    def load_case(cid: str, doc_or_text: Any, message: str, description: str, replace: dict[str, str] | None = None,
                  error: str = invalid) -> None:
        if isinstance(doc_or_text, (str, bytes)):
            file = b.write_json_text(f"{cid}.json", doc_or_text)
        else:
            file = b.write_ir(f"{cid}.json", doc_or_text, replace)
        b.add(Case(cid, "ir_json", description, [file], "load_ir", error, message, _fill(_ir_cli(), file)))

    def mutated(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        fn(doc)
        return doc

    def set_attr(node: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        return lambda d: _node(d, node)["attrs"].__setitem__(key, value)

    # attribute values
    load_case("ij_tag_pickle", mutated(set_attr("mean", "dim", {"pickle": "cos\nsystem\n(S'touch PWNED'\ntR."})),
              r"tagged|pickle", "a {'pickle': ...} tagged value")
    load_case("ij_tag_two_keys", mutated(set_attr("mean", "dim", {"dtype": "float32", "sym": "s0"})),
              r"tagged|one key", "a tag object with two keys")
    load_case("ij_tag_empty", mutated(set_attr("mean", "dim", {})), r"tagged|one key", "an empty object as a value")
    load_case("ij_tag_payload_int", mutated(set_attr("mean", "dim", {"dtype": 5})), r"string", "{'dtype': 5}")
    load_case("ij_tag_payload_nested", mutated(set_attr("mean", "dim", {"sym": {"sym": "s0"}})), r"string",
              "{'sym': {'sym': ...}}")
    load_case("ij_tag_dtype_dunder", mutated(set_attr("gelu", "approximate", {"dtype": "__class__"})),
              r"dtype|__class__", "{'dtype': '__class__'} (a getattr on torch)")
    load_case("ij_tag_dtype_not_dtype", mutated(set_attr("gelu", "approximate", {"dtype": "Tensor"})),
              r"dtype|Tensor", "{'dtype': 'Tensor'}: a torch attribute that is not a dtype")
    load_case("ij_tag_dtype_load", mutated(set_attr("gelu", "approximate", {"dtype": "load"})),
              r"dtype|load", "{'dtype': 'load'}: torch.load is not a dtype")
    load_case("ij_tag_memory_format", mutated(set_attr("gelu", "approximate", {"memory_format": "__dict__"})),
              r"memory_format", "{'memory_format': '__dict__'}")
    load_case("ij_tag_layout", mutated(set_attr("gelu", "approximate", {"layout": "__globals__"})), r"layout",
              "{'layout': '__globals__'}")
    load_case("ij_tag_float", mutated(set_attr("gelu", "approximate", {"float": "1e999"})), r"float",
              "{'float': '1e999'}: only inf, -inf, nan are tagged")
    load_case("ij_attrs_not_object", mutated(lambda d: _node(d, "mean").__setitem__("attrs", [1, 2])),
              r"attrs", "attrs is a list")
    # numbers and nesting
    load_case("ij_5000_digit_dim", mutated(lambda d: _tensor_everywhere(d, "x", shape=[1, 3, "@@BIG@@", 6])),
              r"digit|integer|JSON|not valid", "a 5,000-digit dimension",
              replace={"@@BIG@@": "9" * 5000})
    load_case("ij_5000_digit_attr", mutated(set_attr("mean", "dim", "@@BIG@@")), r"digit|integer|JSON|not valid",
              "a 5,000-digit attribute value", replace={"@@BIG@@": "1" + "0" * 5000})
    load_case("ij_deep_nesting_metadata", mutated(lambda d: d.__setitem__("metadata", {"deep": "@@DEEP@@"})),
              r"nest|deep|JSON", "metadata nested 100,000 deep",
              replace={"@@DEEP@@": "[" * 100_000 + "]" * 100_000})
    load_case("ij_deep_nesting_attr", mutated(set_attr("mean", "dim", "@@DEEP@@")), r"nest|deep|JSON",
              "an attribute nested 100,000 deep", replace={"@@DEEP@@": "[" * 100_000 + "]" * 100_000})
    load_case("ij_deep_nesting_objects", mutated(lambda d: d.__setitem__("metadata", {"deep": "@@DEEP@@"})),
              r"nest|deep|JSON", "metadata of objects nested 100,000 deep",
              replace={"@@DEEP@@": '{"a":' * 100_000 + "1" + "}" * 100_000})
    load_case("ij_nan_literal", mutated(set_attr("mean", "dim", "@@NAN@@")), r"NaN|strict|JSON|not valid",
              "a bare NaN token (not JSON)", replace={"@@NAN@@": "NaN"})
    load_case("ij_infinity_literal", mutated(set_attr("conv2d", "stride", "@@INF@@")), r"Infinity|strict|JSON",
              "a bare -Infinity token (not JSON)", replace={"@@INF@@": "[1, -Infinity]"})
    load_case("ij_nan_in_symbol_bound", mutated(lambda d: d["symbols"].__setitem__("s9", {"min": "@@NAN@@"})),
              r"NaN|strict|JSON|integer", "NaN as a symbol's min", replace={"@@NAN@@": "NaN"})
    load_case("ij_negative_dim", mutated(lambda d: _tensor_everywhere(d, "x", shape=[1, 3, -6, 6])), r"shape",
              "a negative dimension")
    load_case("ij_dim_over_max", mutated(lambda d: _tensor_everywhere(d, "x", shape=[1, 3, 10**13, 6])), r"shape",
              "a dimension over limits.max_dim")
    load_case("ij_bool_dim", mutated(lambda d: _tensor_everywhere(d, "x", shape=[True, 3, 6, 6])), r"shape",
              "a boolean dimension")
    load_case("ij_float_dim", mutated(lambda d: _tensor_everywhere(d, "x", shape=[1, 3, 2.5, 6])), r"shape",
              "a fractional dimension")
    load_case("ij_null_dim", mutated(lambda d: _tensor_everywhere(d, "x", shape=[1, 3, None, 6])), r"shape",
              "a null dimension")
    load_case("ij_shape_not_list", mutated(lambda d: _tensor_everywhere(d, "x", shape="1,3,6,6")), r"shape",
              "a shape given as a string")
    # file level
    load_case("ij_not_utf8", b"\xff\xfe\xfd" + base_text.encode("utf-8")[3:], r"UTF-8|text", "bytes that are not UTF-8")
    load_case("ij_utf16", base_text.encode("utf-16"), r"UTF-8|text|JSON", "the IR encoded as UTF-16")
    load_case("ij_empty_file", "", r"JSON|empty", "an empty file")
    load_case("ij_whitespace_file", "   \n\t ", r"JSON", "only whitespace")
    load_case("ij_truncated", base_text[: len(base_text) // 2], r"JSON", "the IR cut in half")
    load_case("ij_top_level_list", "[]", r"object", "a JSON array")
    load_case("ij_top_level_null", "null", r"object", "JSON null")
    load_case("ij_top_level_string", json.dumps(base_text), r"object", "the IR JSON-quoted as one string")
    load_case("ij_trailing_garbage", base_text + "\n{}", r"JSON|Extra", "a second document after the IR")
    load_case("ij_pickle_file", pickle.dumps({"ir_version": "1.0"}), r"UTF-8|JSON|text", "a pickle, not JSON")
    (b.dir / "ir_dir.json").mkdir(exist_ok=True)
    b.add(Case("ij_directory", "ir_json", "a directory passed as the IR file", ["ir_dir.json"], "load_ir",
               "InputReadError", r"directory", _fill(_ir_cli(), "ir_dir.json")))
    b.add(Case("ij_missing_file", "ir_json", "an IR path that does not exist", ["no_such_ir.json"], "load_ir",
               "InputNotFoundError", r"does not exist", _fill(_ir_cli(), "no_such_ir.json")))
    b.add(Case("ij_file_over_limit", "ir_json", "an IR file larger than limits.max_alloc_bytes (lowered to 1 KiB)",
               [BASE_IR], "load_ir", "LimitExceededError", r"limit", _fill(_ir_cli(), BASE_IR), limit_bytes=1024))
    # structure
    load_case("ij_version_2", mutated(lambda d: d.__setitem__("ir_version", "2.0")), r"version", "ir_version 2.0")
    load_case("ij_version_int", mutated(lambda d: d.__setitem__("ir_version", 1)), r"ir_version", "ir_version 1")
    load_case("ij_version_evil", mutated(lambda d: d.__setitem__("ir_version", "__import__('os')")), r"version",
              "ir_version that is an expression")
    load_case("ij_model_name_int", mutated(lambda d: d.__setitem__("model_name", 7)), r"model_name",
              "model_name 7")
    load_case("ij_missing_nodes", mutated(lambda d: d.pop("nodes")), r"nodes", "no nodes field")
    load_case("ij_nodes_object", mutated(lambda d: d.__setitem__("nodes", {"a": 1})), r"nodes", "nodes is an object")
    load_case("ij_node_not_object", mutated(lambda d: d["nodes"].append("rm -rf /")), r"nodes", "a node is a string")
    load_case("ij_op_type_list", mutated(lambda d: _node(d, "relu").__setitem__("op_type", ["aten", "relu"])),
              r"op_type", "op_type is a list")
    load_case("ij_op_type_empty", mutated(lambda d: _node(d, "relu").__setitem__("op_type", "")), r"op_type",
              "op_type is empty")
    load_case("ij_tensor_name_int", mutated(lambda d: _tensor_everywhere(d, "x", name=5)), r"name",
              "a tensor named 5")
    load_case("ij_dtype_int", mutated(lambda d: _tensor_everywhere(d, "x", dtype=32)), r"dtype", "dtype 32")
    load_case("ij_role_evil", mutated(lambda d: _tensor_everywhere(d, "x", role="__import__")), r"role", "bad role")
    load_case("ij_duplicate_tensor", mutated(lambda d: _node(d, "relu")["outputs"][0].__setitem__("name", "x")),
              r"twice|unique|defined", "a node output reuses the input's name")
    load_case("ij_undefined_input", mutated(lambda d: _node(d, "relu")["inputs"][0].__setitem__("name", "ghost")),
              r"ghost|defined", "a node reads a tensor nothing defines")
    load_case("ij_duplicate_node", mutated(lambda d: _node(d, "mean").__setitem__("name", "relu")),
              r"twice|relu", "two nodes named relu")
    load_case("ij_symbol_name_expr", mutated(lambda d: d["symbols"].__setitem__("__import__('os')", {})),
              r"identifier|symbol", "a symbol named by an expression")
    load_case("ij_symbol_min_string", mutated(lambda d: d["symbols"].__setitem__("s9", {"min": "0"})), r"integer",
              "a symbol's min as a string")
    load_case("ij_symbol_expr_not_tag", mutated(lambda d: d["symbols"].__setitem__("s9", {"expr": "1+1"})),
              r"expr|sym", "symbols.s9.expr is a bare string")
    load_case("ij_symbols_list", mutated(lambda d: d.__setitem__("symbols", [])), r"symbols", "symbols is a list")
    load_case("ij_weight_mapping_int", mutated(lambda d: d["weight_name_mapping"].__setitem__("p_fc_bias", 5)),
              r"weight_name_mapping", "a weight mapped to 5")
    load_case("ij_mutation_ghost", mutated(lambda d: d["mutations"].__setitem__("ghost", "relu")), r"mutat",
              "a mutation of a buffer that does not exist")

    # refused later: when the IR runs or compiles
    cid = "ij_deep_nesting_attr_900"
    file = b.write_ir(f"{cid}.json", mutated(set_attr("mean", "dim", "@@DEEP@@")),
                      {"@@DEEP@@": "[" * 900 + "]" * 900})
    b.add(Case(cid, "ir_json", "aten.mean's dim nested 900 deep (parses): refused on load or by the compiler, "
               "never a crash", [file], "compile", "TorchIRError", "",
               [CliCall(["compile", "{dir}/" + file]), CliCall(["normalize", "{dir}/" + file])]))
    doc = mutated(set_attr("gelu", "approximatee", "tanh"))
    file = b.write_ir("ij_unknown_attr_gelu.json", doc)
    b.add(Case("ij_unknown_attr_gelu", "ir_json", "aten.gelu with a misspelled attribute 'approximatee'", [file],
               "ir_executor", invalid, r"approximatee", _fill(_ir_cli(load_fails=False, executes=True), file)))
    file = b.write_ir("ij_unknown_attr_gelu_compile.json", doc)
    b.add(Case("ij_unknown_attr_gelu_compile", "ir_json", "compiling aten.gelu with 'approximatee'", [file],
               "compile", invalid, r"approximatee", _fill(_ir_cli(load_fails=False, compiles=True), file)))
    doc = mutated(lambda d: _node(d, "conv2d")["attrs"].__setitem__("paddin", _node(d, "conv2d")["attrs"].pop(
        "padding")))
    file = b.write_ir("ij_misspelled_attr_conv_compile.json", doc)
    b.add(Case("ij_misspelled_attr_conv_compile", "ir_json", "aten.conv2d with 'padding' misspelled 'paddin': the "
               "compiler must refuse it as the reference executor does, not compile padding 0", [file], "compile",
               invalid, r"paddin", _fill(_ir_cli(load_fails=False, compiles=True), file)))
    doc = mutated(set_attr("conv2d", "weights_path", str(b.path(SECRET))))
    file = b.write_ir("ij_unknown_attr_conv.json", doc)
    b.add(Case("ij_unknown_attr_conv", "ir_json", "aten.conv2d with an extra attribute naming a file", [file],
               "ir_executor", invalid, r"weights_path", _fill(_ir_cli(load_fails=False, executes=True), file)))

    def compile_case(cid: str, doc: dict[str, Any], error: str, message: str, description: str,
                     big: bool = False) -> None:
        file = b.write_ir(f"{cid}.json", doc)
        b.add(Case(cid, "ir_json", description, [file], "compile", error, message,
                   _fill(_ir_cli(load_fails=False, compiles=True), file), big_alloc=big))

    limit = "LimitExceededError"
    compile_case("ij_huge_weight", mutated(lambda d: _tensor_everywhere(d, "p_fc_weight", shape=[10**12, 10**12])),
                 limit, r"limit|over", "a weight of shape [1e12, 1e12]: compile must refuse, not allocate", True)
    compile_case("ij_huge_activation",
                 mutated(lambda d: _tensor_everywhere(d, "relu", shape=[1, 4, 10**6, 10**6])),
                 limit, r"limit|over", "an activation of 4e12 elements", True)
    compile_case("ij_huge_input", mutated(lambda d: _tensor_everywhere(d, "x", shape=[10**12, 3, 6, 6])), limit,
                 r"limit|over", "an input of batch 1e12", True)
    def huge_constant(d: dict[str, Any]) -> None:
        bias = next(w for w in d["weights"] if w["name"] == "p_fc_bias")
        d["weights"].remove(bias)
        d["constants"].append({**bias, "role": "constant"})
        d["constant_values"]["p_fc_bias"] = 0.0
        _tensor_everywhere(d, "p_fc_bias", shape=[10**6, 10**6], role="constant")

    compile_case("ij_huge_constant", mutated(huge_constant), limit, r"limit|over",
                 "the linear's bias as an inline constant declared [1e6, 1e6] with one value", True)
    # a dtype name is any string in the format (schema.json): refused by whatever needs its size, never a crash
    for cid, tensor, dtype in [("ij_dtype_unknown", "p_fc_bias", "float128"), ("ij_dtype_dunder", "p_fc_bias",
                                                                                "__class__"),
                               ("ij_dtype_function", "x", "load")]:
        file = b.write_ir(f"{cid}.json", mutated(lambda d, t=tensor, v=dtype: _tensor_everywhere(d, t, dtype=v)))
        b.add(Case(cid, "ir_json", f"tensor {tensor!r} of dtype {dtype!r}", [file], "compile", "TorchIRError",
                   re.escape(dtype), [CliCall(["inspect", "{dir}/" + file], [0, 2]),
                                      CliCall(["verify", VERIFY_SPEC, "--ir", "{dir}/" + file])]))


def _amplification_ir(b: _Builder, base: dict[str, Any]) -> None:
    """Nodes whose attributes make an op allocate far more than the IR declares; run under a lowered limit."""
    def case(cid: str, op: str, attrs: dict[str, Any], inputs: bool, description: str) -> None:
        doc = copy.deepcopy(base)
        node = _node(doc, "relu")
        node["op_type"], node["attrs"] = op, attrs
        if not inputs:
            node["inputs"] = []
        file = b.write_ir(f"{cid}.json", doc)
        b.add(Case(cid, "amplification", description, [file], "ir_executor", "TorchIRError", "",
                   [], big_alloc=True, limit_bytes=256 * MiB))

    case("amp_ir_full", "aten.full.default", {"size": [13500, 13500], "fill_value": 1.0}, False,
         "aten.full of 13500x13500 (730 MB) where the IR declares [1, 4, 6, 6]")
    case("amp_ir_repeat", "aten.repeat.default", {"repeats": [1, 1, 1100, 1100]}, True,
         "aten.repeat x 1100x1100 (700 MB) where the IR declares [1, 4, 6, 6]")
    case("amp_ir_ones_huge", "aten.ones.default", {"size": [10**6, 10**6]}, False,
         "aten.ones of 1e12 elements")


# ------------------------------------------------------------------------------------------- programs


def _programs(b: _Builder, header: dict[str, Any], blob: bytes, base_bytes: bytes) -> None:
    npubin_error = "NpubinError"

    def load_case(cid: str, data: bytes | dict[str, Any], message: str, description: str, *,
                  category: str = "npubin", error: str = npubin_error, api: str = "program_load",
                  big: bool = False, escape: bool = False, limit: int | None = None, runs: bool = False,
                  version: tuple[int, int] = VERSION) -> None:
        name = f"{cid}.npubin"
        if isinstance(data, dict):
            b.write_program(name, data, blob, major=version[0], minor=version[1])
        else:
            b.path(name).write_bytes(data)
        cli = _fill(_program_cli(runs), name)
        if category == "amplification":
            cli = cli[:1]  # the run alone: profile would repeat the same allocation several times
        b.add(Case(cid, category, description, [name], api, error, message, cli, escape=escape, big_alloc=big,
                   limit_bytes=limit))

    def mutated(fn: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        h = copy.deepcopy(header)
        fn(h)
        return h

    def tensor(h: dict[str, Any], name: str) -> dict[str, Any]:
        return next(t for t in h["tensors"] if t["name"] == name)

    def spec_everywhere(h: dict[str, Any], name: str, **changes: Any) -> None:
        for key in ("tensors", "input_specs", "output_specs", "weight_specs"):
            for t in h[key]:
                if t["name"] == name:
                    t.update(changes)

    def dispatch(h: dict[str, Any], kernel: str) -> dict[str, Any]:
        return next(d for d in h["dispatches"] if d["kernel"] == kernel)

    d0 = header["dispatches"][0]
    first_in, first_out = d0["inputs"][0], d0["outputs"][0]
    mean_kernel = "aten.mean.dim"
    m = b.marker

    # code execution through dispatch parameters: a 2.0 kernel param is a plain value of its declared type, so an
    # IR tag is a wrong type, never parsed; a 1.x file's params are the IR's attributes, decoded on read, where a
    # symbolic size is refused (a program is planned for static shapes) without being evaluated
    param_rule = r"param 'dim' is .*expected a list of ints"
    for name, expr in {"import_system": "__import__('os').system('touch {marker}')",
                       "subclasses": "().__class__.__base__.__subclasses__()",
                       "lambda": "(lambda: __import__('os').system('touch {marker}'))()",
                       "attribute": "s0.__class__.__mro__",
                       "too_long": "1*" * 1500 + "1"}.items():
        for prefix, version, rule in (("ce_npubin_param", VERSION, param_rule), ("ce_npubin_v1_param", V1, SYM_RULE)):
            cid = f"{prefix}_{name}"
            e = expr.format(marker=m(cid))
            load_case(cid, mutated(lambda h, e=e: dispatch(h, mean_kernel)["params"].__setitem__("dim", [{"sym": e}])),
                      rule, f"dispatch parameter {{'sym': {e[:40]!r}}} (format {version[0]}.{version[1]})",
                      category="code_execution", escape="touch" in e, version=version)
    pickle_tag = {"pickle": "cos\nsystem\n."}
    for prefix, version, rule in (("ce_npubin_param", VERSION, param_rule), ("ce_npubin_v1_param", V1, r"tagged")):
        load_case(f"{prefix}_pickle_tag", mutated(lambda h: dispatch(h, mean_kernel)["params"].__setitem__(
                      "dim", pickle_tag)),
                  rule, f"a {{'pickle': ...}} dispatch parameter (format {version[0]}.{version[1]})",
                  category="code_execution", version=version)
        load_case(f"{prefix}_pow_tower",
                  mutated(lambda h: dispatch(h, mean_kernel)["params"].__setitem__("dim", [{"sym": "9**9**9**9"}])),
                  SYM_RULE if version == V1 else param_rule,
                  f"dispatch parameter {{'sym': '9**9**9**9'}} (format {version[0]}.{version[1]}): never evaluated",
                  category="code_execution", api="executor", version=version)
    cid = "ce_npubin_embedded_ir"
    load_case(cid, mutated(lambda h: h["ir"]["symbols"].__setitem__(
        "s9", {"min": None, "max": None, "expr": {"sym": f"__import__('os').system('touch {m(cid)}')"}})),
        "", "the embedded IR (never executed) carries a code-execution expression: loading and running are fine",
        category="code_execution", api="executor", error=None, escape=True, runs=True)
    cid = "ce_npubin_node_label"
    load_case(cid, mutated(lambda h: dispatch(h, mean_kernel).__setitem__(
        "node", f"__import__('os').system('touch {m(cid)}')")), "",
        "a dispatch's node label is an expression: only ever printed", category="code_execution", api="executor",
        error=None, escape=True, runs=True)

    # kernels
    kernel_rule = r"kernel"
    def set_kernel(h: dict[str, Any], kernel: Any) -> None:
        d = dispatch(h, mean_kernel)
        d["kernel"] = kernel
        if kernel == "aten.from_file.default":
            d["params"] = {"filename": str(b.path(SECRET)), "size": 4}

    for cid, kernel in [("k_from_file", "aten.from_file.default"), ("k_fill_", "aten.fill_.Scalar"),
                        ("k_add_out", "aten.add.out"), ("k_copy_", "aten.copy_.default"),
                        ("k_c10d", "c10d.allreduce_.default"),
                        ("k_profiler", "profiler._record_function_enter.default"),
                        ("k_assert_async", "aten._assert_async.msg"), ("k_nonexistent", "NOT_A_KERNEL"),
                        ("k_builtins_eval", "builtins.eval.default"), ("k_trailing_space", "aten.mean.dim "),
                        ("k_nul", "GEMM\x00"), ("k_dots", "aten.mean.dim.extra"), ("k_host_only", "aten.histc.default"),
                        ("k_lowercase", "gemm"), ("k_int", 42), ("k_null", None), ("k_list", ["GEMM"])]:
        load_case(cid, mutated(lambda h, k=kernel: set_kernel(h, k)), kernel_rule,
                  f"a dispatch running kernel {kernel!r}", category="dangerous_op")
    load_case("k_unknown_target", mutated(lambda h: h.__setitem__("target", "../../npu-evil")), r"target",
              "a target this runtime does not have: loads, refused by the executor", category="dangerous_op",
              api="executor", error="RuntimeInputError")
    load_case("k_unknown_target_bad_kernel", mutated(lambda h: (
        h.__setitem__("target", "npu-evil"), dispatch(h, mean_kernel).__setitem__("kernel", "aten.from_file.default"))),
        r"kernel 'aten\.from_file\.default'.*target", "a dangerous kernel under a target this runtime does not have: "
        "no kernel of the kernel table, refused on load", category="dangerous_op", api="executor")
    load_case("k_unknown_param", mutated(lambda h: dispatch(h, "aten.gelu.default")["params"].__setitem__(
        "approximatee", "tanh")), r"'approximatee' is not a param", "a reference kernel with an attribute its op "
        "does not take: not a param its record declares", api="executor", category="dangerous_op")
    for cid, params, rule in [
            ("k_param_choice", {"approximate": "__import__('os')"}, r"param 'approximate' .*one of 'none', 'tanh'"),
            ("k_param_wrong_type", {"approximate": 1}, r"param 'approximate' is 1, expected"),
            ("k_param_ir_tag", {"approximate": {"dtype": "float32"}}, r"param 'approximate' is \{'dtype'")]:
        load_case(cid, mutated(lambda h, p=params: dispatch(h, "aten.gelu.default")["params"].update(p)), rule,
                  f"aten.gelu with {params}: not what its record declares", category="dangerous_op")
    load_case("k_param_missing_required", mutated(lambda h: dispatch(h, mean_kernel)["params"].pop("dim")),
              r"lacks the required param 'dim'", "aten.mean.dim without its dim", category="dangerous_op")

    # the memory plan
    mem = "memory"
    load_case("nb_overlap_live", mutated(lambda h: h[mem]["offsets"].__setitem__(
        first_out, h[mem]["offsets"][first_in])), r"overlap|share|invalid",
        f"{first_out!r} placed on {first_in!r}, both live at dispatch 0")
    load_case("nb_negative_offset", mutated(lambda h: h[mem]["offsets"].__setitem__(first_out, -64)),
              r"offset|outside|invalid|negative", "a negative offset")
    load_case("nb_unaligned_offset", mutated(lambda h: h[mem]["offsets"].__setitem__(
        first_out, h[mem]["offsets"][first_out] + 1)), r"align|invalid", "an offset off the 64-byte alignment")
    load_case("nb_offset_past_arena", mutated(lambda h: h[mem]["offsets"].__setitem__(
        first_out, h[mem]["arena_bytes"] + 64)), r"outside|arena|invalid", "an offset past the arena")
    load_case("nb_offset_string", mutated(lambda h: h[mem]["offsets"].__setitem__(first_out, "0")),
              r"integer|malformed", "an offset given as a string")
    load_case("nb_offset_float", mutated(lambda h: h[mem]["offsets"].__setitem__(first_out, 0.5)),
              r"integer|malformed", "an offset of 0.5")
    load_case("nb_offset_stray", mutated(lambda h: h[mem]["offsets"].__setitem__("ghost", 0)),
              r"ghost|not tensors", "an offset for a tensor that does not exist")
    load_case("nb_unplaced", mutated(lambda h: h[mem]["offsets"].pop(first_out)), r"no offset|unplaced|offset",
              "a tensor a dispatch writes has no offset")
    load_case("nb_arena_huge", mutated(lambda h: h[mem].__setitem__("arena_bytes", 10**15)), r"limit|over",
              "arena_bytes 1e15", big=True)
    load_case("nb_arena_too_small", mutated(lambda h: h[mem].__setitem__("arena_bytes", 64)),
              r"arena|outside|invalid", "an arena smaller than the tensors placed in it")
    load_case("nb_arena_negative", mutated(lambda h: h[mem].__setitem__("arena_bytes", -1)), r"arena_bytes|negative",
              "arena_bytes -1")
    load_case("nb_arena_bool", mutated(lambda h: h[mem].__setitem__("arena_bytes", True)), r"arena_bytes|integer",
              "arena_bytes true")
    load_case("nb_alignment_zero", mutated(lambda h: h[mem].__setitem__("alignment", 0)), r"alignment",
              "alignment 0")
    load_case("nb_alignment_negative", mutated(lambda h: h[mem].__setitem__("alignment", -64)), r"alignment",
              "alignment -64")
    out_spec = header["output_specs"][0]["name"]
    load_case("nb_view_larger", mutated(lambda h: (h[mem]["aliases"].__setitem__(first_out, out_spec),
                                                   h[mem]["offsets"].pop(first_out))),
              r"larger|view", f"{first_out!r} a view of the much smaller {out_spec!r}")
    load_case("nb_alias_cycle", mutated(lambda h: h[mem]["aliases"].update({first_out: "mean", "mean": first_out})),
              r"cycle|alias", "two tensors that are views of each other")
    load_case("nb_alias_self", mutated(lambda h: h[mem]["aliases"].update({"mean": "mean"})),
              r"cycle|alias", "a tensor that is a view of itself")
    load_case("nb_alias_ghost", mutated(lambda h: h[mem]["aliases"].update({"mean": "ghost"})), r"alias|ghost",
              "a view of a tensor that does not exist")
    load_case("nb_alias_weight", mutated(lambda h: h[mem]["aliases"].update({"mean": "p_fc_bias"})),
              r"alias|p_fc_bias", "an activation that is a view of a weight slot")

    # specs
    big = dict(big=True)
    load_case("nb_input_spec_huge", mutated(lambda h: spec_everywhere(h, first_in, shape=[10**12], layout=None)),
              r"limit|over", "an input of 1e12 elements", **big)
    load_case("nb_input_spec_product", mutated(lambda h: spec_everywhere(h, first_in, shape=[2**20] * 4)),
              r"limit|over", "an input of (2**20)**4 elements, each dimension allowed", **big)
    load_case("nb_dim_over_max", mutated(lambda h: spec_everywhere(h, "mean", shape=[10**30, 4])),
              r"limit|dimension", "a dimension of 1e30", **big)
    load_case("nb_weight_spec_huge", mutated(lambda h: spec_everywhere(h, "p_fc_weight", shape=[10**6, 10**6])),
              r"limit|over", "a weight slot of 1e12 elements", **big)
    load_case("nb_output_spec_huge", mutated(lambda h: spec_everywhere(h, out_spec, shape=[10**7, 10**7])),
              r"limit|over", "an output of 1e14 elements", **big)
    load_case("nb_ghost_tensor_huge", mutated(lambda h: h["tensors"].append(
        {"name": "ghost", "shape": [10**12], "dtype": "float32", "layout": None})), r"limit|over",
        "an unused tensor of 1e12 elements", **big)
    load_case("nb_rank_2000", mutated(lambda h: spec_everywhere(h, "mean", shape=[1] * 1998 + [1, 4])),
              r"rank|dimension|shape|limit|invalid", "a tensor of rank 2000", category="npubin", api="executor",
              error="TorchIRError")
    load_case("nb_unknown_dtype", mutated(lambda h: spec_everywhere(h, "mean", dtype="float128")), r"dtype",
              "dtype float128")
    load_case("nb_dtype_object", mutated(lambda h: spec_everywhere(h, "mean", dtype="object")), r"dtype",
              "dtype object")
    load_case("nb_dtype_dunder", mutated(lambda h: spec_everywhere(h, "mean", dtype="__class__")), r"dtype",
              "dtype __class__")
    load_case("nb_dtype_null", mutated(lambda h: spec_everywhere(h, "mean", dtype=None)), r"dtype",
              "dtype null")
    load_case("nb_bogus_layout", mutated(lambda h: spec_everywhere(h, first_in, layout="NCHW'; rm -rf /")),
              r"layout", "layout \"NCHW'; rm -rf /\"")
    load_case("nb_layout_nhwc_2d", mutated(lambda h: spec_everywhere(h, "mean", layout="NHWC")), r"layout",
              "layout NHWC on a 2-d tensor")
    load_case("nb_layout_int", mutated(lambda h: spec_everywhere(h, "mean", layout=4)), r"layout", "layout 4")
    for cid, bad in [("nb_shape_float", 2.5), ("nb_shape_string", "3"), ("nb_shape_bool", True),
                     ("nb_shape_null", None), ("nb_shape_list", [4]), ("nb_shape_negative", -4)]:
        load_case(cid, mutated(lambda h, v=bad: spec_everywhere(h, "mean", shape=[1, v])),
                  r"integer|malformed|dimension|shape", f"a shape entry {bad!r}")
    load_case("nb_shape_string_whole", mutated(lambda h: spec_everywhere(h, "mean", shape="14")),
              r"integer|malformed|shape", "a shape that is a string")
    load_case("nb_shape_object", mutated(lambda h: spec_everywhere(h, "mean", shape={"1": 4})),
              r"integer|malformed|shape", "a shape that is an object")
    load_case("nb_spec_name_empty", mutated(lambda h: tensor(h, "mean").__setitem__("name", "")),
              r"name|spec", "a tensor spec with an empty name")
    load_case("nb_spec_missing_dtype", mutated(lambda h: tensor(h, "mean").pop("dtype")), r"dtype|lacks",
              "a tensor spec without dtype")
    load_case("nb_input_not_a_tensor", mutated(lambda h: h["input_specs"].append(
        {"name": "ghost", "shape": [1], "dtype": "float32", "layout": None})), r"ghost|input",
        "an input spec naming no tensor")
    load_case("nb_input_shape_disagrees", mutated(lambda h: h["input_specs"][0].__setitem__("shape", [1, 3, 6, 7])),
              r"input|shape", "an input spec whose shape differs from its tensor")
    load_case("nb_weight_is_activation", mutated(lambda h: h["weight_specs"].append(
        {"name": "mean", "shape": [1, 4], "dtype": "float32", "layout": None})), r"weight|activation|mean",
        "a name that is both a weight slot and an activation")
    load_case("nb_weight_keys_int", mutated(lambda h: h["weight_keys"].__setitem__("p_fc_bias", 5)),
              r"weight_keys", "a weight key that is an int")
    load_case("nb_weight_keys_list", mutated(lambda h: h.__setitem__("weight_keys", ["a"])),
              r"weight_keys|malformed", "weight_keys is a list")

    # dispatches
    load_case("nb_dispatch_ghost_input", mutated(lambda h: dispatch(h, mean_kernel)["inputs"].append("ghost")),
              r"ghost|no spec", "a dispatch reading a tensor with no spec")
    load_case("nb_dispatch_writes_weight", mutated(lambda h: dispatch(h, mean_kernel).__setitem__(
        "outputs", ["p_fc_bias"])), r"weight|p_fc_bias", "a dispatch writing a weight slot")
    load_case("nb_dispatch_inputs_string", mutated(lambda h: dispatch(h, mean_kernel).__setitem__("inputs", "relu")),
              r"list|malformed", "dispatch inputs given as a string")
    load_case("nb_dispatch_params_list", mutated(lambda h: dispatch(h, mean_kernel).__setitem__("params", [1])),
              r"params|malformed", "dispatch params given as a list")
    load_case("nb_dispatch_input_int", mutated(lambda h: dispatch(h, mean_kernel).__setitem__("inputs", [7])),
              r"no spec|tensor|malformed", "a dispatch input named 7")
    load_case("nb_dispatch_missing_kernel", mutated(lambda h: dispatch(h, mean_kernel).pop("kernel")),
              r"kernel|lacks", "a dispatch without kernel")
    load_case("nb_dispatches_object", mutated(lambda h: h.__setitem__("dispatches", {"a": 1})),
              r"dispatches|malformed", "dispatches is an object")
    load_case("nb_param_nan", npubin_bytes(json.dumps(mutated(lambda h: dispatch(h, "aten.gelu.default")[
        "params"].__setitem__("approximate", "@@NAN@@")), sort_keys=True).replace('"@@NAN@@"', "NaN"), blob),
        r"NaN|strict|JSON", "a bare NaN in a parameter")

    # kernels given parameters they cannot use
    conv = "CONV"
    # Which layer refuses these (the program check, the executor's construction or the run) is the runtime's
    # choice: any toolkit error will do; a bare library error or a native crash will not.
    for cid, params, error, message in [
            ("nb_conv_groups_zero", {"groups": 0}, "TorchIRError", r"groups|param|dispatch"),
            ("nb_conv_groups_string", {"groups": "one"}, "TorchIRError", r"groups|param|dispatch"),
            ("nb_conv_groups_huge", {"groups": 2**62}, "TorchIRError", r"groups|param|dispatch"),
            ("nb_conv_stride_zero", {"stride": [0, 0]}, "TorchIRError", r"stride|param|dispatch"),
            ("nb_conv_stride_negative", {"stride": [-1, -1]}, "TorchIRError", r"stride|param|dispatch"),
            ("nb_conv_padding_negative", {"padding": [-5, -5]}, "TorchIRError", r"padding|param|dispatch"),
            ("nb_conv_padding_overflows_slot", {"padding": [2, 2]}, "TorchIRError", r"padding|shape|dispatch|size"),
            ("nb_conv_padding_underfills_slot", {"padding": [0, 0]}, "TorchIRError", r"padding|shape|dispatch|size"),
            ("nb_conv_dilation_huge", {"dilation": [10**9, 10**9]}, "TorchIRError", r"dilation|param|dispatch"),
            ("nb_conv_dilation_zero", {"dilation": [0, 0]}, "TorchIRError", r"dilation|param|dispatch"),
            ("nb_conv_stride_list_of_lists", {"stride": [[1], [1]]}, "TorchIRError", r"stride|param|dispatch"),
            ("nb_conv_activation_evil", {"activation": "__import__('os')"}, "TorchIRError",
             r"activation|param|dispatch|__import__")]:
        load_case(cid, mutated(lambda h, p=params: dispatch(h, conv)["params"].update(p)), message,
                  f"CONV with {params}", api="executor", error=error)
    load_case("nb_mean_dim_out_of_range", mutated(lambda h: dispatch(h, mean_kernel)["params"].update(dim=[100])),
              r"dispatch|mean|dim", "aten.mean over dim 100 of a 4-d tensor", api="executor", error="RuntimeInputError")
    load_case("nb_mean_dim_string", mutated(lambda h: dispatch(h, mean_kernel)["params"].update(dim="all")),
              r"param 'dim' is 'all', expected a list of ints or null", "aten.mean with dim 'all'", api="executor")

    # amplification through kernel parameters (lowered limit)
    amp = dict(api="executor", category="amplification", big=True, limit=256 * MiB, error="TorchIRError")
    load_case("amp_npubin_repeat", mutated(lambda h: dispatch(h, mean_kernel).update(
        kernel="aten.repeat.default", params={"repeats": [1, 1, 1100, 1100]})), "",
        "aten.repeat x 1100x1100 (700 MB) into a [1, 4] output", **amp)
    load_case("amp_npubin_conv_padding", mutated(lambda h: dispatch(h, conv)["params"].update(padding=[3300, 3300])),
              "", "CONV padded by 3300: a 700 MB output for a 576-byte slot", **amp)

    # file-level damage
    load_case("nb_truncated_half", base_bytes[: len(base_bytes) // 2], r"truncated|checksum", "the file cut in half")
    load_case("nb_truncated_fixed", base_bytes[:10], r"truncated", "10 bytes")
    load_case("nb_empty_file", b"", r"truncated", "an empty file")
    load_case("nb_wrong_magic", b"NPUBOX\0\0" + base_bytes[8:], r"magic|not a \.npubin", "wrong magic")
    load_case("nb_ir_json_as_program", b.path(BASE_IR).read_bytes(), r"magic|not a \.npubin",
              "an IR JSON file passed as a program")
    h_raw = json.dumps(header, sort_keys=True, separators=(",", ":"))
    load_case("nb_wrong_version", npubin_bytes(h_raw, blob, major=3), r"version", "format version 3.0")
    load_case("nb_version_max", npubin_bytes(h_raw, blob, major=65535, minor=65535), r"version", "format 65535")
    load_case("nb_checksum_mismatch", npubin_bytes(h_raw, blob, checksum=False), r"checksum", "a wrong SHA-256")
    flipped = bytearray(base_bytes)
    flipped[FIXED.size + 5] ^= 0x01
    load_case("nb_flipped_header_byte", bytes(flipped), r"checksum", "one header bit flipped, old checksum kept")
    load_case("nb_header_len_past_end", npubin_bytes(h_raw, blob, header_len=len(h_raw) + 10_000),
              r"truncated", "a header length past the end of the file")
    load_case("nb_header_len_huge", npubin_bytes(h_raw, blob, header_len=2**64 - 1), r"truncated",
              "a header length of 2**64-1")
    load_case("nb_header_len_short", npubin_bytes(h_raw, blob, header_len=10), r"JSON|header",
              "a header length that cuts the JSON")
    load_case("nb_header_not_utf8", npubin_bytes(b"\xff\xfe" + h_raw.encode()[2:], blob), r"UTF-8|JSON",
              "a header that is not UTF-8")
    load_case("nb_header_array", npubin_bytes("[]", blob), r"object|header", "a header that is a JSON array")
    load_case("nb_header_missing_memory", mutated(lambda h: h.pop("memory")), r"memory", "no memory field")
    load_case("nb_nan_arena", npubin_bytes(h_raw.replace(
        f'"arena_bytes":{header["memory"]["arena_bytes"]}', '"arena_bytes":NaN'), blob), r"NaN|strict|JSON",
        "arena_bytes NaN (not JSON)")
    load_case("nb_infinity_arena", npubin_bytes(h_raw.replace(
        f'"arena_bytes":{header["memory"]["arena_bytes"]}', '"arena_bytes":Infinity'), blob),
        r"Infinity|strict|JSON", "arena_bytes Infinity (not JSON)")
    load_case("nb_5000_digits", npubin_bytes(h_raw.replace(
        f'"arena_bytes":{header["memory"]["arena_bytes"]}', '"arena_bytes":' + "9" * 5000), blob),
        r"digit|JSON|integer", "arena_bytes of 5,000 digits", big=True)
    load_case("nb_5000_digits_shape", npubin_bytes(h_raw.replace('"shape":[1,4]', '"shape":[1,' + "4" * 5000 + "]"),
                                                   blob), r"digit|JSON|integer", "a shape entry of 5,000 digits")
    load_case("nb_deep_nesting", npubin_bytes(h_raw.replace('"metadata":{', '"metadata":{"deep":' + "[" * 100_000
                                                            + "]" * 100_000 + ","), blob),
              r"nest|deep|JSON", "metadata nested 100,000 deep")
    load_case("nb_deep_nesting_params", npubin_bytes(h_raw.replace('"params":{"dim":', '"params":{"deep":' +
                                                                   "[" * 990 + "]" * 990 + ',"dim":'), blob),
              r"nest|deep|JSON", "a dispatch parameter nested 990 deep (parses; deeper than the checks recurse)")
    deep_dim = json.dumps(mutated(lambda h: dispatch(h, mean_kernel)["params"].__setitem__("dim", "@@DEEP@@")),
                          sort_keys=True, separators=(",", ":")).replace('"@@DEEP@@"', "[" * 990 + "]" * 990)
    load_case("nb_v1_deep_nesting_params", npubin_bytes(deep_dim, blob, major=V1[0], minor=V1[1]), r"nest|deep|JSON",
              "a 1.x file's param nested 990 deep: upgrading it on read recurses no deeper than the IR's own bound")
    load_case("nb_blob_mismatch", mutated(lambda h: h.__setitem__("blob_nbytes", 64)), r"blob", "blob_nbytes 64, none")
    load_case("nb_constant_outside_blob", mutated(lambda h: h["constants"].__setitem__(
        "mean", {"offset": 0, "nbytes": 16})), r"outside|blob|constant", "a constant range past the blob")
    load_case("nb_constant_negative", npubin_bytes(json.dumps(mutated(lambda h: (
        h["constants"].__setitem__("mean", {"offset": -16, "nbytes": 16}), h.__setitem__("blob_nbytes", 64))),
        sort_keys=True), bytes(64)), r"outside|blob|constant", "a constant at offset -16 (negative slicing)")
    load_case("nb_constant_no_spec", npubin_bytes(json.dumps(mutated(lambda h: (
        h["constants"].__setitem__("ghost", {"offset": 0, "nbytes": 16}), h.__setitem__("blob_nbytes", 64))),
        sort_keys=True), bytes(64)), r"ghost|spec", "a constant with no tensor spec")
    load_case("nb_model_name_null", mutated(lambda h: h.__setitem__("model_name", None)), r"model_name",
              "model_name null")
    load_case("nb_metadata_list", mutated(lambda h: h.__setitem__("metadata", [])), r"metadata", "metadata list")
    (b.dir / "program_dir.npubin").mkdir(exist_ok=True)
    b.add(Case("nb_directory", "npubin", "a directory passed as the program", ["program_dir.npubin"],
               "program_load", npubin_error, r"cannot be read|directory|program_dir",
               _fill(_program_cli(), "program_dir.npubin")))
    b.add(Case("nb_file_over_limit", "npubin", "a program file larger than limits.max_alloc_bytes (lowered to 1 KiB)",
               [BASE_PROGRAM], "program_load", "TorchIRError", r"limit", _fill(_program_cli(), BASE_PROGRAM),
               limit_bytes=1024))
    b.add(Case("nb_missing_file", "npubin", "a program path that does not exist", ["no_such.npubin"],
               "program_load", npubin_error, r"no such file", _fill(_program_cli(), "no_such.npubin")))

    # a hostile model name in a program: never used as a path by run/profile
    cid = "path_npubin_model_name"
    load_case(cid, mutated(lambda h: h.__setitem__("model_name", "../../escaped")), "",
              "a program named ../../escaped runs and writes nothing", category="path_traversal", api="executor",
              error=None, runs=True)


def _weights(b: _Builder, state: dict[str, Any]) -> None:
    """Weights files: unreadable or mismatched ones refused by load_weights; NaN/Inf ones are data."""
    import torch
    from safetensors.torch import save_file

    err = "RuntimeInputError"
    base = b.path(BASE_WEIGHTS).read_bytes()

    def case(cid: str, name: str, message: str, description: str, *, escape: bool = False, big: bool = False) -> None:
        b.add(Case(cid, "weights", description, [name], "load_weights", err, message, _fill(_weights_cli(), name),
                   escape=escape, big_alloc=big))

    def raw(cid: str, data: bytes, message: str, description: str, suffix: str = ".safetensors", **kw: Any) -> None:
        name = f"{cid}{suffix}"
        b.path(name).write_bytes(data)
        case(cid, name, message, description, **kw)

    def tensors(cid: str, values: dict[str, Any], message: str, description: str) -> None:
        name = f"{cid}.safetensors"
        save_file({k: v.contiguous() for k, v in values.items()}, str(b.path(name)))
        case(cid, name, message, description)

    header_len = struct.unpack_from("<Q", base)[0]
    st_header = json.loads(base[8:8 + header_len])

    def st_with_header(h: dict[str, Any], data: bytes = b"") -> bytes:
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + (data or base[8 + header_len:])

    raw("w_truncated", base[: len(base) // 2], r"weights|safetensors|read", "a safetensors file cut in half")
    raw("w_empty", b"", r"weights|safetensors|read", "an empty .safetensors file")
    raw("w_header_len_huge", struct.pack("<Q", 2**63) + base[8:], r"weights|safetensors|read",
        "a header length of 2**63", big=True)
    raw("w_header_not_json", struct.pack("<Q", 5) + b"{{{{{" + base[13:], r"weights|safetensors|read",
        "a header that is not JSON")
    first = next(k for k in st_header if k != "__metadata__")
    h = copy.deepcopy(st_header)
    h[first]["data_offsets"] = [0, 10**12]
    raw("w_offsets_past_end", st_with_header(h), r"weights|safetensors|read", "data_offsets past the end of the file",
        big=True)
    h = copy.deepcopy(st_header)
    h[first]["shape"] = [10**6, 10**6]
    raw("w_shape_huge", st_with_header(h), r"weights|safetensors|read|shape",
        "a tensor declared 1e12 elements over a few bytes", big=True)
    h = copy.deepcopy(st_header)
    h[first]["dtype"] = "OBJECT"
    raw("w_dtype_unknown", st_with_header(h), r"weights|safetensors|read|dtype", "dtype OBJECT")
    h = copy.deepcopy(st_header)
    h[first]["data_offsets"] = [8, 4]
    raw("w_offsets_reversed", st_with_header(h), r"weights|safetensors|read", "data_offsets [8, 4]")

    real = {k: v.detach().clone() for k, v in state.items()}
    tensors("w_wrong_shape", {**real, "fc.weight": real["fc.weight"].t()}, r"fc\.weight.*shape|shape",
            "fc.weight transposed")
    tensors("w_wrong_dtype", {**real, "conv.weight": real["conv.weight"].double()}, r"conv\.weight.*dtype|dtype",
            "conv.weight as float64")
    tensors("w_missing_key", {k: v for k, v in real.items() if k != "fc.bias"}, r"fc\.bias|missing",
            "fc.bias missing")
    tensors("w_int_weights", {**real, "fc.bias": torch.arange(5)}, r"fc\.bias|dtype", "fc.bias as int64")

    # pickles: must never be unpickled with arbitrary globals
    class Evil:
        def __init__(self, marker: str) -> None:
            self.marker = marker

        def __reduce__(self):
            import os

            return (os.system, (f"touch {self.marker}",))

    raw("w_pickle_raw", pickle.dumps({"conv.weight": Evil(b.marker("w_pickle_raw"))}), r"weights|load|pickle",
        "a raw pickle whose loading runs os.system", suffix=".pt", escape=True)
    name = "w_pickle_torch_zip.pt"
    torch.save({"conv.weight": Evil(b.marker("w_pickle_torch_zip"))}, str(b.path(name)))
    case("w_pickle_torch_zip", name, r"weights|load|pickle|weights_only",
         "a torch.save zip whose data.pkl runs os.system", escape=True)
    raw("w_pickle_eval", pickle.dumps(Evil(b.marker("w_pickle_eval"))), r"weights|load|pickle",
        "a pickle of one evil object", suffix=".pth", escape=True)
    raw("w_pickle_as_bin", pickle.dumps({"conv.weight": Evil(b.marker("w_pickle_as_bin"))}),
        r"weights|load|pickle", "a raw pickle named .bin", suffix=".bin", escape=True)
    raw("w_npz", base, r"weights|format|npz", "an unknown suffix (.npz)", suffix=".npz")
    (b.dir / "weights_dir.safetensors").mkdir(exist_ok=True)
    case("w_directory", "weights_dir.safetensors", r"directory|weights", "a directory passed as weights")
    case("w_missing_file", "no_such.safetensors", r"exist|weights|no such", "a weights path that does not exist")
    torch.save([1, 2, 3], str(b.path("w_not_a_dict.pt")))
    case("w_not_a_dict", "w_not_a_dict.pt", r"state dict|list", "a .pt holding a list")

    # NaN / Inf: data, not errors; the runtime must agree with the reference executor, element by element
    def nan_case(cid: str, fn: Callable[[dict[str, Any]], None], description: str) -> None:
        values = {k: v.clone() for k, v in real.items()}
        fn(values)
        name = f"{cid}.safetensors"
        save_file({k: v.contiguous() for k, v in values.items()}, str(b.path(name)))
        argv = ["run", "{dir}/" + BASE_PROGRAM, "--weights", "{dir}/" + name, "--input", "x={dir}/" + BASE_INPUT]
        b.add(Case(cid, "weights_nonfinite", description, [name], "nan_compare", None, "", [CliCall(argv, 0)]))

    nan = float("nan")
    nan_case("w_nan_fc_bias_one", lambda v: v["fc.bias"].__setitem__(2, nan), "fc.bias[2] = NaN: output column 2")
    nan_case("w_nan_fc_weight_one", lambda v: v["fc.weight"].__setitem__((1, 3), nan),
             "fc.weight[1, 3] = NaN: output column 1")
    nan_case("w_nan_conv_weight_channel", lambda v: v["conv.weight"].__setitem__((2, 0, 1, 1), nan),
             "conv.weight[2, 0, 1, 1] = NaN: channel 2 everywhere, so every output")
    nan_case("w_nan_conv_bias", lambda v: v["conv.bias"].__setitem__(0, nan), "conv.bias[0] = NaN")
    nan_case("w_nan_all", lambda v: [t.fill_(nan) for t in v.values()], "every weight NaN")
    nan_case("w_inf_conv_weight", lambda v: v["conv.weight"].__setitem__((1, 1, 1, 1), float("inf")),
             "conv.weight[1, 1, 1, 1] = +inf (relu keeps +inf or NaN, -inf weights become 0)")
    nan_case("w_neg_inf_conv_bias", lambda v: v["conv.bias"].__setitem__(3, float("-inf")),
             "conv.bias[3] = -inf: relu clamps it to 0")
    nan_case("w_inf_fc_weight", lambda v: v["fc.weight"].__setitem__((0, 0), float("inf")),
             "fc.weight[0, 0] = +inf")
    nan_case("w_huge_values", lambda v: v["fc.weight"].fill_(3e38), "fc.weight at 3e38: overflows to inf")


def _cli_only(b: _Builder) -> None:
    """Input arrays (``torch-ir run --input``) are files too."""
    import numpy as np

    class Evil:
        def __init__(self, marker: str) -> None:
            self.marker = marker

        def __reduce__(self):
            import os

            return (os.system, (f"touch {self.marker}",))

    def case(cid: str, writer: Callable[[Path], None], description: str, escape: bool = False,
             big: bool = False) -> None:
        name = f"{cid}.npy"
        writer(b.path(name))
        argv = ["run", "{dir}/" + BASE_PROGRAM, "--weights", "{dir}/" + BASE_WEIGHTS, "--input", "x={dir}/" + name]
        b.add(Case(cid, "input_array", description, [name], "cli", None, "", [CliCall(argv, 2)], escape=escape,
                   big_alloc=big))

    def pickled(path: Path) -> None:
        np.save(path, np.array([Evil(b.marker("in_pickled_object_array"))], dtype=object), allow_pickle=True)

    case("in_pickled_object_array", pickled, "an object array whose loading would run os.system", escape=True)
    case("in_wrong_shape", lambda p: np.save(p, np.zeros((2, 3), np.float32)), "an input of the wrong shape")
    case("in_wrong_dtype", lambda p: np.save(p, np.zeros((1, 3, 6, 6), np.int64)), "an input of the wrong dtype")
    case("in_truncated", lambda p: p.write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'"), "a truncated .npy")
    case("in_not_npy", lambda p: p.write_text("hello"), "a text file named .npy")

    def huge_header(path: Path) -> None:
        header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
        header += " " * (117 - len(header)) + "\n"
        path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(64))

    case("in_huge_header", huge_header, "a .npy declaring 1e12 elements over 64 bytes", big=True)
    b.path("in_dir.npy").mkdir(exist_ok=True)
    b.add(Case("in_directory", "input_array", "a directory passed as an input array", ["in_dir.npy"], "cli", None, "",
               [CliCall(["run", "{dir}/" + BASE_PROGRAM, "--weights", "{dir}/" + BASE_WEIGHTS,
                         "--input", "x={dir}/in_dir.npy"], 2)]))


# ------------------------------------------------------------------------------------------ the entry


def build_base(directory: Path) -> dict[str, Any]:
    """Extract, compile and save the valid model; returns the pieces the cases are made from."""
    import numpy as np
    import torch

    import npu_compiler
    import torch_ir
    from torch_ir.weights import module_state

    tiny = _tiny_class()
    with torch.device("meta"):
        meta = tiny().eval()
    ir = torch_ir.extract_ir(meta, (torch.randn(*INPUT_SHAPE, device="meta"),), model_name="tiny")
    ir.save(directory / BASE_IR)
    program = npu_compiler.compile(ir)
    program.save(directory / BASE_PROGRAM)
    state = module_state(real_model())
    torch_ir.save_weights(state, directory / BASE_WEIGHTS)
    np.save(directory / BASE_INPUT, example_input())
    (directory / SECRET).write_text(SECRET_TEXT)
    return {"state": state}


def build_corpus(directory: str | Path, *, all_commands: bool = False) -> list[Case]:
    """Write the base model files and every hostile file into ``directory``; returns the cases.

    An IR refused on load fails every command that reads it the same way; unless ``all_commands``, each such
    case keeps ``inspect`` and one of ``verify``/``compile``/``normalize`` in turn (all three are covered
    across the corpus, in a third of the time)."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    base = build_base(directory)
    b = _Builder(directory)
    ir_text = (directory / BASE_IR).read_text(encoding="utf-8")
    ir_doc = json.loads(ir_text)
    program_bytes = (directory / BASE_PROGRAM).read_bytes()
    header, blob = decode_npubin_parts(program_bytes)
    _code_execution_ir(b, ir_doc)
    _dangerous_ops_ir(b, ir_doc)
    _paths_ir(b, ir_doc)
    _ir_json(b, ir_doc, ir_text)
    _amplification_ir(b, ir_doc)
    _programs(b, header, blob, program_bytes)
    _weights(b, base["state"])
    _cli_only(b)
    for module in family_modules():
        module.build(b)
    rotation = 0
    for case in b.cases:
        case.isolate = case.isolate or case.api == "executor" or case.category == "amplification"
        commands = [c.argv[0] for c in case.cli]
        if not all_commands and commands == ["inspect", "verify", "compile", "normalize"]:
            keep = commands[1 + rotation % 3]
            case.cli = [c for c in case.cli if c.argv[0] in ("inspect", keep)]
            rotation += 1
    return b.cases


def write_index(cases: list[Case], directory: str | Path) -> Path:
    path = Path(directory) / "cases.json"
    index = {"dir_placeholder": "{dir}", "verify_spec": VERIFY_SPEC, "marker_prefix": MARKER,
             "count": len(cases), "cases": [c.to_dict() for c in cases]}
    path.write_text(json.dumps(index, indent=1, ensure_ascii=True), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", help="directory to write the corpus and cases.json into")
    args = parser.parse_args(argv)
    cases = build_corpus(args.outdir, all_commands=True)
    index = write_index(cases, args.outdir)
    by_category: dict[str, int] = {}
    for c in cases:
        by_category[c.category] = by_category.get(c.category, 0) + 1
    for category, n in sorted(by_category.items()):
        print(f"{category:20s} {n}")
    print(f"{'total':20s} {len(cases)}")
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
