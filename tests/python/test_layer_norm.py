"""hfnn's LayerNorm against torch in float64: forward, every gradient, every variant in the build.

CPU tests check the op's contract and its fall-back to torch; GPU tests iterate the variant table,
so a new variant is tested without new test code.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import hfnn
from conftest import requires_gpu

# Awkward shapes: one row, D = 1, odd D, one off a power of two, odd row counts, size-1 dims, more
# than one normalized dim, and the seed's AlphaFold widths.
SHAPES = [
    ((1, 1), (1,)),
    ((1, 8), (8,)),
    ((7, 63), (63,)),
    ((3, 1, 7, 64), (64,)),
    ((33, 128), (128,)),
    ((2, 3, 5, 256), (256,)),
    ((17, 384), (384,)),
    ((9, 1023), (1023,)),
    ((4, 1024), (1024,)),
    ((2, 4097), (4097,)),
    ((5, 4, 32), (4, 32)),
    ((1, 257, 128), (128,)),
]
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def rel_err(got, want):
    """||got - want|| / ||want||, with elements of size 1 as the floor of the scale: where the exact
    answer is (near) zero, as dx for D = 1, float32 rounding must not count as a relative error."""
    got, want = got.double(), want.double()
    assert not torch.isnan(got).any(), "NaN in output"
    scale = max(want.norm().item(), math.sqrt(want.numel()))
    return (got - want).norm().item() / scale


def make(shape, normalized, dtype, device, affine=True, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(device=device, dtype=dtype)
    dy = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    w = (1 + 0.5 * torch.randn(normalized, generator=g)).to(device=device, dtype=dtype) if affine else None
    b = (0.5 * torch.randn(normalized, generator=g)).to(device=device, dtype=dtype) if affine else None
    return x, dy, w, b


def reference(x, normalized, w, b, dy, eps=1e-5):
    """float64 forward and gradients, through torch's own LayerNorm on upcast inputs."""
    leaves = [t.detach().double().cpu().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = F.layer_norm(leaves[0], normalized, leaves[1], leaves[2], eps)
    y.backward(dy.double().cpu())
    return y.detach(), [t.grad if t is not None else None for t in leaves]


def run_op(x, normalized, w, b, dy, eps=1e-5):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = torch.ops.hfnn.layer_norm(leaves[0], list(normalized), leaves[1], leaves[2], eps)
    y.backward(dy)
    return y.detach(), [t.grad if t is not None else None for t in leaves]


# ---- CPU: the contract and the fall-back ----------------------------------------------------------

@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,normalized", SHAPES[:6])
def test_cpu_falls_back_to_torch_exactly(shape, normalized, affine):
    x, dy, w, b = make(shape, normalized, torch.float32, "cpu", affine)
    y, grads = run_op(x, normalized, w, b, dy)
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    y_t = F.layer_norm(leaves[0], normalized, leaves[1], leaves[2])
    y_t.backward(dy)
    assert torch.equal(y, y_t.detach())
    for got, want in zip(grads, [t.grad if t is not None else None for t in leaves]):
        assert (got is None) == (want is None)
        if got is not None:
            assert torch.equal(got, want)


def test_gradcheck_float64_cpu():
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: torch.ops.hfnn.layer_norm(x, [8], w, b, 1e-5), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, b: torch.ops.hfnn.layer_norm(x, [5, 8], None, None, 1e-5), (x, b))


def test_only_bias_gets_its_gradient():
    x = torch.randn(4, 6, dtype=torch.float64)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    y = torch.ops.hfnn.layer_norm(x, [6], None, b, 1e-5)
    (g,) = torch.autograd.grad(y.sum() * 2, (b,))
    assert torch.allclose(g, torch.full_like(b, 8.0))


def test_meta_shapes_follow_cuda_contract():
    x = torch.empty(2, 3, 16, device="meta", dtype=torch.bfloat16)
    y, mean, rstd = torch.ops.hfnn.layer_norm_fwd(x, [16], None, None, 1e-5)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert mean.shape == (2, 3, 1) and rstd.shape == (2, 3, 1) and mean.dtype == torch.float32


