"""Throwaway study: CPU kernel paths for the NPU runtime vs PyTorch eager and onnxruntime.

Hand-wires transformers ResNet-18/50 into a flat list of ``npu_runtime.backends.cpu_kernels`` dispatches
over preallocated buffers, checks it against eager, and times eager / onnxruntime / our dispatch list in
several variants (conv impl, memory format, fused residual, arena-copy vs fresh outputs).

    .venv/bin/python bench/runtime/kernels_study.py [--runs 30] [--threads 2 1] [--models resnet18 resnet50]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from npu_runtime.backends.cpu_kernels import KERNELS  # noqa: E402

CONFIGS = {
    "resnet18": dict(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"),
    "resnet50": dict(
        embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], layer_type="bottleneck"
    ),
}

# name -> (conv impl, channels_last arena, fused residual conv, out_mode)
VARIANTS = {
    "aten_nchw": ("aten", False, False, "arena"),
    "aten_cl": ("aten", True, False, "arena"),
    "mkldnn_nchw": ("mkldnn", False, False, "arena"),
    "mkldnn_cl": ("mkldnn", True, False, "arena"),
    "mkldnn_cl_fused": ("mkldnn", True, True, "arena"),
    "mkldnn_cl_fused_fresh": ("mkldnn", True, True, "fresh"),
    "mkldnn_cl_fused_inplace": ("mkldnn", True, True, "inplace"),
}


def build_model(name: str) -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_labels=1000, **CONFIGS[name])).eval()
    # random BN stats so folding is actually exercised
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model


# --------------------------------------------------------------------------------------------- plan


@dataclass
class Plan:
    """Flat dispatch list: (kernel name, params, input names, output names) plus weights and shapes."""

    impl: str
    channels_last: bool
    fuse_residual: bool
    out_mode: str
    steps: list[tuple[str, dict, list[str], list[str]]] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    counter: int = 0
    aliases: dict[str, str] = field(default_factory=dict)  # output slot -> slot it shares (in-place residual)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def weight(self, name: str, t: torch.Tensor) -> str:
        self.weights[name] = t.detach()
        return name

    def conv(self, conv_layer: nn.Module, x: str, act: str | None, residual: str | None = None) -> str:
        """A ResNetConvLayer / ResNetShortCut (conv + BN [+ act]) as one conv2d dispatch."""
        conv, bn = conv_layer.convolution, conv_layer.normalization
        p = self.fresh("conv")
        ins = [x, self.weight(f"{p}.w", conv.weight)]
        ins += [self.weight(f"{p}.bn.{k}", getattr(bn, k)) for k in ("weight", "bias", "running_mean", "running_var")]
        n, _, h, w = self.shapes[x]
        k, s, pad, d = conv.kernel_size, conv.stride, conv.padding, conv.dilation
        oh = (h + 2 * pad[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
        ow = (w + 2 * pad[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
        params = dict(
            stride=list(s),
            padding=list(pad),
            dilation=list(d),
            groups=conv.groups,
            has_bias=False,
            bn_eps=bn.eps,
            activation=act,
            impl=self.impl,
            out_mode=self.out_mode.replace("inplace", "arena"),
            input_shape=[n, conv.in_channels, h, w],
        )
        out = self.fresh("t")
        self.shapes[out] = (n, conv.out_channels, oh, ow)
        kind = "conv2d"
        if residual is not None:
            kind, ins = "conv2d_add", [*ins, residual]
            if self.out_mode == "inplace":
                params["inplace_residual"] = True
                self.aliases[out] = residual
        self.steps.append((kind, params, ins, [out]))
        return out

    def add(self, a: str, b: str, act: str | None) -> str:
        out = self.fresh("t")
        self.shapes[out] = self.shapes[a]
        self.steps.append(("add", dict(activation=act), [a, b], [out]))
        return out

    def block(self, layer: nn.Module, x: str) -> str:
        short = x if isinstance(layer.shortcut, nn.Identity) else self.conv(layer.shortcut, x, None)
        convs = list(layer.layer)
        h = x
        for c in convs[:-1]:
            h = self.conv(c, h, "relu")
        if self.fuse_residual:
            return self.conv(convs[-1], h, "relu", residual=short)
        return self.add(self.conv(convs[-1], h, None), short, "relu")


def make_plan(model: nn.Module, impl: str, channels_last: bool, fuse: bool, out_mode: str) -> Plan:
    plan = Plan(impl, channels_last, fuse, out_mode)
    plan.shapes["pixel_values"] = (1, 3, 224, 224)
    plan.shapes["x"] = (1, 3, 224, 224)
    plan.steps.append(("copy_view", {}, ["pixel_values"], ["x"]))  # user input -> arena layout
    emb = model.resnet.embedder
    h = plan.conv(emb.embedder, "x", "relu")
    mp = emb.pooler
    n, c, hh, ww = plan.shapes[h]
    out = plan.fresh("t")
    plan.shapes[out] = (
        n,
        c,
        (hh + 2 * mp.padding - mp.kernel_size) // mp.stride + 1,
        (ww + 2 * mp.padding - mp.kernel_size) // mp.stride + 1,
    )
    plan.steps.append(
        (
            "max_pool2d",
            dict(
                kernel_size=mp.kernel_size,
                stride=mp.stride,
                padding=mp.padding,
                out_mode=out_mode.replace("inplace", "arena"),
            ),
            [h],
            [out],
        )
    )
    h = out
    for stage in model.resnet.encoder.stages:
        for layer in stage.layers:
            h = plan.block(layer, h)
    pooled = plan.fresh("t")
    plan.shapes[pooled] = (1, plan.shapes[h][1])
    plan.steps.append(("global_avg_pool", dict(keepdim=False), [h], [pooled]))
    fc = model.classifier[1]
    plan.shapes["logits"] = (1, fc.out_features)
    ins = [pooled, plan.weight("fc.w", fc.weight), plan.weight("fc.b", fc.bias)]
    plan.steps.append(("gemm", dict(trans_b=True, has_bias=True, activation=None), ins, ["logits"]))
    return plan


def alloc(shape: tuple[int, ...], channels_last: bool) -> torch.Tensor:
    if channels_last and len(shape) == 4:
        return torch.empty(shape, memory_format=torch.channels_last)
    return torch.empty(shape)


class Runner:
    """Instantiates kernels for a plan and runs the dispatch loop (arena or fresh-output binding)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.kernels = []
        for kind, params, ins, outs in plan.steps:
            k = KERNELS[kind](params, ins, outs)
            k.prepare(plan.weights)
            self.kernels.append(k)
        self.bufs = {n: alloc(s, plan.channels_last) for n, s in plan.shapes.items() if n not in plan.aliases}
        for out, res in plan.aliases.items():
            while res in plan.aliases:
                res = plan.aliases[res]
            self.bufs[out] = self.bufs[res]
        self.fresh = any(k.returns_fresh for k in self.kernels)
        self.bound = [
            (k.run, [self.bufs[n] for n in k.activation_inputs], [self.bufs[n] for n in k.output_names])
            for k in self.kernels
        ]
        self.named = [
            (k.run, k.activation_inputs, k.output_names, [self.bufs[n] for n in k.output_names]) for k in self.kernels
        ]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.bufs["pixel_values"] = x
        self.bound[0][1][0] = x
        return self.run_fresh() if self.fresh else self.run_arena()

    def run_arena(self) -> torch.Tensor:
        for run, ins, outs in self.bound:
            run(ins, outs)
        return self.bufs["logits"]

    def run_fresh(self) -> torch.Tensor:
        env = dict(self.bufs)
        for run, in_names, out_names, outs in self.named:
            res = run([env[n] for n in in_names], outs)
            if res is not None:
                env.update(zip(out_names, res))
        return env["logits"]

    def overhead_us(self, reps: int = 2000) -> float:
        """Host cost per dispatch: the same loop with every kernel replaced by a no-op of the same call shape."""
        noop = lambda ins, outs: None
        saved = self.bound, self.named
        self.bound = [(noop, i, o) for _, i, o in saved[0]]
        self.named = [(noop, i, n, o) for _, i, n, o in saved[1]]
        x = torch.empty(1, 3, 224, 224)
        for _ in range(50):
            self(x)
        t0 = time.perf_counter()
        for _ in range(reps):
            self(x)
        dt = time.perf_counter() - t0
        self.bound, self.named = saved
        return dt / reps / len(self.kernels) * 1e6


