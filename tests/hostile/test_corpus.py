"""Every file of the hostile corpus, through the Python API and through ``torch-ir``.

For each case (scripts/make_hostile_corpus.py says what each file does and what must happen):

* the API call raises exactly the expected toolkit error (a ``TorchIRError`` subclass, never a bare
  library error) with a message matching the case's regex, or succeeds where the file is only data;
* every command line exits with its code; a failing one prints exactly one stderr line
  ``torch-ir <command>: error: ...``;
* no marker file (``PWNED*``) appears anywhere, and nothing is written outside the working directory
  (a fresh directory whose parent, the test's ``tmp_path``, is watched, as are the corpus directory and
  its parent); a command that fails writes nothing at all, one that succeeds only plain files in the cwd;
* for the large-allocation cases, the peak RSS of the process grows by less than 500 MiB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import pickle
import re
import resource
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler.compiled_program import CompiledProgram
from npu_runtime import Device, Executor, load_weights
from npu_tools.cli import main
from torch_ir.errors import TorchIRError
from torch_ir.limits import limits
from torch_ir.naming import default_output

from .conftest import ROOT

PEAK_GROWTH_LIMIT = 500 << 20
ESCAPE_NAMES = ("PWNED", "escaped")  # what an escape creates; also looked for in /tmp and the corpus' parent


# ------------------------------------------------------------------------------------------ helpers


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


@contextlib.contextmanager
def peak_rss_growth() -> Iterator[list[int]]:
    """Bytes by which the peak RSS rose inside the block (the peak is reset first, through clear_refs)."""
    result = [0]
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    start = max(_status_kib("VmRSS"), 0)
    try:
        yield result
    finally:
        result[0] = (_status_kib("VmHWM") - start) << 10


def snapshot(*roots: Path, shallow: tuple[Path, ...] = (), escapes_in: tuple[Path, ...] = ()
             ) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of everything under ``roots``, of the direct children of ``shallow``, and of
    the direct children of ``escapes_in`` whose names an escape would use (/tmp and $HOME change for other
    reasons too)."""
    seen: dict[str, tuple[int, int]] = {}

    def walk(directory: str, recursive: bool, only_escapes: bool = False) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            if only_escapes and not any(s in entry.name for s in ESCAPE_NAMES):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            seen[entry.path] = (-1, 0) if is_dir else (st.st_size, st.st_mtime_ns)
            if is_dir and recursive:
                walk(entry.path, True)

    for root in roots:
        walk(str(root), True)
    for root in shallow:
        walk(str(root), False)
    for root in escapes_in:
        walk(str(root), False, only_escapes=True)
    for absolute in ("/abs", "/escaped.npubin", "/escaped.npu.json"):
        if os.path.lexists(absolute):
            seen[absolute] = (0, 0)
    return seen


def _tail(exc: BaseException, lines: int = 4) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])


def call_api(case, d: Path, generator) -> None:
    """The case's API call (see the API kinds in scripts/make_hostile_corpus.py)."""
    f = d / case.file
    x = generator.example_input()
    if case.api == "load_ir":
        torch_ir.load_ir(f)
    elif case.api == "ir_executor":
        torch_ir.IRExecutor(torch_ir.load_ir(f), d / case.weights).run([torch.from_numpy(x)])
    elif case.api == "compile":
        npu_compiler.compile(torch_ir.load_ir(f))
    elif case.api == "program_load":
        CompiledProgram.load(f)
    elif case.api == "executor":
        program = CompiledProgram.load(f)
        device = Device()
        executor = Executor(program, device)
        executor.run({"x": x}, weights=load_weights(d / case.weights, program, device))
    elif case.api == "load_weights":
        load_weights(f, CompiledProgram.load(d / case.program))
    elif case.api == "default_output":
        ir = torch_ir.load_ir(f)
        program = npu_compiler.compile(ir)
        for name in (ir.model_name, program.model_name):
            for suffix in (".npubin", ".npu.json", ".json"):
                out = default_output(name, suffix)
                assert not out.is_absolute() and len(out.parts) == 1 and out.name not in (".", ".."), out
                assert len(out.name.encode()) < 255 and "\x00" not in out.name, out
    elif case.api == "nan_compare":
        compare_nonfinite(d, case.file, x, generator)
    elif case.api != "cli":
        extra = generator.extra_api()
        if case.api not in extra:
            raise AssertionError(f"unknown API kind {case.api!r}")
        extra[case.api](case, d)


