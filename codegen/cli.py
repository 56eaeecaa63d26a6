"""b12x-codegen: list | emit [--check] | build --preset P | prewarm --preset P | verify | prune."""
from __future__ import annotations

import argparse
import os
import sys
import time

from b12x.artifact_cache import ArtifactCache
from b12x.errors import B12xError

from .catalog import DEFAULT_PRESET, PRESETS, PresetError, get_preset, parse_archs
from .specs import SpecError


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def cmd_list(args) -> int:
    rows = []
    for p in PRESETS.values():
        names = ", ".join(s.name.replace("_sm_90a", "") for s in p.specs(("sm_90a",)))
        rows.append([p.name + (" (default)" if p.name == DEFAULT_PRESET else ""), p.description, names])
    print(_table(["preset", "what", "specs (per arch)"], rows))
    return 0


def cmd_emit(args) -> int:
    from .emit import emit, stale

    if args.check:
        bad = stale()
        if bad:
            print(f"generated/ is stale ({len(bad)} files); run `b12x-codegen emit`:", *bad, sep="\n  ")
            return 1
        print("generated/ is fresh")
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


def _build(preset: str, archs: str, jobs: int):
    from .build import build_specs

    p = get_preset(preset)
    specs = p.specs(parse_archs(archs))
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
    _build(args.preset, args.arch, args.jobs)
    return 0


def cmd_prewarm(args) -> int:
    results = _build(args.preset, args.arch, args.jobs)
    import torch

    if not torch.cuda.is_available():
        print(f"artifacts ready for {len(results)} specs; no CUDA device here, so nothing was loaded or launched")
        return 0
    from b12x import registry
    from b12x.prewarm import prewarm_sparse_mla

    from .catalog import ModelConfig

    for cfg in get_preset(args.preset).configs:
        if isinstance(cfg, ModelConfig):
            prewarm_sparse_mla(num_heads=cfg.num_heads, kv_format=cfg.kv_format, topk=cfg.topk,
                               max_batched=args.max_batched)
            print(f"prewarmed h={cfg.num_heads} {cfg.kv_format} topk={cfg.topk} max_batched={args.max_batched}")
        else:  # indexer / DCP bundles: load every artifact (their launches happen in the engine's prewarm)
            for spec in cfg.specs(results[0].spec.arch):
                registry.resolve(spec)
            print(f"loaded {type(cfg).__name__} artifacts")
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
    sub.add_parser("list", help="presets and their specs").set_defaults(fn=cmd_list)
    e = sub.add_parser("emit", help="render the catalog into generated/")
    e.add_argument("--check", action="store_true", help="exit 1 if generated/ is stale")
    e.set_defaults(fn=cmd_emit)
    for name, fn, what in (("build", cmd_build, "build a preset's artifacts ahead of time (no GPU needed)"),
                           ("prewarm", cmd_prewarm, "build, then load and launch once on the GPU if present")):
        b = sub.add_parser(name, help=what)
        b.add_argument("--preset", default=DEFAULT_PRESET)
        b.add_argument("--arch", default="sm_90a", help="comma-separated: sm_90a,sm_120a")
        b.add_argument("--jobs", type=_positive_int, default=max(1, min(4, os.cpu_count() or 1)),
                       help="build worker processes (default: up to 4)")
        if name == "prewarm":
            b.add_argument("--max-batched", type=int, default=256)
        b.set_defaults(fn=fn)
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
