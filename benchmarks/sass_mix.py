"""Instruction mix of a generated kernel's SASS, without a GPU: the numbers to count before a run.

    CUTE_DSL_ARCH=sm_90a python benchmarks/sass_mix.py SPEC_NAME [--top N] [--keep DIR]

SPEC_NAME is any catalog spec (`b12x-codegen list`), e.g. indexer_logits_paged_h64_c1_g2_sm_90a.
The module is compiled with the DSL keeping its PTX, each kernel's PTX goes through `ptxas -O3`
and `nvdisasm`, and the script prints per kernel: registers, the static instruction count, the
most frequent opcodes, and the instructions between consecutive CTA barriers (the usual unit of a
pipelined main loop: one page, one tile). Static counts are not executed counts, but the loop
bodies between barriers are what a page or tile issues, and time tracked them closely in the
indexer logits kernel (docs/notes/indexer-logits.md).

Needs `ptxas` (CUDA toolkit) and `nvdisasm` on PATH or in $NVDISASM; the pip wheel
nvidia-cuda-nvdisasm provides the latter (bin/ inside the nvidia/cu13 package directory)."""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OPCODE = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def find_tool(name: str, env: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        sys.exit(f"sass_mix: {name} not found: put it on PATH or set ${env}")
    return path


def spec_by_name(name: str):
    from codegen.catalog import all_catalog_specs

    for s in all_catalog_specs():
        if s.name == name:
            return s
    sys.exit(f"sass_mix: no catalog spec named {name!r} (see `b12x-codegen list`)")


def opcodes(sass: str) -> list[str]:
    return [m.group(1) for line in sass.splitlines() if (m := OPCODE.match(line))]


def barrier_spans(ops: list[str]) -> list[int]:
    """Instruction counts between consecutive BAR (CTA barrier) instructions."""
    idx = [i for i, op in enumerate(ops) if op == "BAR"]
    return [b - a for a, b in zip(idx, idx[1:])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("--top", type=int, default=16, help="opcodes to list per kernel")
    ap.add_argument("--keep", default=None, help="directory for the PTX, cubin and SASS (default: a temp dir)")
    args = ap.parse_args()
    ptxas, nvdisasm = find_tool("ptxas", "PTXAS"), find_tool("nvdisasm", "NVDISASM")
    spec = spec_by_name(args.spec)
    os.environ.setdefault("CUTE_DSL_ARCH", spec.arch)
    work = Path(args.keep or tempfile.mkdtemp(prefix="sass_mix_"))
    work.mkdir(parents=True, exist_ok=True)
    from codegen.build import compile_module

    cwd = os.getcwd()
    os.chdir(work)                       # the DSL writes kept PTX into the working directory
    try:
        os.environ["CUTE_DSL_KEEP_PTX"] = "1"
        (work / "module").mkdir(exist_ok=True)
        _, manifest, _ = compile_module(spec, work / "module")
    finally:
        os.chdir(cwd)
    regs = manifest.get("kernels", {})
    for ptx in sorted(work.glob("*.ptx")):
        cubin = ptx.with_suffix(".cubin")
        subprocess.run([ptxas, f"-arch={spec.arch}", "-O3", str(ptx), "-o", str(cubin)], check=True,
                       capture_output=True)
        sass = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
        cubin.with_suffix(".sass").write_text(sass)
        ops = opcodes(sass)
        kernel = next((k for k in regs if k.lower().replace("_", "") in ptx.name.lower().replace("_", "")), ptx.stem[:60])
        mix = collections.Counter(ops).most_common(args.top)
        spans = barrier_spans(ops)
        print(f"== {kernel}: {regs.get(kernel, {})}, {len(ops)} instructions")
        print("   " + "  ".join(f"{op}:{n}" for op, n in mix))
        if spans:
            print(f"   between CTA barriers: {spans}")
    print(f"(PTX, cubin and SASS in {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
