"""Running a sweep: ``sweep(points, out_dir)`` evaluates every point on an executor and writes one table.

* Points are grouped by model (``group_points``): one task per model, so one worker's ``ModelCache`` extracts,
  compiles and calibrates that model once for all its hardware points.
* The executor is any :class:`PointExecutor` (``map_groups(fn, groups)`` yields the rows of every group as groups
  finish, in any order, one row per point: a group that fails as a whole yields failed rows for its points, never
  none). The default, :class:`LocalExecutor`, is a ``ProcessPoolExecutor`` of ``workers`` processes (default
  ``os.cpu_count()``; 1 runs in this process); ``npu_tools.sweep.ray_executor.RayExecutor`` runs the same tasks on
  Ray.
* Each row is appended to ``out_dir/results.csv`` as it arrives, one complete line written and flushed at once; a
  second run over the same directory reads it and skips the points whose key is there (``retry_failed``: except
  the failed ones), so an interrupted sweep resumes where it stopped. A line cut off by the interruption is dropped.
* At the end the whole table, sorted by key, replaces ``results.csv`` atomically (and ``results.parquet`` is
  written when pyarrow is installed). Rows of points this run did not ask for (an earlier sweep's) are kept.
"""

from __future__ import annotations

import csv
import io
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Protocol, runtime_checkable

from npu_compiler.costmodel.report import csv_value

from .engine import COLUMNS, Row, blank_row, evaluate_group, failure_reason, worker_cache
from .grid import Point, SweepError

RESULTS_CSV = "results.csv"
RESULTS_PARQUET = "results.parquet"
GroupFn = Callable[[list[Point]], list[Row]]
#: ``progress(done, total, elapsed_seconds)`` after each row.
Progress = Callable[[int, int, float], None]


@runtime_checkable
class PointExecutor(Protocol):
    """Where a sweep's tasks run: ``map_groups(fn, groups)`` calls ``fn(group)`` for every group (somewhere) and
    yields each returned row as its group finishes, in any order; a group whose task fails for good yields a failed
    row (``engine.blank_row`` with a ``reason``) for each of its points, so no point is silently dropped."""

    def map_groups(self, fn: GroupFn, groups: Sequence[list[Point]]) -> Iterator[Row]: ...


class LocalExecutor:
    """A local process pool of ``workers`` processes (default ``os.cpu_count()``); one worker runs in-process.
    Workers are spawned (not forked: a fork of a process that has run torch's thread pools can hang) and each
    limits torch to its share of the cores."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)

    def map_groups(self, fn: GroupFn, groups: Sequence[list[Point]]) -> Iterator[Row]:
        if self.workers == 1 or len(groups) <= 1:
            worker_cache(fresh=True)  # a sweep in this process starts from nothing, as a fresh worker would
            for group in groups:
                yield from _run_safely(fn, group)
            return
        import multiprocessing

        threads = max(1, (os.cpu_count() or 1) // self.workers)
        with ProcessPoolExecutor(min(self.workers, len(groups)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker, initargs=(threads,)) as pool:
            pending: dict[Future, list[Point]] = {pool.submit(fn, g): g for g in groups}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    group = pending.pop(future)
                    try:
                        rows = future.result()
                    except Exception as e:  # noqa: BLE001 - a dead worker fails its points, with the reason
                        rows = failed_rows(group, f"the worker running this model's points failed: "
                                                  f"{failure_reason(e)}")
                    yield from rows


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _run_safely(fn: GroupFn, group: list[Point]) -> list[Row]:
    try:
        return fn(group)
    except Exception as e:  # noqa: BLE001 - evaluate never raises for a point; anything else fails the group
        return failed_rows(group, failure_reason(e))


def failed_rows(group: Iterable[Point], reason: str) -> list[Row]:
    """A failed row for each point of ``group``: what an executor yields for a task that failed for good."""
    rows = []
    for point in group:
        row = blank_row(point)
        row["reason"] = reason
        rows.append(row)
    return rows


def group_points(points: Iterable[Point]) -> list[list[Point]]:
    """The points by model, in first-seen order (one task per model: its cache serves all its points)."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(p.model, []).append(p)
    return list(groups.values())


