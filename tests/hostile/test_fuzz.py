"""Fuzzing the IR JSON loader and the ``.npubin`` loader: success or a TorchIRError, nothing else.

The mutators are scripts/fuzz_loaders.py's (the standalone fuzzer runs them for thousands of iterations);
here hypothesis drives them through its own ``random.Random`` for about 200 examples per target, from the
valid files of the hostile corpus. Programs that load are also constructed into an ``Executor``, given the
corpus weights and run once, in a forked child (a kernel given hostile parameters may crash natively, see
test_corpus.run_forked) under lowered allocation limits.
"""

from __future__ import annotations

import random
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from npu_program.npubin import decode_npubin
from torch_ir.errors import TorchIRError
from torch_ir.ir.serialize import ir_from_dict
from torch_ir.limits import limits

from .test_corpus import run_forked

FUZZ = settings(
    max_examples=200, deadline=None, database=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
RANDOMS = st.randoms(use_true_random=False)
ROUNDS = st.integers(1, 3)


@pytest.fixture(scope="module")
def seeds(fuzz, corpus_dir: Path):
    return fuzz.Seeds(corpus_dir).warm_up()


def only_toolkit_errors(call, *args):
    """``call(*args)``'s result, or None when it raised a TorchIRError; anything else fails the example."""
    try:
        return call(*args)
    except TorchIRError:
        return None


@FUZZ
@given(rng=RANDOMS, rounds=ROUNDS)
def test_ir_documents(fuzz, seeds, rng: random.Random, rounds: int) -> None:
    """Mutated IR documents through ``ir_from_dict`` and, when they load, the compiler."""
    doc = fuzz._mutate_rounds(seeds.ir_doc, rng, rounds, seeds.ir_names)
    with limits(max_alloc_bytes=fuzz.FUZZ_LIMIT_BYTES):
        ir = only_toolkit_errors(ir_from_dict, doc)
        if ir is not None:
            import npu_compiler

            only_toolkit_errors(npu_compiler.compile, ir)


@FUZZ
@given(rng=RANDOMS)
def test_ir_text(fuzz, seeds, rng: random.Random, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Mutated IR JSON text (truncated, not UTF-8, duplicate keys, huge numbers, NaN, deep nesting) through
    ``load_ir``."""
    from torch_ir.ir import load_ir

    path = tmp_path_factory.getbasetemp() / "fuzz_ir.json"
    path.write_bytes(fuzz.mutate_text(seeds.ir_text, rng))
    only_toolkit_errors(load_ir, path)


@FUZZ
@given(rng=RANDOMS, rounds=ROUNDS)
def test_npubin_bytes(fuzz, seeds, rng: random.Random, rounds: int) -> None:
    """Mutated program bytes (checksum not repaired) through ``decode_npubin``."""
    data = seeds.program
    for _ in range(rounds):
        data = fuzz.mutate_bytes(data, rng)
    only_toolkit_errors(decode_npubin, data, "<fuzz>")


@pytest.mark.slow
@FUZZ
@given(rng=RANDOMS)
def test_npubin_headers(fuzz, seeds, rng: random.Random) -> None:
    """Mutated program headers re-encoded with a valid checksum through ``decode_npubin``; those that load
    are constructed into an Executor and run once with the corpus weights."""
    data = fuzz.make_input("npubin_header", seeds, rng)
    with limits(max_alloc_bytes=fuzz.FUZZ_LIMIT_BYTES):
        program = only_toolkit_errors(decode_npubin, data, "<fuzz>")
    if program is None:
        return
    run_seed = rng.randrange(2**32)

    def run() -> list[str]:
        fuzz._limit_address_space()
        try:
            with limits(max_alloc_bytes=fuzz.FUZZ_LIMIT_BYTES):
                fuzz.run_program(program, seeds, random.Random(run_seed))
        except TorchIRError:
            pass
        except Exception as e:  # noqa: BLE001 - reported to the parent
            return [f"{type(e).__module__}.{type(e).__name__}: {e}\n"
                    + "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])]
        return []

    problems = run_forked(run, timeout=60)
    assert not problems, "running a program that loaded:\n" + "\n".join(problems)
