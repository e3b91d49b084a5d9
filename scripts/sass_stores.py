#!/usr/bin/env python3
"""The global loads and stores each kernel of a CUDA library compiles to, by width, from its SASS.

A kernel meant to move 16-byte packs should show LDG.E.128 / STG.E.128. This script disassembles a
library (by default the device build's op library, build/device-sm90/libhfnn_ops.so, made by
scripts/device_wheel.sh) with cuobjdump and prints, per kernel template, how many instantiations
there are and how many global accesses of each width they hold, and flags the instantiations with
SPLIT stores: four unpredicated 4-byte stores from one base register at offsets o, o+4, o+8, o+12
(o a multiple of 16), which is how a 16-byte store that the compiler split looks (bench/README.md,
"The window backward's own sums": every window kernel's pack store came out that way). Loops that
write floats one at a time look the same (bwd_block_kernel's partial rows): a flag is a place to
look, not a verdict.

cuobjdump and nvdisasm come with the CUDA Toolkit; where the toolkit lacks them (this project's CPU
machine), --fetch downloads NVIDIA's PyPI wheels of both (nvidia-cuda-cuobjdump,
nvidia-cuda-nvdisasm) into build/sass-tools/ and uses them from there.

  python3 scripts/sass_stores.py                         every kernel template of the op library
  python3 scripts/sass_stores.py --filter layer_norm     only kernels whose name matches
  python3 scripts/sass_stores.py --lib some.cubin --fetch
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "build" / "sass-tools"
ACCESS = re.compile(r"\b(LDG|STG)\.E((?:\.[A-Z0-9]+)*)\s")
STORE32 = re.compile(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?STG\.E(\.[A-Z0-9.]+)?\s+desc\[[^\]]+\]\[(R\d+)\.64(?:\+0x([0-9a-f]+))?\]")


def fail(msg: str) -> None:
    sys.exit(f"sass_stores.py: {msg}")


def tool(name: str, fetch: bool) -> str:
    """The path of cuobjdump or nvdisasm: on PATH, in the toolkit, or in build/sass-tools/."""
    for where in (shutil.which(name), "/usr/local/cuda/bin/" + name, *map(str, TOOLS.glob(f"**/bin/{name}"))):
        if where and os.access(where, os.X_OK):
            return where
    if not fetch:
        fail(f"{name} not found (not on PATH, not in /usr/local/cuda/bin): run again with --fetch to download "
             f"NVIDIA's PyPI wheel of it into {TOOLS.relative_to(ROOT)}/")
    package = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}[name]
    TOOLS.mkdir(parents=True, exist_ok=True)
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(TOOLS), package],
                         capture_output=True, text=True)
    if got.returncode != 0:
        fail(f"pip download {package} failed: {got.stderr.strip().splitlines()[-1] if got.stderr.strip() else got.returncode}")
    for wheel in TOOLS.glob(f"{package.replace('-', '_')}-*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(TOOLS / wheel.stem)
    for path in TOOLS.glob(f"**/bin/{name}"):
        path.chmod(0o755)
        return str(path)
    fail(f"{package}'s wheel has no bin/{name}")
    return ""


def split_stores(body: str) -> int:
    """Groups of four unpredicated 4-byte stores from one base at o, o+4, o+8, o+12 (16 | o)."""
    offsets = collections.defaultdict(set)
    for m in STORE32.finditer(body):
        predicate, modifier, base, off = m.groups()
        if not predicate and not modifier:
            offsets[base].add(int(off or "0", 16))
    return sum(1 for offs in offsets.values() for o in offs if o % 16 == 0 and {o + 4, o + 8, o + 12} <= offs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", type=Path, default=ROOT / "build" / "device-sm90" / "libhfnn_ops.so",
                    help="a shared library, object file or cubin with device code (default: %(default)s)")
    ap.add_argument("--filter", default="", help="only kernels whose demangled name matches this regex")
    ap.add_argument("--fetch", action="store_true", help="download cuobjdump and nvdisasm from PyPI if missing")
    args = ap.parse_args()
    if not args.lib.is_file():
        fail(f"--lib {args.lib}: no such file (build it with bash scripts/device_wheel.sh, or name another)")
    if shutil.which("c++filt") is None:
        fail("c++filt not found: install binutils (it names the kernels)")
    cuobjdump = tool("cuobjdump", args.fetch)
    nvdisasm = tool("nvdisasm", args.fetch)
    env = dict(os.environ, PATH=f"{os.path.dirname(nvdisasm)}:{os.environ.get('PATH', '')}")
    sass = subprocess.run([cuobjdump, "-sass", str(args.lib)], capture_output=True, text=True, env=env)
    if sass.returncode != 0:
        fail(f"cuobjdump -sass {args.lib} failed: {sass.stderr.strip()[:300]}")
    chunks = re.split(r"\n[ \t]*Function : ", sass.stdout)[1:]
    if not chunks:
        fail(f"--lib {args.lib}: no device functions in it (built without CUDA?)")
    mangled = [c.split("\n", 1)[0].strip() for c in chunks]
    names = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.splitlines()
    rows = collections.OrderedDict()
    flag = re.compile(args.filter) if args.filter else None
    for name, body in zip(names, chunks):
        name = name.replace("(anonymous namespace)::", "").split("(")[0].replace("void ", "")
        if flag and not flag.search(name):
            continue
        family = re.sub(r"<.*", "", name)
        row = rows.setdefault(family, {"n": 0, "split": 0, "access": collections.Counter()})
        row["n"] += 1
        row["split"] += split_stores(body) > 0
        for op, mods in ACCESS.findall(body):
            width = next((w for w in (".128", ".64", ".U16", ".U8", ".S16") if w in mods), ".32")
            row["access"][op + width] += 1
    if not rows:
        fail(f"no kernel matches --filter {args.filter!r}")
    print(f"{args.lib}: {sum(r['n'] for r in rows.values())} kernels")
    print("| kernel | instantiations | with split 16-byte stores | global accesses (static count by width) |")
    print("|---|---|---|---|")
    for family, r in sorted(rows.items(), key=lambda kv: (-kv[1]["split"], kv[0])):
        access = ", ".join(f"{k} {v}" for k, v in sorted(r["access"].items()))
        print(f"| {family} | {r['n']} | {r['split'] or ''} | {access} |")


if __name__ == "__main__":
    main()
