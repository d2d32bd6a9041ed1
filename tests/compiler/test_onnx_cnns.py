"""The nine classic CNNs that ship with the ``onnx`` package compile whole and run equal to onnxruntime.

The models are the "light" ones of ``onnx/backend/test/data/light`` (AlexNet, DenseNet-121, Inception
v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512; 1x3x224x224): each weight is a
``ConstantOfShape`` that fills it with 0.02, so every logit would be equal and the softmax uniform
whatever the program computed. So there are two tests per model:

- the file as shipped compiles whole (strict ``npu_compiler.compile``: no CPU fallback);
- with seeded random weights it compiles whole and runs equal to onnxruntime on the same seeded
  input. Each foldable ``ConstantOfShape`` becomes an initializer of the same name and shape (the
  form real exported models have; the few too large to fold at import, VGG-19's, AlexNet's and
  ZFNet's fc6, stay constant, as in the shipped import), and the logits, the final softmax's input,
  become a second output: random weights often saturate the softmax into a one-hot vector, which
  would hide an error in the logits. The program runs on ``npu_runtime.Executor``.

The two compile differently (folded constant weights let the compiler fold batch norms and constant
arithmetic that weights keep as dispatches: DenseNet-121 gives 613 dispatches shipped, 851 with
weights), so both are checked.

Tolerance: rtol 1e-3 and atol 1e-4 relative to each output's largest magnitude: with random weights
the logits of the residual nets grow large (ResNet-50's reach ~2e5, ShuffleNet's ~1e7), and the
compiled kernels (folded batch norms, NHWC convolutions) sum in another order than onnxruntime does.

A model whose ops lack kernels is marked ``xfail(strict=True)`` in ``MISSING_KERNELS`` with the ops
``compile`` reports; remove the mark when its kernels land (a strict xfail fails once it passes).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import npu_compiler  # noqa: E402
from npu_runtime import Device, Executor, load_weights  # noqa: E402
from tests.onnx.graphs import ort_run  # noqa: E402
from torch_ir import import_onnx  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
CNNS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
        "vgg19", "zfnet512")
#: model -> the ops npu_compiler.compile reports without a kernel (as of the last kernel change: none)
MISSING_KERNELS: dict[str, str] = {}
RTOL, ATOL = 1e-3, 1e-4


def _params() -> list:
    def mark(name: str) -> pytest.MarkDecorator:
        return pytest.mark.xfail(strict=True, reason=f"no kernel yet for {MISSING_KERNELS[name]}")

    return [pytest.param(name, marks=mark(name)) if name in MISSING_KERNELS else name for name in CNNS]


def light_path(name: str) -> str:
    path = os.path.join(LIGHT_DIR, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"this onnx package ({onnx.__version__}) does not ship {path}")
    return path


def randomized(path: str) -> onnx.ModelProto:
    """The light model with seeded random weights and the logits as a second output: the sweep's own function
    (``bench/compile_coverage/models.py``), so the test and the sweep check the same models."""
    spec = importlib.util.spec_from_file_location("compile_coverage_models",
                                                  ROOT / "bench" / "compile_coverage" / "models.py")
    models = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = models  # its dataclasses look their module up while they are built
    spec.loader.exec_module(models)
    return models.randomized_light_model(path)


def run_program(program: npu_compiler.CompiledProgram, weights: dict[str, torch.Tensor],
                x: torch.Tensor) -> list[torch.Tensor]:
    device = Device()
    executor = Executor(program, device)
    (spec,) = program.input_specs
    outputs = executor.run({spec.name: x.numpy()}, weights=load_weights(weights, program, device))
    return [torch.from_numpy(outputs[s.name].to_numpy()) for s in program.output_specs]


@pytest.mark.parametrize("name", _params())
def test_light_cnn_compiles_whole(name: str) -> None:
    ir, _ = import_onnx(light_path(name), model_name=name)
    program = npu_compiler.compile(ir)  # the file as shipped; UnsupportedOpsError names any op without a kernel
    assert program.dispatch_count > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", _params())
def test_light_cnn_with_random_weights_runs_equal_to_onnxruntime(name: str) -> None:
    model = randomized(light_path(name))
    ir, weights = import_onnx(model, model_name=name)
    program = npu_compiler.compile(ir)
    x = torch.randn(*[int(d) for d in ir.graph_inputs[0].shape], generator=torch.Generator().manual_seed(0))
    ours, expected = run_program(program, weights, x), ort_run(model, [x])
    assert len(ours) == len(expected) == len(model.graph.output)
    for i, (got, want) in enumerate(zip(ours, expected)):
        scale = max(1.0, float(want.abs().max()))
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL * scale,
                                   msg=lambda m, i=i, s=scale: f"output {i} (max |value| {s:.3g}): {m}")
