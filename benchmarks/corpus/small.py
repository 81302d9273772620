"""Small models (well under a millisecond on ONNX Runtime), where per-call overhead and
thread start-up decide the race."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.corpus.spec import Input, Spec


def mlp(*widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class TinyCNN(nn.Module):
    """MNIST-sized: two conv/pool stages and a classifier."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(32 * 7 * 7, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class KeywordDSCNN(nn.Module):
    """DS-CNN keyword spotter on 49x10 MFCC frames: conv, 4 depthwise-separable blocks, pool, fc."""

    def __init__(self, ch=64, classes=12):
        super().__init__()
        layers = [nn.Conv2d(1, ch, (10, 4), (2, 2), (5, 1), bias=False), nn.BatchNorm2d(ch), nn.ReLU()]
        for _ in range(4):
            layers += [nn.Conv2d(ch, ch, 3, 1, 1, groups=ch, bias=False), nn.BatchNorm2d(ch), nn.ReLU(),
                       nn.Conv2d(ch, ch, 1, bias=False), nn.BatchNorm2d(ch), nn.ReLU()]
        self.body, self.fc = nn.Sequential(*layers), nn.Linear(ch, classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class TransformerLayer(nn.Module):
    """One pre-norm encoder layer, 256 wide, written out (attention as MatMul/Softmax)."""

    def __init__(self, d=256, heads=4, ff=1024):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):                          # (batch, seq, d)
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class LSTMClassifier(nn.Module):
    """A one-layer LSTM over 40-dim features; the last step's state classified."""

    def __init__(self, features=40, hidden=64, classes=8):
        super().__init__()
        self.rnn, self.fc = nn.LSTM(features, hidden), nn.Linear(hidden, classes)

    def forward(self, x):                          # (seq, batch, features)
        _, (h, _) = self.rnn(x)
        return self.fc(h[-1])


MODELS = [
    Spec("mlp_mnist", "small", lambda: mlp(784, 256, 128, 10), (Input("input", ("batch", 784)),),
         ({"batch": 1}, {"batch": 8}), {"batch": 2}, exporter="dynamo", opset=21),
    Spec("mlp_tabular", "small", lambda: mlp(32, 64, 64, 64, 1), (Input("input", ("batch", 32)),),
         ({"batch": 1}, {"batch": 64}), {"batch": 2}, opset=13),
    Spec("tiny_cnn", "small", TinyCNN, (Input("input", ("batch", 1, 28, 28)),), ({"batch": 1}, {"batch": 8}),
         {"batch": 2}, exporter="dynamo", opset=19),
    Spec("kws_dscnn", "small", KeywordDSCNN, (Input("input", ("batch", 1, 49, 10)),),
         ({"batch": 1}, {"batch": 8}), {"batch": 2}, opset=15),
    Spec("transformer_layer", "small", TransformerLayer, (Input("input", ("batch", "seq", 256)),),
         ({"batch": 1, "seq": 64}, {"batch": 1, "seq": 32}, {"batch": 4, "seq": 64}), {"batch": 2, "seq": 16},
         exporter="dynamo", opset=20),
    Spec("lstm_classifier", "small", LSTMClassifier, (Input("input", ("seq", "batch", 40)),),
         ({"seq": 50, "batch": 1}, {"seq": 50, "batch": 8}), {"seq": 10, "batch": 2}, opset=17),
]
