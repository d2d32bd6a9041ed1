"""fp32, bf16 and int8 inference of our compiler + CPU runtime against onnxruntime and OpenVINO (issue 30, items 3-4).

    bash bench/runtime/peers/setup.sh                                  # the peers' venv, once
    .venv/bin/python bench/runtime/precision.py                        # ResNet-18, ResNet-50, BERT-base; all three
    .venv/bin/python bench/runtime/precision.py --models resnet50 --precisions int8 --runs 50 --json int8.json
    .venv/bin/python bench/runtime/precision.py --quick --runs 3       # small inputs and a small BERT: a smoke run
    .venv/bin/python bench/runtime/precision.py --models bert --profile 5  # + our per-kernel profiles

Batch 1. Per model and precision, our runtime and the peers that run that precision:

* fp32: ours (the IR extracted from the model), onnxruntime and OpenVINO f32 (the float ONNX export);
* bf16: ours with ``CompileOptions(precision="bf16")`` (the IR cast at compile time),
  OpenVINO with the bf16 inference precision hint (it says what it executed: on a CPU without bf16 it runs f32);
* int8: the one per-channel QDQ model onnxruntime's ``quantize_static`` makes from the float export (seeded random
  calibration inputs): ours imports and compiles it, onnxruntime and OpenVINO run it.

Peers run in workers (``peers/worker.py``) under the peers' own interpreter (``peers/setup.sh``), one per engine,
precision and model, kept alive while the model is timed; all runners of a model are timed in alternating blocks
(``blocks.time_blocks``), ours in this process. Before timing, every runner's output is compared with the fp32
PyTorch model's (top-5 classes for ResNet, max abs error and cosine of BERT's pooled output). Beside the times: the
cost model's latency of each of our programs on ``--hw`` and its speed-up over our fp32 program, next to the
measured one. A runner that cannot compile, load or run says why in its cell and the rest goes on.
Markdown to stdout, progress to stderr, every sample with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from blocks import BlockTimer, time_blocks, timed_calls
from int8_peak import contraction_macs, measure_int8_peak
from peers.client import Peer, PeerError, peer_python
from precision_models import MODELS, Model, agreement, build, onnx_files
from qdq import ort_int8_saturates, output_step
from run import cpu_pressure, log, machine, ours_runner

import npu_compiler
from npu_compiler.compiled_program import CompiledProgram
from npu_compiler.costmodel import cost_program, load_hardware, presets
from npu_runtime import CPUBackend, Device, Executor, NPUBuffer, load_weights
from npu_runtime.profile import Spread
from torch_ir.frontends.onnx import import_onnx
from torch_ir.weights import module_state

PRECISIONS = ("fp32", "bf16", "int8")
# who runs each precision, besides ours (onnxruntime's CPU provider has no bf16 compute to ask for)
PEERS = {"fp32": ("ort", "openvino"), "bf16": ("openvino",), "int8": ("ort", "openvino")}
LABELS = {"ours": "ours", "ort": "onnxruntime", "openvino": "openvino"}
TARGET_RATIO = 1.0  # ours / the fastest peer of the precision (issue 30)
ROUNDS = 5  # of alternating blocks (fewer when --runs is smaller: a block has at least one run)


@dataclass
class Runner:
    """One runner of one model at one precision: a block timer, its output, or why it has none (``status``)."""

    who: str  # ours, ort, openvino
    precision: str
    timer: BlockTimer | None = None
    output: np.ndarray | None = None
    status: str = ""  # the cell's short reason when it cannot run; empty when it runs
    detail: dict[str, Any] = field(default_factory=dict)  # executed precision, versions, the full error
    program: CompiledProgram | None = None
    close: Any = None
    profile: Any = None  # ours: runs -> the per-kernel profile's table (Executor.profile)

    @property
    def key(self) -> str:
        return f"{self.who} {self.precision}"


def short(err: BaseException) -> str:
    """An error as a table cell: a worker's own short form, else the type and the start of the first line."""
    if isinstance(err, PeerError) and err.short:
        return f"fails: {err.short}"
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"fails: {type(err).__name__}" + (f": {first[:60]}" if first else "")


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def failed(runner: Runner, err: BaseException) -> Runner:
    runner.status = short(err)
    runner.detail["error"] = one_line(f"{type(err).__name__}: {err}")
    log(f"{runner.key}: {runner.detail['error']}")
    return runner


