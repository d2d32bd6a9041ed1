"""``npu_runtime.State``: persistent buffers made from a program's state slots, written by dispatches, kept
across runs, outside the arena, and shared by executors given the same State (prefill and decode)."""

from __future__ import annotations

import numpy as np
import pytest

from npu_program.program import CompiledProgram, Dispatch, MemoryPlan, StateSpec, TensorSpec
from npu_runtime import Device, Executor, RuntimeInputError, State


def accumulate(name: str = "accumulate", shared_key: str | None = "acc", shape: tuple[int, ...] = (4,)
               ) -> CompiledProgram:
    """acc += x (aten.add.Tensor writing the state slot), then y = acc * x: with x = 1, y shows acc."""
    x, y = TensorSpec("x", list(shape), "float32"), TensorSpec("y", list(shape), "float32")
    return CompiledProgram(
        model_name=name, target="cpu", input_specs=[x], output_specs=[y], weight_specs=[], weight_keys={},
        tensors={"x": x, "y": y},
        dispatches=[Dispatch("aten.add.Tensor", "add", ["acc", "x"], ["acc"]),
                    Dispatch("aten.mul.Tensor", "read", ["acc", "x"], ["y"])],
        memory=MemoryPlan(arena_bytes=128, offsets={"x": 0, "y": 64}, no_reuse_bytes=128),
        state_specs=[StateSpec(f"{name}_acc", list(shape), "float32", shared_key=shared_key)],
    )


def fix_names(program: CompiledProgram) -> CompiledProgram:
    """The dispatches name the slot by the program's own slot name."""
    slot = program.state_specs[0].name
    for d in program.dispatches:
        d.inputs = [slot if n == "acc" else n for n in d.inputs]
        d.outputs = [slot if n == "acc" else n for n in d.outputs]
    return program


ONES = {"x": np.ones(4, dtype=np.float32)}


def y(outputs) -> list[float]:
    return outputs["y"].to_numpy().tolist()


def test_state_starts_as_its_spec_says_and_accumulates_across_runs() -> None:
    device = Device()
    program = fix_names(accumulate())
    state = State(program, device)
    assert list(state) == ["acc"] and state["acc"].to_numpy().tolist() == [0.0] * 4
    executor = Executor(program, device)
    assert y(executor.run(ONES, state=state)) == [1.0] * 4
    assert y(executor.run(ONES, state=state)) == [2.0] * 4
    assert state["acc"].to_numpy().tolist() == [2.0] * 4
    # the state lives outside the arena: the arena holds only x and y
    assert executor.arena.numel() == 128
    state.reset()
    assert y(executor.run(ONES)) == [1.0] * 4  # the bound State is kept, reset in place


def test_two_executors_sharing_one_state_see_each_others_writes() -> None:
    device = Device()
    prefill, decode = fix_names(accumulate("prefill")), fix_names(accumulate("decode"))
    state = State(prefill, device)
    first, second = Executor(prefill, device), Executor(decode, device)
    assert y(first.run(ONES, state=state)) == [1.0] * 4
    assert y(second.run(ONES, state=state)) == [2.0] * 4  # decode read what prefill wrote
    assert y(first.run(ONES, state=state)) == [3.0] * 4
    assert len(state) == 1


def test_executors_without_a_shared_state_have_their_own() -> None:
    device = Device()
    program = fix_names(accumulate())
    first, second = Executor(program, device), Executor(program, device)
    assert y(first.run(ONES)) == [1.0] * 4
    assert y(first.run(ONES)) == [2.0] * 4
    assert y(second.run(ONES)) == [1.0] * 4
    assert first.state is not second.state


def test_a_state_with_a_different_slot_under_the_same_key_is_refused() -> None:
    device = Device()
    state = State(fix_names(accumulate("a", shape=(4,))), device)
    other = fix_names(accumulate("b", shape=(2, 2)))
    with pytest.raises(RuntimeInputError, match="slots shared by several programs must agree"):
        Executor(other, device).run({"x": np.ones((2, 2), dtype=np.float32)}, state=state)


def test_state_must_be_a_state_object() -> None:
    with pytest.raises(RuntimeInputError, match="state must be an npu_runtime.State"):
        Executor(fix_names(accumulate()), Device()).run(ONES, state={"acc": None})
