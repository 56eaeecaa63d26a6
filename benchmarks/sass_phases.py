"""Where a kernel's warps wait, by phase: Nsight Compute's per-SASS-instruction warp-stall samples
(`NCU_SOURCE=1 bash benchmarks/ncu_decode.sh ...` writes them as CSV) summed between the kernel's
CTA barriers and wgmma waits, with the stall reasons of each phase.

    python benchmarks/sass_phases.py ncu-source-128x8-fp8_ds_mla.csv [--top 6]

A phase runs from one BAR.SYNC / WARPGROUP.DEPBAR to the next; it is named by its first
instructions of note (HGMMA, STS, LDG, SHFL, MUFU), so a tile loop reads as its steps. Samples
count warps (issued or stalled) seen at an instruction: a phase's share is the share of the
kernel's warp time spent there."""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

BOUNDARY = re.compile(r"\b(BAR\.SYNC|BAR\.ARV|WARPGROUP\.DEPBAR|EXIT)\b")
NOTE = ("HGMMA", "STS", "LDG", "LDS", "SHFL", "MUFU", "F2FP", "ATOMS", "RED", "STG", "BRA")


def read(path: str):
    """(header, rows) of the CSV's per-instruction table (the lines before it are ncu's log)."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    start = next(i for i, r in enumerate(lines) if r and r[0] == "Address")
    return lines[start], [r for r in lines[start + 1:] if r and r[0]]


def phases(hdr, rows):
    src = hdr.index("Source")
    samples = hdr.index("Warp Stall Sampling (All Samples)")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    out, cur = [], None
    for r in rows:
        if cur is None:
            cur = {"first": r[0], "n": 0, "samples": 0, "ops": collections.Counter(), "why": collections.Counter()}
        words = r[src].split()
        if words and words[0].startswith("@"):       # a predicate guard: the opcode follows
            words = words[1:]
        op = words[0].split(".")[0] if words else ""
        cur["n"] += 1
        cur["samples"] += int(float(r[samples] or 0))
        if op in NOTE:
            cur["ops"][op] += 1
        for i, name in reasons:
            v = r[i].strip()
            if v and v != "0":
                cur["why"][name] += int(float(v))
        if BOUNDARY.search(r[src]):
            cur["end"] = r[src].strip()
            out.append(cur)
            cur = None
    if cur is not None:
        cur["end"] = "(end)"
        out.append(cur)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=4, help="stall reasons shown per phase")
    a = ap.parse_args()
    hdr, rows = read(a.csv)
    ph = phases(hdr, rows)
    total = sum(p["samples"] for p in ph) or 1
    print(f"{len(rows)} instructions, {total} samples")
    print(f"{'first':>8} {'instr':>5} {'samples':>8} {'share':>6}  ops / ends at / top stalls")
    for p in ph:
        if p["samples"] == 0:
            continue
        ops = " ".join(f"{k}x{v}" for k, v in p["ops"].most_common(5))
        why = ", ".join(f"{k} {v / p['samples']:.0%}" for k, v in p["why"].most_common(a.top))
        print(f"{p['first']:>8} {p['n']:>5} {p['samples']:>8} {p['samples'] / total:6.1%}  {ops} | {p['end'][:40]} | {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
