"""How the CPU backend's decode GEMV gets its compiled kernel (``npu_runtime.backends.cpu_gemv_build``): the
build cache and its trust rules, a failed build's fallback, ``gemv.c`` as package data, and the read loop
``bench/gemv`` builds the same way for the bandwidth floor the kernel is compared with."""

from __future__ import annotations

import fnmatch
import importlib.resources
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import torch

from npu_runtime.backends import cpu_gemv, cpu_gemv_build
from tests.runtime.test_gemv import check_against_float64, random


def fresh_state(monkeypatch, cache) -> None:
    monkeypatch.setenv("TORCH_IR_CACHE", str(cache))
    for name, value in (("library", None), ("failed", None), ("warned", False)):
        monkeypatch.setattr(cpu_gemv._kernel, name, value)
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)


def test_no_compiler_falls_back_without_building(tmp_path, monkeypatch):
    missing = tmp_path / "bin" / "no-such-cc"
    fresh_state(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CC", str(missing))
    assert cpu_gemv._load() is None and not cpu_gemv.native_available()
    assert cpu_gemv.native_status() == f"torch (native GEMV unavailable: no C compiler ({missing}) on PATH)"
    assert not (tmp_path / "cache").exists()


def test_a_failed_build_falls_back_with_the_compiler_message(native, tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "cc-broken"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'fatal: this compiler is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    fresh_state(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("CC", str(fake))
    x, w = random((1, 30), torch.float32, 0), random((7, 30), torch.float32, 1)
    with pytest.warns(RuntimeWarning, match="this compiler is broken"):
        check_against_float64(cpu_gemv.gemv(x, w), x, w)
    assert not cpu_gemv.native_available()
    assert not [p for p in (tmp_path / "cache" / "gemv").iterdir()]  # no half-written file left behind


def test_the_library_is_built_once_into_a_private_cache(native, tmp_path, monkeypatch):
    """A build goes to ``$TORCH_IR_CACHE/gemv`` by an atomic rename; a second process loads it without
    building; a cache folder others can write is not trusted (the build goes to a private folder)."""
    builds = []

    def fake_build(source, compiler, flags, target):  # the real library, copied as the compiler would write it
        builds.append(target)
        tmp = target.with_suffix(".tmp")
        shutil.copy(native.path, tmp)
        os.replace(tmp, target)

    fresh_state(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(cpu_gemv_build, "build", fake_build)
    library = cpu_gemv._load()
    assert library is not None and library.path.parent == tmp_path / "cache" / "gemv" and len(builds) == 1
    assert stat.S_IMODE(library.path.parent.stat().st_mode) & 0o077 == 0
    assert [p.name for p in library.path.parent.iterdir()] == [library.path.name]

    fresh_state(monkeypatch, tmp_path / "cache")
    assert cpu_gemv._load().path == library.path and len(builds) == 1  # cached: not built again

    fresh_state(monkeypatch, tmp_path / "cache")
    library.path.parent.chmod(0o777)
    assert cpu_gemv._load().path.parent != library.path.parent and len(builds) == 2


def test_an_edited_kernel_source_is_built_anew(native, tmp_path, monkeypatch):
    """The cache key covers the C source: after an edit of ``gemv.c`` the old library is not loaded."""
    builds = []

    def fake_build(source, compiler, flags, target):
        builds.append(source)
        shutil.copy(native.path, target)

    fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(cpu_gemv_build, "build", fake_build)
    read = cpu_gemv_build.kernel_source
    original = cpu_gemv_build.gemv_source()  # what is compiled: half.c, gemv.c, then gemm_tiles.c
    assert original == "\n".join(read(name) for name in ("half.c", "gemv.c", "gemm_tiles.c"))
    first = cpu_gemv._load().path
    monkeypatch.setattr(cpu_gemv_build, "kernel_source",
                        lambda name=cpu_gemv_build.SOURCE_NAME: read(name) + ("\n/* edited */\n" if name ==
                                                                          cpu_gemv_build.SOURCE_NAME else ""))
    edited = cpu_gemv_build.gemv_source()
    assert edited == original.replace(read(cpu_gemv_build.SOURCE_NAME), read(cpu_gemv_build.SOURCE_NAME)
                                      + "\n/* edited */\n")
    fresh_state(monkeypatch, tmp_path)
    assert cpu_gemv._load().path != first and builds == [original, edited]


@pytest.mark.slow
def test_the_real_build_leaves_one_library(tmp_path, monkeypatch):
    """gcc for real, into an empty cache: one ``.so``, no temporary files (skipped without gcc)."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    fresh_state(monkeypatch, tmp_path)
    monkeypatch.delenv("CC", raising=False)
    library = cpu_gemv._load()
    assert library is not None, cpu_gemv.native_status()
    assert [p.name for p in (tmp_path / "gemv").iterdir()] == [library.path.name]
    x, w = random((1, 40), torch.bfloat16, 0), random((9, 40), torch.bfloat16, 1)
    check_against_float64(cpu_gemv.gemv(x, w), x, w)


@pytest.fixture(scope="module")
def bandwidth(native):
    """``bench/gemv/bandwidth.py``, the floor of the GEMV benchmark (imported as its script does: bench is no
    package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gemv"))
    try:
        import bandwidth
    finally:
        sys.path.pop(0)
    return bandwidth


@pytest.mark.parametrize("threads", [1, 2])
def test_the_benchmarks_read_loop_reads_every_float_once(bandwidth, threads):
    """The floor is only a floor if the loop reads all the bytes: its sum is exact (small integers, every
    partial sum below 2^24) over chunks, streams and tails, on both ISAs."""
    reader = bandwidth.stream_reader()
    assert reader is not None
    n = 3 * 65536 + 8 * 1000 + 5  # 3 whole chunks, then one of 8 streams of 1000 floats and a tail of 5
    buf = (torch.arange(n) % 7).float()
    for isa in {0, reader.isa}:
        assert reader.lib.stream_read(buf.data_ptr(), n, threads, isa) == buf.double().sum().item()


def test_the_streaming_bandwidth_is_measured_within_physical_bounds(bandwidth):
    bw = bandwidth.measure_stream_bandwidth(8 << 20, reps=3)
    assert bw.gbs == max(bw.c_read, bw.c_read_1, bw.torch_mv)
    assert bw.nbytes == 8 << 20 and bw.threads == torch.get_num_threads()
    # no core reads even its L1 at 1 TB/s: a wrong time unit or a loop that skips bytes ends up here
    assert 0 < bw.c_read_1 < 1000 and 0 < bw.c_read < 1000 * bw.threads and 0 < bw.torch_mv < 1000 * bw.threads


def test_the_kernel_source_is_package_data():
    """The C kernels are read from the installed package, so a wheel must ship every one (pyproject's
    package-data patterns must match each ``.c`` file beside the backends)."""
    backends = importlib.resources.files("npu_runtime.backends")
    assert backends.joinpath(cpu_gemv_build.SOURCE_NAME).is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["npu_runtime"]
    sources = sorted(f"backends/{p.name}" for p in Path(str(backends)).glob("*.c"))
    assert len(sources) >= 8 and "backends/qmatmul.c" in sources
    assert [s for s in sources if not any(fnmatch.fnmatch(s, pat) for pat in patterns)] == []

