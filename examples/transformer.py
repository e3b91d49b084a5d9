#!/usr/bin/env python3
"""A small Transformer-encoder language model training script: one of hfnn's examples.

    python3 examples/transformer.py             # plain PyTorch
    python3 examples/transformer.py --hfnn      # the same model after hfnn.to_hfnn(model)
    python3 examples/transformer.py --config 2  # the second seed benchmark shape

The model is pure PyTorch: token and position embeddings, pre-LayerNorm blocks written here from
torch.nn.MultiheadAttention (batch_first=True, causal mask) and a GELU MLP (4x wide), a final
LayerNorm and a linear head over the vocabulary. nn.TransformerEncoderLayer is not used on purpose:
this is how most training code writes the block, and both the LayerNorms and the
MultiheadAttention are the modules hfnn swaps (MultiheadAttention once its kernels land; today
to_hfnn swaps the LayerNorms only). Dropout is left out so runs are deterministic.

Full size matches hfai.nn's seed MultiheadAttention benchmark shapes:

    --config 1  batch 200,  seq 256, embed 1024, heads 16  (default)
    --config 2  batch 5000, seq 64,  embed 512,  heads 8

With the default 2 layers the LayerNorm inputs are [batch, seq, embed] x5 per step (2 per layer and
the final one). The small size (batch 8, seq 32, embed 64, heads 4) keeps the structure, so a step
takes well under a second on a CPU; --config only picks between the full sizes.

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
    embed: int
    heads: int
    vocab: int
    mlp_factor: int = 4


FULL = {
    1: Config(batch=200, seq=256, embed=1024, heads=16, vocab=1024),
    2: Config(batch=5000, seq=64, embed=512, heads=8, vocab=1024),
}
SMALL = Config(batch=8, seq=32, embed=64, heads=4, vocab=256)


class Block(nn.Module):
    """Pre-LayerNorm encoder block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.norm_att = nn.LayerNorm(cfg.embed)
        self.att = nn.MultiheadAttention(cfg.embed, cfg.heads, batch_first=True)
        self.norm_mlp = nn.LayerNorm(cfg.embed)
        self.mlp = nn.Sequential(nn.Linear(cfg.embed, cfg.mlp_factor * cfg.embed), nn.GELU(),
                                 nn.Linear(cfg.mlp_factor * cfg.embed, cfg.embed))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm_att(x)
        # need_weights=False and is_causal=True let MultiheadAttention hand the mask to
        # scaled_dot_product_attention as is_causal, so it never builds the [B, H, L, L] weights.
        x = x + self.att(h, h, h, attn_mask=mask, is_causal=True, need_weights=False)[0]
        return x + self.mlp(self.norm_mlp(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg: Config, layers: int):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.embed)
        self.positions = nn.Embedding(cfg.seq, cfg.embed)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(layers))
        self.norm = nn.LayerNorm(cfg.embed)
        self.head = nn.Linear(cfg.embed, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        pos = torch.arange(length, device=tokens.device)
        x = self.tokens(tokens) + self.positions(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


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
        description="Train a small Transformer-encoder language model on fixed random tokens and time each step.",
        epilog="Example: python3 examples/transformer.py --hfnn --steps 20 --json /tmp/transformer.json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hfnn", action="store_true", help="run every nn.LayerNorm through hfnn (hfnn.to_hfnn(model))")
    p.add_argument("--steps", type=positive, default=10, help="timed training steps")
    p.add_argument("--warmup", type=non_negative, default=3, help="untimed steps before the timed ones")
    p.add_argument("--layers", type=positive, default=2, help="Transformer blocks")
    p.add_argument("--size", choices=["full", "small", "auto"], default="auto",
                   help="full: the --config shape; small: batch 8 seq 32 embed 64 heads 4; "
                        "auto: full on CUDA, small on CPU")
    p.add_argument("--config", type=int, choices=sorted(FULL), default=1,
                   help="full size only: 1: batch 200 seq 256 embed 1024 heads 16; "
                        "2: batch 5000 seq 64 embed 512 heads 8 (hfai.nn's seed benchmark shapes)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16 runs under torch.autocast, CUDA only")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: CUDA when available")
    p.add_argument("--seed", type=int, default=0, help="seeds the parameters and the data")
    p.add_argument("--json", metavar="PATH", help="also write the step times and losses to this JSON file")
    return p.parse_args()


def fail(message: str) -> None:
    print(f"transformer.py: error: {message}", file=sys.stderr)
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
    cfg = FULL[args.config] if size == "full" else SMALL

    torch.manual_seed(args.seed)
    model = TransformerLM(cfg, args.layers).to(device)
    if args.hfnn:
        import hfnn  # only with --hfnn: without it this is a plain PyTorch script
        model = hfnn.to_hfnn(model)
        if device.type != "cuda":
            kernels = "torch's kernels on the CPU"
        elif not hfnn.build_info().get("cuda_kernels"):
            kernels = "torch's kernels: " + (hfnn.ops_error() or "this hfnn build has no CUDA kernels")
        else:
            kernels = "hfnn's CUDA kernels"
        hfnn_note = f"on, {sum(isinstance(x, hfnn.nn.LayerNorm) for x in model.modules())} LayerNorms, {kernels}"
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
                       "model": "transformer", "dtype": args.dtype, "layers": args.layers,
                       "config": args.config if size == "full" else None, "shape": asdict(cfg)}, f, indent=2)


if __name__ == "__main__":
    main()
