"""Profiling that can be trusted and threading that degrades gracefully (issue 26, item 4).

The profile's figures add up (per-kernel times from the same runs as the run time), ``--threads`` reaches the
runs, the noisy warning and the warm-up decide on synthetic timings, and the per-run thread policy
(``npu_runtime.threads``) chooses and tries as designed, driven with synthetic times. No test here asserts
how long anything took: the machine these run on is shared.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from npu_runtime import CPUBackend, Device, Executor, load_weights
from npu_runtime.backends.cpu_kernels import Conv2d
from npu_runtime.profile import (
    CONSISTENCY_TOLERANCE,
    NOISY_RATIO,
    Profile,
    Spread,
    Warmup,
    _middle_runs,
    noise_warning,
    percentile,
    settled,
    warm_up,
)
from npu_runtime.threads import RunThreads
from npu_tools.cli import main
from torch_ir.weights import module_state, save_weights

from .test_runtime import compile_pair, random_inputs

MS = 1_000_000  # ns


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.fixture(scope="module")
def convnet():
    return compile_pair(ConvNet, (1, 3, 12, 12))


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield threads
    torch.set_num_threads(threads)


def _other_count(current: int) -> int:
    """A thread count other than ``current`` (so that applying it shows), whatever the machine."""
    return 1 if current > 1 else 2


# -- the profile's figures add up -------------------------------------------------------------------------

def test_per_kernel_times_add_up_to_the_runs_they_come_from(convnet, restore_threads):
    program, real = convnet
    profile = Executor(program).profile(random_inputs(program), load_weights(module_state(real), program),
                                        runs=8, warmup=2)
    # kernels + the runtime's own time are, exactly, the timed runs they were taken from
    assert profile.kernel_ms == pytest.approx(sum(d.us for d in profile.dispatches) / 1e3)
    assert profile.kernel_ms + profile.own_ms == pytest.approx(profile.timed_run_ms)
    assert profile.own_ms >= 0  # every dispatch's timer lies inside its run's
    assert sum(total for _, _, total, _ in profile.by_kernel()) == pytest.approx(profile.kernel_ms * 1e3)
    assert len(profile.samples_ms) == 8 and profile.run_ms == pytest.approx(Spread.of(profile.samples_ms).median)
    table = profile.table()
    assert "kernels" in table and "runtime's own" in table and "p10-p90" in table
    assert ("within" in table) == profile.consistent
    assert profile.warmup == Warmup(2, None)
    data = profile.to_dict()
    assert data["kernel_ms"] + data["own_ms"] == pytest.approx(data["timed_run_ms"])
    assert all(d["median_us"] == d["us"] for d in data["dispatches"])  # the old key still there


def _profile(run_ms: float, timed_run_ms: float, samples: list[float]) -> Profile:
    return Profile(model_name="m", runs=len(samples), dispatches=[], run_ms=run_ms, host_us_per_dispatch=0.1,
                   host_us_per_run=1.0, samples_ms=samples, timed_run_ms=timed_run_ms, threads=1)


def test_consistency_is_judged_against_the_run_median_with_a_stated_tolerance():
    close = _profile(1.0, 1.0 + CONSISTENCY_TOLERANCE / 2, [1.0] * 5)
    assert close.consistent and f"within ±{CONSISTENCY_TOLERANCE:.0%}" in close.consistency()
    far = _profile(1.0, 1.0 + 2 * CONSISTENCY_TOLERANCE, [1.0] * 5)
    assert not far.consistent and "beyond" in far.consistency() and "timers" in far.consistency()
    noisy = _profile(1.0, 2.0, [1.0, 1.0, 1.0, 3.0, 3.0, 3.0])
    assert "load changed" in noisy.consistency()


def test_the_middle_half_of_the_runs():
    assert _middle_runs([5, 1, 9, 3, 7]) == [0, 3, 4]  # p25 = 3, p75 = 7: the runs of 5, 3 and 7
    assert _middle_runs([4.0]) == [0]
    assert _middle_runs([1.0, 10.0]) in ([0], [1])  # none between p25 and p75: the one nearest the median
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([1, 2, 3, 4], 10) == pytest.approx(1.3)


# -- --threads --------------------------------------------------------------------------------------------

def test_profile_threads_are_applied_in_the_runs_and_restored_after(convnet, restore_threads):
    program, real = convnet
    executor, weights = Executor(program), load_weights(module_state(real), program)
    executor.bind(weights)
    wanted = _other_count(restore_threads)
    seen: list[int] = []
    run, ins, outs = executor.steps[0]

    def recording(ins_: list, outs_: list) -> None:
        seen.append(torch.get_num_threads())
        run(ins_, outs_)

    executor.steps[0] = (recording, ins, outs)
    profile = executor.profile(random_inputs(program), weights, runs=3, warmup=1, threads=wanted)
    assert seen and set(seen) == {wanted} and profile.threads == wanted
    assert torch.get_num_threads() == restore_threads
    with pytest.raises(ValueError, match="threads"):
        executor.profile(random_inputs(program), weights, runs=1, threads=0)


def test_the_profile_command_takes_threads_warmup_and_runs(convnet, tmp_path, capsys, restore_threads):
    program, real = convnet
    path, weights, out = tmp_path / "m.npubin", tmp_path / "m.safetensors", tmp_path / "p.json"
    program.save(path)
    save_weights(module_state(real), weights)
    wanted = _other_count(restore_threads)
    assert main(["profile", str(path), "--weights", str(weights), "--threads", str(wanted), "--warmup", "1",
                 "--runs", "3", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["threads"] == wanted and data["runs"] == 3 and data["warmup_runs"] == 1
    assert f"{wanted} thread" in table and "p10-p90" in table
    for bad in (["--threads", "0"], ["--runs", "0"], ["--warmup", "-1"], ["--threads", "two"]):
        with pytest.raises(SystemExit) as exit_:
            main(["profile", str(path), "--weights", str(weights), *bad])
        assert exit_.value.code == 2
        assert "at least" in capsys.readouterr().err


def test_demo_takes_threads_and_reports_the_spread():
    from npu_tools.cli import build_parser
    from npu_tools.demo import _profile_lines

    args = build_parser().parse_args(["demo", "--threads", "1"])
    assert args.threads == 1
    quiet = _profile_lines(_profile(1.0, 1.0, [1.0, 1.05, 1.1] * 3), 0.1)
    assert len(quiet) == 1 and "p10-p90" in quiet[0] and "1 thread," in quiet[0] and "noisy" not in quiet[0]
    noisy = _profile_lines(_profile(1.0, 1.0, [1.0] * 5 + [3.0] * 5), 0.1)
    assert len(noisy) == 2 and "noisy" in noisy[1]


# -- noisy warning and warm-up, on synthetic timings ------------------------------------------------------

def test_noisy_warning_only_when_the_spread_is_wide():
    assert noise_warning([1.0] * 10) is None
    assert noise_warning([1.0, 1.1, 1.2, 1.3, 1.4] * 2) is None  # p90/p10 ~ 1.36
    assert noise_warning([2.0]) is None  # one run has no spread
    wide = [1.0] * 5 + [3.0] * 5
    message = noise_warning(wide)
    assert message and message.startswith("noisy") and "another process is using the CPU" in message
    assert f"{Spread.of(wide).ratio:.2f}" in message
    edge = [1.0] * 5 + [NOISY_RATIO] * 5  # p10 1.0, p90 1.5: exactly the limit is not noisy
    assert Spread.of(edge).ratio == pytest.approx(NOISY_RATIO) and noise_warning(edge) is None
    assert _profile(1.0, 1.0, wide).noisy and "noisy" in _profile(1.0, 1.0, wide).table()


def test_warm_up_stops_once_the_median_stops_moving():
    times = iter([50.0, 20.0, 12.0, 10.5, 10.0] + [10.0] * 100)
    result = warm_up(lambda: next(times), window=3, tolerance=0.05)
    # the medians of (10.5, 10, 10) and (10, 10, 10) agree first at the 8th run; nothing after it was called
    assert result == Warmup(8, True) and next(times) == 10.0 and len(list(times)) == 96
    assert settled([9.0, 10.0, 11.0, 10.0, 10.2, 9.8], window=3) and not settled([10.0] * 5, window=3)
    assert not settled([20.0, 20.0, 20.0, 10.0, 10.0, 10.0], window=3)


def test_warm_up_is_capped_when_the_times_never_settle():
    swinging = itertools.cycle([1.0, 1.0, 1.0, 5.0, 5.0, 5.0])
    assert warm_up(lambda: next(swinging), window=3, max_runs=40) == Warmup(40, False)
    # the time cap: past it after the first run, and out
    assert warm_up(lambda: next(swinging), window=3, max_runs=10_000, max_seconds=0.0) == Warmup(1, False)
    assert "NOT stable" in Warmup(40, False).text() and "until stable" in Warmup(8, True).text()


# -- the per-run thread policy, on synthetic times --------------------------------------------------------

def _drive(policy: RunThreads, cost_ms: dict[int, float | list[float]], runs: int, configured: int = 2) -> list[int]:
    """``runs`` runs of the policy where a run with ``t`` threads takes ``cost_ms[t]`` (a list: its times in turn,
    as a stalled run's time varies); the choices made."""
    picks = []
    for _ in range(runs):
        threads = policy.pick(configured)
        cost = cost_ms[threads]
        picks.append(threads)
        policy.record(threads, int((cost[picks.count(threads) % len(cost)] if isinstance(cost, list) else cost) * MS))
    return picks


def test_quiet_machine_runs_on_all_threads_and_tries_one_rarely():
    policy = RunThreads()
    picks = _drive(policy, {2: 10.0, 1: 18.0}, 1000)
    steady = picks[20:]
    assert steady.count(2) / len(steady) > 0.95  # the one-thread tries: ~2 % of the time, i.e. ~1 run in 40
    assert 1 in steady  # ... but it is tried


def test_loaded_machine_falls_back_to_one_thread_and_tries_all_sparingly():
    policy = RunThreads()
    picks = _drive(policy, {2: [400.0, 250.0, 600.0], 1: 60.0}, 1000)
    # a warm-up run and three on all threads, stalled (times far apart): one thread is tried at once, warm-up and try
    assert picks[:6] == [2, 2, 2, 2, 1, 1]
    steady = picks[6:]
    tries = steady.count(2)
    # each stalled try costs ~340 ms: they are spaced to cost ~PROBE_SHARE of the time spent
    assert tries >= 1 and tries * 340 <= 2 * RunThreads.PROBE_SHARE * sum(60 for _ in steady) + 600


def test_long_runs_on_a_quiet_machine_try_one_thread_only_once_paid_for():
    """An LLM's prefill, one run per request: the first try of one thread waits until the running time pays for it
    at PROBE_SHARE, or MAX_FIRST_TRY_NS of it (it used to come in every program's fifth to eighth runs, at twice the
    time); over many runs the tries cost about PROBE_SHARE."""
    policy = RunThreads()
    picks = _drive(policy, {2: 700.0, 1: 1300.0}, 1000)
    assert 1 not in picks[:10] and 1 in picks
    extra = picks.count(1) * 600
    assert extra <= 2 * RunThreads.PROBE_SHARE * sum(700 if p == 2 else 1300 for p in picks)


def test_a_steady_neighbour_from_the_start_is_found_within_the_first_try_s_limit():
    """Every run on all threads slow alike (a steady neighbour), so nothing looks stalled: one thread is still
    tried within ``MAX_FIRST_TRY_NS`` of run time, and chosen."""
    policy = RunThreads()
    picks = _drive(policy, {2: 300.0, 1: 60.0}, 60)
    first = picks.index(1)
    # a warm-up run and three timed ones, then at most MAX_FIRST_TRY_NS of 300 ms runs, then the try
    assert first * 300 <= RunThreads.MAX_FIRST_TRY_NS / MS + 5 * 300 and picks[-20:].count(1) >= 19


def test_the_choice_follows_the_machine_both_ways():
    policy = RunThreads()
    assert _drive(policy, {2: 10.0, 1: 18.0}, 50)[-5:].count(2) >= 4
    # a neighbour arrives: two threads stall, and the next runs go to one thread without waiting for a try
    loaded = _drive(policy, {2: 400.0, 1: 25.0}, 30)
    assert loaded[-20:].count(1) >= 19
    # it leaves: the one-thread runs get faster, which brings the next try of all threads forward
    quiet = _drive(policy, {2: 10.0, 1: 15.0}, 30)
    assert quiet.index(2) <= 10 and quiet[-10:].count(2) >= 9


def test_fixed_and_single_counts_choose_nothing(restore_threads):
    fixed = RunThreads(fixed=3)
    assert _drive(fixed, {3: 1.0}, 5, configured=2) == [3] * 5
    single = RunThreads()
    assert _drive(single, {1: 1.0}, 5, configured=1) == [1] * 5
    assert CPUBackend(threads=1).run_threads().fixed == 1
    assert CPUBackend(adaptive=False).run_threads() is None
    with pytest.raises(ValueError, match="threads"):
        CPUBackend(threads=0)


def test_a_run_sets_the_choice_and_restores_the_callers_count(restore_threads):
    torch.set_num_threads(2)
    policy = RunThreads()
    policy.pick = lambda configured: 1  # type: ignore[method-assign]
    with policy.run() as threads:
        assert threads == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), policy.run():
        raise RuntimeError("a failed run")
    assert torch.get_num_threads() == 2


