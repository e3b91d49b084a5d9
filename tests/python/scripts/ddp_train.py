"""A tiny DistributedDataParallel training loop on the CPU (gloo), for `hfnn profile -- torchrun`."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)))
opt = torch.optim.AdamW(model.parameters())
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    loss = model(torch.randn(16 * (rank + 1), 32)).square().mean()  # ranks differ in batch: shapes differ
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
