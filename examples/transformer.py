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

import os
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run by path: the harness is beside it
import _harness as harness  # noqa: E402


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


def main() -> None:
    args, device, size = harness.start(
        __file__, "Train a small Transformer-encoder language model on fixed random tokens and time each step.",
        size_help="full: the --config shape; small: batch 8 seq 32 embed 64 heads 4",
        options=lambda p: p.add_argument("--layers", type=harness.positive, default=2, help="Transformer blocks"),
        size_options=lambda p: p.add_argument(
            "--config", type=int, choices=sorted(FULL), default=1,
            help="full size only: 1: batch 200 seq 256 embed 1024 heads 16; "
                 "2: batch 5000 seq 64 embed 512 heads 8 (hfai.nn's seed benchmark shapes)"))
    cfg = FULL[args.config] if size == "full" else SMALL
    model, hfnn_note = harness.apply_hfnn(TransformerLM(cfg, args.layers).to(device), args.hfnn, device)
    tokens, target = make_batch(cfg, args.seed, device)
    harness.print_header(device, size, cfg, f"layers {args.layers}", model, args.dtype, hfnn_note)
    harness.train(model, args, device, size, lambda: model(tokens),
                  lambda logits: F.cross_entropy(logits.float().flatten(0, 1), target.flatten()),
                  {"model": "transformer", "dtype": args.dtype, "layers": args.layers,
                   "config": args.config if size == "full" else None, "shape": asdict(cfg)})


if __name__ == "__main__":
    main()
