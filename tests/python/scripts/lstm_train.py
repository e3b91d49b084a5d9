"""A tiny recurrent training loop for the LSTM dispatch tests: per step, one batch-first LSTM and
one two-layer bidirectional sequence-first LSTM (calls hfnn's ops take), and one with proj_size
(torch's path: no key).

    python3 lstm_train.py DEVICE STEPS [to_hfnn]

Prints one JSON line: {"losses", "stats" (hfnn.dispatch_stats()), "wrapped" (whether nn.LSTM.forward
is HFNN_DISPATCH_DB's wrapper), "hfnn_calls", "hfnn_fallbacks" (hfnn.nn.lstm_calls / lstm_fallbacks)}.
"""
import sys

import torch
from torch import nn

from _train_loop import train_and_report

device, steps = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else ""
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
B, T, E, H = 4, 12, 16, 24


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.LSTM(E, H, batch_first=True)
        self.second = nn.LSTM(H, H, num_layers=2, bidirectional=True)  # sequence-first
        self.proj = nn.LSTM(2 * H, H, batch_first=True, proj_size=8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x, _ = self.first(x)
        x, _ = self.second(x.transpose(0, 1))
        x, _ = self.proj(x.transpose(0, 1))
        return self.head(x)


train_and_report(Model, device, steps, mode, [(B, T, E)], (B, T, 4),
                 lambda hfnn: {"wrapped": hasattr(nn.LSTM.forward, "__wrapped__"), "hfnn_calls": dict(hfnn.nn.lstm_calls),
                               "hfnn_fallbacks": dict(hfnn.nn.lstm_fallbacks)})
