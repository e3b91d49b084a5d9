#!/usr/bin/env python3
"""A small LSTM language model training script: one of hfnn's examples.

    python3 examples/lstm_lm.py           # plain PyTorch
    python3 examples/lstm_lm.py --hfnn    # the same model after hfnn.to_hfnn(model): hfnn.nn.LSTM
    HFNN_DISPATCH_DB=shapes.db python3 examples/lstm_lm.py   # the LSTM key's tuned winner, no code change

The model is pure PyTorch: an embedding, torch.nn.LSTM (batch_first=True) and a linear head over
the vocabulary. At full size the LSTM has hfai.nn's seed LSTM benchmark shape: input 985 (the
embedding dim), hidden 985, batch 4, seq 1000, one layer by default (--layers 2 stacks a second).
The small size (input 64, hidden 64, batch 4, seq 32) keeps the structure, so a step takes well
under a second on a CPU.

--hfnn swaps the nn.LSTM for hfnn.nn.LSTM (issue 12): on CUDA it runs hfnn's LSTM kernels where the
op library has them (the built-in choice of variant), else torch's own LSTM with the reason counted
in hfnn.nn.lstm_fallbacks (the header line says which). `hfnn profile` sees the plain model's
recurrent calls (aten::lstm and, on CUDA, cuDNN's RNN kernels); bench/e2e.py --example lstm_lm runs
it through profile, tune and HFNN_DISPATCH_DB.

The task: next-token prediction on a fixed batch of seeded random tokens, with cross entropy and
AdamW. The tokens carry nothing to learn beyond the batch itself; the loss falls as the model
memorizes it, which is all a timing run needs.
"""
from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run by path: the harness is beside it
import _harness as harness  # noqa: E402


@dataclass(frozen=True)
class Config:
    batch: int
    seq: int
    embed: int   # the LSTM's input size
    hidden: int
    vocab: int


SIZES = {
    "full": Config(batch=4, seq=1000, embed=985, hidden=985, vocab=1024),
    "small": Config(batch=4, seq=32, embed=64, hidden=64, vocab=256),
}


class LSTMLM(nn.Module):
    def __init__(self, cfg: Config, layers: int):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.embed)
        self.lstm = nn.LSTM(cfg.embed, cfg.hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))  # zero initial state: every step starts fresh
        return self.head(out)


def make_batch(cfg: Config, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed random tokens; the target of each position is the next token."""
    g = torch.Generator().manual_seed(seed)  # on the CPU, so every device trains on the same data
    tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def swapped_note(hfnn: Any, model: nn.Module, device: torch.device) -> str:
    """How many LSTMs to_hfnn swapped, and whose kernels they run: say so rather than imply the LSTM
    runs hfnn's code where it falls back to torch's."""
    swapped = sum(isinstance(x, hfnn.nn.LSTM) for x in model.modules())
    if device.type != "cuda":
        kernels = "torch's LSTM on the CPU"
    elif not hasattr(torch.ops.hfnn, "lstm_layer_fwd"):
        kernels = "torch's LSTM: " + (hfnn.ops_error() or "this op library has no LSTM kernels")
    else:
        kernels = "hfnn's LSTM kernels"
    return f"{swapped} LSTM(s), {kernels}"


def main() -> None:
    args, device, size = harness.start(
        __file__, "Train a small LSTM language model on fixed random tokens and time each step.",
        size_help="full: input 985 hidden 985 batch 4 seq 1000; small: input 64 hidden 64 batch 4 seq 32",
        options=lambda p: p.add_argument("--layers", type=harness.positive, default=1, help="stacked LSTM layers"),
        hfnn_help="apply hfnn.to_hfnn(model): the nn.LSTM runs hfnn's LSTM kernels (torch's where it cannot)")
    cfg = SIZES[size]
    model, hfnn_note = harness.apply_hfnn(LSTMLM(cfg, args.layers).to(device), args.hfnn, device, swapped_note)
    tokens, target = make_batch(cfg, args.seed, device)
    harness.print_header(device, size, cfg, f"layers {args.layers}", model, args.dtype, hfnn_note)
    harness.train(model, args, device, size, lambda: model(tokens),
                  lambda logits: F.cross_entropy(logits.float().flatten(0, 1), target.flatten()),
                  {"model": "lstm_lm", "dtype": args.dtype, "layers": args.layers, "shape": asdict(cfg)})


if __name__ == "__main__":
    main()
