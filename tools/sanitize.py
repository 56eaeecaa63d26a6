"""A small call of every kernel family and form, for compute-sanitizer (tools/sanitize.sh runs it
under memcheck, initcheck, racecheck and synccheck).

    python tools/sanitize.py [--only sparse_mla,model1,v4_bf16,grouped,bundles[,control]] [--heads 8,16,32,64,128]
                             [--bundles deepseek-v3.2-tp8,indexer-compressed]

(initcheck is slow, about half a minute a call: split the run over processes by --only, --heads
and --bundles, each under its own OUT; one GPU runs them side by side.)

sparse_mla: decode (a one-row call of many splits, so the many-split combine; a three-row call of
few) and extend, every head count, fp8_ds_mla and bf16, on random caches with -1 entries.
model1: DeepSeek-V4 pages, main list + C4 extra list, decode and extend, every head count.
v4_bf16: bf16 KV at DeepSeek-V4's dims, decode and extend, every head count.
grouped: the indexer's grouped top-k (Caps.group_select) through each route of its maxima rows.
bundles: prewarm_preset of the V3.2 bundle (indexer paged / row-pair / contiguous logits, top-k
with and without scores, the fused path, DCP conversion, merge and owner filter) and of the
compressed-indexer preset (c = 4, 128), at up to 4 rows. control (not in the default run): a decode
on a q that was never written, which initcheck must report (that the tool sees our kernels). Each call is synchronised and checked
for NaN, so a fault names the call that made it (printed before it runs)."""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from b12x.attention import sparse_mla as sm  # noqa: E402
from b12x.reference import V4_DIM, quantize_fp8_ds_mla, quantize_model1_fp8  # noqa: E402

HEADS = (8, 16, 32, 64, 128)


def _step(name: str) -> None:
    print(f"-- {name}", flush=True)


def _finish(out: torch.Tensor) -> None:
    torch.cuda.synchronize()
    if out.isnan().any():
        raise SystemExit("unwritten (NaN) outputs")


def _run(p, scratch, q, idx, lens, kv, extra_bind=None, extra_kv=None):
    rows, h = q.shape[:2]
    out = torch.full((rows, h, p.caps.v_head_dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lens, out=out, **(extra_bind or {}))
    run = sm.run_extend if p.caps.mode == "extend" else sm.run_decode
    kw = {"extra_kv_cache": extra_kv} if extra_kv is not None else {}
    run(b, kv_cache=kv, sm_scale=0.05, lse_base="e", **kw)
    _finish(out)


def _indices(rows: int, width: int, slots: int, g) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, slots, (rows, width), device="cuda", generator=g, dtype=torch.int32)
    idx[torch.rand(rows, width, device="cuda", generator=g) < 0.1] = -1
    lens = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    return idx, lens


def sparse_mla_calls(heads: tuple[int, ...], v4_dims: bool = False) -> None:
    """V3.2's dims over fp8_ds_mla and bf16, or (v4_dims) bf16 at DeepSeek-V4's dims (V over the
    RoPE block: P beside the one K stage of the 8-32-head extend)."""
    g = torch.Generator(device="cuda").manual_seed(3 if v4_dims else 0)
    dims = sm.V4_HEAD_DIMS if v4_dims else {}
    k = torch.randn(16, 64, V4_DIM if v4_dims else 576, device="cuda", generator=g)
    caches = {"bf16 d512": ("bf16", k.bfloat16())} if v4_dims else {
        f: (f, kv) for f, kv in (("fp8_ds_mla", quantize_fp8_ds_mla(k)), ("bf16", k.bfloat16()))}
    for label, (fmt, kv) in caches.items():
        for h in heads:
            for mode, calls in (("decode", ((1, 2048), (3, 512))), ("extend", ((3, 512),))):
                p = sm.plan(sm.Caps(num_heads=h, topk=2048, kv_format=fmt, max_rows=4, mode=mode, **dims))
                scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
                for rows, width in calls:
                    _step(f"sparse_mla {label} h{h} {mode} rows {rows} width {width}")
                    q = torch.randn(rows, h, p.caps.q_head_dim, device="cuda", generator=g).bfloat16()
                    _run(p, scratch, q, *_indices(rows, width, 16 * 64, g), kv)


