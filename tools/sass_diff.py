"""Which kernels two artifact caches compiled differently: per spec and per kernel function, the
SASS (nvdisasm of the cubins embedded in each kernel.so, addresses and encodings dropped).

    python tools/sass_diff.py BASE_CACHE [NEW_CACHE]      # NEW_CACHE: $B12X_CACHE_DIR

Build the base tree's artifacts into their own cache first (a worktree of the base commit:
`PYTHONPATH=<worktree> B12X_CACHE_DIR=<dir> python -m codegen.cli build --preset ...`). A change
whose every old kernel has the same SASS runs every old call as before: what a session without a
GPU can say of a refactor or of new entry points (docs/notes/README.md). Needs nvdisasm (the
nvidia-cuda-nvdisasm wheel that nvidia-cutlass-dsl brings, or a CUDA toolkit)."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def nvdisasm() -> str:
    found = shutil.which("nvdisasm") or next(iter(glob.glob(os.path.join(
        os.path.dirname(sys.executable), "..", "lib", "python3*", "site-packages", "nvidia", "*", "bin", "nvdisasm"))),
        None)
    if not found:
        raise SystemExit("nvdisasm not found (pip install nvidia-cuda-nvdisasm, or put a CUDA toolkit on PATH)")
    return found


def artifacts(cache: str) -> dict[str, str]:
    """spec name -> kernel.so path, for every sm_* artifact of a cache."""
    out = {}
    for m in glob.glob(os.path.join(cache, "v1", "sm_*", "*", "*", "manifest.json")):
        with open(m) as f:
            out[json.load(f)["name"]] = os.path.join(os.path.dirname(m), "kernel.so")
    return out


def embedded_cubins(data: bytes) -> list[bytes]:
    """The uncompressed ELF cubins a b12x kernel.so embeds (the .so itself skipped)."""
    return [data[m.start():] for m in re.finditer(rb"\x7fELF", data) if m.start()]


def disassemble(cubins: list[bytes], tool: str) -> dict[str, tuple[list[str], dict[str, int]]]:
    """Kernel function -> (its SASS instructions, addresses and encodings dropped; label ->
    instruction index), from each cubin nvdisasm reads (other blobs are skipped)."""
    kernels = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, blob in enumerate(cubins):
            path = os.path.join(tmp, f"{i}.cubin")
            with open(path, "wb") as f:
                f.write(blob)
            r = subprocess.run([tool, "-c", path], capture_output=True, text=True)
            if r.returncode:
                continue                        # not a cubin (or trailing bytes nvdisasm refuses)
            cur, labels, pending = None, {}, []
            for line in r.stdout.splitlines():
                head = re.match(r"\s*\.text\.(\S+):", line)
                if head:
                    cur, labels, pending = [], {}, []
                    kernels[head.group(1)] = (cur, labels)
                    continue
                if cur is None:
                    continue
                label = re.match(r"\s*(\.L_x_\d+):", line)
                if label:
                    pending.append(label.group(1))
                    continue
                ins = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
                if ins:
                    for name in pending:
                        labels[name] = len(cur)
                    pending = []
                    cur.append(ins.group(1))
    return kernels


def sass(so_path: str, tool: str) -> dict[str, list[str]]:
    """Kernel function -> its SASS instructions, from every cubin embedded in the .so."""
    with open(so_path, "rb") as f:
        kernels = disassemble(embedded_cubins(f.read()), tool)
    return {name: ins for name, (ins, _) in kernels.items()}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    base_cache = argv[0]
    new_cache = argv[1] if len(argv) > 1 else os.environ.get("B12X_CACHE_DIR", "")
    tool = nvdisasm()
    base, new = artifacts(base_cache), artifacts(new_cache)
    changed = 0
    for name in sorted(base):
        if name not in new:
            print(f"{name}: not in the new cache")
            continue
        a, b = sass(base[name], tool), sass(new[name], tool)
        diff = [f for f in a if a[f] != b.get(f)]
        added = [f for f in b if f not in a]
        changed += bool(diff)
        note = "same SASS" if not diff else f"{len(diff)} of {len(a)} kernels differ: " + ", ".join(diff)
        print(f"{name}: {note}" + (f" (+{len(added)} new kernels)" if added else ""))
    for name in sorted(set(new) - set(base)):
        print(f"{name}: new")
    print(f"{len(base)} base specs, {changed} with a kernel whose SASS differs")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
