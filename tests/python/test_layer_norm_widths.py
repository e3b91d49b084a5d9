"""LayerNorm at every width (GPU): every variant whose supports() says yes runs and matches float64,
and so does the built-in choice, from D = 1 to D = 262,144.

Widths: every D from 1 to 1,100, then a dense set up to 262,144 (powers of two and their
neighbours, multiples of 64 and of 96, odd values); row counts 1, 3, 257 and many (about 4M
elements); float32, bfloat16 and float16; and tensors that start 1, 2 or 4 elements into their
storage (rows aligned to less than 16 bytes). One test per dtype and range of widths: it runs every
case and reports every mismatch at once. On a machine without a GPU they skip with the reason.
"""
import ast
import fnmatch
import math
import os
import zlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import hfnn
from conftest import requires_gpu

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def wide_widths():
    """A dense set from 1,101 to 262,144: powers of two and their neighbours, multiples of 64 and 96
    (every one to 8,192, then about 8% apart), odd values, and today's hidden sizes."""
    ws = set()
    for e in range(11, 19):
        ws |= {2 ** e - 1, 2 ** e, 2 ** e + 1}
    ws |= set(range(1152, 8193, 64)) | set(range(1152, 8193, 96))
    # Past 8,192: multiples of 64 and of 96 about 8% apart, and the odd width beside each.
    w = 8192.0
    while w < 262144:
        w *= 1.08
        for m in (64, 96):
            near = int(round(w / m)) * m
            if near <= 262144:
                ws |= {near, near + 1}
    # 1,901 and 2,041: 16-bit rows the window variants take at 8 packs a lane of tpr32, all 8 needed.
    ws |= {1101, 1111, 1537, 1901, 2041, 2049, 3001, 4095, 5121, 6143, 9999, 12289, 20481, 25600, 32767, 49153, 65535, 99999,
           131071, 200001, 262143, 262144}
    # Rows aligned to 4 or 8 bytes only (16-bit D = 2 or 4 mod 8, float32 D = 2 mod 4): the widest
    # variants take them with narrower accesses.
    ws |= {1102, 1500, 4100, 6402, 12300, 25602, 32772, 65538, 131074, 262140}
    return sorted(w for w in ws if 1100 < w <= 262144)


WIDE = wide_widths()
# Globs (space-separated) of the variants the width and row-count tests check, where set: a kernel
# change's own cases on the GPU machine in a fraction of the time, e.g. LN_TEST_VARIANTS='fwd_flat_*'.
# The built-in choice runs either way; the check that some variant takes every case only without it.
VARIANT_GLOBS = os.environ.get("LN_TEST_VARIANTS", "").split()


def variants_under_test():
    """hfnn.layer_norm_variants(), or those LN_TEST_VARIANTS names where it is set."""
    variants = hfnn.layer_norm_variants()
    if not VARIANT_GLOBS:
        return variants
    return {p: [v for v in names if any(fnmatch.fnmatchcase(v, g) for g in VARIANT_GLOBS)]
            for p, names in variants.items()}