def test_the_caller_changing_its_count_starts_the_policy_over():
    policy = RunThreads()
    _drive(policy, {2: 10.0, 1: 18.0}, 20)
    assert policy.all == 2 and policy.explored
    assert policy.pick(4) == 4 and policy.all == 4 and not policy.explored


def test_executor_runs_are_equal_at_either_count_with_a_weight_packed_per_count(convnet, restore_threads):
    """A convolution's weight is packed for the thread count of the run (oneDNN's layout depends on it)."""
    program, real = convnet
    device = Device()
    executor = Executor(program, device)
    weights = load_weights(module_state(real), program, device)
    inputs = random_inputs(program)
    torch.set_num_threads(2)
    executor.threads.pick = lambda configured: 2  # type: ignore[method-assign]
    many = executor.run(inputs, weights=weights)["output"].to_numpy()
    executor.threads.pick = lambda configured: 1  # type: ignore[method-assign]
    one = executor.run(inputs, weights=weights)["output"].to_numpy()
    np.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-6)
    convs = [k for k in executor.kernels if isinstance(k, Conv2d)]
    assert convs and all(set(k.packed) == {1, 2} for k in convs)
    assert torch.get_num_threads() == 2


# -- the benchmark's neighbours ---------------------------------------------------------------------------

def test_load_workers_are_stopped_with_their_children():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "runtime"))
    try:
        from load import Load
    finally:
        sys.path.pop(0)
    with Load(1, max_mb=32, seconds=30) as load:
        (worker,) = load.processes
        assert worker.poll() is None
    assert worker.poll() is not None and not load.processes
    # its process group is gone too (once the OS has reaped them): no child outlives the block
    deadline = time.monotonic() + 10
    while _group_alive(worker.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_alive(worker.pid)


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` still runs (a zombie waiting to be reaped does not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False
