"""Kernel names in `hfnn report`: the database keeps CUPTI's mangled names, the reports show them
demangled and shortened as torch.profiler does, with the whole name in JSON and CSV, and each kernel
in the category of the ops that launch it (profiles/kernel_names.h).

No GPU needed: the run comes from a profile part such as a GPU process writes, put where
`hfnn profile` collects parts by a command that is not Python (so no collector runs beside it)."""
import csv
import html
import io
import json
import shutil
import sqlite3
import subprocess

import pytest

HFNN = shutil.which("hfnn")
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")

# Issue 13's kernel: an autocast cast (torch before 2.11), as CUPTI names it.
COPY = ("_ZN2at6native27unrolled_elementwise_kernelIZZZNS0_23direct_copy_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE1"
        "_clEvENKUlvE5_clEvEUlfE_NS_6detail5ArrayIPcLi2EEE23TrivialOffsetCalculatorILi1EjESC_NS0_6memory12LoadWithCast"
        "ILi1EEENSD_13StoreWithCastILi1EEEEEviT_T0_T1_T2_T3_T4_")
COPY_SHORT = "at::native::unrolled_elementwise_kernel<at::native::..."
NVJET = "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN"  # Hopper's cuBLAS GEMM: not mangled
SUM = ("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIf18__nv_hdl_wrapper_tILb0ELb1ELb0E1"
       "1__nv_dl_tagIMNS0_11sum_functorIfffEEFvRNS_14TensorIteratorEEXadL_ZNS7_clES9_EELj1EEFfffEJEEEEjfLi4ELi4EEEEEvT"
       "1_")  # aten::sum
HFNN_LN = ("_ZN4hfnn7kernels10layer_norm50_GLOBAL__N__68502824_17_layer_norm_fwd_cu_ac60f00415fwd_regs_kernelI13__nv_bf"
           "loat16Li16ELi1ELi1ELi16EEEvNS1_9FwdParamsE")


def _part():
    op = lambda name, us: {"name": name, "phase": "fwd", "calls": 10, "cpu_total_us": 50.0, "cpu_self_us": 50.0,
                           "cuda_total_us": us, "cuda_self_us": us}
    return {"format": "hfnn-profile-part", "version": 1,
            "meta": {"rank": 0, "world_size": 1, "pid": 1, "host": "test", "torch": "2.11.0", "hfnn": "0.1.0",
                     "cuda": "13.0", "gpu": {"name": "NVIDIA H200", "cc": "9.0", "sm_count": 132}},
            "warmup": 0, "steps_requested": 0, "step_boundaries": 0, "step_ms": [],
            "ops": [op("aten::mm", 400.0), op("aten::copy_", 300.0), op("aten::sum", 200.0),
                    op("hfnn::layer_norm_fwd", 100.0)],
            "shapes": [],
            "kernels": [{"name": NVJET, "calls": 10, "cuda_us": 400.0}, {"name": COPY, "calls": 10, "cuda_us": 300.0},
                        {"name": SUM, "calls": 10, "cuda_us": 200.0}, {"name": HFNN_LN, "calls": 10, "cuda_us": 100.0}]}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel_names")
    (tmp / "part.json").write_text(json.dumps(_part()))
    db = tmp / "shapes.db"
    out = subprocess.run([HFNN, "profile", "--db", str(db), "-q", "sh", "-c", 'cp part.json "$HFNN_PROFILE_DIR"/'],
                         capture_output=True, text=True, cwd=tmp, timeout=60)
    assert out.returncode == 0, out.stderr
    return db


def report(db, fmt):
    out = subprocess.run([HFNN, "report", "--db", str(db), "--format", fmt], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_database_keeps_the_raw_names(db):
    with sqlite3.connect(db) as con:
        assert {n for (n,) in con.execute("SELECT name FROM kernel_stats")} == {NVJET, COPY, SUM, HFNN_LN}


def test_text_report_shows_demangled_short_names_and_categories(db):
    text = report(db, "text")
    assert "_ZN" not in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert rows[COPY_SHORT.split()[0]][:2] == ["copy", "aten"] and COPY_SHORT in text
    assert rows[NVJET][:2] == ["gemm", "cublas"]  # drawn as "other" before
    assert rows["at::native::reduce_kernel<512,"][-5:-3] == ["reduction", "aten"]
    assert "hfnn::kernels::layer_norm::fwd_regs_kernel<__nv_bflo..." in text
    # The op table's categories are the kernels': aten::mm with nvjet, aten::copy_ with the cast.
    shares = text.split("Share by category:")[1].splitlines()[0]
    for category in ("gemm 40.0%", "copy 30.0%", "reduction 20.0%", "layer_norm 10.0%"):
        assert category in shares


def full_name(raw):
    """The kernel's name as torch.profiler has it (torch._C._demangle: c10::demangle, the C++ ABI's)."""
    import torch

    return torch._C._demangle(raw)


def test_json_report_has_the_whole_names(db):
    kernels = {k["raw_name"]: k for k in json.loads(report(db, "json"))["kernels"]}
    assert kernels[COPY]["name"] == full_name(COPY) and kernels[COPY]["short_name"] == COPY_SHORT
    assert kernels[COPY]["name"].startswith("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_")
    assert kernels[HFNN_LN]["name"] == full_name(HFNN_LN)
    assert "hfnn::kernels::layer_norm::(anonymous namespace)::fwd_regs_kernel<" in kernels[HFNN_LN]["name"]
    assert (kernels[HFNN_LN]["category"], kernels[HFNN_LN]["library"]) == ("layer_norm", "hfnn")
    assert kernels[NVJET]["name"] == kernels[NVJET]["short_name"] == NVJET
    assert kernels[SUM]["name"].startswith("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, ")


def test_csv_and_html_reports_have_the_whole_names(db):
    rows = [r for r in csv.DictReader(io.StringIO(report(db, "csv"))) if r["section"] == "kernel"]
    assert {(r["name"], r["category"]) for r in rows} >= {(full_name(COPY), "copy"), (NVJET, "gemm")}
    page = report(db, "html")
    assert f'title="{html.escape(full_name(COPY))}"><code>{html.escape(COPY_SHORT)}</code>' in page
    assert "_ZN" not in page
