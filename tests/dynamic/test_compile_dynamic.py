"""compile(ir, dynamic=...): one DynamicProgram of static variants, its padding decisions, its file (format 3.0)
and every refusal (issue 31, items 1 and 4)."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from npu_compiler import Buckets, CompileError, compile, load_program
from npu_program.check import check_program
from npu_program.dynamic import DynamicProgram
from npu_program.npubin import NpubinError
from npu_program.npubin_dynamic import encode_dynamic
from npu_program.program import CompiledProgram
from torch_ir.weights import module_state

from .models import bert, mean_pool

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert_model():
    return bert()


@pytest.fixture(scope="module")
def bert_program(bert_model):
    model, ir = bert_model
    return compile(ir, dynamic=Buckets({"seq": [64, 128, 256, 512], "batch": [1, 4]}, weights=module_state(model)))


def test_every_bucket_is_a_checked_static_variant_sharing_one_weight_table(bert_program):
    program = bert_program
    assert isinstance(program, DynamicProgram) and len(program.variants) == 8
    assert {(v.sizes["seq"], v.sizes["batch"]) for v in program.variants} == {
        (s, b) for s in (64, 128, 256, 512) for b in (1, 4)}
    first = program.variants[0].program
    for v in program.variants:
        check_program(v.program)  # the independent checker, memory plan included
        assert v.program.input_specs[0].shape == [v.sizes["batch"], v.sizes["seq"]]
        assert v.program.weight_specs == first.weight_specs and v.program.weight_keys == first.weight_keys
        assert v.program.ir is None  # the symbolic IR is kept once, in the container
    assert program.ir is not None and program.ir["symbols"].keys() >= {"seq", "batch"}
    assert program.input_shapes == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}
    arenas = [v.program.arena_bytes for v in program.variants]
    assert program.arena_bytes == max(arenas)


def test_attention_masked_padding_is_allowed_for_both_symbols(bert_program):
    program = bert_program
    assert program.padding["seq"].allowed and program.padding["batch"].allowed
    assert (program.symbols["seq"].min, program.symbols["seq"].max) == (8, 512)  # from the exported range
    assert (program.symbols["batch"].min, program.symbols["batch"].max) == (1, 4)
    padded = {(a.name, a.axis, a.value) for a in program.padding["seq"].inputs}
    assert padded == {("input_ids", 1, 0.0), ("attention_mask", 1, 0.0)}
    assert {(a.name, a.axis) for a in program.padding["seq"].outputs} == {("output_0", 1)}  # the pooled output has none


def test_a_mean_over_the_sequence_is_never_padded():
    model, ir = mean_pool()
    program = compile(ir, dynamic=Buckets({"seq": [8, 16]}, weights=module_state(model)))
    pad = program.padding["seq"]
    assert not pad.allowed and "changes output" in pad.reason and "seq from 2 to 8" in pad.reason
    assert (program.symbols["seq"].min, program.symbols["seq"].max) == (8, 16)
    assert "exact sizes only" in program.summary()


def test_a_model_that_writes_state_is_never_padded():
    """An LLM prefill writes its KV cache: padded positions would write it too (the generator pads those itself)."""
    from npu_tools.zoo.runner import resolve_spec

    spec = resolve_spec("llama_kv")
    program = compile(spec.extract(spec.build("meta")), dynamic={"seq": [4, 8]})
    assert not program.padding["seq"].allowed and "writes state" in program.padding["seq"].reason
    assert len(program.state_specs) > 0


def test_the_file_round_trips_byte_for_byte_and_is_deterministic(bert_model, bert_program, tmp_path):
    model, ir = bert_model
    path = tmp_path / "bert.npubin"
    bert_program.save(path)
    loaded = load_program(path)
    assert isinstance(loaded, DynamicProgram) and encode_dynamic(loaded) == path.read_bytes()
    again = compile(ir, dynamic=Buckets({"seq": [64, 128, 256, 512], "batch": [1, 4]}, weights=module_state(model)))
    assert encode_dynamic(again) == path.read_bytes()
    assert struct.unpack_from("<H", path.read_bytes(), 8)[0] == 3


def test_static_programs_keep_their_format_and_each_reader_names_the_other(bert_model, bert_program, tmp_path):
    _, ir = bert_model
    static = tmp_path / "static.npubin"
    compile(ir, bind={"seq": 16, "batch": 1}).save(static)
    assert struct.unpack_from("<HH", static.read_bytes(), 8) == (2, 1)  # old readers still read it
    assert isinstance(load_program(static), CompiledProgram)
    dynamic = tmp_path / "dynamic.npubin"
    bert_program.save(dynamic)
    with pytest.raises(NpubinError, match="dynamic program.*load_program"):
        CompiledProgram.load(dynamic)
    with pytest.raises(NpubinError, match="one static program"):
        DynamicProgram.load(static)


def _rewrite_header(data: bytes, edit) -> bytes:
    """The file with its JSON header edited and the checksum made right again (a careful forger)."""
    _, _, _, length = struct.unpack_from("<8sHHQ", data)
    header = json.loads(data[20:20 + length])
    edit(header)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    start = -(-(20 + length) // 64) * 64
    fixed = data[:12] + struct.pack("<Q", len(text))
    head = fixed + text
    body = head + bytes(-(-len(head) // 64) * 64 - len(head)) + data[start:-32]
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h: h["variants"][0]["sizes"].update(seq=65), "variant 0"),
    (lambda h: h["variants"][1].update(offset=10 ** 9), "outside the"),
    (lambda h: h["symbols"]["seq"].update(min=-4), "empty or negative range"),
    (lambda h: h["inputs"][0].update(shape=["batch", "__import__('os')"]), "not an allowed function"),
    (lambda h: h["padding"]["seq"]["inputs"][0].update(axis=0), "not an axis of 'seq'"),
    (lambda h: h["variants"].clear(), "without variants"),
])
def test_a_forged_file_is_refused_with_its_name(bert_program, tmp_path, edit, message):
    path = tmp_path / "forged.npubin"
    bert_program.save(path)
    path.write_bytes(_rewrite_header(path.read_bytes(), edit))
    with pytest.raises(NpubinError, match=message) as err:
        load_program(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(("buckets", "message"), [
    ({"seq": [64, 1024], "batch": [1]}, "bucket seq=1024 is outside the range the model was exported for"),
    ({"seq": [64], "batch": [1], "heads": [2]}, r"name \['heads'\], which no input has"),
    ({"seq": [64]}, r"symbols \['batch'\] have no buckets.*--buckets batch=.*--bind batch=N"),
    (Buckets({"seq": [64, 256], "batch": [1]}, ranges={"seq": (8, 512)}), "do not cover seq 8..512"),
    (Buckets({"seq": [64], "batch": [1]}, ranges={"seq": (4, 64)}), "not inside the range the model was exported"),
])
def test_bad_buckets_are_refused_before_any_compile(bert_model, buckets, message):
    _, ir = bert_model
    with pytest.raises(CompileError, match=message):
        compile(ir, dynamic=buckets, progress=lambda line: pytest.fail(f"compiled before refusing: {line}"))


def test_an_exact_size_symbol_needs_every_size_of_the_range_asked_for():
    model, ir = mean_pool()
    with pytest.raises(CompileError, match=r"sizes \[9, 10, 11, 12, 13\] have no bucket of their own"):
        compile(ir, dynamic=Buckets({"seq": [8, 16]}, ranges={"seq": (8, 16)}, weights=module_state(model)))