RANGES = {"1-275": range(1, 276), "276-550": range(276, 551), "551-825": range(551, 826),
          "826-1100": range(826, 1101), "wide-a": WIDE[: len(WIDE) // 2], "wide-b": WIDE[len(WIDE) // 2:]}


def rel_err(got, want, floor=0.0):
    """||got - want|| / ||want||, with sqrt(n) (or `floor`, if larger) as the floor of the scale (see
    test_layer_norm.py)."""
    got, want = got.double(), want.double()
    if not bool(torch.isfinite(got).all()):
        return math.inf
    scale = max(want.norm().item(), math.sqrt(want.numel()), floor)
    return (got - want).norm().item() / scale


def row_counts(cols):
    return [1, 3, 257, max(8, (1 << 22) // cols)]


def at_offset(t, offset):
    """t's values in a contiguous view that starts `offset` elements into a fresh buffer: with
    offset 1, 2 or 4, 16-bit data is only 2-, 4- or 8-byte aligned (float32: 4, 8, 16)."""
    if offset == 0:
        return t
    buf = torch.empty(t.numel() + offset, device=t.device, dtype=t.dtype)
    view = buf[offset:].view(t.shape)
    view.copy_(t)
    return view


def check_width(cols, dtype, variants, gen, rows_list=None, offset=0, shift=0.0):
    """Every supporting variant and the built-in choice at this width, its tensors `offset` elements
    into their buffers, x's mean `shift` further from zero; returns the failures."""
    failures = []
    ns = [cols]
    for rows in rows_list or row_counts(cols):
        for affine in ([True, False] if rows == 3 else [True]):
            x = at_offset((torch.randn(rows, cols, device="cuda", generator=gen) * 2 + 0.5 + shift).to(dtype), offset)
            dy = at_offset(torch.randn(rows, cols, device="cuda", generator=gen).to(dtype), offset)
            w = at_offset((1 + 0.5 * torch.randn(cols, device="cuda", generator=gen)).to(dtype), offset) if affine else None
            b = at_offset((0.5 * torch.randn(cols, device="cuda", generator=gen)).to(dtype), offset) if affine else None
            w64 = w.double() if affine else None
            b64 = b.double() if affine else None
            y_ref, m_ref, r_ref = torch.ops.aten.native_layer_norm(x.double(), ns, w64, b64, 1e-5)
            mask = [True, affine, affine]
            d_ref = torch.ops.aten.native_layer_norm_backward(dy.double(), x.double(), ns, m_ref, r_ref, w64, b64, mask)
            # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma: a difference of terms
            # of size rstd * g, so float32 rounds it to about that scale. Where they cancel (D = 1:
            # dx is 0, rstd is 1 / sqrt(eps) = 316) that, not sqrt(n), is the error's scale.
            dx_scale = (r_ref * dy.double() * (w64 if affine else 1.0)).norm().item()
            _, mean, rstd = torch.ops.aten.native_layer_norm(x, ns, w, b, 1e-5)
            where = (f"D={cols} rows={rows} {str(dtype)[6:]}{'' if affine else ' plain'}{f' offset {offset}' if offset else ''}"
                     f"{f' mean +{shift:g}' if shift else ''}")
            tol = TOL[dtype]
            ran = {"fwd": 0, "bwd": 0}
            for v in variants["fwd"]:
                if not torch.ops.hfnn.layer_norm_supports(x, ns, w, b, v):
                    continue
                ran["fwd"] += 1
                try:
                    y, m, r = torch.ops.hfnn.layer_norm_fwd(x, ns, w, b, 1e-5, v)
                except RuntimeError as e:
                    failures.append(f"{where} {v}: {str(e).splitlines()[0]}")
                    continue
                errs = (rel_err(y, y_ref), rel_err(m.view(-1), m_ref.view(-1)), rel_err(r.view(-1), r_ref.view(-1)))
                if errs[0] > tol or errs[1] > 1e-5 or errs[2] > 1e-5:
                    failures.append(f"{where} {v}: error y {errs[0]:.2e}, mean {errs[1]:.2e}, rstd {errs[2]:.2e}")
            for v in variants["bwd"]:
                if not torch.ops.hfnn.layer_norm_supports(x, ns, w, b, v):
                    continue
                ran["bwd"] += 1
                try:
                    got = torch.ops.hfnn.layer_norm_bwd(dy, x, ns, mean, rstd, w, b, mask, v)
                except RuntimeError as e:
                    failures.append(f"{where} {v}: {str(e).splitlines()[0]}")
                    continue
                errs = [rel_err(g, r, dx_scale if i == 0 else 0.0) for i, (g, r) in enumerate(zip(got, d_ref))
                        if r is not None]
                if errs[0] > tol or any(e > tol + 1e-5 for e in errs[1:]):
                    failures.append(f"{where} {v}: errors dx/dgamma/dbeta {', '.join(f'{e:.2e}' for e in errs)}")
            if not VARIANT_GLOBS and (not ran["fwd"] or not ran["bwd"]):
                failures.append(f"{where}: no variant takes it ({ran})")
            # The built-in choice, through the autograd op (what hfnn.nn.LayerNorm runs).
            leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
            try:
                y = torch.ops.hfnn.layer_norm(leaves[0], ns, leaves[1], leaves[2], 1e-5)
                y.backward(dy)
            except RuntimeError as e:
                failures.append(f"{where} built-in choice: {str(e).splitlines()[0]}")
                continue
            errs = [rel_err(y.detach(), y_ref)] + [rel_err(t.grad, r, dx_scale if i == 0 else 0.0)
                                                   for i, (t, r) in enumerate(zip(leaves, d_ref)) if t is not None]
            if errs[0] > tol or errs[1] > tol or any(e > tol + 1e-5 for e in errs[2:]):
                failures.append(f"{where} built-in choice: errors {', '.join(f'{e:.2e}' for e in errs)}")
    return failures


@requires_gpu
@pytest.mark.parametrize("widths", list(RANGES), ids=list(RANGES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_every_variant_at_every_width(dtype, widths):
    variants = variants_under_test()
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{dtype} {widths}".encode()))
    failures = []
    for cols in RANGES[widths]:
        failures += check_width(cols, dtype, variants, gen)
        if len(failures) > 200:
            break
    torch.cuda.synchronize()
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:40])


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_every_variant_with_the_mean_far_from_zero(dtype):
    """Rows whose mean is about 150 standard deviations from zero (x = 300.5 + 2 N(0, 1)): every
    variant that says yes, and the built-in choice, match float64 at widths from 1 to 65,536 (3 rows,
    and 8M elements, where the persistent backward kernels take several rounds of rows). What fails
    here: a one-pass variance (E[x^2] - mean^2) or a mean or variance summed in 16-bit (mean and rstd
    within 1e-5). What does not: xhat as one fma, x * rstd - mean * rstd (the 16-bit backward's dx
    does it; bench/README.md, "xhat as one fma"), which loses |mean| / std times float32's rounding,
    about 1e-5, under each dtype's tolerance. float32 from 255 columns on: over fewer a row's std can
    be small enough that |mean| / std times float32's rounding of the mean is past float32's
    tolerance in any kernel (at 2 columns every variant alike, y 2.7e-5 against 2e-5)."""
    probe = (300.5 + 2 * torch.randn(64, 1024, device="cuda")).to(dtype).double()
    assert (probe.mean(1) / probe.std(1)).min().item() > 100, "the rows' mean is not far from zero in their std"
    variants = variants_under_test()
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{dtype} far mean".encode()))
    failures = []
    for cols in [1, 2, 3, 8, 33, 64, 127, 128, 255, 256, 257, 1000, 1023, 1024, 1025, 2048, 4096, 4097, 12288,
                 65536]:
        if dtype == torch.float32 and cols < 255:
            continue
        failures += check_width(cols, dtype, variants, gen, rows_list=[3, max(8, (1 << 23) // cols)], shift=300.0)
    torch.cuda.synchronize()
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:40])


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_every_variant_at_unaligned_pointers(dtype):
    """Tensors that start 1, 2 or 4 elements into their storage (views, slices of a flat buffer):
    every variant that says yes matches float64; the row-register variants, which take the widest
    access the rows allow, say yes to every such row of up to 256 columns, the wide ones to rows of
    1,024 to 4,096 aligned to 4 bytes or more, and the window variants to every row not 16-byte
    aligned up to 2,041 columns in 16-bit (1,021 in float32), bwd_win_tpr32_smem to those of more
    than 8 elements a lane, the one-block wide window variants to every such row of 32 to 4,096
    packs (the backward's dx to 2,048, with its sums to 1,024) and to no 16-byte row, and
    bwd_block_win to exactly the rows
    aligned to one element, and the flat forward to every row of up to 16 elements a lane (512
    columns at tpr32, 64 at tpr4, 2,048 at tpr128) and no wider one, at tpr64 and tpr128 of more
    than 4 elements a lane. x and dy sit at the offset and dx is
    fresh, so the window variants' element-at-a-time path for tensors of another lead runs here."""
    variants = variants_under_test()
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{dtype} offsets".encode()))
    failures = []
    widths = [1, 2, 3, 5, 7, 8, 16, 31, 32, 33, 64, 100, 127, 128, 255, 256, 257, 500, 512, 1000, 1024, 1025, 4096,
              4100, 12302]
    for offset in (1, 2, 4):
        for cols in widths:
            failures += check_width(cols, dtype, variants, gen, rows_list=[3, 1000], offset=offset)
            x = at_offset(torch.zeros(7, cols, device="cuda", dtype=dtype), offset)
            w = at_offset(torch.ones(cols, device="cuda", dtype=dtype), offset)
            # The row-register variants take every row of up to 256 columns; the one-block wide ones
            # every row of 1,024 to 4,096 whose accesses can be 4 bytes wide (not 16-bit data 2 bytes in).
            takers = ("fwd_regs_tpr32", "bwd_regs_tpr32") if cols <= 256 else ()
            if 1024 <= cols <= 4096 and (cols * dtype.itemsize) % 4 == 0 and (offset * dtype.itemsize) % 4 == 0:
                takers = ("fwd_wide_c1", "bwd_wide_c1")
                # With its sums in shared memory, at most 256 threads of 8 accesses: 2,048 accesses
                # (float32 4,096 columns only with 8- or 16-byte ones).
                access = next(a for a in (16, 8, 4)
                              if (cols * dtype.itemsize) % a == 0 and (offset * dtype.itemsize) % a == 0)
                if cols * dtype.itemsize // access <= 2048:
                    takers += ("bwd_wide_c1_smem",)
            # The window variants take every row not 16-byte aligned that tpr32's 8 packs a lane
            # cover from any lead (V - 1 elements before the row, V to a 16-byte pack).
            vec = 16 // dtype.itemsize
            if ((cols * dtype.itemsize) % 16 or (offset * dtype.itemsize) % 16) and cols + vec - 1 <= 32 * 8 * vec:
                takers += ("fwd_win_tpr32", "bwd_win_tpr32")
                # Its _smem twin exactly where a lane holds more than 8 elements (below, the plain one).
                packs = -(-(cols + vec - 1) // (32 * vec))
                if packs * vec > 8:
                    takers += ("bwd_win_tpr32_smem",)
                elif torch.ops.hfnn.layer_norm_supports(x, [cols], w, w, "bwd_win_tpr32_smem"):
                    failures.append(f"D={cols} offset {offset} {str(dtype)[6:]}: bwd_win_tpr32_smem takes {packs} packs")
            # The wide window variants take every row not 16-byte aligned that one block holds:
            # the forward to 4,096 packs (8 a thread; gamma and beta as floats in the 227 KB of shared
            # memory a block may have, less the kernel's 384 bytes of its own), the backward's dx to
            # 2,048 (4 a thread).
            if (cols * dtype.itemsize) % 16 or (offset * dtype.itemsize) % 16:
                packs = (cols + 2 * vec - 2) // vec
                if 32 <= packs <= 4096 and packs * vec * 8 + 384 <= 227 * 1024:
                    takers += ("fwd_wide_win_c1",)
                if 32 <= packs <= 2048:
                    takers += ("bwd_wide_win_c1_cols",)
                # With its sums in shared memory, blocks of up to 256 threads of 4 packs.
                if 32 <= packs <= 1024:
                    takers += ("bwd_wide_win_c1_smem",)
            elif torch.ops.hfnn.layer_norm_supports(x, [cols], w, w, "fwd_wide_win_c1"):
                failures.append(f"D={cols} offset {offset} {str(dtype)[6:]}: fwd_wide_win_c1 takes a 16-byte row")
            # The flat forward takes every row of up to 16 elements a lane, at any alignment, and
            # no wider one; its row-groups of several warps (64 and 128 lanes) no row of 4 elements
            # a lane or fewer either.
            for tpr in FLAT_TPRS:
                v = f"fwd_flat_tpr{tpr}"
                if flat_takes(cols, tpr):
                    takers += (v,)
                elif torch.ops.hfnn.layer_norm_supports(x, [cols], w, w, v):
                    failures.append(f"D={cols} offset {offset} {str(dtype)[6:]}: {v} takes {cols} columns")
            # bwd_block_win takes exactly the rows aligned to one element (odd widths, odd offsets);
            # wider-aligned rows are bwd_block's.
            element_only = cols % 2 == 1 or offset % 2 == 1
            if element_only:
                takers += ("bwd_block_win",)
            elif torch.ops.hfnn.layer_norm_supports(x, [cols], w, w, "bwd_block_win"):
                failures.append(f"D={cols} offset {offset} {str(dtype)[6:]}: bwd_block_win takes a row aligned wider")
            for v in takers:
                if not torch.ops.hfnn.layer_norm_supports(x, [cols], w, w, v):
                    failures.append(f"D={cols} offset {offset} {str(dtype)[6:]}: {v} does not take it")
    torch.cuda.synchronize()
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:40])


def backward_case(rows, cols, dtype, gen, offset=0):
    """A backward's inputs: x, gamma and beta `offset` elements into their buffers, dy aligned; the
    float64 statistics and the dtype's own mean and rstd (what the forward hands the backward)."""
    ns = [cols]
    x = at_offset((torch.randn(rows, cols, device="cuda", generator=gen) * 2 + 0.5).to(dtype), offset)
    dy = torch.randn(rows, cols, device="cuda", generator=gen).to(dtype)
    w = at_offset((1 + 0.5 * torch.randn(cols, device="cuda", generator=gen)).to(dtype), offset)
    b = at_offset((0.5 * torch.randn(cols, device="cuda", generator=gen)).to(dtype), offset)
    _, m_ref, r_ref = torch.ops.aten.native_layer_norm(x.double(), ns, w.double(), b.double(), 1e-5)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, ns, w, b, 1e-5)
    return ns, x, dy, w, b, m_ref, r_ref, mean, rstd


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_backward_at_another_lead_and_every_output_mask(dtype):
    """The backward's paths the other tests leave out: dy at another offset in its 16 bytes than x
    (the window kernels read it an element at a time), and output masks without dx, without
    dgamma/dbeta, or with one of them alone (the *_cols variants' column sums write either). Every
    backward variant that takes the row, odd and even widths, one past the width where bwd_block's
    partials leave shared memory (about 25.8K columns), rows 1, 3 and 257."""
    variants = hfnn.layer_norm_variants()["bwd"]
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{dtype} leads".encode()))
    failures = []
    for cols in [1, 3, 33, 255, 1000, 1023, 2049, 4097, 12289, 30001]:
        for rows in [1, 3, 257]:
            # dy aligned: x's lead is not
            ns, x, dy, w, b, m_ref, r_ref, mean, rstd = backward_case(rows, cols, dtype, gen, offset=1)
            w64, b64 = w.double(), b.double()
            dx_scale = (r_ref * dy.double() * w64).norm().item()
            for mask in ([True, True, True], [True, False, False], [False, True, True], [True, True, False],
                         [False, False, True]):
                ref = torch.ops.aten.native_layer_norm_backward(dy.double(), x.double(), ns, m_ref, r_ref, w64, b64, mask)
                for v in variants:
                    if not torch.ops.hfnn.layer_norm_supports(x, ns, w, b, v):
                        continue
                    where = f"D={cols} rows={rows} {str(dtype)[6:]} mask {mask} {v}"
                    try:
                        got = torch.ops.hfnn.layer_norm_bwd(dy, x, ns, mean, rstd, w, b, mask, v)
                    except RuntimeError as e:
                        failures.append(f"{where}: {str(e).splitlines()[0]}")
                        continue
                    for i, (g, r) in enumerate(zip(got, ref)):
                        if not mask[i]:
                            continue
                        e = rel_err(g, r, dx_scale if i == 0 else 0.0)
                        if e > TOL[dtype] + (1e-5 if i else 0.0):
                            failures.append(f"{where}: output {i} error {e:.2e}")
    torch.cuda.synchronize()
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:40])


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_column_sums_at_every_row_step(dtype):
    """The *_cols variants' column sums (layer_norm_cols.cu) at the row counts where their loop
    changes step: a slice of the rows (every 16th) takes 16 rows at a time at 2-byte accesses (16-bit
    odd widths), then 4, then one, so counts around 16, 64 and 241 (a slice's first step of 16) run
    each mix of steps. dgamma and dbeta match float64 and are the same bits in a second call (sums in
    a fixed order); odd widths from 1 to 12,289 (2-byte accesses in 16-bit), a 4-byte one and a
    16-byte one."""
    variants = [v for v in hfnn.layer_norm_variants()["bwd"] if v.endswith("_cols")]
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{dtype} column steps".encode()))
    failures, ran = [], 0
    for cols in [1, 3, 33, 255, 1023, 2041, 4097, 12289, 4100, 4096]:
        for rows in [1, 2, 15, 16, 17, 63, 64, 65, 79, 80, 240, 241, 255, 256, 257, 321, 1000]:
            ns, x, dy, w, b, m_ref, r_ref, mean, rstd = backward_case(rows, cols, dtype, gen)
            w64, b64 = w.double(), b.double()
            mask = [True, True, True]
            ref = torch.ops.aten.native_layer_norm_backward(dy.double(), x.double(), ns, m_ref, r_ref, w64, b64, mask)
            for v in variants:
                if not torch.ops.hfnn.layer_norm_supports(x, ns, w, b, v):
                    continue
                ran += 1
                where = f"D={cols} rows={rows} {str(dtype)[6:]} {v}"
                try:
                    first = torch.ops.hfnn.layer_norm_bwd(dy, x, ns, mean, rstd, w, b, mask, v)
                    second = torch.ops.hfnn.layer_norm_bwd(dy, x, ns, mean, rstd, w, b, mask, v)
                except RuntimeError as e:
                    failures.append(f"{where}: {str(e).splitlines()[0]}")
                    continue
                for i in (1, 2):
                    e = rel_err(first[i], ref[i])
                    if e > TOL[dtype] + 1e-5:
                        failures.append(f"{where}: output {i} error {e:.2e}")
                    if not torch.equal(first[i], second[i]):
                        failures.append(f"{where}: output {i} differs between two calls")
    torch.cuda.synchronize()
    assert ran > 0, "no *_cols variant took any case"
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:40])


