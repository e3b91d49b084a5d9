"""A tiny Transformer training loop for the attention dispatch tests: per step, two causal
self-attention blocks (nn.MultiheadAttention, batch_first, the mask with the causal hint, as
examples/transformer.py calls it), one cross-attention call (key is value, sequence-first), one
call with need_weights=True (the default), one with a padding mask, and one call hfnn's op does
not take (a module with add_bias_kv).

    python3 mha_train.py DEVICE STEPS [to_hfnn]

Prints one JSON line: {"losses", "stats" (hfnn.dispatch_stats()), "wrapped" (whether
nn.MultiheadAttention.forward is HFNN_DISPATCH_DB's wrapper), "hfnn_calls", "hfnn_fallbacks"}.
"""
import sys

import torch
from torch import nn

from _train_loop import train_and_report

device, steps = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else ""
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
B, L, S, E, H = 4, 16, 24, 32, 4


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.ModuleList(nn.MultiheadAttention(E, H, batch_first=True) for _ in range(2))
        self.cross = nn.MultiheadAttention(E, H)  # sequence-first
        self.other = nn.MultiheadAttention(E, H, batch_first=True)
        self.bias_kv = nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True)
        self.head = nn.Linear(E, 8)

    def forward(self, x, memory):
        mask = nn.Transformer.generate_square_subsequent_mask(L, device=x.device)
        for att in self.att:
            x = x + att(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
        mem = memory.transpose(0, 1)
        x = x + self.cross(x.transpose(0, 1), mem, mem, need_weights=False)[0].transpose(0, 1)
        x = x + self.other(x, x, x)[0]  # need_weights=True
        pad = torch.zeros(B, L, dtype=torch.bool, device=x.device)
        pad[:, -1] = True
        x = x + self.other(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        x = x + self.bias_kv(x, x, x, need_weights=False)[0]  # torch's module
        return self.head(x)


train_and_report(Model, device, steps, mode, [(B, L, E), (B, S, E)], (B, L, 8),
                 lambda hfnn: {"wrapped": hasattr(nn.MultiheadAttention.forward, "__wrapped__"),
                               "hfnn_calls": dict(hfnn.nn.attention_calls),
                               "hfnn_fallbacks": dict(hfnn.nn.attention_fallbacks)})
