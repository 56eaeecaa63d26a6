"""Fingerprints of the PTX every kernel of a spec compiles to, without a GPU: the check that a
restructure of the templates (building blocks, renamed classes, moved helpers) left the device
code as it was.

    CUTE_DSL_ARCH=sm_90a python benchmarks/ptx_fingerprint.py --preset sparse-mla-all --json after.json
    python benchmarks/ptx_fingerprint.py --compare before.json after.json

Each entry point is compiled as the builder compiles it (codegen/build.py), with the PTX kept in
memory. The PTX is normalised before hashing: comments, `.file` / `.loc` debug lines and the
names of entries and functions (they carry the module and class names) are dropped, so only the
instructions, their order and the resources they declare count. Equal fingerprints mean the
same PTX, hence the same SASS from ptxas. A spec's arch must match CUTE_DSL_ARCH: run once per
arch."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_NAME = re.compile(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$][\w$]*)")


def normalise(ptx: str) -> str:
    lines = [ln for ln in ptx.splitlines()
             if ln.strip() and not ln.lstrip().startswith(("//", ".file", ".loc"))]
    text = "\n".join(lines)
    for i, name in enumerate(dict.fromkeys(_NAME.findall(text))):
        text = text.replace(name, f"F{i}")
    return text


def fingerprints(spec) -> dict[str, str]:
    import cutlass.cute as cute

    from codegen.build import _import_from_file
    from codegen.render import render

    with tempfile.TemporaryDirectory(prefix="ptxfp-") as tmp:
        path = Path(tmp) / f"{spec.name}.py"
        path.write_text(render(spec))
        module = _import_from_file(path, f"b12x_gen_{spec.name}")
        out = {}
        for name, (obj, make_fakes) in module.ENTRY_POINTS.items():
            compiled = cute.compile(obj, *make_fakes(), options="--enable-tvm-ffi --keep-ptx")
            out[name] = hashlib.sha256(normalise(compiled.artifacts.PTX).encode()).hexdigest()[:16]
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", default=[], help="a catalog preset (repeatable)")
    ap.add_argument("--spec", action="append", default=[], help="a spec name from `b12x-codegen list P`")
    ap.add_argument("--json", help="write {spec name: {entry point: fingerprint}} here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprint files")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        same = [n for n in a if n in b and a[n] == b[n]]
        diff = [n for n in a if n in b and a[n] != b[n]]
        print(f"{len(same)} specs with the same PTX, {len(diff)} differ, "
              f"{len(set(a) - set(b))} only before, {len(set(b) - set(a))} only after")
        for n in diff:
            print(f"  {n}: " + ", ".join(k for k in a[n] if a[n].get(k) != b[n].get(k)))
        return 1 if diff else 0
    from codegen.catalog import all_catalog_specs, get_preset

    arch = os.environ.get("CUTE_DSL_ARCH", "sm_90a")
    os.environ["CUTE_DSL_ARCH"] = arch
    specs = [s for p in args.preset for s in get_preset(p).specs((arch,))]
    specs += [s for s in all_catalog_specs() if s.name in args.spec]
    specs = [s for s in dict.fromkeys(specs) if s.arch == arch]
    result = {}
    for i, s in enumerate(specs, 1):
        result[s.name] = fingerprints(s)
        print(f"[{i}/{len(specs)}] {s.name}: {result[s.name]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
