"""The hfnn executable: version, help, variants, and one-line errors for bad input."""
import json
import shutil
import subprocess

import pytest

import hfnn

HFNN = shutil.which("hfnn")
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")


def run(*args):
    return subprocess.run([HFNN, *args], capture_output=True, text=True, timeout=60)


def test_version_matches_the_python_package():
    out = run("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"hfnn {hfnn.__version__}"


def test_help_teaches_the_commands():
    for args in ([], ["--help"]):
        out = run(*args)
        assert out.returncode == 0
        assert "variants" in out.stdout and "to_hfnn" in out.stdout


def test_variants_json_matches_the_op_library():
    out = run("variants", "--json")
    assert out.returncode == 0
    rows = json.loads(out.stdout)
    names = {"fwd": [r["name"] for r in rows if r["pass"] == "fwd"], "bwd": [r["name"] for r in rows if r["pass"] == "bwd"]}
    assert names == hfnn.layer_norm_variants()


def test_bad_input_is_one_line_and_nonzero():
    for args in (["--bogus"], ["nonsense"], ["variants", "--what"]):
        out = run(*args)
        assert out.returncode == 2
        lines = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert "hfnn --help" in lines[0]


def test_the_main_job_runs_the_chain_on_the_bundled_example(tmp_path):
    """scripts/main.sh, the README's first command after setup: profile, then (with a GPU) tune and
    train with the winners, then report.html. On a machine without CUDA the last two say why not."""
    import torch
    from pathlib import Path

    main = Path(__file__).resolve().parents[2] / "scripts" / "main.sh"
    out = subprocess.run(["bash", str(main), "--steps", "3"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LayerNorm input shapes" in out.stdout and (tmp_path / "report.html").stat().st_size > 5000
    if torch.cuda.is_available():
        assert "Projected step time" in out.stdout and "step time: torch" in out.stdout
    else:
        assert "skipped: no CUDA device here" in out.stdout
    report = run("report", "--db", str(tmp_path / "shapes.db"))
    assert report.returncode == 0 and "Run 1" not in report.stderr, report.stderr
