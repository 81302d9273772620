"""Recurrent nets (ONNX LSTM/GRU ops): stacked, bidirectional, batch 1 and long sequences."""

from __future__ import annotations

from torch import nn

from benchmarks.corpus.spec import Input, Spec


class Recurrent(nn.Module):
    """An RNN over (seq, batch, features) with a linear head on every step (acoustic-model shaped)."""

    def __init__(self, cell, features=80, hidden=256, layers=2, bidirectional=False, classes=32):
        super().__init__()
        self.rnn = getattr(nn, cell)(features, hidden, num_layers=layers, bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y)


SEQ = (Input("input", ("seq", "batch", 80)),)
CASES = ({"seq": 128, "batch": 1}, {"seq": 512, "batch": 1}, {"seq": 128, "batch": 8})
TRACE = {"seq": 20, "batch": 2}

MODELS = [
    Spec("lstm_stacked", "rnn", lambda: Recurrent("LSTM", layers=3), SEQ, CASES, TRACE, opset=17),
    Spec("gru_stacked", "rnn", lambda: Recurrent("GRU", layers=3), SEQ, CASES, TRACE, opset=14),
    Spec("bilstm", "rnn", lambda: Recurrent("LSTM", layers=2, bidirectional=True), SEQ, CASES, TRACE, opset=13),
    Spec("bigru", "rnn", lambda: Recurrent("GRU", hidden=384, layers=1, bidirectional=True), SEQ, CASES, TRACE,
         opset=16),
]
