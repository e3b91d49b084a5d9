#!/usr/bin/env python3
"""A small AlphaFold-style Evoformer training script: hfnn's bundled example.

    python3 examples/evoformer.py           # plain PyTorch
    python3 examples/evoformer.py --hfnn    # the same model after hfnn.to_hfnn(model)

The model is pure PyTorch with torch.nn.LayerNorm modules, written the way AlphaFold 2 writes it
(supplementary Algorithms 6-15): its own gated attention built from matmul and softmax, and a
LayerNorm at the start of every sub-block. That is what makes LayerNorm a large share of the step
time in AlphaFold, and what hfnn speeds up. Dropout is left out so runs are deterministic.

Each Evoformer block updates the MSA representation m [1, n_seq, n_res, c_m] and the pair
representation z [1, n_res, n_res, c_z]. At full size (n_seq=128, n_res=256, c_m=256, c_z=128)
the LayerNorm inputs of one block are:

    [1, 128, 256, 256]  x4  MSA row attention, MSA column attention, MSA transition,
                            outer product mean
    [1, 256, 256, 128]  x8  pair bias of the MSA row attention, triangle multiplication outgoing
                            and incoming (input and hidden, c_mul=128: 2 each), triangle attention
                            starting and ending node, pair transition

so 12 LayerNorms per block, 24 with the default 2 blocks, all over the last dimension. The small
size (n_seq=16, n_res=32, c_m=64, c_z=32) keeps the structure with every size divided, so a step
takes well under a second on a CPU.

The task: fixed random MSA and sequence features in, a distogram (64 distance bins, as AlphaFold's
distogram head) of a fixed random chain out, trained with cross entropy and AdamW.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run by path: the harness is beside it
import _harness as harness  # noqa: E402


@dataclass(frozen=True)
class Config:
    n_seq: int      # MSA depth
    n_res: int      # residues
    c_m: int        # MSA channels
    c_z: int        # pair channels
    c_att: int      # hidden channels per attention head
    heads_msa: int
    heads_pair: int
    c_opm: int      # outer product mean hidden channels
    c_mul: int      # triangle multiplication hidden channels
    n_aa: int = 22  # 20 amino acids, unknown, gap
    n_bins: int = 64


SIZES = {
    "full": Config(n_seq=128, n_res=256, c_m=256, c_z=128, c_att=32, heads_msa=8, heads_pair=4, c_opm=32, c_mul=128),
    "small": Config(n_seq=16, n_res=32, c_m=64, c_z=32, c_att=8, heads_msa=8, heads_pair=4, c_opm=8, c_mul=32),
}


def final_linear(c_in: int, c_out: int) -> nn.Linear:
    """AlphaFold's "final" init for the last layer of every residual update: zeros, so each block
    starts as the identity and the first steps of training are stable."""
    layer = nn.Linear(c_in, c_out)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


class GatedAttention(nn.Module):
    """Multi-head attention over the second-to-last dimension of x [..., L, c_in], with a sigmoid
    gate on the output and an optional additive bias on the logits [..., heads, L, L]."""

    def __init__(self, c_in: int, c_hidden: int, heads: int):
        super().__init__()
        self.heads, self.c_hidden = heads, c_hidden
        self.q = nn.Linear(c_in, heads * c_hidden, bias=False)
        self.k = nn.Linear(c_in, heads * c_hidden, bias=False)
        self.v = nn.Linear(c_in, heads * c_hidden, bias=False)
        self.gate = nn.Linear(c_in, heads * c_hidden)
        self.out = final_linear(heads * c_hidden, c_in)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        *batch, length, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:  # [..., L, H*c] -> [..., H, L, c]
            return t.view(*batch, length, self.heads, self.c_hidden).transpose(-2, -3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        logits = (q @ k.transpose(-1, -2)) / math.sqrt(self.c_hidden)
        if bias is not None:
            logits = logits + bias
        o = torch.softmax(logits, dim=-1) @ v
        o = o.transpose(-2, -3).reshape(*batch, length, self.heads * self.c_hidden)
        return self.out(torch.sigmoid(self.gate(x)) * o)


class MSARowAttentionWithPairBias(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm_m = nn.LayerNorm(cfg.c_m)
        self.norm_z = nn.LayerNorm(cfg.c_z)
        self.bias = nn.Linear(cfg.c_z, cfg.heads_msa, bias=False)
        self.att = GatedAttention(cfg.c_m, cfg.c_att, cfg.heads_msa)

    def forward(self, m: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # The pair representation biases how residues attend to each other in every MSA row.
        bias = self.bias(self.norm_z(z)).permute(0, 3, 1, 2).unsqueeze(1)  # [1, 1, H, R, R]
        return self.att(self.norm_m(m), bias)


class MSAColumnAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.c_m)
        self.att = GatedAttention(cfg.c_m, cfg.c_att, cfg.heads_msa)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        # Attend across sequences: make n_seq the attended dimension, then swap back.
        return self.att(self.norm(m).transpose(-2, -3)).transpose(-2, -3)


class Transition(nn.Module):
    def __init__(self, c: int, factor: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, factor * c), nn.ReLU(), final_linear(factor * c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x))


class OuterProductMean(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.c_m)
        self.a = nn.Linear(cfg.c_m, cfg.c_opm)
        self.b = nn.Linear(cfg.c_m, cfg.c_opm)
        self.out = final_linear(cfg.c_opm * cfg.c_opm, cfg.c_z)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        m = self.norm(m)
        a, b = self.a(m), self.b(m)  # [1, S, R, c]
        outer = torch.einsum("bsic,bsjd->bijcd", a, b) / m.shape[1]  # mean over the MSA
        return self.out(outer.flatten(-2))


class TriangleMultiplication(nn.Module):
    """Edge ij is updated from edges ik and jk (outgoing) or ki and kj (incoming)."""

    def __init__(self, cfg: Config, outgoing: bool):
        super().__init__()
        self.equation = "bikc,bjkc->bijc" if outgoing else "bkic,bkjc->bijc"
        self.norm_in = nn.LayerNorm(cfg.c_z)
        self.a, self.a_gate = nn.Linear(cfg.c_z, cfg.c_mul), nn.Linear(cfg.c_z, cfg.c_mul)
        self.b, self.b_gate = nn.Linear(cfg.c_z, cfg.c_mul), nn.Linear(cfg.c_z, cfg.c_mul)
        self.norm_out = nn.LayerNorm(cfg.c_mul)
        self.out = final_linear(cfg.c_mul, cfg.c_z)
        self.gate = nn.Linear(cfg.c_z, cfg.c_z)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = self.norm_in(z)
        a = torch.sigmoid(self.a_gate(z)) * self.a(z)
        b = torch.sigmoid(self.b_gate(z)) * self.b(z)
        x = self.out(self.norm_out(torch.einsum(self.equation, a, b)))
        return torch.sigmoid(self.gate(z)) * x


class TriangleAttention(nn.Module):
    """Row ij attends over edges ik (starting node) or, on the transposed pair, kj (ending node),
    biased by the third edge of each triangle."""

    def __init__(self, cfg: Config, starting: bool):
        super().__init__()
        self.starting = starting
        self.norm = nn.LayerNorm(cfg.c_z)
        self.bias = nn.Linear(cfg.c_z, cfg.heads_pair, bias=False)
        self.att = GatedAttention(cfg.c_z, cfg.c_att, cfg.heads_pair)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        # LayerNorm works on the last dimension, so normalizing before the transpose is the same
        # as AlphaFold's transpose-then-normalize, and the LayerNorm sees a contiguous input.
        z = self.norm(z)
        if not self.starting:
            z = z.transpose(-2, -3)
        bias = self.bias(z).permute(0, 3, 1, 2).unsqueeze(1)  # [1, 1, H, R, R]
        z = self.att(z, bias)
        return z if self.starting else z.transpose(-2, -3)


class EvoformerBlock(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.row_att = MSARowAttentionWithPairBias(cfg)
        self.col_att = MSAColumnAttention(cfg)
        self.msa_transition = Transition(cfg.c_m)
        self.opm = OuterProductMean(cfg)
        self.tri_mul_out = TriangleMultiplication(cfg, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(cfg, outgoing=False)
        self.tri_att_start = TriangleAttention(cfg, starting=True)
        self.tri_att_end = TriangleAttention(cfg, starting=False)
        self.pair_transition = Transition(cfg.c_z)

    def forward(self, m: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = m + self.row_att(m, z)
        m = m + self.col_att(m)
        m = m + self.msa_transition(m)
        z = z + self.opm(m)
        for update in (self.tri_mul_out, self.tri_mul_in, self.tri_att_start, self.tri_att_end, self.pair_transition):
            z = z + update(z)
        return m, z


class Evoformer(nn.Module):
    """Input embedder, Evoformer blocks, distogram head."""

    def __init__(self, cfg: Config, blocks: int):
        super().__init__()
        self.msa_embed = nn.Linear(cfg.n_aa, cfg.c_m)
        self.target_embed = nn.Linear(cfg.n_aa, cfg.c_m)
        self.left, self.right = nn.Linear(cfg.n_aa, cfg.c_z), nn.Linear(cfg.n_aa, cfg.c_z)
        self.relpos = nn.Embedding(2 * 32 + 1, cfg.c_z)  # residue offsets clipped to [-32, 32]
        self.blocks = nn.ModuleList(EvoformerBlock(cfg) for _ in range(blocks))
        self.distogram = nn.Linear(cfg.c_z, cfg.n_bins)

    def forward(self, msa: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        msa, seq = F.one_hot(msa, self.msa_embed.in_features).float(), F.one_hot(seq, self.left.in_features).float()
        m = self.msa_embed(msa) + self.target_embed(seq).unsqueeze(1)
        pos = torch.arange(seq.shape[1], device=seq.device)
        offset = (pos[:, None] - pos[None, :]).clamp(-32, 32) + 32
        z = self.left(seq)[:, :, None] + self.right(seq)[:, None, :] + self.relpos(offset)
        for block in self.blocks:
            m, z = block(m, z)
        logits = self.distogram(z)
        return logits + logits.transpose(1, 2)  # distances are symmetric


def make_batch(cfg: Config, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Fixed random MSA (first row is the sequence) and the distogram of a random chain with
    3.8 A steps between neighbours, binned like AlphaFold's (64 bins over 2-22 A)."""
    g = torch.Generator().manual_seed(seed)  # on the CPU, so every device trains on the same data
    msa = torch.randint(0, cfg.n_aa, (1, cfg.n_seq, cfg.n_res), generator=g)
    msa[:, 0] = torch.randint(0, 20, (1, cfg.n_res), generator=g)
    steps = torch.randn(cfg.n_res, 3, generator=g)
    coords = torch.cumsum(3.8 * steps / steps.norm(dim=-1, keepdim=True), dim=0)
    edges = torch.linspace(2.3125, 21.6875, cfg.n_bins - 1)
    target = torch.bucketize(torch.cdist(coords, coords), edges).unsqueeze(0)
    return msa.to(device), msa[:, 0].to(device), target.to(device)


def main() -> None:
    args, device, size = harness.start(
        __file__, "Train a small AlphaFold-style Evoformer on fixed random data and time each step.",
        size_help="full: n_seq=128 n_res=256 c_m=256 c_z=128; small: n_seq=16 n_res=32 c_m=64 c_z=32",
        options=lambda p: p.add_argument("--blocks", type=harness.positive, default=2, help="Evoformer blocks"))
    cfg = SIZES[size]
    model, hfnn_note = harness.apply_hfnn(Evoformer(cfg, args.blocks).to(device), args.hfnn, device)
    msa, seq, target = make_batch(cfg, args.seed, device)
    harness.print_header(device, size, cfg, f"blocks {args.blocks}", model, args.dtype, hfnn_note)
    harness.train(model, args, device, size, lambda: model(msa, seq),
                  lambda logits: F.cross_entropy(logits.float().flatten(0, 2), target.flatten()))


if __name__ == "__main__":
    main()