def model1_calls(heads: tuple[int, ...]) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    main = quantize_model1_fp8(torch.randn(4, 256, V4_DIM, device="cuda", generator=g))
    extra = quantize_model1_fp8(torch.randn(16, 64, V4_DIM, device="cuda", generator=g))
    for h in heads:
        xtopk = 1024 if h == 128 else 512
        for mode in ("decode", "extend"):
            p = sm.plan(sm.v4_caps(num_heads=h, topk=512, page_size=256, extra_topk=xtopk, extra_page_size=64,
                                   max_rows=4, mode=mode))
            scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
            for rows in (1, 3):
                _step(f"model1 h{h} {mode} rows {rows} main 128 + C4 {xtopk}")
                q = torch.randn(rows, h, V4_DIM, device="cuda", generator=g).bfloat16()
                idx, lens = _indices(rows, 128, 4 * 256, g)
                xidx, xlens = _indices(rows, xtopk, 16 * 64, g)
                _run(p, scratch, q, idx, lens, main, dict(extra_indices=xidx, extra_lengths=xlens), extra)


def grouped_calls() -> None:
    """The grouped top-k (indexer Caps.group_select) on caller logits with row starts: its maxima
    rows through chunk_final (5000 groups), the wide top-k (3 rows of 20480) and row_final (64 rows
    of 17500)."""
    from b12x import indexer as ix
    g = torch.Generator(device="cuda").manual_seed(4)
    for rows, width in ((3, 40000), (3, 163840), (64, 140000)):
        p = ix.plan(ix.Caps(num_heads=64, topk=2048, mode="contiguous", max_rows=rows, max_width=width,
                            with_scores=True, group_select=True))
        scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
        logits = torch.randn(rows, width, device="cuda", generator=g)
        starts = torch.randint(0, 1000, (rows,), device="cuda", generator=g, dtype=torch.int32)
        ends = torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
        _step(f"grouped top-k rows {rows} width {width}")
        idx, sc = ix.run_topk(ix.bind(p, scratch=scratch, lengths=ends, starts=starts, logits=logits))
        _finish(sc)


BUNDLES = ("deepseek-v3.2-tp8", "indexer-compressed")


def bundle_calls(names: tuple[str, ...]) -> None:
    from b12x.prewarm import prewarm_preset
    for name in names:
        _step(f"prewarm_preset {name} (indexer, top-k, fused, DCP) max_rows 4")
        prewarm_preset(name, max_rows=4, max_width=8192)
        torch.cuda.synchronize()


def control_call() -> None:
    """The negative control: a decode whose q was never written (torch.empty). initcheck must
    report its reads (tools/sanitize.sh expects it to); the other tools have nothing to say."""
    g = torch.Generator(device="cuda").manual_seed(2)
    kv = quantize_fp8_ds_mla(torch.randn(16, 64, 576, device="cuda", generator=g))
    p = sm.plan(sm.Caps(num_heads=16, topk=2048, kv_format="fp8_ds_mla", max_rows=4))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    _step("control: sparse_mla fp8_ds_mla h16 decode, q never written (initcheck must report it)")
    q = torch.empty(1, 16, 576, dtype=torch.bfloat16, device="cuda")
    idx, lens = _indices(1, 512, 16 * 64, g)
    out = torch.empty(1, 16, 512, dtype=torch.bfloat16, device="cuda")
    sm.run_decode(p.bind(scratch, q=q, indices=idx, lengths=lens, out=out), kv_cache=kv, sm_scale=0.05)
    torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="sparse_mla,model1,v4_bf16,grouped,bundles")
    ap.add_argument("--heads", default=",".join(map(str, HEADS)))
    ap.add_argument("--bundles", default=",".join(BUNDLES), help="presets the bundles part prewarms")
    args = ap.parse_args()
    heads = tuple(int(h) for h in args.heads.split(","))
    parts = args.only.split(",")
    if "sparse_mla" in parts:
        sparse_mla_calls(heads)
    if "model1" in parts:
        model1_calls(heads)
    if "v4_bf16" in parts:
        sparse_mla_calls(heads, v4_dims=True)
    if "grouped" in parts:
        grouped_calls()
    if "bundles" in parts:
        bundle_calls(tuple(args.bundles.split(",")))
    if "control" in parts:
        control_call()
    print("sanitize: all calls ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
