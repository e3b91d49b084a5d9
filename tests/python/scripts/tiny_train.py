"""A tiny real training loop for the profiler tests: Linear, LayerNorm, AdamW on the CPU.

    python3 tiny_train.py STEPS [raise|loop|manual-steps|cuda]
    python3 tiny_train.py argv FILE ARGS...   (writes ARGS to FILE)
raise: fail after the loop; loop: train until killed; manual-steps: no optimizer, hfnn.step().
"""
import sys
import time

import torch

if len(sys.argv) > 2 and sys.argv[1] == "argv":  # write what the script was given, nothing else
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(sys.argv[3:]))
    sys.exit(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
mode = sys.argv[2] if len(sys.argv) > 2 else ""
device = "cuda" if mode == "cuda" else "cpu"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(),
                            torch.nn.LayerNorm(64, elementwise_affine=False), torch.nn.Linear(64, 8)).to(device)
opt = torch.optim.AdamW(model.parameters())
step = 0
while step < steps or mode == "loop":
    x = torch.randn(16, 32, device=device)
    loss = model(x).square().mean()
    loss.backward()
    if mode == "manual-steps":
        import hfnn

        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
                p.grad = None
        hfnn.step()
    else:
        opt.step()
        opt.zero_grad()
    step += 1
    if mode == "loop":
        print(f"step {step}", flush=True)
        time.sleep(0.01)
if mode == "raise":
    raise RuntimeError("the user's script failed")
