"""The loops of a kernel's SASS, counted: what each warp issues per trip of each loop (MMAs by
shape, exp2, shared-memory and global copies, barriers), for our artifacts and for a peer's
compiled library side by side, on a machine without a GPU.

    python tools/sass_loops.py SPEC_NAME                        # an artifact of $B12X_CACHE_DIR
    python tools/sass_loops.py PATH.so|PATH.whl [--kernel SUBSTR] [--arch 90]
    ... [--seq]                                                  # also each loop's event sequence

A peer's library (FlashMLA's `_C_legacy.abi3.so`, or the wheel that holds it) carries its cubins in
fatbin entries, compressed with zstd by recent nvcc; they are unpacked with the `zstd` command.
`--kernel` keeps the kernels whose mangled name contains SUBSTR. A loop is a backward branch
over at least 24 instructions (shorter ones are mbarrier and spin waits); an unconditional jump
back across an unconditional EXIT is the return of a retry stub nvcc places after the kernel's
end, not a loop. Counts are static: a branch inside a loop counts both of its sides.
docs/notes/extend.md ("FlashMLA's SASS beside ours") is what this was written for."""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_diff import artifacts, disassemble, embedded_cubins, nvdisasm  # noqa: E402

FATBIN_MAGIC = b"\x50\xed\x55\xba"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# The classes a loop's line counts; HGMMA is also split by shape.
COUNTED = ("HGMMA", "MUFU", "FMUL", "FFMA", "FADD", "FMNMX", "FSEL", "F2FP", "SHFL", "LDS", "STS",
           "STSM", "LDSM", "LDG", "LDGSTS", "STG", "SYNCS", "BAR", "WARPGROUP")


def fatbin_cubins(data: bytes, arch: int) -> list[bytes]:
    """The ELF cubins for sm_<arch> in every fatbin of a shared object."""
    out, pos = [], 0
    while (start := data.find(FATBIN_MAGIC, pos)) >= 0:
        _, _, header, size = struct.unpack_from("<IHHQ", data, start)
        entry, end = start + header, start + header + size
        while entry < end:
            (kind, _, ehead, padded, csize, _, _, _, e_arch, _, _, _flags, _,
             _dsize) = struct.unpack_from("<HHIQIIHHIIIQQQ", data, entry)
            payload = data[entry + ehead: entry + ehead + (csize or padded)]
            if kind == 2 and e_arch == arch:
                if payload[:4] == ZSTD_MAGIC:
                    if shutil.which("zstd") is None:
                        raise SystemExit("this library's cubins are zstd-compressed: put the zstd command on PATH")
                    payload = subprocess.run(["zstd", "-d", "-c"], input=payload, capture_output=True,
                                             check=True).stdout
                if payload[:4] == b"\x7fELF":
                    out.append(payload)
            entry += ehead + padded
        pos = end
    return out


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", ins).split()[0]


def loops(ins: list[str], labels: dict[str, int], min_len: int = 24) -> list[tuple[int, int]]:
    found = []
    for i, text in enumerate(ins):
        target = re.search(r"\((\.L_x_\d+)\)", text) if opcode(text).startswith("BRA") else None
        start = labels.get(target.group(1), i + 1) if target else i + 1
        # An unconditional jump back across an unconditional EXIT is the return of a wait's retry
        # stub (nvcc places those after the kernel's end), not a loop. A loop may hold a
        # predicated EXIT (a producer leaving when its rows run out) or be left by a predicated
        # back edge.
        stub = not text.startswith("@") and any(t in ("EXIT", "RET") for t in ins[start:i])
        if start <= i - min_len and not stub:
            found.append((start, i))
    return sorted(set(found))


def counts(ins: list[str]) -> collections.Counter:
    c = collections.Counter()
    for text in ins:
        op = opcode(text)
        c[op.split(".")[0]] += 1
        if op.startswith("HGMMA."):
            c["HGMMA " + op.split(".")[1]] += 1
    return c


def sequence(ins: list[str]) -> str:
    """MMAs, waits, barriers and the softmax's exp2 in order, runs collapsed (other ops as '.')."""
    words = []
    for text in ins:
        op = opcode(text)
        base = op.split(".")[0]
        if base == "HGMMA":
            word = "G" + op.split(".")[1]
        elif base == "MUFU":
            word = "EX2"
        elif base in ("SYNCS", "BAR", "WARPGROUP", "ARRIVES"):
            word = op
        elif base in ("LDGSTS", "LDS", "STS", "STSM", "LDG", "SHFL", "FMUL", "FMNMX"):
            word = base
        else:
            word = "."
        if words and words[-1][0] == word:
            words[-1][1] += 1
        else:
            words.append([word, 1])
    return " ".join(w if n == 1 else f"{w}x{n}" for w, n in words)


def report(kernels: dict, substr: str | None, seq: bool) -> None:
    for name, (ins, labels) in kernels.items():
        if substr and substr not in name:
            continue
        print(f"{name[:160]}\n  {len(ins)} instructions")
        for lo, hi in loops(ins, labels):
            c = counts(ins[lo:hi + 1])
            shapes = " ".join(f"{k[6:]}={v}" for k, v in sorted(c.items()) if k.startswith("HGMMA "))
            classes = " ".join(f"{k}={c[k]}" for k in COUNTED if c[k])
            print(f"  loop [{lo}, {hi}] {hi - lo + 1} instructions: {classes}" + (f" | {shapes}" if shapes else ""))
            if seq:
                print("    " + sequence(ins[lo:hi + 1]))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", help="a spec name in $B12X_CACHE_DIR, a peer's .so, or a wheel holding one")
    ap.add_argument("--kernel", help="keep kernels whose mangled name contains this")
    ap.add_argument("--arch", type=int, default=90, help="fatbin entries of sm_<arch> (peer libraries)")
    ap.add_argument("--seq", action="store_true", help="print each loop's event sequence")
    args = ap.parse_args(argv)
    if args.what.endswith(".whl"):
        with zipfile.ZipFile(args.what) as z:
            cubins = [c for n in z.namelist() if n.endswith(".so") for c in fatbin_cubins(z.read(n), args.arch)]
    elif os.path.isfile(args.what):
        cubins = fatbin_cubins(open(args.what, "rb").read(), args.arch)
    else:
        found = artifacts(os.environ.get("B12X_CACHE_DIR", ""))
        if args.what not in found:
            raise SystemExit(f"{args.what}: not a file and not a spec in B12X_CACHE_DIR "
                             f"({len(found)} specs there)")
        cubins = embedded_cubins(open(found[args.what], "rb").read())
    report(disassemble(cubins, nvdisasm()), args.kernel, args.seq)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