def test_autocast_cpu_behaves_like_torch():
    x = torch.randn(4, 32)
    w, b = torch.randn(32), torch.randn(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xb = x.to(torch.bfloat16)
        got = torch.ops.hfnn.layer_norm(xb, [32], w, b, 1e-5)
        want = F.layer_norm(xb, (32,), w, b)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def test_bad_normalized_shape_is_a_clear_error():
    with pytest.raises(RuntimeError, match="normalized_shape"):
        torch.ops.hfnn.layer_norm(torch.randn(2, 8), [7], None, None, 1e-5)


def test_named_variant_on_cpu_says_why():
    with pytest.raises(RuntimeError, match="not a CUDA tensor"):
        torch.ops.hfnn.layer_norm_fwd(torch.randn(2, 8), [8], None, None, 1e-5, "fwd_block")


def test_module_matches_torch_module_on_cpu():
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm(32)
    mod = hfnn.nn.LayerNorm(32)
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(4, 32)
    assert torch.equal(mod(x), ref(x))
    assert list(mod.state_dict()) == list(ref.state_dict())


def test_functional_accepts_int_normalized_shape():
    x = torch.randn(3, 10)
    assert torch.equal(hfnn.nn.layer_norm(x, 10), F.layer_norm(x, (10,)))


def test_build_info_lists_variants_when_built_with_cuda():
    info = hfnn.build_info()
    variants = hfnn.layer_norm_variants()
    if info["cuda_kernels"]:
        assert "fwd_block" in variants["fwd"] and "bwd_block" in variants["bwd"]
    else:
        assert variants == {"fwd": [], "bwd": []}


def test_rel_err_catches_a_wrong_answer():
    want = torch.randn(100, dtype=torch.float64)
    assert rel_err(want.float(), want) < 1e-6
    assert rel_err(want * 1.01, want) > 5e-3


# ---- GPU: every variant against float64 -----------------------------------------------------------

def _cuda_variants(direction):
    return hfnn.layer_norm_variants()[direction] if hfnn.build_info()["cuda_kernels"] else []


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,normalized", SHAPES, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_gpu_every_variant_matches_float64(shape, normalized, dtype, affine):
    x, dy, w, b = make(shape, normalized, dtype, "cuda", affine, seed=sum(shape))
    y_ref, grads_ref = reference(x, normalized, w, b, dy)
    ran = 0
    for fwd in _cuda_variants("fwd"):
        if not torch.ops.hfnn.layer_norm_supports(x, list(normalized), w, b, fwd):
            continue
        y, mean, rstd = torch.ops.hfnn.layer_norm_fwd(x, list(normalized), w, b, 1e-5, fwd)
        assert rel_err(y.cpu(), y_ref) < TOL[dtype], fwd
        for bwd in _cuda_variants("bwd"):
            if not torch.ops.hfnn.layer_norm_supports(x, list(normalized), w, b, bwd):
                continue
            ran += 1
            mask = [True, affine, affine]
            dx, dw, db = torch.ops.hfnn.layer_norm_bwd(dy, x, list(normalized), mean, rstd, w, b, mask, bwd)
            assert rel_err(dx.cpu(), grads_ref[0]) < TOL[dtype], (fwd, bwd)
            if affine:
                assert rel_err(dw.cpu(), grads_ref[1]) < TOL[dtype] + 1e-5, (fwd, bwd, "dgamma")
                assert rel_err(db.cpu(), grads_ref[2]) < TOL[dtype] + 1e-5, (fwd, bwd, "dbeta")
    assert ran > 0, "no variant pair supports this case"


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_autograd_op_matches_float64(dtype):
    for shape, normalized in SHAPES:
        x, dy, w, b = make(shape, normalized, dtype, "cuda", seed=3)
        y_ref, grads_ref = reference(x, normalized, w, b, dy)
        y, grads = run_op(x, normalized, w, b, dy)
        assert rel_err(y.cpu(), y_ref) < TOL[dtype], shape
        for got, want in zip(grads, grads_ref):
            assert rel_err(got.cpu(), want) < TOL[dtype] + 1e-5, shape


@requires_gpu
@pytest.mark.parametrize("dtype,cols", [(torch.float32, 4096), (torch.float32, 4097), (torch.bfloat16, 8192),
                                        (torch.bfloat16, 8193), (torch.bfloat16, 8194), (torch.bfloat16, 63),
                                        (torch.bfloat16, 256), (torch.float16, 8192), (torch.float16, 8193)], ids=str)
def test_gpu_backward_past_l2_every_variant_matches_float64(dtype, cols):
    # Passes whose bytes are more than L2 holds: there the dgamma/dbeta partial rows are dropped
    # from L2 as the reduction reads them (discard.global.L2), which the small shapes above never
    # reach. A line dropped before it was summed would come back as garbage in dgamma or dbeta.
    # Widths that are not whole 128-byte lines of partials too (their lines straddle partial rows,
    # so they are not dropped), narrow and wide, 16-byte, 4-byte and 2-byte aligned rows.
    shape = (2048 if cols >= 1024 else 2**24 // cols, cols)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    if 3 * shape[0] * cols * torch.tensor([], dtype=dtype).element_size() <= l2:
        pytest.skip(f"this GPU's L2 ({l2 >> 20} MiB) holds the pass: nothing is dropped")
    x, dy, w, b = make(shape, (cols,), dtype, "cuda", seed=11)
    y_ref, grads_ref = reference(x, (cols,), w, b, dy)
    _, mean, rstd = torch.ops.hfnn.layer_norm_fwd(x, [cols], w, b, 1e-5)
    ran = []
    for bwd in _cuda_variants("bwd"):
        if not torch.ops.hfnn.layer_norm_supports(x, [cols], w, b, bwd):
            continue
        ran.append(bwd)
        dx, dw, db = torch.ops.hfnn.layer_norm_bwd(dy, x, [cols], mean, rstd, w, b, [True, True, True], bwd)
        assert rel_err(dx.cpu(), grads_ref[0]) < TOL[dtype], bwd
        assert rel_err(dw.cpu(), grads_ref[1]) < TOL[dtype] + 1e-5, (bwd, "dgamma")
        assert rel_err(db.cpu(), grads_ref[2]) < TOL[dtype] + 1e-5, (bwd, "dbeta")
        # Again into a fresh workspace: the same bits (the drops leave nothing a later call reads).
        again = torch.ops.hfnn.layer_norm_bwd(dy, x, [cols], mean, rstd, w, b, [True, True, True], bwd)
        assert all(torch.equal(a, c) for a, c in zip((dx, dw, db), again)), (bwd, "second call differs")
    assert any(v.startswith("bwd_wide_" if cols >= 1024 else "bwd_") for v in ran), ran


@requires_gpu
def test_gpu_autocast_runs_our_kernels_in_float32():
    lin = torch.nn.Linear(64, 64).cuda()
    norm = torch.nn.LayerNorm(64).cuda()
    x = torch.randn(32, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = lin(x)
        assert h.dtype == torch.bfloat16
        want = norm(h)
        got = hfnn.to_hfnn(norm)(h)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@requires_gpu
def test_gpu_pairs_with_torch_both_ways():
    x, dy, w, b = make((64, 256), (256,), torch.float32, "cuda")
    y_t, mean_t, rstd_t = torch.native_layer_norm(x, [256], w, b, 1e-5)
    y_h, mean_h, rstd_h = torch.ops.hfnn.layer_norm_fwd(x, [256], w, b, 1e-5)
    assert mean_h.shape == mean_t.shape and mean_h.dtype == mean_t.dtype
    torch.testing.assert_close(mean_h, mean_t)
    torch.testing.assert_close(rstd_h, rstd_t)
    ours_on_torch = torch.ops.hfnn.layer_norm_bwd(dy, x, [256], mean_t, rstd_t, w, b, [True, True, True])
    torch_on_ours = torch.ops.aten.native_layer_norm_backward(dy, x, [256], mean_h, rstd_h, w, b, [True, True, True])
    for a, c in zip(ours_on_torch, torch_on_ours):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


@requires_gpu
def test_gpu_bit_identical_run_to_run():
    x, dy, w, b = make((4099, 384), (384,), torch.bfloat16, "cuda")
    first = run_op(x, (384,), w, b, dy)
    second = run_op(x, (384,), w, b, dy)
    assert torch.equal(first[0], second[0])
    for a, c in zip(first[1], second[1]):
        assert torch.equal(a, c)


@requires_gpu
def test_gpu_unsupported_inputs_fall_back_to_torch():
    # float64, non-contiguous input, weight in another dtype: torch's kernel, same answers.
    x = torch.randn(8, 64, dtype=torch.float64, device="cuda")
    assert torch.equal(torch.ops.hfnn.layer_norm(x, [64], None, None, 1e-5), F.layer_norm(x, (64,)))
    xt = torch.randn(64, 8, device="cuda").t()
    torch.testing.assert_close(torch.ops.hfnn.layer_norm(xt, [64], None, None, 1e-5), F.layer_norm(xt, (64,)))
    w = torch.randn(128, device="cuda")[::2]  # a strided weight: no variant takes it
    x = torch.randn(8, 64, device="cuda")
    torch.testing.assert_close(torch.ops.hfnn.layer_norm(x, [64], w, None, 1e-5), F.layer_norm(x, (64,), w))


@requires_gpu
def test_gpu_nan_and_inf_propagate_like_torch():
    x = torch.randn(4, 128, device="cuda")
    x[1, 5] = math.nan
    x[2, 7] = math.inf
    got = torch.ops.hfnn.layer_norm(x, [128], None, None, 1e-5)
    want = F.layer_norm(x, (128,))
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    torch.testing.assert_close(got[[0, 3]], want[[0, 3]])


@requires_gpu
def test_gpu_unknown_or_unsupporting_variant_is_a_clear_error():
    x = torch.randn(4, 63, device="cuda")
    with pytest.raises(RuntimeError, match="no variant named"):
        torch.ops.hfnn.layer_norm_fwd(x, [63], None, None, 1e-5, "fwd_nope")
    # A variant that says no to these rows (asked, not assumed: variants learn new shapes; the
    # row-register ones took unaligned rows such as these on 2026-11-23).
    refusing = [v for v in hfnn.layer_norm_variants()["fwd"]
                if not torch.ops.hfnn.layer_norm_supports(x, [63], None, None, v)]
    assert refusing, "every forward variant takes 4 x 63 float32: pick another shape for this test"
    with pytest.raises(RuntimeError, match="does not support"):
        torch.ops.hfnn.layer_norm_fwd(x, [63], None, None, 1e-5, refusing[0])


@requires_gpu
def test_gpu_defaults_file_replaces_the_compiled_in_choice(tmp_path):
    """HFNN_LAYER_NORM_DEFAULTS: the built-in choice is read from that file (a GPU the repository
    never swept gets its own sweep's choice, a new sweep is checked before it is compiled in); a file
    that is not such data is one clear error at the first call, not a silent fall-back."""
    import json
    import subprocess
    import sys

    name = torch.cuda.get_device_name()
    cc = "{}.{}".format(*torch.cuda.get_device_capability())
    x = torch.randn(1000, 1024, device="cuda")
    # Two variants that take these rows, ranked first for this GPU (forward and backward): not what
    # the compiled-in data ranks first at least once, so the test sees the file.
    fwd = [v for v in hfnn.layer_norm_variants()["fwd"]
           if torch.ops.hfnn.layer_norm_supports(x, [1024], None, None, v)]
    bwd = [v for v in hfnn.layer_norm_variants()["bwd"]
           if torch.ops.hfnn.layer_norm_supports(x, [1024], None, None, v)]
    assert len(fwd) >= 2 and len(bwd) >= 2
    builtin = (torch.ops.hfnn.layer_norm_default(x, [1024], None, None, False),
               torch.ops.hfnn.layer_norm_default(x, [1024], None, None, True))
    pick = (next(v for v in fwd if v != builtin[0]), next(v for v in bwd if v != builtin[1]))
    data = {"gpus": [{"name": name, "compute_capability": cc, "points": [
        {"dtype": "float32", "pass": p, "rows": 1000, "cols": 1024, "ranking": [v, "torch"]}
        for p, v in zip(("fwd", "bwd"), pick)]}]}
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(data))
    bad.write_text('{"gpus": [{"name": "x"}]}')
    script = ("import torch, hfnn; x = torch.randn(1000, 1024, device='cuda');"
              "print(torch.ops.hfnn.layer_norm_default(x, [1024], None, None, False),"
              " torch.ops.hfnn.layer_norm_default(x, [1024], None, None, True))")
    env = dict(__import__("os").environ)
    env["HFNN_LAYER_NORM_DEFAULTS"] = str(good)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == list(pick)
    env["HFNN_LAYER_NORM_DEFAULTS"] = str(bad)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"HFNN_LAYER_NORM_DEFAULTS={bad}: " in out.stderr and "layer_norm_sweep.py --defaults" in out.stderr
