"""tools/sass_loops.py on synthetic input: the fatbin walk (plain and zstd-compressed entries, other
archs and PTX skipped) and the loop finder (retry stubs after EXIT and spin waits are no loops)."""
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import sass_loops  # noqa: E402

ELF = b"\x7fELF" + bytes(range(60)) * 3


def entry(payload: bytes, kind: int = 2, arch: int = 90, padded: int | None = None) -> bytes:
    padded = len(payload) if padded is None else padded
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, padded, len(payload), 0, 0, 0, arch, 0, 0,
                       0, 0, len(ELF))
    return head + payload + b"\0" * (padded - len(payload))


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_entries_of_the_arch():
    lib = b"\x7fELF host object" + fatbin(entry(ELF), entry(ELF + b"x", arch=100),
                                           entry(b"// ptx", kind=1)) + b"tail"
    assert sass_loops.fatbin_cubins(lib, 90) == [ELF]
    assert sass_loops.fatbin_cubins(lib, 100) == [ELF + b"x"]
    assert sass_loops.fatbin_cubins(lib, 120) == []


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
def test_fatbin_zstd_entry_and_padding():
    packed = subprocess.run(["zstd", "-c", "-q"], input=ELF, capture_output=True, check=True).stdout
    lib = fatbin(entry(packed, padded=len(packed) + 5), entry(ELF)) * 2
    assert sass_loops.fatbin_cubins(lib, 90) == [ELF] * 4


def test_loops_skip_waits_and_retry_stubs():
    body = ["FFMA R1, R2, R3, R1"] * 30
    ins = (["MOV R0, RZ"]                                        # 0
           + ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0",     # 1: a spin wait
              "@!P0 BRA `(.L_x_1)"]                               # 2 -> 1
           + body                                                 # 3..32: the loop body
           + ["@P1 BRA `(.L_x_2)"]                                # 33 -> 3
           + ["EXIT"]                                             # 34
           + ["SYNCS.PHASECHK.TRANS64 P0, [UR4], R0",             # 35: the retry stub
              "BRA `(.L_x_1)"])                                   # 36 -> 1, across EXIT
    labels = {".L_x_1": 1, ".L_x_2": 3}
    assert sass_loops.loops(ins, labels) == [(3, 33)]
    # a producer's loop, left by a predicated EXIT and closed by an unconditional branch
    producer = ["LDG.E R1, desc[UR4][R2.64]"] * 30 + ["@!P0 EXIT", "BRA `(.L_x_3)"]
    assert sass_loops.loops(["MOV R0, RZ"] + producer, {".L_x_3": 1}) == [(1, 32)]
    c = sass_loops.counts(ins[3:34])
    assert c["FFMA"] == 30 and c["BRA"] == 1
    assert sass_loops.sequence(["HGMMA.64x64x16.F32.BF16 R0, gdesc[UR4], R0"] * 3 + ["IADD3 R1, R1, 1, RZ"]
                               + ["MUFU.EX2 R2, R2"]) == "G64x64x16x3 . EX2"
