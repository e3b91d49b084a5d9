"""A tiny training loop for the HFNN_DISPATCH_DB tests: LayerNorm [16,64] with and without affine
(the keys tiny_train.py's profile records), through nn.LayerNorm, F.layer_norm and a custom module.

    python3 dispatch_train.py DEVICE STEPS [to_hfnn|autocast|graph|compile|checkpoint]

Prints the final loss and then hfnn.dispatch_stats() as JSON on the last line.
"""
import json
import sys

import torch
import torch.nn.functional as F


class PlainNorm(torch.nn.Module):  # a custom module calling F.layer_norm without affine
    def forward(self, x):
        return F.layer_norm(x, (64,))


device, steps = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else ""
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(), PlainNorm(),
                            torch.nn.Linear(64, 8)).to(device)
if mode == "to_hfnn":
    import hfnn

    model = hfnn.to_hfnn(model)
opt = torch.optim.AdamW(model.parameters())
forward = torch.compile(model) if mode == "compile" else model
loss = None
for _ in range(steps):
    x = torch.randn(16, 32, device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
        out = forward(x)
    loss = out.float().square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
if mode == "graph":  # the forward captured into a CUDA graph and replayed
    static_x = torch.randn(16, 32, device=device)
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model(static_x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(static_x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.allclose(static_y, model(static_x), atol=1e-5), "graph replay differs from eager"
if mode == "checkpoint":  # save and load under dispatch: the same keys, the same outputs
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    model.load_state_dict(torch.load(buf))
print(f"loss {loss.item():.6f}")
import hfnn  # noqa: E402

print(json.dumps(hfnn.dispatch_stats()))
