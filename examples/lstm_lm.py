#!/usr/bin/env python3
"""A small LSTM language model training script: one of hfnn's examples.

    python3 examples/lstm_lm.py           # plain PyTorch
    python3 examples/lstm_lm.py --hfnn    # the same model after hfnn.to_hfnn(model)

The model is pure PyTorch: an embedding, torch.nn.LSTM (batch_first=True) and a linear head over
the vocabulary. At full size the LSTM has hfai.nn's seed LSTM benchmark shape: input 985 (the
embedding dim), hidden 985, batch 4, seq 1000, one layer by default (--layers 2 stacks a second).
The small size (input 64, hidden 64, batch 4, seq 32) keeps the structure, so a step takes well
under a second on a CPU.

hfnn has no LSTM kernels yet: to_hfnn swaps LayerNorms, and this model has none, so --hfnn leaves
it unchanged for now. The script is here so `hfnn profile` sees a recurrent model (aten::lstm and,
on CUDA, cuDNN's RNN kernels), and so the LSTM can be timed the same way once kernels land.

The task: next-token prediction on a fixed batch of seeded random tokens, with cross entropy and
AdamW. The tokens carry nothing to learn beyond the batch itself; the loss falls as the model
memorizes it, which is all a timing run needs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


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


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a small LSTM language model on fixed random tokens and time each step.",
        epilog="Example: python3 examples/lstm_lm.py --hfnn --steps 20 --json /tmp/lstm_lm.json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hfnn", action="store_true",
                   help="apply hfnn.to_hfnn(model) (no LSTM kernels yet: the model is unchanged)")
    p.add_argument("--steps", type=positive, default=10, help="timed training steps")
    p.add_argument("--warmup", type=non_negative, default=3, help="untimed steps before the timed ones")
    p.add_argument("--layers", type=positive, default=1, help="stacked LSTM layers")
    p.add_argument("--size", choices=["full", "small", "auto"], default="auto",
                   help="full: input 985 hidden 985 batch 4 seq 1000; small: input 64 hidden 64 batch 4 seq 32; "
                        "auto: full on CUDA, small on CPU")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16 runs under torch.autocast, CUDA only")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: CUDA when available")
    p.add_argument("--seed", type=int, default=0, help="seeds the parameters and the data")
    p.add_argument("--json", metavar="PATH", help="also write the step times and losses to this JSON file")
    return p.parse_args()


def fail(message: str) -> None:
    print(f"lstm_lm.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but CUDA is not available to this torch")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if args.dtype == "bfloat16" and device.type != "cuda":
        fail("--dtype bfloat16 needs CUDA; on the CPU use --dtype float32")
    size = args.size if args.size != "auto" else ("full" if device.type == "cuda" else "small")
    cfg = SIZES[size]

    torch.manual_seed(args.seed)
    model = LSTMLM(cfg, args.layers).to(device)
    if args.hfnn:
        import hfnn  # only with --hfnn: without it this is a plain PyTorch script
        model = hfnn.to_hfnn(model)
        # to_hfnn swaps LayerNorms only so far; say so rather than imply the LSTM runs hfnn's code.
        swapped = sum(type(x).__module__.startswith("hfnn") for x in model.modules())
        hfnn_note = f"on, {swapped} modules swapped (hfnn has no LSTM kernels yet)"
    else:
        hfnn_note = "off"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens, target = make_batch(cfg, args.seed, device)

    params = sum(p.numel() for p in model.parameters())
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"size {size} {asdict(cfg)}, layers {args.layers}, {params / 1e6:.2f}M parameters, dtype {args.dtype}, "
          f"hfnn {hfnn_note}")

    def sync() -> None:  # CUDA runs asynchronously: wait for the step before reading the clock
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step_ms, losses = [], []
    for step in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), target.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        ms = (time.perf_counter() - start) * 1e3
        value = loss.item()
        timed = step >= args.warmup
        if timed:
            step_ms.append(ms)
            losses.append(value)
        label = f"step {step - args.warmup + 1}/{args.steps}" if timed else f"warmup {step + 1}/{args.warmup}"
        print(f"{label:>14}  loss {value:.4f}  {ms:9.2f} ms")

    median = statistics.median(step_ms)
    print(f"median step {median:.2f} ms over {args.steps} steps ({device.type}, {size}, {args.dtype}, "
          f"hfnn {'on' if args.hfnn else 'off'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "step_ms": step_ms, "median_step_ms": median, "loss": losses,
                       "device": str(device), "size": size, "hfnn": args.hfnn,
                       "model": "lstm_lm", "dtype": args.dtype, "layers": args.layers, "shape": asdict(cfg)},
                      f, indent=2)


if __name__ == "__main__":
    main()
