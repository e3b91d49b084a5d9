"""A tiny Transformer training loop for the attention dispatch tests: per step, two causal
self-attention blocks (nn.MultiheadAttention, batch_first, the mask with the causal hint, as
examples/transformer.py calls it), one cross-attention call (key is value, sequence-first), and
one call hfnn's op does not take (need_weights=True, the default), and one with a padding mask.

    python3 mha_train.py DEVICE STEPS [to_hfnn]

Prints one JSON line: {"losses", "stats" (hfnn.dispatch_stats()), "wrapped" (whether
nn.MultiheadAttention.forward is HFNN_DISPATCH_DB's wrapper), "hfnn_calls", "hfnn_fallbacks"}.
"""
import json
import sys

import torch
from torch import nn

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
        self.head = nn.Linear(E, 8)

    def forward(self, x, memory):
        mask = nn.Transformer.generate_square_subsequent_mask(L, device=x.device)
        for att in self.att:
            x = x + att(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
        mem = memory.transpose(0, 1)
        x = x + self.cross(x.transpose(0, 1), mem, mem, need_weights=False)[0].transpose(0, 1)
        x = x + self.other(x, x, x)[0]  # need_weights=True: torch's module
        pad = torch.zeros(B, L, dtype=torch.bool, device=x.device)
        pad[:, -1] = True
        x = x + self.other(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        return self.head(x)


torch.manual_seed(0)
model = Model().to(device)
if mode == "to_hfnn":
    import hfnn

    model = hfnn.to_hfnn(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
x = torch.randn(B, L, E, generator=g).to(device)
memory = torch.randn(B, S, E, generator=g).to(device)
target = torch.randn(B, L, 8, generator=g).to(device)
losses = []
for _ in range(steps):
    loss = (model(x, memory) - target).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())

import hfnn  # noqa: E402

print(json.dumps({"losses": losses, "stats": hfnn.dispatch_stats(),
                  "wrapped": hasattr(nn.MultiheadAttention.forward, "__wrapped__"),
                  "hfnn_calls": dict(hfnn.nn.attention_calls), "hfnn_fallbacks": dict(hfnn.nn.attention_fallbacks)}))
