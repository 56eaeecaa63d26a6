"""b12x-codegen: list [PRESET] | emit [--check] | build --preset P | export --preset P --to DIR | prewarm --preset P |
verify | prune."""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time

from b12x.artifact_cache import ArtifactCache
from b12x.errors import B12xError

from .catalog import DEFAULT_PRESET, PRESETS, PresetError, get_preset, parse_archs, spec_role
from .specs import SpecError


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


LIST_WIDTH = 100  # `list` fits a 100-column terminal


def _fitted_table(headers: list[str], rows: list[list[str]]) -> str:
    """_table with the last column clipped so that no line is wider than LIST_WIDTH."""
    used = sum(max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(headers[:-1]))
    room = max(8, LIST_WIDTH - used)
    rows = [r[:-1] + [r[-1] if len(r[-1]) <= room else r[-1][: room - 3] + "..."] for r in rows]
    return "\n".join(line.rstrip() for line in _table(headers, rows).splitlines())


def cmd_list(args) -> int:
    """Without a preset: one line per preset (name, model, spec count, what). With one: its specs."""
    archs = parse_archs(args.arch)
    if args.preset:
        p = get_preset(args.preset)
        print(f"{p.name}{' (default)' if p.name == DEFAULT_PRESET else ''}: "
              f"{p.model + ' model preset' if p.model else 'component preset'}")
        print(textwrap.fill(p.description, LIST_WIDTH))
        print(_fitted_table(["spec", "arch", "family", "what"],
                            [[s.name, s.arch, s.family, spec_role(s)] for s in p.specs(archs)]))
        return 0
    rows = [[p.name + ("*" if p.name == DEFAULT_PRESET else ""), p.model or "-", str(len(p.specs(archs))),
             p.description] for p in PRESETS.values()]
    print(_fitted_table(["preset", "model", "specs", "what"], rows))
    print(f"* default. specs: count for {', '.join(archs)}; `b12x-codegen list PRESET` names them.")
    print("model -: a component preset (tests, benchmarks).")
    return 0


def cmd_emit(args) -> int:
    """In a checkout: write (or --check) generated/ and codegen/source_index.json. In an installed
    wheel there is no generated/: --check compares the shipped index with the shipped templates."""
    from . import PACKAGE_DIR, SOURCE_INDEX_PATH, SOURCE_TREE, TEMPLATES_DIR
    from .identity import can_render

    if not can_render():
        print(f"b12x-codegen: emit renders the templates ({TEMPLATES_DIR}) and needs them and jinja2; "
              f"install jinja2 (a serving box does not need emit)", file=sys.stderr)
        return 2
    from .emit import emit, stale, stale_index

    if not SOURCE_TREE:
        if not args.check:
            print(f"b12x-codegen: emit writes generated/ and codegen/source_index.json of a source checkout; this "
                  f"b12x is installed at {PACKAGE_DIR}: run it in a clone (`emit --check` checks the installed index)",
                  file=sys.stderr)
            return 2
        bad = stale_index()
        if bad:
            print(f"source index {SOURCE_INDEX_PATH} is stale ({len(bad)} entries): this wheel was built from a "
                  f"tree where `b12x-codegen emit` was not run:", *bad, sep="\n  ")
            return 1
        print("source index is fresh: it matches the installed templates (installed package: no generated/ to check)")
        return 0
    if args.check:
        bad = stale()
        if bad:
            print(f"generated/ is stale ({len(bad)} files); run `b12x-codegen emit`:", *bad, sep="\n  ")
            return 1
        print("generated/ and codegen/source_index.json are fresh")
        return 0
    changed = emit()
    print(f"emitted: {len(changed)} files changed" + "".join(f"\n  {p}" for p in changed))
    return 0