# --------------------------------------------------------------------------------------------- timing


def median_ms(fn, x, runs: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def ort_session(model: nn.Module, x: torch.Tensor, threads: int | None):
    import onnxruntime as ort

    if not hasattr(ort_session, "proto"):
        proto = torch.onnx.export(model, (x,), dynamo=True).model_proto
        proto.ir_version = min(proto.ir_version, 10)
        ort_session.proto = proto.SerializeToString()
    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(ort_session.proto, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda t: sess.run(None, {name: t.numpy()})[0]


def study(model_name: str, threads: int, runs: int) -> list[dict]:
    torch.set_num_threads(threads)
    model = build_model(model_name)
    torch.manual_seed(1)
    x = torch.randn(1, 3, 224, 224)
    rows = []
    with torch.inference_mode():
        ref = model(pixel_values=x).logits
        eager_ms = median_ms(lambda t: model(pixel_values=t), x, runs)
        if hasattr(ort_session, "proto"):
            del ort_session.proto
        ort_default = ort_session(model, x, None)
        ort_n = ort_session(model, x, threads)
        ort_err = (torch.from_numpy(ort_default(x)) - ref).abs().max().item()
        ort_default_ms = median_ms(ort_default, x, runs)
        ort_ms = median_ms(ort_n, x, runs)
        del ort_default, ort_n  # drop ORT sessions so their spinning thread pools cannot steal our cores
        gc.collect()
        print(
            f"[{model_name} threads={threads}] eager {eager_ms:.2f} ms | ort default-threads {ort_default_ms:.2f}"
            f" ms | ort intra_op={threads} {ort_ms:.2f} ms | ort max err {ort_err:.2e}",
            flush=True,
        )
        for vname, (impl, cl, fuse, mode) in VARIANTS.items():
            runner = Runner(make_plan(model, impl, cl, fuse, mode))
            y = runner(x)
            err = (y - ref).abs().max().item()
            top5 = torch.equal(y.topk(5).indices, ref.topk(5).indices)
            ours = median_ms(runner, x, runs)
            rows.append(
                dict(
                    model=model_name,
                    threads=threads,
                    variant=vname,
                    eager=eager_ms,
                    ort=ort_ms,
                    ort_default=ort_default_ms,
                    ours=ours,
                    n=len(runner.kernels),
                    ovh=runner.overhead_us(),
                    err=err,
                    top5=top5,
                )
            )
            print(fmt_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'model':9} {'thr':>3} {'variant':22} {'eager ms':>9} {'ort ms':>8} {'ours ms':>8} {'/eager':>7}"
    f" {'/ort':>6} {'disp':>5} {'ovh us':>7} {'max err':>9} top5"
)


def fmt_row(r: dict) -> str:
    return (
        f"{r['model']:9} {r['threads']:>3} {r['variant']:22} {r['eager']:9.2f} {r['ort']:8.2f} {r['ours']:8.2f}"
        f" {r['ours'] / r['eager']:7.3f} {r['ours'] / r['ort']:6.3f} {r['n']:5d} {r['ovh']:7.2f}"
        f" {r['err']:9.2e} {r['top5']}"
    )


def gemm_micro(runs: int) -> None:
    """fc-layer gemm: addmm(out=) into the arena vs oneDNN linear_pointwise + copy."""
    torch.manual_seed(0)
    for k_dim in (512, 2048):
        w, b, x = torch.randn(1000, k_dim), torch.randn(1000), torch.randn(1, k_dim)
        out = torch.empty(1, 1000)
        ref = torch.nn.functional.linear(x, w, b)
        for impl in ("addmm", "mkldnn"):
            k = KERNELS["gemm"](dict(trans_b=True, has_bias=True, impl=impl), ["x", "w", "b"], ["y"])
            k.prepare({"w": w, "b": b})
            ms = median_ms(lambda t, k=k, out=out: k.run([t], [out]), x, runs * 10)
            print(f"gemm K={k_dim} N=1000 {impl:7} {ms * 1e3:8.1f} us  err {(out - ref).abs().max().item():.1e}")
        ms = median_ms(lambda t, w=w, b=b: torch.nn.functional.linear(t, w, b), x, runs * 10)
        print(f"gemm K={k_dim} N=1000 F.linear(fresh) {ms * 1e3:8.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    ap.add_argument("--models", nargs="+", default=list(CONFIGS))
    args = ap.parse_args()
    print(f"torch {torch.__version__}, default torch.get_num_threads() = {torch.get_num_threads()}")
    rows = [r for t in args.threads for m in args.models for r in study(m, t, args.runs)]
    gemm_micro(args.runs)
    print("\n" + HEADER)
    for r in rows:
        print(fmt_row(r))


if __name__ == "__main__":
    main()
