"""µs per step of hfnn's LSTM variants and cuDNN's forward at T = 1,000 steps, float32, hidden 8
to 985 x batch 1, 4, 32: the per-step floor (what a step costs with almost no work) and how it
grows. `python3 bench/lstm_floor.py` (prints; no file)."""
import torch, hfnn  # noqa: F401
def timed(fn, reps=5):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps
T = 1000
for H in (8, 32, 128, 256, 512, 985):
    for B in (1, 4, 32):
        x = torch.randn(T, B, H, device="cuda"); wi = torch.randn(4 * H, H, device="cuda") * 0.05
        wh = torch.randn(4 * H, H, device="cuda") * 0.05; dy = torch.randn(T, B, H, device="cuda")
        out = []
        for v in ("persistent", "steps"):
            if not torch.ops.hfnn.lstm_supports(x, wh, v): out.append(f"{v} -"); continue
            f = lambda: torch.ops.hfnn.lstm_layer_fwd(x, wi, wh, None, None, None, None, False, v)
            ws = f()[3]
            b = lambda: torch.ops.hfnn.lstm_layer_bwd(dy, None, None, x, wi, wh, None, None, ws, False, v)
            out.append(f"{v} fwd {timed(f) / T * 1e3:5.2f} bwd {timed(b) / T * 1e3:5.2f} us/step")
        m = torch.nn.LSTM(H, H, device="cuda")
        m.flatten_parameters()
        out.append(f"cudnn fwd {timed(lambda: m(x)) / T * 1e3:5.2f}")
        print(f"H={H:4d} B={B:3d}: " + " | ".join(out), flush=True)