def guarded(runner: Runner) -> BlockTimer:
    """``runner``'s timer, which on an error (a worker that died, a kernel that failed on the nth run) records why
    and gives no more samples: the runner's cell then says why, and the other runners go on."""
    def block(n: int) -> list[float]:
        if runner.status:
            return []
        try:
            return runner.timer(n)
        except Exception as err:  # the cell says why; the other runners go on
            failed(runner, err)
            return []

    return block


# -- ours ------------------------------------------------------------------------------------------------

def ours_program(model: Model, precision: str, files: dict[str, Path]) -> tuple[CompiledProgram, Any]:
    """Our program at ``precision`` and the weights it binds. Host fallback on, so that a node without a CPU kernel
    (BERT's id wrap in the imported QDQ model) runs by its reference rather than failing the row."""
    if precision == "int8":
        ir, weights = import_onnx(files["int8"])
        return npu_compiler.compile(ir, fallback="cpu"), {k: v.contiguous() for k, v in weights.items()}
    options = npu_compiler.CompileOptions(precision=precision) if precision != "fp32" else None
    return npu_compiler.compile(model.ir, options=options, fallback="cpu"), module_state(model.real)


def make_ours(model: Model, precision: str, files: dict[str, Path]) -> Runner:
    runner = Runner("ours", precision)
    try:
        program, weights = ours_program(model, precision, files)
        device = Device(CPUBackend())
        bound = load_weights(weights, program, device)
        inputs = {spec.name: NPUBuffer.from_numpy(value, device, spec=spec)
                  for spec, value in zip(program.input_specs, model.feeds.values())}
        executor = Executor(program, device)
        run = ours_runner(executor, bound, inputs)
        runner.output = run()
    except Exception as err:  # the row says why; the other rows go on
        return failed(runner, err)
    runner.program, runner.timer = program, timed_calls(run)
    def profile(runs: int) -> str:
        try:
            return executor.profile(inputs, bound, runs=runs, warmup=1).table()
        except Exception as err:  # a profile is extra: its failure is said, the results stand
            return f"profile failed: {one_line(f'{type(err).__name__}: {err}')}"

    runner.profile = profile
    runner.detail["host_dispatches"] = sum(d.host is not None for d in program.dispatches)
    runner.detail["kernels"] = program.kernel_histogram()
    return runner


# -- peers -----------------------------------------------------------------------------------------------

def make_peer(engine: str, precision: str, model: Model, files: dict[str, Path], threads: int) -> Runner:
    runner = Runner(engine, precision)
    python, where = peer_python(engine)
    if python is None:
        runner.status = f"n/a ({where})"
        return runner
    path = files["int8" if precision == "int8" else "fp32"]
    try:
        peer = Peer(engine, precision, path, threads, python)
    except PeerError as err:
        return failed(runner, err)
    runner.close = peer.close
    runner.detail.update(peer.info, environment=where)
    try:
        runner.output = peer.run(model.feeds)
    except PeerError as err:
        peer.close()
        return failed(runner, err)
    runner.timer = peer.block
    return runner


def executed_note(runner: Runner) -> str:
    """What OpenVINO ran when it differs from what was asked (bf16 asked, f32 run on a CPU without bf16)."""
    executed = runner.detail.get("executed", {})
    main = executed.get("main")
    expected = {"fp32": ("f32",), "bf16": ("bf16",), "int8": ("u8", "i8")}[runner.precision]
    return f" (ran {main})" if runner.who == "openvino" and main and main not in expected else ""


# -- one model -------------------------------------------------------------------------------------------

