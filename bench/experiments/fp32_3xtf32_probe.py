"""Probe (H100, 2026-11-27; bench/README.md, "float32 GEMMs on bf16 tensor cores"; answer: no,
the tensor cores' accumulation loses it at large k): can fp32 GEMMs at full fp32 accuracy run on
TF32 tensor cores (3xTF32: each operand split into a TF32 "big" part and the TF32 rounding of what
is left, three TF32 products summed in fp32), fast enough to matter for nn.MultiheadAttention's projections in fp32 (issue 11: fp32 at
1.18x on seed 001's config 0, its GEMMs about 28 of 32 ms on CUDA cores)?

Per GEMM shape of the op (config 0 and seed 001's second config), against float64:
  sgemm      torch.mm, allow_tf32 off (cuBLAS on CUDA cores: what torch runs)
  tf32       torch.mm, allow_tf32 on (one TF32 product: not fp32's accuracy)
  3xtf32     big = round(x to TF32), small = x - big (exact); small_a big_b + big_a small_b +
             big_a big_b, each a TF32 mm; the split by torch's elementwise ops, timed apart
  3xtf32_t   the same with the hardware's own TF32 reading of x as big (x itself passed): whether
             the tensor cores truncate or round; correct only if they truncate
  3xtf32_k1024, 3xtf32_k4096 (where k > 4,096)  3xtf32 per chunk of k, the chunks' results summed
             by CUDA-core adds
Error: max over entries of |D - D64| / (|A| |B|)64 (the entry's own scale), and the
Frobenius relative error. Times: CUDA events, median of 5 after 2 warm-ups.
Re-run: python3 bench/experiments/fp32_3xtf32_probe.py --out probe.json
"""
import argparse
import datetime
import json
import statistics

import torch

SHAPES = {  # (M, K, N): D[M, N] = A[M, K] B[K, N]
    "c0_in_fwd": (51200, 1024, 3072),
    "c0_out_fwd": (51200, 1024, 1024),
    "c0_dw_in": (3072, 51200, 1024),
    "c0_dx": (51200, 3072, 1024),
    "c1_in_fwd": (320000, 512, 1536),
    "c1_dw_in": (1536, 320000, 512),
    "small_in_fwd": (4096, 768, 2304),
}


def tf32_round(x):
    i = x.view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_trunc(x):
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def timed(fn, reps=5):
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def run_shape(name):
    """One shape's record: every method's time and error."""
    m, k, n = SHAPES[name]
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda") / k ** 0.5
    # Exactness check of the reading: a TF32 mm of x and of trunc(x)/round(x).
    torch.backends.cuda.matmul.allow_tf32 = True
    sub_a, sub_b = a[:512], b[:, :512]
    plain = torch.mm(sub_a, sub_b)
    reads = {"trunc": torch.equal(plain, torch.mm(tf32_trunc(sub_a), tf32_trunc(sub_b))),
             "round": torch.equal(plain, torch.mm(tf32_round(sub_a), tf32_round(sub_b)))}
    ref = (a.double() @ b.double())
    scale = a.double().abs() @ b.double().abs()
    a_b, b_b = tf32_round(a), tf32_round(b)
    a_s, b_s = a - a_b, b - b_b
    a_st, b_st = a - tf32_trunc(a), b - tf32_trunc(b)

    def mm(allow_tf32):
        def run():
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            return torch.mm(a, b)
        return run

    def three_products(a_small, a_big, b_small, b_big):
        """small·big + big·small + big·big in TF32, the last two accumulating into the first."""
        def run():
            torch.backends.cuda.matmul.allow_tf32 = True
            d = torch.mm(a_small, b_big)
            d.addmm_(a_big, b_small)
            d.addmm_(a_big, b_big)
            return d
        return run

    three = three_products(a_s, a_b, b_s, b_b)
    three_t = three_products(a_st, a, b_st, b)  # the operand itself as "big"

    def three_chunked(kc=1024):
        # K in chunks, each chunk's three products into its own fp32 result, the chunk results
        # summed by CUDA-core adds (the tensor cores' accumulation is not fp32's)
        torch.backends.cuda.matmul.allow_tf32 = True
        d = None
        for k0 in range(0, k, kc):
            sl = slice(k0, min(k, k0 + kc))
            part = torch.mm(a_s[:, sl], b_b[sl])
            part.addmm_(a_b[:, sl], b_s[sl])
            part.addmm_(a_b[:, sl], b_b[sl])
            d = part if d is None else d.add_(part)
        return d

    def split():
        x = tf32_round(a)
        return a - x

    rec = {"shape": name, "mkn": [m, k, n], "reads": reads}
    for label, fn in [("sgemm", mm(False)), ("tf32", mm(True)), ("3xtf32", three), ("3xtf32_t", three_t)] + (
            [("3xtf32_k1024", three_chunked), ("3xtf32_k4096", lambda: three_chunked(4096))] if k > 4096 else []):
        d = fn().double()
        err = (d - ref).abs()
        rec[label] = {"ms": timed(fn), "max_scaled_err": float((err / scale).max()),
                      "frob_rel": float(err.norm() / ref.norm())}
        del d, err
    rec["split_a_ms"] = timed(split)
    flops = 2 * m * k * n
    for label in [l for l in rec if isinstance(rec[l], dict) and "ms" in rec[l]]:
        rec[label]["tflops"] = flops / rec[label]["ms"] / 1e9
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    torch.manual_seed(0)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "records": []}
    for name in args.shapes.split(","):
        rec = run_shape(name)
        print(json.dumps(rec), flush=True)
        out["records"].append(rec)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
