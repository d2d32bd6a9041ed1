"""The DRAM bytes the cost model charges each kind of kernel, one hand-derived test per kind whose charge is not
"every input whole, every output whole": gathers read the rows they gather, a slice the elements it keeps, KV_UPDATE
writes only the new rows, attention reads the live part of a KV cache. Each test builds the smallest program with
the dispatch (a one-op model compiled, or a program written out where no model makes the dispatch alone) and works
the expected bytes out by hand from the shapes, never by calling the code under test."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import CostModelError, cost_lm, cost_program
from npu_compiler.costmodel.model import DispatchCost
from npu_program.kernels import KERNELS
from npu_program.program import CompiledProgram, Dispatch, MemoryPlan, StateSpec, TensorSpec

from ..llm.checkpoints import tiny_config
from .test_costmodel import small_hw
from .test_reports import run_cli

I64, F32, BOOL = 8, 4, 1  # bytes per element


class Fn(nn.Module):
    """A model that is one function of its inputs."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def compiled(model: nn.Module, *args: torch.Tensor) -> CompiledProgram:
    ir = torch_ir.extract_ir(model, tuple(a.to("meta") for a in args))
    return npu_compiler.compile(ir)


def only_row(program: CompiledProgram, kernel: str, dtype: str | None = None, **kw: object) -> DispatchCost:
    """The cost of the one dispatch of ``kernel`` in ``program`` (toy hardware; see test_costmodel)."""
    rows = [r for r in cost_program(program, small_hw(), dtype, **kw).rows if r.kernel == kernel]
    assert len(rows) == 1, [r.kernel for r in cost_program(program, small_hw(), dtype, **kw).rows]
    return rows[0]


def traffic(row: DispatchCost) -> tuple[int, int]:
    return row.dram_bytes_read, row.dram_bytes_written


def hand_program(dispatches: list[Dispatch], tensors: list[TensorSpec], inputs: list[str], outputs: list[str],
                 state: list[StateSpec] = ()) -> CompiledProgram:
    """A program written out: for dispatches no one-op model compiles to (a KV cache, an overwriting copy)."""
    specs = {t.name: t for t in tensors}
    return CompiledProgram(
        model_name="hand", target="cpu", input_specs=[specs[n] for n in inputs],
        output_specs=[specs[n] for n in outputs], weight_specs=[], weight_keys={}, tensors=specs,
        dispatches=dispatches, memory=MemoryPlan(arena_bytes=0, offsets={}, no_reuse_bytes=0),
        state_specs=list(state))


# -- gathers and slices --------------------------------------------------------------------------------------------


def test_an_embedding_reads_the_rows_it_gathers_not_the_table():
    program = compiled(nn.Embedding(1000, 16, device="meta"), torch.zeros(1, 7, dtype=torch.long))
    # 7 rows of 16 float32 and the 7 int64 ids, not 1000 * 16 * 4 = 64,000 bytes of table
    assert traffic(only_row(program, "EMBEDDING")) == (7 * 16 * F32 + 7 * I64, 7 * 16 * F32)
    # costed as int8, the rows are a byte an element; the ids stay int64
    assert traffic(only_row(program, "EMBEDDING", "int8")) == (7 * 16 + 7 * I64, 7 * 16)


def test_a_lookup_of_more_ids_than_rows_reads_the_table_once():
    program = compiled(nn.Embedding(4, 16, device="meta"), torch.zeros(1, 10, dtype=torch.long))
    # 10 ids into a 4-row table: at most the 4 * 16 table itself, then the ids; 10 rows written
    assert traffic(only_row(program, "EMBEDDING")) == (4 * 16 * F32 + 10 * I64, 10 * 16 * F32)


def test_index_select_reads_the_selected_rows():
    program = compiled(Fn(lambda x, i: x.index_select(0, i)), torch.zeros(50, 8), torch.zeros(3, dtype=torch.long))
    assert traffic(only_row(program, "aten.index_select.default")) == (3 * 8 * F32 + 3 * I64, 3 * 8 * F32)


def test_index_with_a_tensor_reads_the_indexed_rows():
    program = compiled(Fn(lambda x, i: x[:, i]), torch.zeros(8, 50), torch.zeros(3, dtype=torch.long))
    # x[:, i]: 3 of 50 columns of 8 rows
    assert traffic(only_row(program, "aten.index.Tensor")) == (8 * 3 * F32 + 3 * I64, 8 * 3 * F32)


def test_gather_reads_one_element_per_index():
    program = compiled(Fn(lambda x, i: torch.gather(x, 1, i)), torch.zeros(3, 40), torch.zeros(3, 2, dtype=torch.long))
    assert traffic(only_row(program, "aten.gather.default")) == (6 * F32 + 6 * I64, 6 * F32)


def test_embedding_bag_reads_the_rows_its_indices_name():
    bag = nn.EmbeddingBag(100, 4, mode="max", device="meta")
    program = compiled(bag, torch.zeros(6, dtype=torch.long), torch.tensor([0, 3]))
    row = only_row(program, "aten.embedding_bag.padding_idx")
    # 6 rows of 4 float32 of the 100-row table, the 6 indices and the 2 offsets
    assert row.dram_bytes_read == 6 * 4 * F32 + 6 * I64 + 2 * I64
    # written: the 2 bags' maxima and the kernel's auxiliary outputs, whole
    assert row.dram_bytes_written == sum(program.tensors[n].nbytes for n in program.dispatches[0].outputs)