def bench_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    log(f"{name}: building (seeded weights){' at the quick sizes' if args.quick else ''}...")
    model = build(name, args.quick)
    log(f"{name}: ONNX export and the per-channel QDQ model (quantize_static)...")
    files = onnx_files(model, tmp)
    runners: list[Runner] = []
    try:
        for precision in args.precisions:
            log(f"{name}: {precision}: compiling ours, starting the peers...")
            runners.append(make_ours(model, precision, files))
            runners += [make_peer(engine, precision, model, files, args.threads) for engine in PEERS[precision]]
        compare(name, model, runners, files)
        timers = {r.key: guarded(r) for r in runners if r.timer is not None}
        log(f"{name}: timing {args.runs} runs after {args.warmup} warm-up, in blocks of {' / '.join(timers)}...")
        pressure: dict[str, str] = {}
        with cpu_pressure(pressure, "timed"):
            samples = time_blocks(timers, args.runs, args.warmup, rounds=min(ROUNDS, args.runs))
        profiles = {r.precision: r.profile(args.profile) for r in runners if r.profile and args.profile}
    finally:
        for r in runners:
            if r.close:
                r.close()
    for precision, text in profiles.items():
        print(f"\n### {name}, ours {precision}: per-kernel profile ({args.profile} runs)\n\n```\n{text}\n```")
    return {"model": name, "shape": model.shape, "pressure": pressure.get("timed", "n/a"),
            "macs": contraction_macs(model.real, tuple(torch.from_numpy(v) for v in model.feeds.values()))
            if "int8" in args.precisions else 0,  # a forward pass, for the int8 rates of notes() only
            "costs": costs(runners, args.hw), "runners": [_row(r, samples.get(r.key)) for r in runners]}


def compare(name: str, model: Model, runners: list[Runner], files: dict[str, Path]) -> None:
    """Every runner's output against the fp32 PyTorch model's; ours int8 also against onnxruntime's run of the same
    QDQ file (the integer arithmetic both should do: within a few output quantization steps)."""
    reference = model.reference()
    for r in runners:
        if r.output is not None:
            r.detail["agreement"] = agreement(model.kind, reference, r.output)
            log(f"{name}: {r.key}: {r.detail['agreement']['text']}{executed_note(r)}")
    outputs = {r.key: r.output for r in runners if r.output is not None}
    if "ours int8" in outputs and "ort int8" in outputs:
        ours, ort = (np.asarray(outputs[k], dtype=np.float64).reshape(-1) for k in ("ours int8", "ort int8"))
        vs = agreement(model.kind, ort, ours) if ours.shape == ort.shape else {"text": "other shape"}
        if ours.shape == ort.shape:
            vs["max_abs_diff"] = float(np.max(np.abs(ours - ort)))
            vs["output_step"] = output_step(files["int8"])  # None: a float op makes the output
            steps = f" ({vs['max_abs_diff'] / vs['output_step']:.1f} output steps)" if vs["output_step"] else ""
            vs["text"] += f", max abs diff {vs['max_abs_diff']:.2e}{steps}"
        vs["ort_saturates"] = ort_int8_saturates()
        if vs["ort_saturates"]:
            vs["text"] += (" (this x86 CPU has no VNNI: onnxruntime's fused u8s8 kernels sum pairs of products in "
                           "int16 with saturation, so its int8 result is the approximate one; compare each with fp32)")
        next(r for r in runners if r.key == "ours int8").detail["vs_ort_int8"] = vs
        log(f"{name}: ours int8 vs onnxruntime int8 (the same QDQ file): {vs['text']}")


def _row(runner: Runner, samples: list[float] | None) -> dict[str, Any]:
    row = {"who": runner.who, "precision": runner.precision, "status": runner.status, "samples_ms": samples or [],
           "detail": runner.detail}
    if samples and not runner.status:  # a runner that failed part-way has no median to compare
        row["median_ms"] = statistics.median(samples)
    return row


def costs(runners: list[Runner], hw_name: str) -> dict[str, dict[str, Any]]:
    """The cost model on each of our programs (item 4): latency, DRAM bytes by role and the widths it computes in;
    without a bf16 program, the fp32 one costed at bf16 (a what-if, labelled as such)."""
    hw = load_hardware(hw_name)
    out: dict[str, dict[str, Any]] = {}
    for r in runners:
        if r.who != "ours" or r.program is None:
            continue
        try:
            report = cost_program(r.program, hw)
        except Exception as err:  # a program the cost model refuses: said, not fatal
            out[r.precision] = {"error": short(err)}
            continue
        out[r.precision] = {"latency_ms": report.latency_ms, "weight_bytes": report.weight_bytes,
                            "activation_bytes": report.activation_bytes, "widths": report.width_mix(),
                            "host_dispatches": len(report.host)}
    return out


