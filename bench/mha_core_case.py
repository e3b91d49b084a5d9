#!/usr/bin/env python3
"""One nn.MultiheadAttention call through hfnn's op with a named core, forward and backward, for
Nsight Compute (the core's kernels by name) or a quick look at CUDA-event times per core:

    python3 bench/mha_core_case.py --config 5000 64 512 8 --cores hfnn_short sdpa_efficient
    python3 bench/mha_core_case.py --config 200 256 1024 16 --cores sdpa_cudnn --kernels   # where a call's GPU time goes
    python3 bench/mha_core_case.py --config 200 256 1024 16 --cores sdpa_cudnn --gaps      # where the GPU waits for the CPU
    ncu --kernel-name regex:short_ --launch-skip 4 --launch-count 2 python3 bench/mha_core_case.py --cores hfnn_short
"""
import argparse

import torch
from torch import nn

import hfnn  # noqa: F401  (loads the op library)
from mha_cpu import timeline_gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=int, nargs=4, default=[5000, 64, 512, 8], metavar=("B", "L", "E", "HEADS"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--cores", nargs="+", default=["hfnn_short"],
                    help="hfnn's op with these cores; `module` times torch's nn.MultiheadAttention instead")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--causal", action="store_true", help="causal self-attention (is_causal with its mask)")
    ap.add_argument("--kernels", action="store_true",
                    help="also each kernel's GPU time per call (torch.profiler over the timed calls), largest first")
    ap.add_argument("--gaps", action="store_true",
                    help="also the GPU's idle time between kernels per call and the longest gaps, with the kernels "
                         "on either side (torch.profiler's timeline of the timed calls, back to back as a training "
                         "loop makes them)")
    a = ap.parse_args()
    b, length, embed, heads = a.config
    dtype = getattr(torch, a.dtype)
    m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
    x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn_like(x)
    mask = nn.Transformer.generate_square_subsequent_mask(length, device="cuda", dtype=dtype) if a.causal else None
    for core in a.cores:
        def call():
            if core == "module":  # torch's nn.MultiheadAttention itself, for comparison
                out = m(x, x, x, need_weights=False, attn_mask=mask, is_causal=a.causal)[0]
            else:
                out = torch.ops.hfnn.multi_head_attention(x, x, x, heads, m.in_proj_weight, m.in_proj_bias,
                                                          m.out_proj.weight, m.out_proj.bias, True, a.causal, 0.0,
                                                          core)
            out.backward(g)
        call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(a.iters):
            call()
        end.record()
        torch.cuda.synchronize()
        print(f"{core}: fwd+bwd {start.elapsed_time(end) / a.iters:.3f} ms a call")
        if a.kernels:
            kernel_table(call, a.iters)
        if a.gaps:
            gap_table(call, a.iters)


def kernel_table(call, iters):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    total = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t, n = total.get(e.name, (0.0, 0))
            total[e.name] = (t + e.device_time, n + 1)
    gpu = sum(t for t, _ in total.values()) / iters
    print(f"  GPU busy {gpu / 1e3:.3f} ms a call; kernels, us a call (launches a call):")
    for name, (t, n) in sorted(total.items(), key=lambda kv: -kv[1][0]):
        print(f"  {t / iters:9.1f} ({n / iters:g}) {name[:150]}")


def gap_table(call, iters, top=12):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # CUPTI alone: the CPU path as unprofiled as it gets
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    # Idle: where no kernel runs (kernels of other streams may overlap: the latest end so far counts).
    busy, wall, gaps = timeline_gaps(spans)
    print(f"  GPU from first to last kernel {wall / iters / 1e3:.3f} ms a call, busy {busy / iters / 1e3:.3f}, "
          f"idle between kernels {sum(g for g, _, _ in gaps) / iters:.1f} us a call ({len(gaps) / iters:g} gaps); "
          f"the longest, us (after -> before):")
    for g, before, after in sorted(gaps, reverse=True)[:top]:
        print(f"  {g:8.1f}  {before[:70]} -> {after[:70]}")


if __name__ == "__main__":
    main()