def test_a_slice_reads_the_elements_it_keeps():
    program = compiled(Fn(lambda x: x[:, 2:6]), torch.zeros(4, 64))
    assert traffic(only_row(program, "aten.slice.Tensor")) == (4 * 4 * F32, 4 * 4 * F32)


def test_select_reads_one_index_along_its_dim():
    program = compiled(Fn(lambda x: x[:, 0]), torch.zeros(2, 11, 8))
    assert traffic(only_row(program, "aten.select.int")) == (2 * 8 * F32, 2 * 8 * F32)


def test_copy_does_not_read_what_it_overwrites():
    tensors = [TensorSpec("self", [2, 3, 4], "float32"), TensorSpec("src", [3, 4], "float32"),
               TensorSpec("y", [2, 3, 4], "float32")]
    program = hand_program([Dispatch("aten.copy.default", "copy", ["self", "src"], ["y"])], tensors,
                           ["self", "src"], ["y"])
    # src broadcast into self's shape: src is read, self only lends its shape
    assert traffic(only_row(program, "aten.copy.default")) == (3 * 4 * F32, 2 * 3 * 4 * F32)


# -- what is charged whole, and views ------------------------------------------------------------------------------


def test_a_view_of_a_contiguous_tensor_is_no_dispatch_and_no_bytes():
    program = compiled(Fn(lambda x: x.view(4, 16) + 1), torch.zeros(64))
    report = cost_program(program, small_hw())
    assert [r.kernel for r in report.rows] == ["aten.add.Tensor"] and program.memory.aliases
    assert report.dram_bytes == 64 * F32 + 64 * F32  # the add reads the view's bytes once and writes its own


def test_concatenation_and_pad_read_every_input_whole():
    cat = compiled(Fn(lambda x, y: torch.cat([x, y], 1)), torch.zeros(2, 3), torch.zeros(2, 5))
    assert traffic(only_row(cat, "aten.cat.default")) == ((6 + 10) * F32, 16 * F32)
    pad = compiled(Fn(lambda x: nn.functional.pad(x, (1, 2))), torch.zeros(2, 3, 4))
    assert traffic(only_row(pad, "aten.pad.default")) == (24 * F32, 2 * 3 * 7 * F32)


def test_the_kernel_records_own_cost_uses_the_same_traffic():
    table, ids, rows = TensorSpec("t", [1000, 16], "float32"), TensorSpec("i", [7], "int64"), \
        TensorSpec("y", [7, 16], "float32")
    cost = KERNELS["EMBEDDING"].cost([table, ids], [rows])
    assert (cost.bytes_read, cost.bytes_written) == (7 * 16 * F32 + 7 * I64, 7 * 16 * F32)


# -- a KV cache ----------------------------------------------------------------------------------------------------

#: One decode step of one layer: 4 query heads and 2 key/value heads of 4 dims, a cache of 8 positions.
CACHE = [1, 2, 8, 4]


def decode_layer(fused: bool = True) -> CompiledProgram:
    """KV_UPDATE of k and v at one position, then attention over the caches: fused (ATTENTION) or as ATTN_SCORE
    and ATTN_OUTPUT."""
    tensors = [TensorSpec("q", [1, 4, 1, 4], "float32"), TensorSpec("k_new", [1, 2, 1, 4], "float32"),
               TensorSpec("v_new", [1, 2, 1, 4], "float32"), TensorSpec("pos", [1], "int64"),
               TensorSpec("mask", [1, 1, 1, 8], "bool"), TensorSpec("p", [1, 4, 1, 8], "float32"),
               TensorSpec("y", [1, 1, 16], "float32"), TensorSpec("o", [1, 4, 1, 4], "float32")]
    writes = [Dispatch("KV_UPDATE", "write_k", ["k", "k_new", "pos"], ["k"], {"dim": 2}),
              Dispatch("KV_UPDATE", "write_v", ["v", "v_new", "pos"], ["v"], {"dim": 2})]
    if fused:
        attention = [Dispatch("ATTENTION", "attention", ["q", "k", "v", "mask"], ["y"],
                              {"scale": 0.5, "causal": False, "merge_heads": True})]
    else:
        attention = [Dispatch("ATTN_SCORE", "score", ["q", "k", "mask"], ["p"], {"scale": 0.5, "causal": False}),
                     Dispatch("ATTN_OUTPUT", "output", ["p", "v"], ["o"], {"merge_heads": False})]
    state = [StateSpec("k", CACHE, "float32"), StateSpec("v", CACHE, "float32")]
    return hand_program(writes + attention, tensors, ["q", "k_new", "v_new", "pos", "mask"],
                        ["y" if fused else "o"], state)


