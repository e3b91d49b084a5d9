"""hfnn's LSTM op, one layer and one direction, against nn.LSTM (cuDNN), op against module: the
first GPU look at the kernels (issue 12) before the Python module and bench/lstm.py.

Per config of the issue x dtype: every variant's largest relative difference from cuDNN in y, h_n,
c_n and the gradients (dx, dW_ih, dW_hh, db), and fwd / fwd+bwd ms per call (CUDA events around
back-to-back calls; cuDNN through autograd, the op's fwd and bwd called directly).

    python3 bench/lstm_layer.py --json bench/results/lstm_layer-h200.json
"""
import argparse, json, sys, time
import torch
import hfnn  # noqa: F401  (loads the op library)

CONFIGS = [(985, 985, 4, 1000), (512, 512, 32, 256), (1024, 1024, 64, 256), (256, 256, 128, 100), (2048, 2048, 16, 512)]


def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    best = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            fn()
        e.record(); torch.cuda.synchronize()
        best.append(s.elapsed_time(e) / reps)
    return sorted(best)[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args()
    recs = []
    for (I, H, B, T) in CONFIGS:
        for dn in args.dtypes:
            dt = getattr(torch, dn)
            torch.manual_seed(0)
            m = torch.nn.LSTM(I, H, device="cuda", dtype=dt)
            m.flatten_parameters()  # built on the GPU its weights are separate: cuDNN would copy them a call
            x = torch.randn(T, B, I, device="cuda", dtype=dt, requires_grad=True)
            dy = torch.randn(T, B, H, device="cuda", dtype=dt)
            W = [m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0]
            y_ref, (hn_ref, cn_ref) = m(x)
            g_ref = torch.autograd.grad(y_ref, [x] + W, dy)
            reps = max(2, min(20, int(2e5 / (T * 10))))
            t_fwd = timed(lambda: m(x), reps)
            t_all = timed(lambda: torch.autograd.grad(m(x)[0], [x] + W, dy), reps)
            recs.append(dict(config=[I, H, B, T], dtype=dn, candidate="cudnn", fwd_ms=t_fwd, fwd_bwd_ms=t_all))
            print(f"{[I, H, B, T]} {dn} cudnn fwd {t_fwd:.3f} fwd+bwd {t_all:.3f} ms", flush=True)
            xd = x.detach()
            for v in torch.ops.hfnn.lstm_variants():
                if not torch.ops.hfnn.lstm_supports(xd, W[1], v):
                    print(f"   {v}: does not support", flush=True)
                    continue
                try:
                    def fwd():
                        return torch.ops.hfnn.lstm_layer_fwd(xd, W[0].detach(), W[1].detach(), W[2].detach(),
                                                             W[3].detach(), None, None, False, v)
                    def both():
                        y, hn, cn, ws = fwd()
                        return torch.ops.hfnn.lstm_layer_bwd(dy, None, None, xd, W[0].detach(), W[1].detach(),
                                                             None, None, ws, False, v)
                    y, hn, cn, ws = fwd()
                    g = torch.ops.hfnn.lstm_layer_bwd(dy, None, None, xd, W[0].detach(), W[1].detach(), None, None,
                                                      ws, False, v)
                    rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
                    errs = dict(y=rel(y, y_ref), h_n=rel(hn, hn_ref[0]), c_n=rel(cn, cn_ref[0]), dx=rel(g[0], g_ref[0]),
                                dw_ih=rel(g[1], g_ref[1]), dw_hh=rel(g[2], g_ref[2]), db=rel(g[3], g_ref[3]))
                    t_f = timed(fwd, reps)
                    t_a = timed(both, reps)
                    torch.cuda.synchronize()
                    recs.append(dict(config=[I, H, B, T], dtype=dn, candidate=v, fwd_ms=t_f, fwd_bwd_ms=t_a, rel_vs_cudnn=errs))
                    print(f"   {v}: fwd {t_f:.3f} fwd+bwd {t_a:.3f} ms ({t_all / t_a:.2f}x cudnn)  "
                          f"worst rel diff vs cudnn {max(errs.values()):.2e} {errs}", flush=True)
                except Exception as e:
                    print(f"   {v}: FAILED {str(e).splitlines()[0][:300]}", flush=True)
                    torch.cuda.synchronize()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
    if args.json:
        json.dump([dict(meta, **r) for r in recs], open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
