"""Two forwards and backwards of the persistent LSTM variant at hidden H, batch B, steps T, float32,
for Nsight Compute:
    ncu -k regex:"persistent_(fwd|bwd)_kernel" --launch-skip 2 --launch-count 2 --set full \
        python3 bench/lstm_profile_case.py 985 4 100
"""
import sys, torch, hfnn  # noqa: F401
H, B, T = (int(a) for a in sys.argv[1:4])
x = torch.randn(T, B, H, device="cuda"); wi = torch.randn(4 * H, H, device="cuda") * 0.05
wh = torch.randn(4 * H, H, device="cuda") * 0.05; dy = torch.randn(T, B, H, device="cuda")
for _ in range(2):
    ws = torch.ops.hfnn.lstm_layer_fwd(x, wi, wh, None, None, None, None, False, "persistent")[3]
    torch.ops.hfnn.lstm_layer_bwd(dy, None, None, x, wi, wh, None, None, ws, False, "persistent")
torch.cuda.synchronize()
