"""A sweep's points as Ray tasks (``torch-ir sweep --ray auto|ADDRESS``): the same rows as the local process pool,
on this machine's Ray instance or an existing cluster.

``RayExecutor`` implements ``run.PointExecutor``: ``map_groups(fn, groups)`` yields the rows of every group (one
model's points) as their tasks finish.

* Where: ``address="auto"`` connects to the cluster ``RAY_ADDRESS`` names or one ``ray start`` left running on this
  machine, else starts a local instance sized to the machine (``ray.init()``'s own rule); any other address
  (``ray://head:10001``, ``head:6379``) is passed to ``ray.init(address=...)``. A Ray already initialized in this
  process (a notebook's, a test's) is used as it is.
* One task per model group; a group of more than ``chunk_points`` points (a zoo model swept over thousands of
  hardware points) is split so a cluster's nodes share it. The group's first task extracts, compiles and, where a
  precision quantizes, calibrates the model (its rows carry those phases' times, as locally), and returns its
  ``ModelCache`` as a second result, which stays in Ray's object store: the group's other tasks take it from
  there (an ``ObjectRef`` argument), so the model's IR, programs, weights and calibration are made once and
  shipped, never re-read or re-extracted per task.
* Failures: a task whose worker dies or that raises is retried (``retries``: Ray's ``max_retries`` with
  ``retry_exceptions``); one that still fails gives each of its points a ``failed`` row with the reason, never a
  dropped point. A bad point is not a task failure: ``engine.evaluate`` makes it a failed row inside the task.

Ray is optional (``pip install 'torch-ir[ray]'``); without it, using ``RayExecutor`` raises a ``SweepError``
saying so. On a cluster, every node needs torch-ir installed as on the driver (docs/sweep.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .engine import ModelCache, Row, evaluate, evaluate_group, failure_reason
from .grid import Point, SweepError
from .run import failed_rows

#: Points per task before a model's group is split: enough that a task's overhead (milliseconds) is small next to
#: costing its points, few enough that a big group spreads over a cluster.
DEFAULT_CHUNK_POINTS = 256


def import_ray() -> Any:
    """The ``ray`` module, or a ``SweepError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise SweepError("--ray: Ray is not installed; fix: pip install 'torch-ir[ray]' (or pip install ray), or "
                         "leave --ray out to run on a local process pool") from None
    return ray


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` (or ``ray://HOST:PORT``) nothing answers at, in seconds: ``ray.init`` would retry
    for minutes before it gave up. An address of another form is left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise SweepError(f"--ray {address}: nothing answers at {host}:{port} ({e.strerror or e}); fix: give the Ray "
                         "head's address (ray://HOST:10001 for Ray Client, HOST:6379 from a node of the cluster) "
                         "once `ray start --head` runs there, or --ray auto for a local instance") from None


def _first_chunk(points: list[Point]) -> tuple[list[Row], ModelCache]:
    """A group's first task: its rows from a fresh cache, and that cache (the model made ready) for the others."""
    cache = ModelCache(max_models=1)
    return [evaluate(p, cache) for p in points], cache


def _other_chunk(cache: ModelCache, points: list[Point]) -> list[Row]:
    """A later task of a group: its rows from the cache the first task shipped through the object store."""
    return [evaluate(p, cache) for p in points]


def _call(fn: Callable[[list[Point]], list[Row]], points: list[Point]) -> list[Row]:
    """A group through a caller's own ``fn`` (not the engine's ``evaluate_group``): one task, nothing shipped."""
    return list(fn(points))


def task_failed_rows(points: Sequence[Point], error: BaseException, retries: int) -> list[Row]:
    """A row per point of a task that failed ``retries`` + 1 times: ``failed``, with why."""
    return failed_rows(points, f"the Ray task running these points failed {retries + 1} time(s): "
                               f"{failure_reason(_cause(error))}")


def _cause(error: BaseException) -> BaseException:
    """The task's own exception inside Ray's wrapper (``RayTaskError.cause``), else the error itself."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def chunks(points: Sequence[Point], size: int) -> list[list[Point]]:
    """``points`` in consecutive pieces of at most ``size``."""
    return [list(points[i:i + size]) for i in range(0, len(points), max(size, 1))]


class RayExecutor:
    """``run.PointExecutor`` on Ray (module docstring). ``init_kwargs`` go to ``ray.init`` (``runtime_env``,
    ``num_cpus``, ...) when this executor starts or connects to Ray."""

    def __init__(self, address: str | None = "auto", retries: int = 2, *, chunk_points: int = DEFAULT_CHUNK_POINTS,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        if retries < 0 or chunk_points < 1:
            raise SweepError(f"RayExecutor: retries {retries} and chunk_points {chunk_points}; fix: retries >= 0, "
                             "chunk_points >= 1")
        self.address = address or "auto"
        self.retries = retries
        self.chunk_points = chunk_points
        self.init_kwargs = dict(init_kwargs or {})

    def connect(self) -> Any:
        """Ray, initialized: the running one in this process, else ``ray.init`` by ``address``."""
        ray = import_ray()
        if not ray.is_initialized():
            kwargs = {"log_to_driver": False, **self.init_kwargs}
            if self.address != "auto":
                check_address(self.address)
                kwargs["address"] = self.address
            elif "RAY_ADDRESS" not in os.environ:
                kwargs.setdefault("include_dashboard", False)  # a local instance for one sweep needs no dashboard
            try:
                ray.init(**kwargs)
            except ConnectionError as e:
                raise SweepError(f"--ray {self.address}: cannot connect ({e}); fix: give the head node's address "
                                 "(ray://HOST:10001 with Ray Client, or HOST:6379 on a node of the cluster), or "
                                 "--ray auto for a local instance") from None
        return ray

    def map_groups(self, fn: Callable[[list[Point]], list[Row]], groups: Iterable[list[Point]]) -> Iterator[Row]:
        """The rows of every point of ``groups``, as their tasks finish (module docstring)."""
        ray = self.connect()
        options = {"max_retries": self.retries, "retry_exceptions": True}
        pending: dict[Any, list[Point]] = {}
        if fn is evaluate_group:
            first = ray.remote(_first_chunk).options(num_returns=2, **options)
            other = ray.remote(_other_chunk).options(**options)
            for group in groups:
                head, *rest = chunks(group, self.chunk_points) or [[]]
                rows_ref, cache_ref = first.remote(head)
                pending[rows_ref] = head
                for piece in rest:  # the cache is an ObjectRef: Ray hands the task the stored object
                    pending[other.remote(cache_ref, piece)] = piece
        else:
            call, fn_ref = ray.remote(_call).options(**options), ray.put(fn)
            for group in groups:
                pending[call.remote(fn_ref, list(group))] = list(group)
        yield from self._collect(ray, pending)

    def _collect(self, ray: Any, pending: dict[Any, list[Point]]) -> Iterator[Row]:
        """Each task's rows as it finishes; a task that failed past its retries, its points as failed rows."""
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                points = pending.pop(ref)
                try:
                    rows = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost task is reported per point, never dropped
                    rows = task_failed_rows(points, e, self.retries)
                yield from rows


__all__ = ["DEFAULT_CHUNK_POINTS", "RayExecutor", "check_address", "chunks", "import_ray", "task_failed_rows"]