def sweep(points: Sequence[Point], out_dir: str | os.PathLike, *, workers: int | None = None,
          executor: PointExecutor | None = None, progress: Progress | None = None,
          retry_failed: bool = False) -> Path:
    """Evaluate ``points`` into ``out_dir/results.csv`` (module docstring) and return its path. ``progress``:
    called after each row (default: a bar on stderr with the count, points/s and the ETA)."""
    from torch_ir.fileio import make_output_dir

    out = make_output_dir(out_dir, "sweep output directory")
    path = out / RESULTS_CSV
    done = read_results(path)
    skip = {k for k, row in done.items() if not (retry_failed and row.get("status") != "ok")}
    todo = list({p.key: p for p in points if p.key not in skip}.values())  # a point given twice is done once
    report = progress or _bar(len(todo))
    start = time.perf_counter()
    with open(path, "a", encoding="utf-8", newline="") as f:
        if f.tell() == 0:
            _write_line(f, COLUMNS)
        for count, row in enumerate((executor or LocalExecutor(workers)).map_groups(evaluate_group,
                                                                                    group_points(todo)), 1):
            _write_line(f, [_cell(row.get(c), c) for c in COLUMNS])
            report(count, len(todo), time.perf_counter() - start)
    if progress is None:
        report(-1, len(todo), 0.0)  # closes the bar
    write_table(path, read_results(path))
    return path


def _write_line(f: io.TextIOBase, cells: Sequence[str]) -> None:
    """One whole CSV line in one write, flushed: an interruption leaves complete lines and at most a cut last one,
    which ``read_results`` drops."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    f.write(buf.getvalue())
    f.flush()


def _cell(value: object, column: str) -> str:
    """A value as the table holds it: repr for a float (it reads back exactly), empty for none. The ``reason`` is
    free text from an exception, which may quote a model file's names: one plain line, neutralized for spreadsheets
    as the cost report's cells are (``csv_value``); the key and the parameters must read back exactly (resume)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(csv_value(str(value))) if column == "reason" else str(value)


def read_results(path: Path) -> dict[str, dict[str, str]]:
    """The rows of a results file by key (the last row of a key wins); {} when there is none. A last line cut off
    by an interrupted run is removed from the file. A file with other columns is refused (``SweepError``)."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):  # the line being written when the run stopped: not a result
        data = data[:data.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(len(data))
    if not data:
        return {}
    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace"), newline=""))
    header = next(reader, None)
    if header != list(COLUMNS):
        raise SweepError(f"{path}: its columns are not a sweep's results of this version ({len(header or [])} "
                         f"columns, expected {len(COLUMNS)}: {', '.join(COLUMNS[:4])}, ...); fix: give another -o "
                         "directory, or move the file away")
    return {cells[0]: dict(zip(COLUMNS, cells)) for cells in reader if len(cells) == len(COLUMNS)}


def write_table(path: Path, rows: dict[str, dict[str, str]]) -> None:
    """The final table: every row sorted by key, written whole or not at all; ``results.parquet`` beside it when
    pyarrow is installed."""
    from torch_ir.fileio import atomic_write

    ordered = [rows[k] for k in sorted(rows)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([r.get(c, "") for c in COLUMNS] for r in ordered)
    atomic_write(path, buf.getvalue(), what="sweep results")
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        return
    table = pacsv.read_csv(pa.BufferReader(buf.getvalue().encode()))

    def write(f: object) -> None:
        pq.write_table(table, f)

    atomic_write(path.with_name(RESULTS_PARQUET), write, what="sweep results (Parquet)")


def _bar(total: int) -> Progress:
    from tqdm import tqdm

    bar = tqdm(total=total, desc="sweep", unit="point", disable=None, file=sys.stderr)

    def report(done: int, total: int, elapsed: float) -> None:
        if done < 0:
            bar.close()
        else:
            bar.update(1)

    return report


__all__ = ["RESULTS_CSV", "RESULTS_PARQUET", "LocalExecutor", "PointExecutor", "Progress", "failed_rows",
           "group_points", "read_results", "sweep", "write_table"]
