"""Loaders and checks are linear in their input: a small file must not cost quadratic time.

The large cases (a ``.npubin`` with a 100,000-long chain of view aliases, an IR of 100,000 nodes) are
loaded in a child process under a generous timeout: the fixed loaders take seconds, the quadratic ones
took over ten minutes (a 10,000-long chain: 7 s, growing with the square). No test measures wall-clock time
otherwise; the smaller cases count operations instead. Deep nesting and running out of memory while
loading are one ``TorchIRError`` naming the file.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import npu_compiler
from npu_program import memory_check
from npu_program.check import check_program
from npu_program.memory_check import Lifetime, MemoryPlanError, alias_roots, check_plan
from npu_program.npubin import NpubinError, decode_npubin, encode_npubin, read_npubin
from npu_program.program import CompiledProgram, TensorSpec
from torch_ir.errors import IRValidationError, TorchIRError
from torch_ir.ir import NPU_IR, OpNode, TensorMeta, load_ir
from torch_ir.ir import serialize as ir_serialize
from torch_ir.ir.validate import MAX_JSON_DEPTH, nested_deeper_than

LONG = 100_000
#: Seconds a child may take to load a LONG-sized file: far above what the linear loaders need on a loaded
#: machine (seconds), far below what a quadratic step costs at this size (over ten minutes for the alias chain).
CHILD_TIMEOUT = 120


# ------------------------------------------------------------------------------------------ builders


def chain_ir(n: int) -> NPU_IR:
    """x -> relu -> relu -> ... (n nodes) over a float32[4] tensor."""
    def meta(name: str, role: str | None = None) -> TensorMeta:
        return TensorMeta(name, [4], "float32", role=role)

    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(OpNode(f"relu{i}", "aten.relu.default", [meta(prev)], [meta(f"t{i}")]))
        prev = f"t{i}"
    return NPU_IR("chain", [meta("x", "input")], [meta(prev, "output")], [], nodes)


def alias_chain_program(n: int, *, cycle: bool = False) -> CompiledProgram:
    """A compiled 3-relu program whose last dispatch reads, instead of its input ``t1``, the end of an n-long
    chain of views of it (v{n-1} -> ... -> v0 -> t1); ``cycle`` closes the chain instead."""
    program = npu_compiler.compile(chain_ir(3))
    prev = program.dispatches[-1].inputs[0]
    for i in range(n):
        name = f"v{i}"
        program.tensors[name] = TensorSpec(name, [4], "float32", None)
        program.memory.aliases[name] = prev
        prev = name
    if cycle:
        program.memory.aliases["v0"] = prev
    program.dispatches[-1].inputs = [prev]
    return program


class CountingDict(dict):
    """A dict that counts its lookups (``in`` and ``[]``): the work of resolving aliases through it."""

    lookups = 0

    def __contains__(self, key: object) -> bool:
        self.lookups += 1
        return super().__contains__(key)

    def __getitem__(self, key: str) -> str:
        self.lookups += 1
        return super().__getitem__(key)


def run_child(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout, or a test failure naming a timeout."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading took more than {CHILD_TIMEOUT} s: a step is not linear in the input")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# ------------------------------------------------------------------------------- 10^5 in a child process


@pytest.mark.slow
def test_a_100000_long_alias_chain_loads_and_runs_in_seconds(tmp_path: Path):
    path = tmp_path / "alias_chain.npubin"
    path.write_bytes(encode_npubin(alias_chain_program(LONG)))
    cycle = tmp_path / "alias_cycle.npubin"
    cycle.write_bytes(encode_npubin(alias_chain_program(LONG, cycle=True)))
    out = run_child(f"""
        import numpy as np
        from npu_program.memory_check import alias_roots
        from npu_program.npubin import NpubinError, read_npubin
        from npu_runtime import Device, Executor
        program = read_npubin({str(path)!r})
        roots = alias_roots(program.memory.aliases)
        print(len(roots), roots["v{LONG - 1}"])
        out = Executor(program, Device()).run({{"x": np.array([-1, 0, 1, 2], np.float32)}}, weights={{}})
        print(out["output"].to_numpy().tolist())
        try:
            read_npubin({str(cycle)!r})
        except NpubinError as e:
            print("refused:", e)
    """)
    chained, ran, refused = out.splitlines()
    assert chained == f"{LONG} t1"
    assert ran == "[0.0, 0.0, 1.0, 2.0]"  # the runtime placed the chain's end on its root: relu(relu(relu(x)))
    assert refused.startswith(f"refused: {cycle}: memory.aliases: alias cycle through")


@pytest.mark.slow
def test_a_100000_node_ir_loads_and_checks_in_seconds(tmp_path: Path):
    path = tmp_path / "chain.json"
    chain_ir(LONG).save(str(path))
    out = run_child(f"""
        from torch_ir.ir import load_ir
        ir = load_ir({str(path)!r})
        print(len(ir.nodes), ir.graph_outputs[0].name)
    """)
    assert out.split() == [str(LONG), f"t{LONG - 1}"]


# ------------------------------------------------------------------------------- counted, in process


def test_alias_roots_follows_each_link_once():
    n = 10_000  # resolving each view on its own: n^2 / 2 = 5 * 10^7 lookups
    aliases = CountingDict({f"v{i}": f"v{i - 1}" if i else "base" for i in range(n)})
    roots = alias_roots(aliases)
    assert roots == {f"v{i}": "base" for i in range(n)}
    assert aliases.lookups <= 4 * n


def test_check_program_resolves_a_long_chain_in_linear_work():
    n = 10_000
    program = alias_chain_program(n)
    program.memory.aliases = CountingDict(program.memory.aliases)
    check_program(program, "chain.npubin")
    assert program.memory.aliases.lookups <= 20 * n  # the checker resolves the chain a constant number of times


@pytest.mark.parametrize("aliases", [{"a": "a"}, {"a": "b", "b": "a"}, {"a": "b", "b": "c", "c": "b"}],
                         ids=["self", "pair", "tail_into_loop"])
def test_alias_roots_refuses_a_cycle(aliases):
    with pytest.raises(MemoryPlanError, match="alias cycle"):
        alias_roots(aliases)


def test_alias_roots_of_a_tree():
    assert alias_roots({"a": "r", "b": "a", "c": "a", "d": "c", "e": "s"}) == {
        "a": "r", "b": "r", "c": "r", "d": "r", "e": "s"}
    assert alias_roots(None) == {} and alias_roots({}) == {}


def test_the_live_set_stays_in_small_buckets():
    """A plain sorted list moved every later key on each insert: quadratic with 10^5 tensors live at once."""
    keys = memory_check._SortedKeys()
    values = list(range(20_000))
    random.Random(0).shuffle(values)
    for v in values:
        keys.add((v, "t"))
    assert max(len(b) for b in keys.buckets) <= 2 * keys.BUCKET
    assert [k for b in keys.buckets for k in b] == sorted((v, "t") for v in values)


def test_check_plan_agrees_with_the_pairwise_check(monkeypatch):
    monkeypatch.setattr(memory_check._SortedKeys, "BUCKET", 2)  # many buckets: splits and bucket edges
    rng = random.Random(1)
    for _ in range(1500):
        lives = [Lifetime(f"t{i}", rng.choice([0, 64, 128, 192]), first, first + rng.randint(0, 5))
                 for i, first in enumerate(rng.randint(-1, 10) for _ in range(rng.randint(1, 25)))]
        offsets = {lt.name: 64 * rng.randint(0, 12) for lt in lives}
        collide = any(a.name < b.name and a.nbytes and b.nbytes and a.overlaps(b)
                      and offsets[a.name] < offsets[b.name] + b.nbytes and offsets[b.name] < offsets[a.name] + a.nbytes
                      for a in lives for b in lives)
        if collide:
            with pytest.raises(MemoryPlanError, match="share bytes"):
                check_plan(lives, offsets, 64 * 20)
        else:
            check_plan(lives, offsets, 64 * 20)


# ------------------------------------------------------------------------------- nesting and memory


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_nested_deeper_than_counts_lists_and_objects():
    assert not nested_deeper_than(1, 0)
    assert nested_deeper_than([], 0) and not nested_deeper_than([], 1)
    assert not nested_deeper_than(nested(MAX_JSON_DEPTH), MAX_JSON_DEPTH)
    assert nested_deeper_than({"x": [nested(MAX_JSON_DEPTH)]}, MAX_JSON_DEPTH)
    very_deep: list = []
    for _ in range(5000):
        very_deep = [very_deep]
    assert nested_deeper_than(very_deep, MAX_JSON_DEPTH)  # iterative: no RecursionError


def ir_doc() -> dict:
    return chain_ir(2).to_dict()


@pytest.mark.parametrize("where", ["metadata", "producer", "quant"])
def test_an_ir_nested_past_the_bound_is_refused_naming_the_file(tmp_path: Path, where: str):
    doc = ir_doc()
    deep = nested(MAX_JSON_DEPTH + 50)  # parses, but walks over it (a copy, a save) would be close to the limit
    if where == "quant":
        doc["nodes"][0]["outputs"][0]["quant"] = deep
    else:
        doc[where] = {"deep": deep}
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(IRValidationError, match=rf"^{path}: .*{where}.*nested more than {MAX_JSON_DEPTH}"):
        load_ir(path)


def test_an_ir_within_the_bound_loads(tmp_path: Path):
    doc = ir_doc()
    doc["metadata"] = nested(MAX_JSON_DEPTH)
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(doc))
    assert load_ir(path).metadata == doc["metadata"]


def test_a_quant_that_is_not_an_object_is_refused(tmp_path: Path):
    doc = ir_doc()
    doc["graph_inputs"][0]["quant"] = "int8"
    path = tmp_path / "quant.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(IRValidationError, match=r"graph_inputs\[0\]\.quant: expected an object"):
        load_ir(path)


def test_json_nested_beyond_the_parser_is_one_error_naming_the_file(tmp_path: Path):
    ir_path = tmp_path / "deep.json"
    ir_path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(IRValidationError, match=rf"^{ir_path}: nested too deeply"):
        load_ir(ir_path)
    raw = encode_npubin(alias_chain_program(0))
    with pytest.raises(NpubinError, match=r"^deep\.npubin: header is nested too deeply"):
        decode_npubin(with_header(raw, "[" * 100_000 + "]" * 100_000), "deep.npubin")


def with_header(raw: bytes, header: str) -> bytes:
    """``raw`` (a valid .npubin) with its header replaced by ``header`` and a valid checksum."""
    import hashlib
    import struct

    fixed = struct.Struct("<8sHHQ")
    magic, major, minor, _ = fixed.unpack_from(raw)
    body = fixed.pack(magic, major, minor, len(header.encode())) + header.encode()
    body += bytes(-len(body) % 64)
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize("field", ["metadata", "ir"])
def test_a_program_header_nested_past_the_bound_is_refused_naming_the_file(field: str):
    raw = encode_npubin(alias_chain_program(0))
    header = json.loads(raw[20:20 + int.from_bytes(raw[12:20], "little")])
    header[field] = {"deep": nested(MAX_JSON_DEPTH + 50)}
    with pytest.raises(NpubinError, match=rf"^m\.npubin: header field '{field}' is nested more than"):
        decode_npubin(with_header(raw, json.dumps(header)), "m.npubin")


def test_a_program_with_its_ir_embedded_loads():
    """The bound leaves room for what the compiler writes: the embedded IR, its tensor values included."""
    raw = encode_npubin(alias_chain_program(0))
    assert decode_npubin(raw, "m.npubin").ir is not None


def out_of_memory(*args: object, **kwargs: object) -> None:
    raise MemoryError


def test_out_of_memory_loading_an_ir_names_the_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "chain.json"
    chain_ir(2).save(str(path))
    monkeypatch.setattr(ir_serialize, "ir_from_dict", out_of_memory)
    with pytest.raises(IRValidationError, match=rf"^{path}: out of memory"):
        load_ir(path)


@pytest.mark.parametrize("where", ["from_json", "read_input"])
def test_out_of_memory_loading_a_program_names_the_file(tmp_path: Path, monkeypatch, where: str):
    from npu_program import npubin

    path = tmp_path / "m.npubin"
    path.write_bytes(encode_npubin(alias_chain_program(0)))
    monkeypatch.setattr(npubin, where, out_of_memory)
    with pytest.raises(NpubinError, match=rf"^{path}: out of memory") as err:
        read_npubin(path)
    assert isinstance(err.value, TorchIRError)