class _Progress:
    """One line per event; on a terminal, the running line is rewritten in place."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.tty = sys.stdout.isatty()

    def __call__(self, done: int, total: int, spec, status: str) -> None:
        msg = f"[{done}/{total}] {time.perf_counter() - self.t0:6.1f}s  {spec.name}: {status}"
        if status == "queued":  # a log gets one line per finished spec; a terminal sees the queue move
            if self.tty:
                print("\r" + msg.ljust(100), end="", flush=True)
        else:
            print(("\r" if self.tty else "") + msg.ljust(100 if self.tty else 0), flush=True)


def _build(preset: str, archs: str, jobs: int, only: str | None = None):
    from .build import build_specs

    p = get_preset(preset)
    specs = p.specs(parse_archs(archs))
    if only:
        # a part of a bundle (an A/B of one kernel, a benchmark's specs): names containing a fragment
        frags = [f for f in only.split(",") if f]
        specs = [s for s in specs if any(f in s.name for f in frags)]
        if not specs:
            raise PresetError(f"--only {only!r}: no spec of preset {p.name} for {archs} has a name containing "
                              f"one of {frags}; `b12x-codegen list {p.name}` names them")
    cache = ArtifactCache()
    print(f"building preset {p.name}: {len(specs)} specs into {cache.root} with {jobs} job(s)", flush=True)
    results = build_specs(specs, cache, jobs=jobs, progress=_Progress())
    rows = []
    for r in results:
        kern = "; ".join(f"{n} {k.get('registers')}r/{k.get('spill_bytes')}B" for n, k in r.kernels.items())
        rows.append([r.spec.name, r.spec.arch, kern, f"{r.size / 1024:.0f} KiB",
                     f"{r.seconds:.1f}" if r.built else "cached", r.key[:12]])
    print(_table(["spec", "arch", "registers/spill bytes (per kernel)", "size", "seconds", "key"], rows))
    return results


def cmd_build(args) -> int:
    _build(args.preset, args.arch, args.jobs, args.only)
    return 0


def cmd_prewarm(args) -> int:
    """Build (where the DSL compiler is installed), then on a GPU load and launch the whole bundle
    through b12x.prewarm.prewarm_preset. A GPU box without the compiler prewarms from the cache."""
    from b12x.registry import dsl_available

    if dsl_available():
        _build(args.preset, args.arch, args.jobs)
    else:
        get_preset(args.preset)
        print("nvidia-cutlass-dsl is not installed: nothing is built, artifacts come from the cache")
    import torch

    if not torch.cuda.is_available():
        print(f"preset {args.preset}: no CUDA device here, so nothing was loaded or launched")
        return 0
    from b12x.prewarm import prewarm_preset

    t0 = time.perf_counter()
    # --max-batched is the deprecated spelling of --max-rows: passed on as spelled (prewarm_preset warns)
    rows = {"max_batched": args.max_batched} if args.max_batched is not None else {"max_rows": args.max_rows}
    bundle = prewarm_preset(args.preset, **rows, max_width=args.max_width)
    print(f"prewarmed preset {bundle.preset} on {bundle.arch}: {len(bundle.specs())} specs loaded and launched "
          f"(max_rows={bundle.max_rows}, max_width={bundle.max_width}) in {time.perf_counter() - t0:.1f}s")
    return 0


def cmd_verify(args) -> int:
    cache = ArtifactCache()
    cache.ensure_root()
    rows, bad = [], 0
    for arch, key, _ in cache.entries():
        art, why = cache.check(key, arch)
        bad += art is None
        rows.append([key[:16], arch, art.manifest.get("name", "?") if art else "-", why])
    print(_table(["key", "arch", "spec", "status"], rows))
    print(f"{len(rows)} artifacts in {cache.root}, {bad} bad")
    return 1 if bad else 0


def cmd_prune(args) -> int:
    """Delete cache entries that no catalog spec of the current templates maps to."""
    import shutil

    from b12x.artifact_cache import artifact_key

    from .catalog import all_catalog_specs

    cache = ArtifactCache()
    cache.ensure_root()
    live = {artifact_key(s) for s in all_catalog_specs()}
    removed = 0
    for _, key, d in list(cache.entries()):
        if key not in live:
            shutil.rmtree(d)
            removed += 1
    leftovers = cache.clean_leftovers()
    print(f"pruned {removed} stale artifacts and {leftovers} leftovers of killed builds from {cache.root}")
    return 0


def cmd_export(args) -> int:
    """Copy the built artifacts of some presets from this cache (B12X_CACHE_DIR) into the cache at
    --to: what a serving box needs of a build box's cache (its model's bundle, verified, nothing
    else). Refuses, naming them, when some spec has no good artifact here."""
    from b12x.artifact_cache import MANIFEST_FORMAT_FIELDS, SOURCE_NAME, artifact_key

    archs = parse_archs(args.arch)
    specs = []
    for name in (n for n in args.preset.split(",") if n):
        specs += [s for s in get_preset(name).specs(archs) if s not in specs]
    src, dst = ArtifactCache(), ArtifactCache(args.to)
    found, missing = [], []
    for spec in specs:
        key = artifact_key(spec)
        art, why = src.check(key, spec.arch)
        (found if art is not None else missing).append((spec, key, art if art is not None else why))
    if missing:
        print(f"b12x-codegen: {len(missing)} of {len(specs)} specs have no good artifact in {src.root}; build them "
              f"first (`b12x-codegen build --preset ...`):", *(f"{s.name} ({s.arch}): {why}" for s, _, why in missing),
              sep="\n  ", file=sys.stderr)
        return 1
    if src.root.resolve() == dst.root.resolve():
        print(f"b12x-codegen: --to {args.to} is the source cache itself", file=sys.stderr)
        return 2
    dst.ensure_writable()
    rows, total = [], 0
    for spec, key, art in found:
        with dst.lock(key):
            fields = {k: v for k, v in art.manifest.items() if k not in MANIFEST_FORMAT_FIELDS}
            source = art.dir / SOURCE_NAME
            dst.store(key, spec.arch, art.so_path, fields, source.read_text() if source.exists() else None)
        size = art.so_path.stat().st_size
        total += size
        rows.append([spec.name, spec.arch, f"{size / 1024:.0f} KiB", key[:12]])
    print(_table(["spec", "arch", "size", "key"], rows))
    print(f"exported {len(rows)} artifacts ({total / 2 ** 20:.1f} MiB) from {src.root} to {dst.root}")
    return 0


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="b12x-codegen", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="presets (model, spec count), or one preset's specs")
    ls.add_argument("preset", nargs="?", help="show this preset's specs")
    ls.add_argument("--arch", default="sm_90a", help="comma-separated: sm_90a,sm_120a")
    ls.set_defaults(fn=cmd_list)
    e = sub.add_parser("emit", help="render the catalog into generated/ and codegen/source_index.json")
    e.add_argument("--check", action="store_true",
                   help="exit 1 if generated/ or the source index is stale (installed: the index vs the templates)")
    e.set_defaults(fn=cmd_emit)
    for name, fn, what in (("build", cmd_build, "build a preset's artifacts ahead of time (no GPU needed)"),
                           ("prewarm", cmd_prewarm, "build, then load and launch once on the GPU if present")):
        b = sub.add_parser(name, help=what)
        b.add_argument("--preset", default=DEFAULT_PRESET)
        b.add_argument("--arch", default="sm_90a", help="comma-separated: sm_90a,sm_120a")
        b.add_argument("--jobs", type=_positive_int, default=max(1, min(4, os.cpu_count() or 1)),
                       help="build worker processes (default: up to 4)")
        if name == "build":
            b.add_argument("--only", default=None,
                           help="comma-separated name fragments: only the preset's specs whose name holds one")
        if name == "prewarm":
            b.add_argument("--max-rows", type=int, default=256, help="most query rows per call")
            b.add_argument("--max-batched", type=int, default=None, help="deprecated name of --max-rows")
            b.add_argument("--max-width", type=int, default=131072, help="widest indexer row warmed, in entries")
        b.set_defaults(fn=fn)
    ex = sub.add_parser("export", help="copy the artifacts of presets into another cache (a serving box's)")
    ex.add_argument("--preset", default=DEFAULT_PRESET, help="comma-separated presets")
    ex.add_argument("--arch", default="sm_90a", help="comma-separated: sm_90a,sm_120a")
    ex.add_argument("--to", required=True, help="the destination cache dir (created if needed)")
    ex.set_defaults(fn=cmd_export)
    sub.add_parser("verify", help="check every cached artifact against its manifest").set_defaults(fn=cmd_verify)
    pr = sub.add_parser("prune", help="delete artifacts that no current catalog spec maps to, and what killed builds left")
    pr.set_defaults(fn=cmd_prune)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (SpecError, PresetError, B12xError) as e:
        print(f"b12x-codegen: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