def compare_nonfinite(d: Path, weights: str, x: np.ndarray, generator) -> None:
    """The runtime and the reference executor on the same non-finite weights: NaN, +inf, -inf in the same
    places, the finite values close."""
    ir = torch_ir.load_ir(d / generator.BASE_IR)
    (ref,) = torch_ir.IRExecutor(ir, d / weights).run([torch.from_numpy(x)])
    ref = ref.numpy()
    program = CompiledProgram.load(d / generator.BASE_PROGRAM)
    device = Device()
    out = Executor(program, device).run({"x": x}, weights=load_weights(d / weights, program, device))
    got = out[program.output_specs[0].name].to_numpy()
    assert got.shape == ref.shape
    for name, test in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        assert np.array_equal(test(got), test(ref)), (
            f"{name} at {np.argwhere(test(got)).tolist()} in the runtime, at {np.argwhere(test(ref)).tolist()} "
            f"in the reference executor\nruntime:\n{got}\nreference:\n{ref}")
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-4, atol=1e-5)


def check_api(case, d: Path, generator) -> None:
    try:
        call_api(case, d, generator)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any escape from the call is what is being judged
        if case.error is None:
            raise AssertionError(f"{case.id}: expected success, got {type(exc).__name__}: {str(exc)[:300]}\n"
                                 f"{_tail(exc)}") from exc
        if not isinstance(exc, TorchIRError):
            raise AssertionError(f"{case.id}: expected {case.error}, got the bare {type(exc).__module__}."
                                 f"{type(exc).__name__} (not a TorchIRError): {str(exc)[:300]}\n{_tail(exc)}") from exc
        if case.error != "TorchIRError" and type(exc).__name__ != case.error:
            raise AssertionError(f"{case.id}: expected {case.error}, got {type(exc).__name__}: {str(exc)[:300]}\n"
                                 f"{_tail(exc)}") from exc
        if not re.search(case.message, str(exc)):
            raise AssertionError(f"{case.id}: message of {type(exc).__name__} does not match {case.message!r}: "
                                 f"{str(exc)[:500]}") from exc
    else:
        if case.error is not None:
            raise AssertionError(f"{case.id}: expected {case.error}, the call succeeded")


