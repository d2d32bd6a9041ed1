"""Detection models whose anchors and masks are computed in ``forward`` (issue 13): YOLO-style and DETR-family.

The YOLO-style zoo model is written like Ultralytics' ``DetectionModel``: strides measured in ``__init__`` and
read into Python there (``math.log(640 / stride)``), anchors made from the feature shapes on the first call and
cached with that shape, a stride tensor used as a fill value (an ``.item()`` in the exported graph).
"""

from __future__ import annotations

import pytest
import torch

import torch_ir
from npu_tools.zoo import build_pair, get_model
from npu_tools.zoo.detection import TinyYOLO
from torch_ir.frontends.constants import build_on_meta

from .helpers import assert_outputs_close


@pytest.fixture(scope="module")
def yolo():
    entry = get_model("tiny_yolo")
    meta, real = build_pair(entry)  # the zoo builds on meta under build_on_meta
    (x,), _ = entry.example_inputs()
    return meta, real, x


def test_yolo_style_model_extracts_on_meta_and_runs_equal_to_eager(yolo, tmp_path):
    meta, real, x = yolo
    assert all(p.device.type == "meta" for p in meta.parameters())
    ir = torch_ir.extract_ir(meta, (x,), model_name="tiny_yolo")
    # the strides, read with .item() in forward, are known numbers in the IR
    fills = [n.attrs["fill_value"] for n in ir.nodes if n.op_type == "aten.new_full.default"]
    assert fills == [8.0, 16.0, 32.0]
    assert not ir.symbols
    # the anchor cache the trace filled is put back, so a second extraction traces the first call again
    assert "shape" not in vars(meta.head) and meta.head.anchors.numel() == 0
    again = torch_ir.extract_ir(meta, (x,), model_name="tiny_yolo")
    assert [n.op_type for n in again.nodes] == [n.op_type for n in ir.nodes]
    ir.save(tmp_path / "yolo.json")
    ir = torch_ir.load_ir(tmp_path / "yolo.json")
    (boxes,) = torch_ir.IRExecutor(ir, real, check_shapes=True).run([x])
    with torch.no_grad():
        expected = real(x)
    assert boxes.shape == (2, 4 + 4, 8 * 8 + 4 * 4 + 2 * 2)
    assert_outputs_close([boxes], [expected])


def test_yolo_needs_its_strides_known_on_meta(yolo):
    _, _, x = yolo
    with torch.device("meta"), pytest.raises(RuntimeError, match="item"):
        TinyYOLO()  # as Ultralytics' DetectionModel: __init__ reads the strides into Python
    with build_on_meta():
        model = TinyYOLO().eval()
    model.head.stride = model.head.stride.to("meta").clone()  # what Ultralytics' .to("meta") does to it
    model.stride = model.head.stride
    with pytest.raises(torch_ir.ExtractionError, match=r"(?s)reads the value of the tensor constant 'stride' into "
                                                       r"Python.*torch_ir.build_on_meta\(\)"):
        torch_ir.extract_ir(model, (x,))


def test_yolo_with_real_weights_behind_the_flag(yolo):
    _, _, x = yolo
    real = get_model("tiny_yolo").build("cpu")  # never run: its anchor cache is still empty
    ir = torch_ir.extract_ir(real, (x,), allow_real_weights=True)
    assert [n.attrs["fill_value"] for n in ir.nodes if n.op_type == "aten.new_full.default"] == [8.0, 16.0, 32.0]
    assert_outputs_close(torch_ir.IRExecutor(ir, real).run([x]), [real(x)])


@pytest.mark.slow
def test_rt_detr_anchors_and_valid_mask_from_init_are_inlined():
    transformers = pytest.importorskip("transformers")
    backbone = transformers.RTDetrResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1], layer_type="basic",
        out_features=["stage2", "stage3", "stage4"])
    config = transformers.RTDetrConfig(
        backbone_config=backbone, use_pretrained_backbone=False, encoder_hidden_dim=32,
        encoder_in_channels=[32, 64, 64], feat_strides=[8, 16, 32], encoder_layers=1, encoder_ffn_dim=64,
        encoder_attention_heads=2, d_model=32, num_queries=10, decoder_layers=1, decoder_ffn_dim=64,
        decoder_attention_heads=2, decoder_n_points=2, num_labels=5, anchor_image_size=[64, 64], num_denoising=0,
        decoder_in_channels=[32, 32, 32], hidden_expansion=0.5)
    with build_on_meta():
        meta = transformers.RTDetrForObjectDetection(config).eval()
    torch.manual_seed(0)
    real = transformers.RTDetrForObjectDetection(config).eval()
    x = torch.randn(1, 3, 64, 64)
    ir = torch_ir.extract_ir(meta, (x,))
    assert sorted(ir.inlined_constant_keys.values()) == ["model.anchors", "model.valid_mask"]
    ok, report = torch_ir.verify_ir(ir, real.state_dict(), real, (x,))
    assert ok, report.to_text()


@pytest.mark.slow
def test_detr_with_a_padded_pixel_mask():
    entry = get_model("detr")
    if not entry.available():
        pytest.skip("needs transformers")
    meta, real = build_pair(entry)
    pixels = torch.randn(2, 3, 64, 64)
    mask = torch.ones(2, 64, 64, dtype=torch.long)
    mask[1, :, 40:] = 0  # the second image is padded on the right
    kwargs = {"pixel_values": pixels, "pixel_mask": mask}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=kwargs)
    outputs = torch_ir.IRExecutor(ir, real, check_shapes=True).run(kwargs)
    with torch.no_grad():
        expected = real(**kwargs)
    assert_outputs_close(outputs[:2], [expected.logits, expected.pred_boxes])
