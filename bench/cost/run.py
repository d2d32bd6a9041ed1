"""The cost model against SCALE-Sim v3: compute cycles and SRAM/DRAM traffic of GEMM and convolution shapes from
ResNet-50, BERT-base and Qwen2-0.5B, both tools on the same array, with both tools' run time.

    .venv/bin/python bench/cost/run.py                          # 24 shapes, 64 x 64 output-stationary
    .venv/bin/python bench/cost/run.py --dataflow ws is         # the other dataflows
    .venv/bin/python bench/cost/run.py --only bert --jobs 1 --json cost.json

Needs ``pip install scalesim`` (3.0.0). Each shape runs through ``npu_compiler.costmodel.crosscheck``: ours is
a one-dispatch program through ``cost_program`` (int8: a byte is a SCALE-Sim word), theirs is SCALE-Sim's layer
simulation in its CALC bandwidth mode (no DRAM stalls). Per shape the table gives both figures and the
difference (ours - theirs) / theirs; then the median and max |difference| per figure and both tools' run time.
Exits 1 when a gated figure of any shape is more than 10 % off (DRAM writes under ws/is are not gated: SCALE-Sim
writes every K fold's partial sums to DRAM, we accumulate on chip; see docs/cost_model.md).

Why this configuration: SCALE-Sim walks every SRAM access in Python (0.1 to 0.4 M reads a second here), so a
shape costs it roughly M*K*ceil(N/C) + K*N*ceil(M/R) reads. A 64 x 64 array keeps the 24 shapes at about
80 M reads, about 6 minutes on two cores with ``--jobs 2`` (on a 16 x 16 array BERT's FFN alone takes 8
minutes; ``--only`` picks a subset). Each SRAM is 64 MiB so that every operand stays resident in SCALE-Sim's
double-buffered scratchpad (whose active half is what it hits in): both tools then read each DRAM word once, and
its hit check, which walks the SRAM's filled sets, stays short. Batch 1; ResNet-50 at 224 x 224;
BERT-base at sequence 128;
Qwen2-0.5B (hidden 896, 14 query and 2 key/value heads of 64, FFN 4864) with a 32-token prefill chunk and
one-token decode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_compiler.costmodel.crosscheck import (  # noqa: E402
    METRICS,
    TOLERANCE,
    ArrayConfig,
    Comparison,
    Figures,
    Shape,
    ours,
    theirs,
)

R50, BERT, QWEN = "ResNet-50", "BERT-base", "Qwen2-0.5B"
SHAPES = [
    Shape.conv("r50.conv1", R50, 224, 7, 3, 64, stride=2, pad=3),  # the 7x7 stem
    Shape.conv("r50.l1.conv1", R50, 56, 1, 64, 64),
    Shape.conv("r50.l1.conv2", R50, 56, 3, 64, 64, pad=1),
    Shape.conv("r50.l1.conv3", R50, 56, 1, 64, 256),
    Shape.conv("r50.l2.conv2", R50, 56, 3, 128, 128, stride=2, pad=1),  # strided 3x3
    Shape.conv("r50.l2.downsample", R50, 56, 1, 256, 512, stride=2),  # strided 1x1: reads a quarter
    Shape.conv("r50.l3.conv2", R50, 14, 3, 256, 256, pad=1),
    Shape.conv("r50.l3.conv1", R50, 14, 1, 1024, 256),
    Shape.conv("r50.l4.conv2", R50, 7, 3, 512, 512, pad=1),
    Shape.conv("r50.l4.conv3", R50, 7, 1, 512, 2048),
    Shape.gemm("r50.fc", R50, 1, 1000, 2048),
    Shape.gemm("bert.qkv", BERT, 128, 2304, 768),
    Shape.gemm("bert.attn_out", BERT, 128, 768, 768),
    Shape.gemm("bert.ffn_up", BERT, 128, 3072, 768),
    Shape.gemm("bert.ffn_down", BERT, 128, 768, 3072),
    Shape.gemm("bert.scores", BERT, 128, 128, 64),  # one head: q kᵀ
    Shape.gemm("bert.context", BERT, 128, 64, 128),  # one head: p v
    Shape.gemm("qwen2.prefill.qkv", QWEN, 32, 1152, 896),
    Shape.gemm("qwen2.prefill.gate", QWEN, 32, 4864, 896),
    Shape.gemm("qwen2.prefill.down", QWEN, 32, 896, 4864),
    Shape.gemm("qwen2.decode.qkv", QWEN, 1, 1152, 896),
    Shape.gemm("qwen2.decode.o_proj", QWEN, 1, 896, 896),
    Shape.gemm("qwen2.decode.down", QWEN, 1, 896, 4864),
    Shape.gemm("qwen2.decode.scores", QWEN, 1, 512, 64),  # one head over a 512-token cache
]
SHORT = {"compute_cycles": "cycles", "sram_reads": "SRAM rd", "sram_writes": "SRAM wr", "dram_reads": "DRAM rd",
         "dram_writes": "DRAM wr"}


def _theirs_one(args: tuple[Shape, ArrayConfig]) -> Figures:
    shape, config = args
    return theirs([shape], config)[0]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(shapes: list[Shape], config: ArrayConfig, jobs: int) -> tuple[list[Comparison], float, float]:
    """Both tools on every shape: (comparisons, our wall seconds, SCALE-Sim's wall seconds)."""
    hw = config.hardware()
    start = time.perf_counter()
    mine = [ours(s, config, hw) for s in shapes]
    ours_wall = time.perf_counter() - start
    start = time.perf_counter()
    work = [(s, config) for s in shapes]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            their = []
            for shape, figures in zip(shapes, pool.map(_theirs_one, work)):
                log(f"  {config.dataflow} {shape.name}: SCALE-Sim {figures.seconds:.1f} s")
                their.append(figures)
    else:
        their = []
        for item in work:
            their.append(_theirs_one(item))
            log(f"  {config.dataflow} {item[0].name}: SCALE-Sim {their[-1].seconds:.1f} s")
    theirs_wall = time.perf_counter() - start
    return [Comparison(s, config, a, b) for s, a, b in zip(shapes, mine, their)], ours_wall, theirs_wall


def print_table(rows: list[Comparison]) -> None:
    head = f"{'shape':<22} {'GEMM / conv':<32}" + "".join(f" {SHORT[m]:>22}" for m in METRICS) + f" {'SCALE-Sim s':>11}"
    print(head)
    print(f"{'':<55}" + "".join(f" {'ours / theirs  diff':>22}" for _ in METRICS))
    for c in rows:
        cells = []
        for m in METRICS:
            mark = "" if c.gated(m) else "*"
            cells.append(f" {_short(c.ours.get(m)):>7}/{_short(c.theirs.get(m)):<7}{100 * c.diff(m):+6.1f}%{mark:1}")
        print(f"{c.shape.name:<22} {c.shape.label:<32}" + "".join(cells) + f" {c.theirs.seconds:>11.2f}")


def _short(value: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= 10 * scale:
            return f"{value / scale:.1f}{unit}" if value < 100 * scale else f"{value / scale:.0f}{unit}"
    return str(value)


def summary(rows: list[Comparison]) -> list[str]:
    lines = []
    for m in METRICS:
        diffs = [abs(c.diff(m)) for c in rows if c.gated(m)]
        if diffs:
            lines.append(f"  {SHORT[m]:<8} median |diff| {100 * statistics.median(diffs):6.3f} %   "
                         f"max |diff| {100 * max(diffs):6.3f} %   ({len(diffs)} shapes gated)")
        ungated = [c.diff(m) for c in rows if not c.gated(m)]
        if ungated:
            lines.append(f"  {SHORT[m]:<8} not gated (by design) on {len(ungated)} shapes: ours is "
                         f"{100 * min(ungated):+.0f} % to {100 * max(ungated):+.0f} % of theirs")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--dataflow", nargs="+", default=["os"], choices=["os", "ws", "is"])
    ap.add_argument("--sram-kib", type=int, default=65536, help="each of the IFMAP, filter and OFMAP SRAMs")
    ap.add_argument("--only", default="", help="shapes whose name contains this (e.g. bert, r50, qwen2.decode)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="SCALE-Sim processes")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    shapes = [s for s in SHAPES if args.only in s.name]
    if not shapes:
        ap.error(f"--only {args.only!r} matches no shape")
    failed, everything = 0, []
    for dataflow in args.dataflow:
        config = ArrayConfig(args.rows, args.cols, dataflow, args.sram_kib, args.sram_kib, args.sram_kib)
        log(f"{len(shapes)} shapes on {args.rows}x{args.cols} {dataflow}, SCALE-Sim in {args.jobs} process(es)")
        rows, ours_wall, theirs_wall = run(shapes, config, args.jobs)
        everything += rows
        print(f"\n== {args.rows}x{args.cols} {dataflow}, SRAM {args.sram_kib} KiB each, words "
              f"(* = differs by design, not gated) ==")
        print_table(rows)
        print("\n".join(summary(rows)))
        ours_cpu = sum(c.ours.seconds for c in rows)
        theirs_cpu = sum(c.theirs.seconds for c in rows)
        print(f"  run time: ours {1000 * ours_wall:.1f} ms ({1000 * ours_cpu:.1f} ms in cost_program), SCALE-Sim "
              f"{theirs_wall:.1f} s wall in {args.jobs} process(es) ({theirs_cpu:.1f} s summed over shapes): "
              f"{theirs_cpu / max(ours_cpu, 1e-9):,.0f}x")
        bad = [c for c in rows if not c.ok()]
        for c in bad:
            print(f"  BEYOND {100 * TOLERANCE:.0f} %: {c.shape.name} ({100 * c.worst():.1f} %)")
        failed += len(bad)
    if args.json:
        Path(args.json).write_text(json.dumps([{"shape": asdict(c.shape), "config": asdict(c.config),
                                                "ours": asdict(c.ours), "theirs": asdict(c.theirs),
                                                "diff": {m: c.diff(m) for m in METRICS}} for c in everything],
                                              indent=1))
    print(f"\n{'FAIL' if failed else 'OK'}: {failed} of {len(everything)} shape runs beyond {100 * TOLERANCE:.0f} %")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