# -- report ----------------------------------------------------------------------------------------------

def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    if row["status"] or not row["samples_ms"]:
        return row["status"] or "not timed"
    spread = Spread.of(row["samples_ms"])
    return f"{spread.median:.2f} [{spread.p10:.2f}-{spread.p90:.2f}]" + executed_note(
        Runner(row["who"], row["precision"], detail=row["detail"]))


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n## Batch 1, median ms [p10-p90] of {args.runs} runs after {args.warmup} warm-up, alternating blocks, "
          f"{args.threads} threads each\n")
    print(f"| model | precision | ours | onnxruntime | openvino | ours / fastest peer (≤ {TARGET_RATIO:g}) | "
          f"agreement with fp32 PyTorch: ours; onnxruntime; openvino | cost model ms ({args.hw}) | "
          f"speed-up over our fp32: predicted, measured |")
    print("|---|---|---:|---:|---:|---:|---|---:|---|")
    for result in results:
        rows = {(r["who"], r["precision"]): r for r in result["runners"]}
        ours_fp32 = rows.get(("ours", "fp32"), {}).get("median_ms")
        fp32_cost = result["costs"].get("fp32", {}).get("latency_ms")
        for precision in args.precisions:
            ours = rows.get(("ours", precision))
            peers = [rows.get((e, precision)) for e in ("ort", "openvino")]
            fastest = min((p["median_ms"] for p in peers if p and "median_ms" in p), default=None)
            ratio = "—"
            if ours and "median_ms" in ours and fastest:
                ratio = f"{ours['median_ms'] / fastest:.2f}" + ("" if ours["median_ms"] <= fastest else " (missed)")
                if precision == "fp32" and not ours["detail"].get("agreement", {}).get("fp32_ok", False):
                    ratio += " (ours WRONG: see agreement)"
            agree = "; ".join(r["detail"].get("agreement", {}).get("text", "—") if r else "—"
                              for r in [ours, *peers])
            cost = result["costs"].get(precision, {})
            predicted = (f"{fp32_cost / cost['latency_ms']:.2f}x" if fp32_cost and cost.get("latency_ms")
                         else "n/a")
            measured = (f"{ours_fp32 / ours['median_ms']:.2f}x" if ours_fp32 and ours and "median_ms" in ours
                        else "n/a")
            cost_cell = f"{cost['latency_ms']:.3f}" if "latency_ms" in cost else cost.get("error", "n/a")
            print(f"| {result['model']} ({result['shape']}) | {precision} | {cell(ours)} | {cell(peers[0])} | "
                  f"{cell(peers[1])} | {ratio} | {agree} | {cost_cell} | {predicted}, {measured} |")


def notes(results: list[dict[str, Any]], info: dict[str, Any]) -> None:
    print(f"\nmachine: {info['processor']}, {info['cpu_count']} CPUs; harness torch {info['torch']}, "
          f"onnxruntime {info['onnxruntime']}, Python {info['python']}")
    for result in results:
        print(f"\n**{result['model']}** (CPU pressure while timed: {result['pressure']})")
        for r in result["runners"]:
            d = r["detail"]
            if r["who"] != "ours" and "version" in d:
                executed = d.get("executed", {})
                what = (f"executed {executed.get('main')} (hint {executed.get('hint')}; heavy ops "
                        f"{executed.get('heavy_ops')}; kernels {executed.get('kernels')})" if "main" in executed
                        else executed.get("note", ""))
                print(f"- {LABELS[r['who']]} {r['precision']}: {d['version']} from the {d['environment']}; {what}")
            elif r["who"] == "ours" and "kernels" in d:
                vs = f"; against onnxruntime int8 on the same file: {d['vs_ort_int8']['text']}" if (
                    "vs_ort_int8" in d) else ""
                print(f"- ours {r['precision']}: {d['host_dispatches']} host dispatches; kernels {d['kernels']}{vs}")
            if "error" in d or "why" in d:
                print(f"- {LABELS[r['who']]} {r['precision']}: {d.get('error') or d.get('why')}")
        for what, cost in result["costs"].items():
            text = (f"{cost['latency_ms']:.3f} ms" if "latency_ms" in cost else cost["error"])
            if "widths" in cost:
                text += (f"; DRAM weights {cost['weight_bytes']:,} B, activations {cost['activation_bytes']:,} B; "
                         f"compute widths: {cost['widths']}; {cost['host_dispatches']} host dispatches")
            print(f"- cost model, {what}: {text}")
        int8_rates(result, info)