# Widths that put each variant family's row loop on a row count of its own: the flat forward (33,
# 63, 127, 255, 257; 257 to 2,041 in row-groups of several warps), the row-register kernels (34,
# 100, 160, 512), the window ones (1,023 and 2,041: 5 and 8 packs a lane at tpr32), the one-block
# and cluster wide ones (4,096, 12,288) and their window twins (4,097, 12,289); 1 and 7 for the
# smallest rows.
ROW_WIDTHS = [1, 7, 33, 34, 63, 100, 127, 160, 255, 257, 512, 766, 1023, 1536, 2041, 2044, 3072, 4096, 4097, 12288,
              12289]


FLAT_TPRS = (4, 8, 16, 32, 64, 128)


def flat_takes(cols, tpr):
    """Whether fwd_flat_tpr<tpr> takes rows of `cols` columns (flat_per_lane in layer_norm_flat.cu):
    up to 16 elements a lane, and with row-groups of several warps more than 4."""
    return cols <= 16 * tpr and (tpr <= 32 or cols > 4 * tpr)


def flat_tile_rows(cols, itemsize):
    """The flat forward's rows a tile for each of its lane counts that takes the width (flat_shape
    in layer_norm_flat.cu: 16 KB of the row's elements, at least a block's 256 threads' row-groups,
    at most 1,024)."""
    return sorted({min(1024, max(256 // tpr, 16384 // (cols * itemsize))) for tpr in FLAT_TPRS
                   if flat_takes(cols, tpr)})


def row_sweep(cols, itemsize):
    """Row counts for one width: every count to 70 (past the forward row-register kernels' rows a
    block, 128 / lanes x 2 at most 64, and the flat tile's row-groups, 64 at 4 lanes; the backward's
    take 256 / lanes x 2, up to 128, whose boundary the powers of two cover), the counts around
    1, 2 and 3 flat tiles, around powers of two to 1,024, and for wide rows the counts around the
    persistent grids' rows a round on the 132 SMs of an H100 or H200 (124 clusters of 8 x 2
    row-groups: 248, 62 of 16: 124; c1_ps at two blocks an SM: 264) and twice that; for 16-bit rows
    that the two-rows backward takes in one block (4- and 8-byte rows of 128 to 2,048 columns: 766
    and 2,044 here; 16-byte rows in blocks of 192 threads or one row-group: 1,536, 3,072 and
    4,096), the counts around where it starts, 3 rows for each row-group of a grid of 132 blocks
    (bwd_clusters' floor there: 396 for blocks of one row-group, 792 for two), and in clusters
    (16-bit rows of 4,096 columns and more) the counts from 96 to 111 and 160 to 175 (12,288
    columns: 99 rows in c4, 3 x 33 clusters of one row-group; 102 in c8, 3 x 17 of two; 168 in c16,
    3 x 14 resident clusters of four on the H200); past 1,025 rows only what keeps a case within
    about 4M elements."""
    rows = set(range(1, 71))
    if cols <= 16 * max(FLAT_TPRS):
        for t in flat_tile_rows(cols, itemsize):
            for k in (1, 2, 3):
                rows |= {k * t - 1, k * t, k * t + 1}
    for e in range(7, 11):
        rows |= {2 ** e - 1, 2 ** e, 2 ** e + 1}
    if cols >= 4096:
        rows |= set(range(120, 136)) | set(range(244, 269)) | {495, 496, 497, 527, 528, 529}
    if itemsize == 2 and 128 <= cols <= 4096:
        rows |= {395, 396, 397, 791, 792, 793}
    if itemsize == 2 and cols >= 4096:
        rows |= set(range(96, 112)) | set(range(160, 176))
    cap = max(8, (1 << 22) // cols)
    return sorted(r for r in rows if r <= max(cap, 1025))


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_gpu_every_variant_at_every_row_count(dtype):
    """Every variant that takes the row, and the built-in choice, at dense row counts (row_sweep):
    the last tile, row-group, block or persistent round partly filled in every way the kernels' row
    loops allow, where the width test has 1, 3, 257 and about 4M / D rows."""
    variants = variants_under_test()
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{dtype} row counts".encode()))
    failures = []
    for cols in ROW_WIDTHS:
        failures += check_width(cols, dtype, variants, gen, rows_list=row_sweep(cols, dtype.itemsize))
        if len(failures) > 200:
            break
    torch.cuda.synchronize()
    assert not failures, f"{len(failures)} failures, first ones:\n" + "\n".join(failures[:40])


def test_row_sweep_covers_every_boundary():
    """The counts the row test runs: every count to 70, both sides of each flat tile (33 bf16
    columns: 248 rows a tile at every lane count), of the powers of two, and of the persistent
    rounds."""
    rows = row_sweep(33, 2)
    assert set(range(1, 71)) <= set(rows)
    assert {247, 248, 249, 495, 496, 497, 743, 744, 745} <= set(rows)
    assert {127, 128, 129, 1023, 1024, 1025} <= set(rows)
    assert {30, 31, 32, 61, 62, 63, 92, 93, 94} <= set(row_sweep(257, 2))  # tpr64: 31 rows a tile
    assert {395, 396, 397, 791, 792, 793} <= set(row_sweep(766, 2))  # where the two-rows backward starts
    assert {395, 396, 397, 791, 792, 793} <= set(row_sweep(3072, 2)) & set(row_sweep(1536, 2))
    assert {98, 99, 100, 101, 102, 103, 167, 168, 169} <= set(row_sweep(12288, 2))  # in clusters
    wide = row_sweep(12288, 2)
    assert {247, 248, 249, 263, 264, 265} <= set(wide) and max(wide) <= 1025


def test_wide_widths_cover_what_the_issue_asks():
    ws = set(WIDE)
    assert all(2 ** e in ws and 2 ** e - 1 in ws and 2 ** e + 1 in ws for e in range(11, 18))
    assert 262144 in ws and max(ws) == 262144
    assert any(w % 2 for w in ws) and any(w % 96 == 0 and w % 64 for w in ws)
    assert any(w % 8 == 2 for w in ws) and any(w % 8 == 4 for w in ws) and any(w % 8 == 6 for w in ws)
    assert len(ws) > 200


# ---- the failures issue 10 reported, as a user meets them ----------------------------------------

@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("cols", [6144, 12288, 20480, 25600, 32768, 65536])
@pytest.mark.parametrize("rows", [3, 257])
def test_gpu_wide_layer_norm_trains_through_to_hfnn(cols, rows, dtype):
    torch.manual_seed(cols + rows)
    ref = torch.nn.LayerNorm(cols, device="cuda", dtype=dtype)
    with torch.no_grad():
        ref.weight.normal_(1, 0.5)
        ref.bias.normal_(0, 0.5)
    mod = hfnn.to_hfnn(torch.nn.LayerNorm(cols, device="cuda", dtype=dtype))
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(rows, cols, device="cuda", dtype=dtype) * 2 + 0.5
    dy = torch.randn_like(x)
    outs = []
    for m in (ref, mod):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.backward(dy)
        outs.append((y.detach().double(), xi.grad.double(), m.weight.grad.double(), m.bias.grad.double()))
        m.zero_grad()
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    for a, b in zip(*outs):
        assert rel_err(b, a) < tol


@requires_gpu
def test_gpu_builtin_choice_names_a_supporting_variant_or_torch():
    x = torch.randn(4096, 1024, device="cuda")
    for backward in (False, True):
        name = torch.ops.hfnn.layer_norm_default(x, [1024], None, None, backward)
        known = hfnn.layer_norm_variants()["bwd" if backward else "fwd"]
        assert name == "torch" or (name in known and torch.ops.hfnn.layer_norm_supports(x, [1024], None, None, name))


_FAILING_LAUNCH = r"""
import sys, torch, hfnn
x = torch.randn(64, 1024, device="cuda", requires_grad=True)
m = hfnn.to_hfnn(torch.nn.LayerNorm(1024, device="cuda"))
ref = torch.nn.LayerNorm(1024, device="cuda")
for _ in range(3):
    y = m(x)
    y.sum().backward()
torch.testing.assert_close(y, ref(x))
print("ok")
print(hfnn.dispatch_stats()["ops"]["layer_norm"]["fallbacks"])
"""


@requires_gpu
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_gpu_failed_launch_runs_torch_with_one_warning(backward):
    x = torch.randn(64, 1024, device="cuda")
    name = torch.ops.hfnn.layer_norm_default(x, [1024], torch.ones(1024, device="cuda"),
                                             torch.zeros(1024, device="cuda"), backward)
    if name == "torch":
        pytest.skip("the built-in choice for [64, 1024] on this GPU is torch's kernel: no hfnn launch to fail")
    env = dict(os.environ, HFNN_TEST_FAIL_LAUNCH=name)
    env.pop("HFNN_STRICT", None)
    out = subprocess.run([sys.executable, "-c", _FAILING_LAUNCH], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ok, fallbacks = out.stdout.strip().splitlines()
    assert ok == "ok"
    warnings = [line for line in out.stderr.splitlines() if f"variant '{name}' failed" in line]
    assert len(warnings) == 1, out.stderr  # three calls, one warning
    # Every call counted as a failed launch: the first failed, the others went to torch directly.
    assert ast.literal_eval(fallbacks)["bwd" if backward else "fwd"].get("kernel launch failed") == 3, fallbacks
    env["HFNN_STRICT"] = "1"
    out = subprocess.run([sys.executable, "-c", _FAILING_LAUNCH], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0
    assert "HFNN_STRICT=1" in out.stderr and name in out.stderr


@requires_gpu
def test_gpu_named_variant_that_fails_raises_for_the_tuner():
    # A variant asked for by name (hfnn tune, tests) reports its failure instead of falling back.
    x = torch.randn(64, 1024, device="cuda")
    script = ("import torch, hfnn\nx = torch.randn(64, 1024, device='cuda')\n"
              "try:\n    torch.ops.hfnn.layer_norm_fwd(x, [1024], None, None, 1e-5, 'fwd_wide_c1')\n"
              "except RuntimeError as e:\n    print('raised', 'fwd_wide_c1 failed' in str(e))\n")
    if not torch.ops.hfnn.layer_norm_supports(x, [1024], None, None, "fwd_wide_c1"):
        pytest.skip("fwd_wide_c1 does not take [64, 1024] here")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, HFNN_TEST_FAIL_LAUNCH="fwd_wide_c1"))
    assert out.stdout.strip() == "raised True", out.stderr[-2000:]


@requires_gpu
def test_gpu_unmeasured_width_matches_torch():
    # Whatever the choice, F.layer_norm and hfnn agree on a width no sweep measured.
    x = torch.randn(5, 777, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(hfnn.nn.layer_norm(x, 777), F.layer_norm(x, (777,)), rtol=2e-2, atol=2e-2)
