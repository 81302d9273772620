"""The corpus architectures (benchmarks/corpus's own module classes) at small widths and
shapes, through both torch entry points, against eager on fresh random inputs (rtol 1e-3,
atol 1e-4). The full-size models are test_corpus.py's (slow)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from benchmarks.corpus import cnn, rnn, transformer  # noqa: E402
from tests.frontends.torch.test_models import dynamo_matches, export_matches  # noqa: E402


def _mobilenet_v2():
    blocks = [cnn.conv_bn(3, 16, 3, 2, act=nn.ReLU6), cnn.InvertedResidual(16, 16, 3, 1, 16),
              cnn.InvertedResidual(16, 24, 3, 2, 96), cnn.InvertedResidual(24, 24, 3, 1, 144)]
    return cnn.Pooled(nn.Sequential(*blocks), nn.Linear(24, 10))


def _wav2vec2():
    return transformer.hf("Wav2Vec2Model", "Wav2Vec2Config", ["input_values"], hidden_size=32,
                          num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(16,) * 7,
                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                          do_stable_layer_norm=False, feat_extract_norm="group")()


L = cnn.MBV3_LARGE
# name -> (builder, input shape); widths cut where a class takes them, published elsewhere
MODELS = {
    "resnet50": (lambda: cnn.ResNet(layers=(1, 1, 1, 1), classes=10), (2, 3, 32, 32)),
    "resnext50": (lambda: cnn.ResNet(layers=(1, 1, 1, 1), groups=32, width_per_group=4, classes=10),
                  (2, 3, 32, 32)),
    "mobilenet_v2": (_mobilenet_v2, (2, 3, 32, 32)),
    "mobilenet_v3_large": (lambda: cnn.mobilenet_v3(L[:4] + [L[6], L[10]], 64, 128, classes=10), (2, 3, 32, 32)),
    "convnext_tiny": (lambda: cnn.ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 32, 64), classes=10), (2, 3, 64, 64)),
    "unet": (lambda: cnn.UNet(base=4, levels=2), (2, 3, 32, 32)),
    "dbnet_resnet18": (lambda: cnn.DBNet(inner=16), (1, 3, 64, 64)),
    "yolov5s_style": (lambda: cnn.YoloS(classes=2), (1, 3, 64, 64)),
    "crnn": (lambda: cnn.CRNN(classes=5, hidden=16), (2, 1, 32, 24)),
    "wav2vec2": (_wav2vec2, (2, 1600)),
    "lstm_stacked": (lambda: rnn.Recurrent("LSTM", features=8, hidden=16, layers=3, classes=5), (7, 2, 8)),
    "bilstm": (lambda: rnn.Recurrent("LSTM", features=8, hidden=16, layers=2, bidirectional=True, classes=5),
               (7, 2, 8)),
}
NEEDS = {"wav2vec2": "transformers"}
FAST = {"mobilenet_v2", "unet", "lstm_stacked"}  # the rest compile for 10-60 s each under load: slow


def build(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    make, shape = MODELS[name]
    torch.manual_seed(0)
    m = make().eval()
    g = torch.Generator().manual_seed(1)
    example, fresh = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    return m, (example,), (fresh,)


PARAMS = [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in MODELS]


@pytest.mark.parametrize("name", PARAMS)
def test_export_entry_point(name):
    export_matches(*build(name))


@pytest.mark.parametrize("name", PARAMS)
def test_dynamo_entry_point(name, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "allow_rnn", True)  # else nn.LSTM is a graph break
    dynamo_matches(*build(name))