def test_kv_update_reads_and_writes_only_the_new_rows():
    rows = [r for r in cost_program(decode_layer(), small_hw()).rows if r.kernel == "KV_UPDATE"]
    # one position of 2 heads x 4 dims and its int64 position in; that one row out, not the 8-row cache
    assert [traffic(r) for r in rows] == [(2 * 4 * F32 + I64, 2 * 4 * F32)] * 2
    assert all(r.vector_cycles == 2 for r in rows)  # 8 elements moved on 4 lanes at 1 a cycle


def test_attention_reads_the_whole_cache_without_a_context():
    row = only_row(decode_layer(), "ATTENTION")
    # q 4 x 4, k and v 2 x 8 x 4 each, the 8-position mask; y 16 out
    assert traffic(row) == (16 * F32 + 2 * 64 * F32 + 8 * BOOL, 16 * F32)
    assert row.macs == 4 * (8 * 4) * 2  # per query head: q·kᵀ over 8 positions of 4 dims, then p·v


def test_attention_reads_the_live_rows_of_the_cache_at_a_context():
    row = only_row(decode_layer(), "ATTENTION", context=3)
    # 3 live positions: k and v 2 x 3 x 4 each, 3 mask columns; q and y as before
    assert traffic(row) == (16 * F32 + 2 * 24 * F32 + 3 * BOOL, 16 * F32)
    assert row.macs == 4 * (3 * 4) * 2
    assert traffic(only_row(decode_layer(), "ATTENTION", context=8)) == traffic(only_row(decode_layer(), "ATTENTION"))


def test_unfused_attention_reads_the_live_rows_and_writes_the_live_scores():
    program = decode_layer(fused=False)
    score, output = only_row(program, "ATTN_SCORE", context=3), only_row(program, "ATTN_OUTPUT", context=3)
    # scores: q 16 and k 2 x 3 x 4 and 3 mask columns in, 4 heads x 3 scores out; output: those scores and v's
    # 2 x 3 x 4 live rows in, 4 heads x 4 dims out
    assert traffic(score) == (16 * F32 + 24 * F32 + 3 * BOOL, 4 * 3 * F32)
    assert traffic(output) == (4 * 3 * F32 + 24 * F32, 16 * F32)


def test_a_context_outside_the_cache_or_without_one_is_refused():
    for context in (0, 9):
        with pytest.raises(CostModelError, match="holds 8 positions"):
            cost_program(decode_layer(), small_hw(), context=context)
    plain = compiled(Fn(lambda x: x[:, 0]), torch.zeros(2, 11, 8))
    with pytest.raises(CostModelError, match="no KV cache"):
        cost_program(plain, small_hw(), context=4)


@pytest.fixture(scope="module")
def tiny_lm():
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from npu_compiler.llm import compile_lm
    from torch_ir.frontends.hf import extract_lm

    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(tiny_config("qwen2"), attn_implementation="sdpa").eval()
    return compile_lm(extract_lm(meta, 32, name="tiny_qwen2"), chunk=8)


@pytest.mark.slow
def test_an_llm_decode_step_at_a_context(tiny_lm, tmp_path, capsys):
    """tiny qwen2: hidden 64, 4 query and 2 key/value heads of 16 dims, 2 layers, a 32-position cache."""
    cost = cost_lm(tiny_lm.prefill, tiny_lm.decode, small_hw(), context=5)
    decode = cost.decode.rows
    embedding, = (r for r in decode if r.kernel == "EMBEDDING")
    assert traffic(embedding) == (64 * F32 + I64, 64 * F32)  # one row of the 320 x 64 table
    updates = [r for r in decode if r.kernel == "KV_UPDATE"]
    assert len(updates) == 4 and {traffic(r) for r in updates} == {(2 * 16 * F32 + I64, 2 * 16 * F32)}
    attention = [r for r in decode if r.kernel == "ATTENTION"]
    mask = tiny_lm.decode.tensors[tiny_lm.decode.dispatches[attention[0].index].inputs[3]]
    assert mask.dtype == "bool" and mask.shape[-1] == 32
    # q 4 x 16, k and v 2 x 5 x 16 each, 5 of the mask's 32 columns; 64 out
    assert {traffic(r) for r in attention} == {(64 * F32 + 2 * 160 * F32 + 5 * BOOL, 64 * F32)}
    assert cost.context == 5 and "context 5" in cost.summary()
    # prefill's chunk of 8 at context 5: its own 8 tokens are live
    assert {r.dram_bytes_read for r in cost.prefill.rows if r.kernel == "ATTENTION"} == \
        {8 * 64 * F32 + 2 * 8 * 32 * F32 + 8 * 8 * BOOL}
    whole = cost_lm(tiny_lm.prefill, tiny_lm.decode, small_hw())
    # the whole cache: in each of 2 layers, 27 more rows of 2 heads x 16 dims of k and of v, 27 more mask columns
    assert whole.context == 32 and whole.decode.dram_bytes - cost.decode.dram_bytes == \
        2 * (2 * 2 * 27 * 16 * F32 + 27 * BOOL)
    tiny_lm.save(tmp_path / "lm")
    assert run_cli("cost", str(tmp_path / "lm"), "--hw", "tpu_v1", "--context", "5") == 0
    assert "at context 5" in capsys.readouterr().out
