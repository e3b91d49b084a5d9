"""float32 GEMMs on tensor cores without TF32: how fast, how accurate (issue 11, fp32 configs).

nn.MultiheadAttention in float32 without TF32 spends 85-90% of its time in float32 GEMMs on CUDA
cores (about 50 TFLOP/s on an H200). A float32 matrix is exactly the sum of three bfloat16 ones
(a = a0 + a1 + a2, 8 + 8 + 8 significant bits), and bf16 x bf16 products are exact in float32, so
A B = sum over i + j <= 2 of Ai Bj, up to the dropped terms of 2^-24 relative: float32's own
rounding. Six products, laid side by side along k, are one bf16 GEMM with float32 output and 6k.

Candidates, per GEMM shape of the op's fp32 calls (seed 001's two configs):
  fp32       torch.mm, float32 on CUDA cores (TF32 off): what torch's module runs
  tf32       torch.mm with TF32, for reference only (10 significant bits: not float32 accuracy)
  bf16x6     the split above, the GEMM alone (the split's bytes are counted apart: `split_bytes`)
  bf16x9     cuBLAS's own float32 emulation (CUBLAS_FP32_EMULATED_BF16X9_MATH, eager): on a GPU
             without it (Hopper) cuBLAS runs float32, the same time and error bits
Error: max |C - C64| / (|A| |B|)[row, col] over the output, C64 the float64 product: the bound a
float32 GEMM's rounding obeys (about k * 2^-24 at worst, sqrt(k) * 2^-24 typically).

    python3 bench/fp32_gemm.py --out bench/results/fp32_gemm-h200.json
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

from _bench import write_result

# (name, m, n, k): D[m, n] = A[m, k] B[k, n], the op's six GEMMs per call of two configs
# (tokens T = B * L, width E): in-projection [T, E] x [E, 3E], out-projection [T, E] x [E, E],
# their input gradients (k = 3E and E) and weight gradients (k = T).
def shapes(configs):
    out = []
    for b, l, e in configs:
        t = b * l
        tag = f"[{b},{l},{e}]"
        out += [
            (f"{tag} in_proj", t, 3 * e, e),
            (f"{tag} out_proj", t, e, e),
            (f"{tag} dx_in", t, e, 3 * e),
            (f"{tag} dw_in", 3 * e, e, t),
            (f"{tag} dx_out", t, e, e),
            (f"{tag} dw_out", e, e, t),
        ]
    return out


def timed(fn, iters=10, reps=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters * 1e3)
    return statistics.median(times)


def split3(x):
    x0 = x.to(torch.bfloat16)
    r = x - x0.float()
    x1 = r.to(torch.bfloat16)
    x2 = (r - x1.float()).to(torch.bfloat16)
    return x0, x1, x2


def emulated_mm(a, b):
    """bf16x6 as torch ops (the split by several kernels; only the mm is timed)."""
    a0, a1, a2 = split3(a)
    b0, b1, b2 = split3(b)
    ap = torch.cat([a0, a0, a0, a1, a1, a2], dim=1)
    bp = torch.cat([b0, b1, b2, b0, b1, b0], dim=0)
    return ap, bp


class Cublas:
    """cuBLAS through ctypes: Sgemm with its float32 emulation math mode (the library torch loaded)."""

    def __init__(self):
        torch.mm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))
        self.lib = None
        for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.lib is None:
            raise OSError("libcublas not found")
        self.handle = ctypes.c_void_p()
        self.check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        ver = ctypes.c_int()
        self.lib.cublasGetVersion_v2(self.handle, ctypes.byref(ver))
        self.version = ver.value

    @staticmethod
    def check(status, what):
        if status != 0:
            raise RuntimeError(f"{what}: cublas status {status}")

    def emulated(self, strategy=2):
        self.check(self.lib.cublasSetMathMode(self.handle, 4), "cublasSetMathMode(BF16X9)")
        self.check(self.lib.cublasSetEmulationStrategy(self.handle, strategy), "cublasSetEmulationStrategy")

    def sgemm(self, a, b, c):
        """c[m, n] = a[m, k] b[k, n], row-major (column-major c^T = b^T a^T)."""
        m, k = a.shape
        n = b.shape[1]
        self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.check(self.lib.cublasSgemm_v2(
            self.handle, 0, 0, n, m, k, ctypes.byref(one),
            ctypes.c_void_p(b.data_ptr()), n, ctypes.c_void_p(a.data_ptr()), k,
            ctypes.byref(zero), ctypes.c_void_p(c.data_ptr()), n), "cublasSgemm")


def rel_error(c, c64, bound):
    return float(((c.double() - c64).abs() / bound).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--configs", nargs="+", default=["200,256,1024", "5000,64,512"],
                    help="B,L,E per config (default: seed 001's two)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/fp32_gemm.py: needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    try:
        cb = Cublas()
        emu = Cublas()
        emu.emulated()
        cublas_note = f"cuBLAS {cb.version}"
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        cb = emu = None
        cublas_note = f"cuBLAS via ctypes unavailable: {e}"
    print(gpu, torch.__version__, cublas_note, flush=True)
    has_out_dtype = True
    try:
        torch.mm(torch.ones(8, 8, device="cuda", dtype=torch.bfloat16),
                 torch.ones(8, 8, device="cuda", dtype=torch.bfloat16), out_dtype=torch.float32)
    except (TypeError, RuntimeError) as e:
        has_out_dtype = False
        print("torch.mm has no out_dtype:", e)
    records = []
    torch.manual_seed(0)
    for name, m, n, k in shapes([tuple(int(v) for v in c.split(",")) for c in args.configs]):
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda") / k ** 0.5
        c64 = a.double() @ b.double()
        bound = a.double().abs() @ b.double().abs()
        flops = 2 * m * n * k
        rec = dict(shape=name, m=m, n=n, k=k)
        out = torch.empty(m, n, device="cuda")
        us = timed(lambda: torch.mm(a, b, out=out))
        rec["fp32_us"] = us
        rec["fp32_tflops"] = flops / us / 1e6
        rec["fp32_err"] = rel_error(out, c64, bound)
        torch.backends.cuda.matmul.allow_tf32 = True
        us = timed(lambda: torch.mm(a, b, out=out))
        rec["tf32_us"], rec["tf32_err"] = us, rel_error(out, c64, bound)
        torch.backends.cuda.matmul.allow_tf32 = False
        if has_out_dtype:
            app, bpp = emulated_mm(a, b)
            us = timed(lambda: torch.mm(app, bpp, out_dtype=torch.float32))
            res = torch.mm(app, bpp, out_dtype=torch.float32)
            rec["bf16x6_us"] = us
            rec["bf16x6_effective_tflops"] = flops / us / 1e6
            rec["bf16x6_err"] = rel_error(res, c64, bound)
            # the fused split kernel would read A and B once (4 B) and write them six times (12 B)
            rec["split_bytes"] = 16 * (m * k + k * n)
            del app, bpp, res
        if emu is not None:
            try:
                emu.sgemm(a, b, out)
                us = timed(lambda: emu.sgemm(a, b, out))
                rec["bf16x9_us"], rec["bf16x9_err"] = us, rel_error(out, c64, bound)
            except RuntimeError as e:
                rec["bf16x9"] = f"unsupported: {e}"
        print(json.dumps(rec), flush=True)
        records.append(rec)
        del a, b, c64, bound, out
        torch.cuda.empty_cache()
    result = dict(gpu=gpu, torch=torch.__version__, cublas=cublas_note,
                  date=datetime.date.today().isoformat(), records=records)
    write_result(result, args.out, leave_out=("records",))  # the records were printed as they came


if __name__ == "__main__":
    main()
