"""``--ray``: the same small sweep on a local Ray instance started here gives the table the local run gives (but
the wall times), every latency is ``cost_program``'s on that point's hardware (computed here), a model's group
split over several tasks extracts the model once (the later tasks take it from the object store), and a task that
dies is retried, one that keeps failing reported per point."""

from __future__ import annotations

import csv
import os

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'torch-ir[ray]')")

import npu_compiler  # noqa: E402
from npu_compiler.costmodel import cost_program, load_hardware  # noqa: E402
from npu_compiler.costmodel.hardware import hardware_from_dict  # noqa: E402
from npu_compiler.costmodel.hardware_template import hardware_to_dict  # noqa: E402
from npu_tools.commands.normalize import _load  # noqa: E402
from npu_tools.sweep.engine import NONDETERMINISTIC_COLUMNS, evaluate_group  # noqa: E402
from npu_tools.sweep.grid import SweepError, expand  # noqa: E402
from npu_tools.sweep.ray_executor import RayExecutor, check_address  # noqa: E402
from npu_tools.sweep.run import LocalExecutor, group_points, sweep  # noqa: E402

MODELS = ["convnet", "residual", "no_such_model"]
ARRAYS = [(16, 16), (32, 32)]
PRECISIONS = ["fp16", "w8a8"]
QUIET = {"progress": lambda *a: None}


def _table(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_COLUMNS} for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def local_ray():
    """A Ray instance on this machine, for this module only (two CPUs: the machine's, whatever else runs)."""
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def points():
    return expand(MODELS, ["edge_4tops"], {"array": ARRAYS}, PRECISIONS)


def test_ray_gives_the_local_table(local_ray, points, tmp_path_factory):
    local = sweep(points, tmp_path_factory.mktemp("local"), executor=LocalExecutor(1), **QUIET)
    # 3 points per task: each model's 4 points are two tasks, the second fed the first's cache
    remote = sweep(points, tmp_path_factory.mktemp("ray"), executor=RayExecutor("auto", chunk_points=3), **QUIET)
    local_rows, ray_rows = _table(local), _table(remote)
    assert len(ray_rows) == len(points) and ray_rows == local_rows
    with open(remote, newline="") as f:
        timed = list(csv.DictReader(f))
    for model in ("convnet", "residual"):
        mine = [r for r in timed if r["model"] == model]
        assert sum(float(r["t_extract"]) > 0 for r in mine) == 1, "the second task re-extracted the model"
        assert sum(float(r["t_compile"]) > 0 for r in mine) == 1
    failed = [r for r in ray_rows if r["model"] == "no_such_model"]
    assert len(failed) == 4 and all(r["status"] == "failed" and "no_such_model" in r["reason"] for r in failed)


def test_ray_latencies_are_cost_programs(local_ray, points, tmp_path):
    rows = {r["key"]: r for r in _table(sweep(points, tmp_path, executor=RayExecutor(), **QUIET))}
    base = hardware_to_dict(load_hardware("edge_4tops"))
    for point in points[:8]:  # convnet's and residual's
        program = npu_compiler.compile(_load(point.model)[0], fallback="cpu")
        rows_, cols = point.override("array")
        hw = hardware_from_dict({**base, "array": {**base["array"], "rows": rows_, "cols": cols}})
        row = rows[point.key]
        assert row["status"] == "ok", row["reason"]
        assert float(row["latency_ms"]) == cost_program(program, hw, precision=point.precision).latency_ms


def test_a_task_that_dies_is_retried_and_one_that_keeps_failing_is_reported(local_ray, points, tmp_path):
    convnet_points = [p for p in points if p.model == "convnet"]
    marker = tmp_path / "died-once"

    def dies_once(group):
        if not marker.exists():
            marker.touch()
            os._exit(1)  # the worker process dies: a system failure, which Ray retries
        return evaluate_group(group)

    rows = list(RayExecutor(retries=1).map_groups(dies_once, group_points(convnet_points)))
    assert marker.exists() and [r["status"] for r in rows] == ["ok"] * 4

    def always_raises(group):
        raise RuntimeError("out of cheese")

    rows = list(RayExecutor(retries=1).map_groups(always_raises, group_points(convnet_points)))
    assert sorted(r["key"] for r in rows) == sorted(p.key for p in convnet_points)
    assert all(r["status"] == "failed" and "failed 2 time(s)" in r["reason"] and "out of cheese" in r["reason"]
               for r in rows)


def test_cli_ray_flag_runs_on_the_running_instance(local_ray, tmp_path, capsys):
    from npu_tools.cli import main

    argv = ["sweep", "--models", "convnet", "--hw", "edge_4tops", "--grid", "array=16x16,32x32", "--precision",
            "fp16", "-o", str(tmp_path), "--ray", "auto"]
    assert main(argv) == 0
    assert "2 points: 2 ok, 0 failed" in capsys.readouterr().out
    assert [r["status"] for r in _table(tmp_path / "results.csv")] == ["ok", "ok"]


def test_an_address_nothing_answers_at_is_refused_at_once():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(SweepError, match=f"--ray {address}: nothing answers at 127.0.0.1:{port}.*fix: give"):
            check_address(address, timeout_s=2)
