"""Design-space sweep at scale on this machine (issue 33, item 4): points per second, the time in each phase, and
1 against 2 workers; then the cost-only part of a 10,000-point sweep, timed.

    .venv/bin/python bench/sweep/run.py                        # both parts, as README.md reports them
    .venv/bin/python bench/sweep/run.py --workers 1 2 4 --json sweep.json
    .venv/bin/python bench/sweep/run.py --skip-full            # the 10,000-point cost-only sweep alone
    .venv/bin/python bench/sweep/run.py --ray auto             # the full sweep on Ray as well

Full sweep: 12 models (``ZOO_MODELS``: 10 small zoo models, CNNs, a U-Net, a detector, attention blocks, a tiny
BERT and ViT; and ``HF_CONFIGS``: BERT-base and DistilBERT at full size, from config.json files) x 50
hardware points (edge_4tops with 5 arrays x 10 SRAM sizes) x 3 precisions (fp16, w8a8, w4a16) = 1,800 points, run
once per worker count, each into a fresh directory (no resume, no cache carried over: every run extracts,
compiles, calibrates and evaluates every model again). The phase times are the sums of the rows' ``t_*`` columns
(seconds of work summed over the workers; the wall time is the run's).

Cost-only sweep: the first 10 of those models x 500 hardware points (25 arrays x 10 SRAM sizes x 2 DRAM
bandwidths) x 2 float precisions (fp16, bf16): 10,000 points, no quantization (a float precision is costed on the
float program as if at that width), on ``--cost-workers`` workers (default: the machine's cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_tools.sweep.engine import PHASES  # noqa: E402
from npu_tools.sweep.grid import expand  # noqa: E402
from npu_tools.sweep.run import LocalExecutor, sweep  # noqa: E402

ZOO_MODELS = ["convnet", "residual", "unet", "two_tower", "tied_lm", "mhsa", "sdpa_block", "tiny_yolo", "bert",
              "vit"]
#: Two models of real size, as Hugging Face config.json files (weight-free; seeded weights where a precision
#: quantizes): the zoo's are tiny, and a sweep's time goes into calibrating and evaluating models like these.
HF_CONFIGS = {
    "bert_base": {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
                  "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu", "pad_token_id": 0},
    "distilbert": {"architectures": ["DistilBertModel"], "model_type": "distilbert", "dim": 768, "n_layers": 6,
                   "n_heads": 12, "hidden_dim": 3072, "vocab_size": 30522, "max_position_embeddings": 512,
                   "activation": "gelu", "pad_token_id": 0},
}
HW = "edge_4tops"
ARRAYS = [(8, 8), (16, 16), (32, 32), (64, 64), (128, 128)]
SRAM_KIB = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
PRECISIONS = ["fp16", "w8a8", "w4a16"]
COST_ONLY_ARRAYS = [(r, c) for r in (8, 16, 32, 64, 128) for c in (8, 16, 32, 64, 128)]
COST_ONLY_DRAM = [8, 32]
COST_ONLY_PRECISIONS = ["fp16", "bf16"]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_once(points: list, executor: object, label: str) -> dict:
    """One sweep into a fresh directory: wall time, points/s, ok and failed counts, phase sums, failure reasons."""
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as out:
        start = time.perf_counter()
        path = sweep(points, out, executor=executor, progress=lambda *a: None)
        wall = time.perf_counter() - start
        rows = _rows(path)
    ok = sum(r["status"] == "ok" for r in rows)
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] != "ok":
            reasons[f"{r['model']}: {r['reason'][:160]}"] = reasons.get(f"{r['model']}: {r['reason'][:160]}", 0) + 1
    phases = {p: sum(float(r[f"t_{p}"] or 0) for r in rows) for p in PHASES}
    return {"label": label, "points": len(rows), "ok": ok, "failed": len(rows) - ok, "wall_s": wall,
            "points_per_s": len(rows) / wall if wall else 0.0, "phase_s": phases, "failures": reasons}


def one_thread(points: list) -> dict:
    """1 worker with one torch thread, as each of N workers gets cores / N: one worker runs in this process with
    all the cores' threads, so this is the run the 2-worker one scales from core for core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_once(points, LocalExecutor(1), "local, 1 worker, 1 torch thread")
    finally:
        torch.set_num_threads(threads)


def write_configs(directory: Path) -> list[str]:
    """``HF_CONFIGS`` as ``directory/NAME/config.json``; their paths, the models' names in the table."""
    paths = []
    for name, config in HF_CONFIGS.items():
        (directory / name).mkdir()
        (directory / name / "config.json").write_text(json.dumps(config))
        paths.append(str(directory / name / "config.json"))
    return paths


def full_points(models: list[str]) -> list:
    return expand(models, [HW], {"array": ARRAYS, "sram_kib": SRAM_KIB}, PRECISIONS)


def cost_only_points(models: list[str]) -> list:
    return expand(models[:10], [HW], {"array": COST_ONLY_ARRAYS, "sram_kib": SRAM_KIB, "dram_gbps": COST_ONLY_DRAM},
                  COST_ONLY_PRECISIONS)


def print_table(results: list[dict]) -> None:
    head = ["run", "points", "ok", "failed", "wall s", "points/s", *(f"{p} s" for p in PHASES)]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        cells = [r["label"], r["points"], r["ok"], r["failed"], f"{r['wall_s']:.1f}", f"{r['points_per_s']:.1f}",
                 *(f"{r['phase_s'][p]:.1f}" for p in PHASES)]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    for base in [r for r in results if r["label"].startswith("local, 1 worker")]:
        for r in results:
            if r["label"].startswith("local") and not r["label"].startswith("local, 1 worker"):
                print(f"{r['label']}: {base['wall_s'] / r['wall_s']:.2f}x the speed of {base['label'][7:]}")
    for r in results:
        for reason, count in sorted(r["failures"].items()):
            print(f"  {r['label']}: {count} failed: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts of the full sweep")
    parser.add_argument("--cost-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ray", metavar="ADDRESS", help="also run the full sweep on Ray (auto: a local instance)")
    parser.add_argument("--skip-full", action="store_true", help="only the cost-only sweep")
    parser.add_argument("--skip-cost-only", action="store_true", help="only the full sweep")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sweep-models-") as configs:
        results = run_all(args, ZOO_MODELS + write_configs(Path(configs)))
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


def run_all(args: argparse.Namespace, models: list[str]) -> list[dict]:
    results = []
    if not args.skip_full:
        points = full_points(models)
        print(f"full sweep: {len(models)} models x {len(ARRAYS) * len(SRAM_KIB)} hardware points x "
              f"{len(PRECISIONS)} precisions = {len(points)} points", file=sys.stderr)
        for n in args.workers:
            label = f"local, {n} worker" + ("s" if n > 1 else "")
            results.append(run_once(points, LocalExecutor(n), label))
            print(f"  {label}: {results[-1]['wall_s']:.1f} s", file=sys.stderr)
            if n == 1 and (os.cpu_count() or 1) > 1:
                results.append(one_thread(points))
        if args.ray:
            from npu_tools.sweep.ray_executor import RayExecutor

            results.append(run_once(points, RayExecutor(args.ray), f"ray {args.ray}"))
    if not args.skip_cost_only:
        points = cost_only_points(models)
        print(f"cost-only sweep: {len(points)} points on {args.cost_workers} workers", file=sys.stderr)
        results.append(run_once(points, LocalExecutor(args.cost_workers),
                                f"cost-only, {args.cost_workers} workers"))
    return results


if __name__ == "__main__":
    sys.exit(main())
