"""The benchmark and example scripts run on the GPU machine only, so a name they import from hfnn
that has moved would first fail there, after a build and a device start (it happened: bench/ kept
importing graph_samples from the tune worker after it moved to hfnn._measure). Every
`from hfnn... import name` in them must resolve here."""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("examples/*.py"), *ROOT.glob("scripts/*.py")])


def hfnn_imports(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hfnn" and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hfnn":
                    yield alias.name, None


def test_the_scan_finds_imports():
    found = [m for p in SCRIPTS for m in hfnn_imports(p)]
    assert ("hfnn._measure", "graph_samples") in found, found


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_hfnn_name_a_script_imports_exists(path):
    for module, name in hfnn_imports(path):
        mod = importlib.import_module(module)
        if name is not None and name != "*":
            assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None, \
                f"{path.relative_to(ROOT)}: `from {module} import {name}`: {module} has no {name}"