def int8_rates(result: dict[str, Any], info: dict[str, Any]) -> None:
    """Each int8 runner's multiply-adds per second (the model's convolutions and linear layers over its median)
    beside this CPU's int8 peak (``int8_peak.py``): how far each is from the instructions it computes with."""
    macs = result.get("macs", 0)
    timed = [r for r in result["runners"] if r["precision"] == "int8" and "median_ms" in r]
    if not macs or not timed:
        return
    rates = ", ".join(f"{LABELS[r['who']]} {macs / r['median_ms'] / 1e6:.0f}" for r in timed)
    print(f"- int8 GMAC/s ({macs / 1e9:.2f} G multiply-adds in its convolutions and linear layers): {rates}; "
          f"{info['int8_peak']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated: fp32, bf16, int8")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per runner (median and p10-p90 shown)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per runner first")
    parser.add_argument("--threads", type=int, default=None,
                        help=f"threads of every runner (default: torch's, {torch.get_num_threads()})")
    parser.add_argument("--hw", default="edge_4tops", help=f"cost model preset, from: {', '.join(presets())}")
    parser.add_argument("--profile", type=int, default=0, metavar="RUNS",
                        help="also print the per-kernel profile of each of our programs over RUNS runs (default 0: "
                             "none; what limits a ratio that misses)")
    parser.add_argument("--quick", action="store_true", help="small inputs and a small BERT: a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the results (every sample) here")
    args = parser.parse_args(argv)
    for option, known in (("models", MODELS), ("precisions", PRECISIONS)):
        chosen = [n.strip() for n in getattr(args, option).split(",") if n.strip()]
        unknown = [n for n in chosen if n not in known]
        if unknown or not chosen:
            parser.error(f"--{option}: unknown or none {unknown}; choose from {', '.join(known)}")
        setattr(args, option, chosen)
    if args.runs < 1 or args.warmup < 0 or args.profile < 0 or (args.threads is not None and args.threads < 1):
        parser.error("--runs and --threads must be at least 1, --warmup and --profile at least 0")
    if args.hw not in presets():
        parser.error(f"--hw {args.hw!r}: not a preset; choose from {', '.join(presets())}")
    args.threads = args.threads or torch.get_num_threads()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # our CPU backend's kernels run on PyTorch's pool
    results = []
    with tempfile.TemporaryDirectory(prefix="precision-bench-") as tmp:
        for name in args.models:
            folder = Path(tmp) / name
            folder.mkdir()
            results.append(bench_model(name, args, folder))
    info = machine()
    if "int8" in args.precisions:
        log("the int8 dot-product peak of this CPU (int8_peak.c)...")
        peak = measure_int8_peak(args.threads)
        info["int8_peak"], info["int8_peak_gmacs"] = peak.line(), peak.rates
    table(results, args)
    notes(results, info)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "results": results}, indent=1))
    wrong = [result["model"] for result in results for r in result["runners"] if r["who"] == "ours"
             and r["precision"] == "fp32" and not r["detail"].get("agreement", {}).get("fp32_ok", False)]
    if wrong:  # a wrong or missing fp32 output of ours is a bug to see in the exit status, not only in a cell
        log(f"ours fp32 is wrong or did not run on: {', '.join(wrong)} (see the agreement column and the notes)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