def check_cli(case, d: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Run each command line; returns the problems (all commands run, so one report shows every failure)."""
    problems = []
    for call in case.cli:
        argv = [a.replace("{dir}", str(d)) for a in call.argv]
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as e:  # argparse
            code = e.code
        out, err = capsys.readouterr()
        lines = err.splitlines()
        what = f"torch-ir {argv[0]} ({' '.join(a[:40] for a in call.argv[1:])})"
        if code not in call.codes:
            problems.append(f"{what}: exit {code}, expected {call.code}; stderr: {err[-600:]!r}")
        elif code == 2 and (len(lines) != 1 or not lines[0].startswith(f"torch-ir {argv[0]}: error:")):
            problems.append(f"{what}: expected one stderr line 'torch-ir {argv[0]}: error: ...', got "
                            f"{len(lines)} line(s): {err[:600]!r}")
    return problems


def run_forked(fn, timeout: float = 120.0) -> list[str]:
    """``fn()`` (returning a list of problems) in a forked child, so that a native crash of a kernel given
    hostile parameters (SIGFPE, SIGSEGV) or a hang is reported as a problem instead of ending the test run."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
            torch.set_num_threads(1)  # the parent's OpenMP team does not exist in a forked child
            payload = pickle.dumps(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            payload = pickle.dumps([f"the isolated run raised {type(e).__name__}: {e}\n{_tail(e)}"])
            status = 1
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        os._exit(status)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_end, "rb") as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return [f"the run did not finish within {timeout:.0f} s (killed)"]
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return [f"the process was killed by {signal.Signals(sig).name} ({signal.strsignal(sig)}): a native crash"]
    return pickle.loads(b"".join(chunks)) if chunks else [f"the isolated run exited {os.WEXITSTATUS(status)}"]


def exercise(case, corpus_dir: Path, generator, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The API call and the command lines of ``case``, under its limit, watching peak memory."""
    limit = limits(max_alloc_bytes=case.limit_bytes) if case.limit_bytes else contextlib.nullcontext()
    problems: list[str] = []
    with limit, peak_rss_growth() as growth:
        try:
            check_api(case, corpus_dir, generator)
        except AssertionError as e:
            problems.append(f"API: {e}")
        problems += check_cli(case, corpus_dir, capsys)
    if case.big_alloc and growth[0] >= PEAK_GROWTH_LIMIT:
        problems.append(f"peak RSS grew by {growth[0] / (1 << 20):.0f} MiB (limit {PEAK_GROWTH_LIMIT >> 20} MiB)")
    return problems


# ---------------------------------------------------------------------------------------------- the test


def judge(case, corpus_dir: Path, generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Everything that went wrong with ``case``: the API call, the command lines, the files written, memory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    watched = (tmp_path, corpus_dir)
    around = {"shallow": (corpus_dir.parent,), "escapes_in": (Path("/tmp"), Path.home())}
    before = snapshot(*watched, **around)
    run = lambda: exercise(case, corpus_dir, generator, capsys)
    problems = run_forked(run) if case.isolate else run()

    after = snapshot(*watched, **around)
    changed = sorted(p for p in after if before.get(p) != after[p])
    markers = [p for p in changed if generator.MARKER in Path(p).name]
    if markers:
        problems.append(f"escape: marker file(s) created: {markers}")
    in_cwd = [p for p in changed if Path(p).parent == cwd]
    outside = [p for p in changed if p not in in_cwd and p not in markers]
    if outside:
        problems.append(f"written outside the working directory: {outside[:10]}")
    expects_writes = case.cli and all(c.codes == [0] for c in case.cli) and case.category == "path_traversal"
    if in_cwd and not expects_writes:
        problems.append(f"a failing case wrote into the working directory: {in_cwd[:10]}")
    for p in in_cwd:
        if not Path(p).is_file() or Path(p).is_symlink():
            problems.append(f"{p} in the working directory is not a plain file")
    return problems


def test_case(case, corpus_dir: Path, generator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> None:
    problems = judge(case, corpus_dir, generator, tmp_path, monkeypatch, capsys)
    if problems:
        pytest.fail(f"{case.id} ({case.description}):\n  " + "\n  ".join(problems), pytrace=False)


def test_the_judge_sees_escapes_crashes_and_memory(cases, corpus_dir: Path, generator, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The checks themselves, on a case whose API call misbehaves on purpose: a marker file, a file beside the
    corpus, a native crash in an isolated run, a large allocation, a bare exception."""
    base = next(c for c in cases if c.id == "ij_tag_pickle")
    marker, beside = corpus_dir / f"{generator.MARKER}_selftest", corpus_dir.parent / "escaped_selftest"

    def escape(case, d, gen):
        marker.touch()
        beside.write_text("x")
        raise ValueError("bare")

    def allocate(case, d, gen):
        block = np.ones(600 << 17)  # 600 MiB of float64, touched
        del block
        raise TorchIRError("refused, but only after allocating")

    def crash(case, d, gen):
        faulthandler.disable()  # (in the forked child) no stack dump for this deliberate crash
        os.kill(os.getpid(), signal.SIGFPE)

    expectations = [(escape, {}, ["escape: marker", "written outside", "bare builtins.ValueError"]),
                    (allocate, {"big_alloc": True, "error": "TorchIRError", "message": ""}, ["peak RSS grew"]),
                    (crash, {"isolate": True}, ["killed by SIGFPE"])]
    try:
        for i, (api, changes, wanted) in enumerate(expectations):
            case = dataclasses.replace(base, cli=[], **changes)
            monkeypatch.setattr(sys.modules[__name__], "call_api", api)
            problems = judge(case, corpus_dir, generator, tmp_path / str(i), monkeypatch, capsys)
            for text in wanted:
                assert any(text in p for p in problems), (text, problems)
    finally:
        marker.unlink(missing_ok=True)
        beside.unlink(missing_ok=True)


def test_case_kinds_are_known(cases, generator) -> None:
    assert len(cases) >= 100
    assert {c.api for c in cases} == set(generator.api_kinds())
    for c in cases:
        assert c.error is None or c.error == "TorchIRError" or c.message, c.id
        assert all(call.argv and set(call.codes) <= {0, 1, 2} for call in c.cli), c.id
    assert sum(c.escape for c in cases) >= 20 and sum(c.big_alloc for c in cases) >= 10


def test_index_lists_every_case(cases, generator, tmp_path: Path) -> None:
    """cases.json (what ``python scripts/make_hostile_corpus.py OUTDIR`` writes beside the files)."""
    import json

    index = json.loads(generator.write_index(cases, tmp_path).read_text())
    assert index["count"] == len(cases) == len({c["id"] for c in index["cases"]})
    first = index["cases"][0]
    assert {"id", "files", "api", "error", "message", "cli", "escape", "big_alloc"} <= set(first)


# --------------------------------------------------------------------------------- real processes


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "scripts")])}
    env.pop("TORCH_IR_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "npu_tools.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_real_process_deep_nesting_and_pickled_weights(corpus_dir: Path, tmp_path: Path) -> None:
    """Outside pytest's in-process capture: a 100,000-deep IR and a pickled weights file whose loading
    would run os.system each end the process with status 2 and one stderr line, and no marker."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = _run_cli(["inspect", str(corpus_dir / "ij_deep_nesting_metadata.json")], cwd)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("torch-ir inspect: error:")
    result = _run_cli(["run", str(corpus_dir / "tiny.npubin"), "--weights", str(corpus_dir / "w_pickle_torch_zip.pt"),
                       "--input", f"x={corpus_dir / 'x.npy'}"], cwd)
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("torch-ir run: error:")
    assert not [p for p in list(corpus_dir.rglob("PWNED*")) + list(cwd.rglob("*"))]
