"""scripts/sass_stores.py's detector of 16-byte stores the compiler split into four 4-byte ones
(bench/README.md, "The window backward's own sums"), on SASS lines as cuobjdump prints them: the
window kernels' pack store before the fix, a kept STG.E.128, predicated element stores, and
4-byte stores that do not make a 16-byte group."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sass_stores", ROOT / "scripts" / "sass_stores.py")
sass_stores = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_stores)


def line(addr, text):
    return f"        /*{addr:04x}*/                   {text} ;   /* 0x0000000000000000 */\n"


# As in bwd_wide_kernel<__nv_bfloat16, 2, 16, true, true, true> before the fix (SASS of 55f222e).
SPLIT = "".join([
    line(0x6a10, "STG.E desc[UR26][R38.64], R29"),
    line(0x6a30, "STG.E desc[UR26][R38.64+0x4], R31"),
    line(0x6a40, "STG.E desc[UR26][R38.64+0x8], R33"),
    line(0x6a50, "STG.E desc[UR26][R38.64+0xc], R35"),
])


def test_four_unpredicated_word_stores_from_one_base_are_a_split_store():
    assert sass_stores.split_stores(SPLIT) == 1
    # two packs, 16 bytes apart, from the same base
    second = SPLIT.replace("R38.64+0xc]", "R38.64+0x1c]").replace("R38.64+0x8]", "R38.64+0x18]") \
                  .replace("R38.64+0x4]", "R38.64+0x14]").replace("R38.64]", "R38.64+0x10]")
    assert sass_stores.split_stores(SPLIT + second) == 2


def test_a_kept_128_bit_store_predicated_stores_and_partial_groups_are_not():
    kept = line(0x3d60, "STG.E.128 desc[UR14][R6.64], R32")
    assert sass_stores.split_stores(kept) == 0
    # the element-at-a-time path: predicated 16-bit and 32-bit stores
    predicated = "".join(line(0x6900 + 16 * k, f"@!P{k} STG.E desc[UR26][R28.64+0x{4 * k:x}], R30") for k in range(4))
    assert sass_stores.split_stores(predicated) == 0
    # three words only, or four from different bases, or not starting on 16 bytes
    assert sass_stores.split_stores("".join(SPLIT.splitlines(keepends=True)[:3])) == 0
    mixed = SPLIT.replace("R38.64+0x8]", "R40.64+0x8]")
    assert sass_stores.split_stores(mixed) == 0
    shifted = "".join(line(0x100 + 16 * k, f"STG.E desc[UR4][R2.64+0x{4 + 4 * k:x}], R{k}") for k in range(4))
    assert sass_stores.split_stores(shifted) == 0
