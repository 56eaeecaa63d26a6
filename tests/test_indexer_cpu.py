"""Lightning indexer on the CPU: specs, rendering, references, plan/bind validation, and an
ahead-of-time build of a representative subset for sm_90a and sm_120a (marked slow)."""
import ast
import re
import subprocess
from pathlib import Path

import pytest
import torch

from b12x import indexer as ix
from b12x import indexer_topk as tk
from b12x.errors import InputError
from b12x.indexer_reference import (dequantize_k_pages, indexer_logits_contiguous_reference,
                                    indexer_logits_paged_reference, quantize_k_pages, quantize_q, topk_reference)
from codegen.indexer_specs import IndexerLogitsSpec, IndexerTopKSpec, TopKSpec
from codegen.render import header, render, template_hash
from codegen.specs import KernelSpec, SpecError

ROOT = Path(__file__).resolve().parents[1]


# ---- specs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,field,value,allowed", [
    (IndexerLogitsSpec, "num_heads", 48, "8, 16, 32, 64"),
    (IndexerLogitsSpec, "index_head_dim", 64, "128"),
    (IndexerLogitsSpec, "compress_ratio", 2, "1, 4, 128"),
    (IndexerLogitsSpec, "mode", "ragged", "paged, contiguous"),
    (IndexerLogitsSpec, "page_size", 32, "64"),
    (IndexerLogitsSpec, "arch", "sm_80", "sm_90a, sm_120a"),
    (TopKSpec, "k", 100, "multiple of 128"),
    (TopKSpec, "k", 4096, "multiple of 128"),
    (TopKSpec, "max_width", 1 << 20, "[1, 262144]"),
    (TopKSpec, "with_scores", 1, "True, False"),
    (IndexerTopKSpec, "num_heads", 128, "8, 16, 32, 64"),
    (IndexerTopKSpec, "k", 192, "multiple of 128"),
])
def test_spec_validation_names_field_and_allowed(cls, field, value, allowed):
    with pytest.raises(SpecError) as e:
        cls(**{field: value})
    assert e.value.field == field
    msg = str(e.value)
    assert f"{cls.__name__}.{field}" in msg and repr(value) in msg and allowed in msg


@pytest.mark.parametrize("kw", [dict(arch="sm_120a"), dict(rows_per_unit=3), dict(mode="contiguous", arch="sm_120a")])
def test_row_pairs_need_sm90(kw):
    with pytest.raises(SpecError, match="rows_per_unit"):
        IndexerLogitsSpec(**{"rows_per_unit": 2, **kw})
    assert IndexerLogitsSpec(mode="contiguous", rows_per_unit=2).name == "indexer_logits_contiguous_h64_c1_g2_sm_90a"


def test_contiguous_rejects_compression():
    with pytest.raises(SpecError, match="compress_ratio.*contiguous"):
        IndexerLogitsSpec(mode="contiguous", compress_ratio=4)


@pytest.mark.parametrize("spec", [IndexerLogitsSpec(num_heads=32, compress_ratio=4), TopKSpec(k=1024, with_scores=True),
                                  IndexerTopKSpec(num_heads=16, compress_ratio=128, arch="sm_120a")])
def test_canonical_json_roundtrip(spec):
    back = KernelSpec.from_json(spec.canonical_json())
    assert back == spec and type(back) is type(spec)
    assert f'"family":"{spec.family}"' in spec.canonical_json()


RENDER_SPECS = [
    IndexerLogitsSpec(num_heads=64), IndexerLogitsSpec(num_heads=8, compress_ratio=128, arch="sm_120a"),
    IndexerLogitsSpec(num_heads=32, mode="contiguous"), IndexerLogitsSpec(num_heads=16, rows_per_unit=2),
    TopKSpec(), TopKSpec(k=512, with_scores=True, arch="sm_120a"),
    IndexerTopKSpec(num_heads=64, with_scores=True), IndexerTopKSpec(num_heads=16, compress_ratio=4, arch="sm_120a"),
]


@pytest.mark.parametrize("spec", RENDER_SPECS, ids=lambda s: s.name)
def test_render_is_deterministic_and_parses(spec):
    a, b = render(spec), render(spec)
    assert a == b and a.startswith(header(spec))
    assert spec.canonical_json() in a and template_hash(spec.template) in a
    tree = ast.parse(a)
    assert "ENTRY_POINTS" in a
    # no jinja left over, and the class-per-kernel style
    assert "{%" not in a and "{{" not in a
    assert any(isinstance(n, ast.ClassDef) for n in tree.body)


def test_specs_render_differently():
    texts = {render(s) for s in RENDER_SPECS}
    assert len(texts) == len(RENDER_SPECS)


# ---- references -------------------------------------------------------------------------------
def _paged_case(rows=4, next_n=2, blocks=40, pages=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = quantize_k_pages(torch.randn(blocks, 64, 128, generator=g))
    q = quantize_q(torch.randn(rows, 8, 128, generator=g) * 4)
    w = torch.randn(rows, 8, generator=g).abs()
    bt = torch.randperm(blocks, generator=g)[: rows // next_n * pages].view(rows // next_n, pages).int()
    lengths = torch.tensor([0, 65, 300, 512][:rows], dtype=torch.int32)
    return q, w, kv, bt, lengths


def test_k_page_layout_roundtrip():
    k = torch.randn(3, 64, 128)
    kv = quantize_k_pages(k)
    assert kv.shape == (3, 64, 132) and kv.dtype == torch.uint8
    flat = kv.view(3, -1)
    # scales sit after the 64 x 128 fp8 rows of each page
    scale = flat[:, 8192:].contiguous().view(torch.float32)
    torch.testing.assert_close(scale, k.abs().amax(-1) / 448.0)
    kd, sd = dequantize_k_pages(kv)
    torch.testing.assert_close(kd * sd[..., None], k, atol=0.1, rtol=0.07)


def test_paged_logits_reference_semantics():
    q, w, kv, bt, lengths = _paged_case()
    out = indexer_logits_paged_reference(q, w, kv, bt, lengths, width=512)
    assert torch.isinf(out[0]).all()                                   # zero-length row
    assert torch.isfinite(out[1, :65]).all() and torch.isinf(out[1, 65:]).all()
    # brute force one entry: row 2 (request 1), token 130 -> page 2 of request 1, offset 2
    kd, sd = dequantize_k_pages(kv)
    blk = int(bt[1, 2])
    want = sum(float(w[2, h]) * max(float(q[2, h].float() @ kd[blk, 2]), 0.0) for h in range(8)) * float(sd[blk, 2])
    assert abs(float(out[2, 130]) - want) <= 1e-4 * abs(want) + 1e-5
    # compression: floor(300 / 4) = 75 entries; the active width counts entries: 128 = ceil(512 / 4)
    c = indexer_logits_paged_reference(q, w, kv, bt, lengths, width=512, compress_ratio=4, active_width=128)
    assert torch.isfinite(c[2, :75]).all() and torch.isinf(c[2, 75:]).all()
    # an active width of 70 entries cuts row 2 (75 entries) and is not divided by c again
    c = indexer_logits_paged_reference(q, w, kv, bt, lengths, width=512, compress_ratio=4, active_width=70)
    assert torch.isfinite(c[2, :70]).all() and torch.isinf(c[2, 70:]).all()


def test_contiguous_logits_reference_bounds():
    g = torch.Generator().manual_seed(1)
    kv = quantize_q(torch.randn(100, 128, generator=g))
    sc = torch.rand(100, generator=g) + 0.5
    q = quantize_q(torch.randn(3, 8, 128, generator=g))
    w = torch.randn(3, 8, generator=g)
    out = indexer_logits_contiguous_reference(q, w, kv, sc, torch.tensor([0, 10, 50]), torch.tensor([5, 10, 120]), 128)
    assert torch.isfinite(out[0, :5]).all() and torch.isinf(out[0, 5:]).all()
    assert torch.isinf(out[1]).all()
    assert torch.isfinite(out[2, 50:100]).all() and torch.isinf(out[2, 100:]).all() and torch.isinf(out[2, :50]).all()


def test_topk_reference_semantics():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 1000, generator=g)
    ends = torch.tensor([0, 100, 1000, 700], dtype=torch.int32)
    idx, sc = topk_reference(logits, 256, ends)
    assert (idx[0] == -1).all() and torch.isinf(sc[0]).all()
    assert (idx[1, :100] == torch.arange(100)).all() and (idx[1, 100:] == -1).all()     # short row: all, -1 tail
    want = set(torch.topk(logits[2], 256).indices.tolist())
    assert set(idx[2].tolist()) == want
    torch.testing.assert_close(sc[2], logits[2, idx[2].long()])
    # row-relative with starts, physical slots through a block table, compressed ends
    starts = torch.tensor([0, 10, 500, 0], dtype=torch.int32)
    idx2, _ = topk_reference(logits, 128, ends, starts)
    assert set((idx2[2] + 500).tolist()) == set((torch.topk(logits[2, 500:], 128).indices + 500).tolist())
    bt = torch.arange(16, dtype=torch.int32).flip(0).view(1, 16).repeat(4, 1)
    phys, _ = topk_reference(logits, 128, ends, block_table=bt)
    pos = idx2.new_tensor(sorted(torch.topk(logits[3, :700], 128).indices.tolist()))
    assert phys[3].tolist() == ((15 - pos // 64) * 64 + pos % 64).tolist()
    idx4, _ = topk_reference(logits, 128, ends, compress_ratio=4, active_width=250)
    assert (idx4[1, :25] == torch.arange(25)).all() and (idx4[1, 25:] == -1).all()       # floor(100 / 4)
    idx5, _ = topk_reference(logits, 256, ends, compress_ratio=4, active_width=160)     # row 2: 250 entries
    assert set(idx5[2].tolist()) - {-1} == set(range(160))


# ---- plan / bind ------------------------------------------------------------------------------
H, ROWS = 16, 4


@pytest.fixture(scope="module")
def plan():
    return ix.plan(ix.Caps(num_heads=H, topk=2048, max_rows=8, max_width=65536, with_scores=True,
                           arch="sm_90a", num_sms=132))


def _inputs(rows=ROWS):
    return dict(q=torch.randn(rows, H, 128).to(torch.float8_e4m3fn), weights=torch.randn(rows, H),
                lengths=torch.full((rows,), 1000, dtype=torch.int32),
                block_table=torch.zeros(rows // 2, 1024, dtype=torch.int32), width=65536)


def _scratch(p):
    return torch.empty(p.scratch_bytes(), dtype=torch.uint8)


@pytest.mark.parametrize("rows", (1, 8, 64, 128, 256, 600))
@pytest.mark.parametrize("width", (16385, 32768, 131072, 262144))
def test_wide_topk_grid_never_waits_on_a_missing_cta(rows, width):
    """The CTAs of a row wait for each other: a row's CTAs must all fit one wave of the SMs
    (or be a single CTA, which waits on no one), and their counts fit the scratch region where
    the rows take the wide top-k (row_final selects 64 or more rows of up to 32K in one CTA each)."""
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=rows, max_width=width, arch="sm_90a", num_sms=132))
    t = p.tiling
    tiles = -(-width // t["wide_tile"])
    tpc = p.wide_tiles_per_cta(rows, width)
    per_row = -(-tiles // tpc)
    assert 1 <= tpc <= tiles
    assert per_row == 1 or rows * per_row <= 132 * t["wide_min_ctas"]
    assert rows * 2 * per_row <= p.regions["wide_cnt"].numel or (not p.wide_route(rows, width)
                                                                  and p.row_final(rows, width))


def test_wide_topk_arguments_are_views_of_scratch():
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=3, max_width=50000, arch="sm_90a", num_sms=132))
    s = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    b = ix.bind(p, scratch=s, lengths=torch.full((3,), 50000, dtype=torch.int32), width=50000)
    hist, args = tk.wide_args(b)
    lo, hi = s.data_ptr(), s.data_ptr() + s.numel()
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert args[5] is hist and hist.shape == (3, (1 << p.tiling["wide_bits"]) + 4)
    # everything but the caller's lengths (also the placeholder for absent inputs) lives in scratch
    assert all(lo <= t.data_ptr() < hi for t in tensors if t.data_ptr() != b.lengths.data_ptr())
    assert args[-1] == p.wide_tiles_per_cta(3, 50000)


def test_row_pairs_only_for_even_next_n(plan):
    assert plan.logits_rows_per_unit(6, 1) == 1 and plan.logits_rows_per_unit(6, 3) == 1
    assert plan.logits_rows_per_unit(6, 2) == 2 and plan.logits_rows_per_unit(8, 4) == 2
    assert {s.name for s in plan.specs()} >= {plan.logits_spec.name, plan.logits_pair_spec.name}


def test_contiguous_row_pairs_for_even_row_counts():
    p = ix.plan(ix.Caps(num_heads=64, mode="contiguous", max_rows=8, max_width=4096, arch="sm_90a", num_sms=132))
    assert p.logits_pair_spec.rows_per_unit == 2 and p.logits_pair_spec.mode == "contiguous"
    assert p.logits_rows_per_unit(4, 1) == 2 and p.logits_rows_per_unit(5, 1) == 1
    q = ix.plan(ix.Caps(num_heads=64, mode="contiguous", max_rows=8, max_width=4096, arch="sm_120a", num_sms=188))
    assert q.logits_pair_spec is None and q.logits_rows_per_unit(4, 1) == 1


def test_bind_views_scratch(plan):
    s = _scratch(plan)
    b = ix.bind(plan, scratch=s, **_inputs())
    for t in (b.logits, b.indices, b.scores):
        assert t.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
    assert b.logits.shape == (ROWS, 65536) and b.indices.shape == (ROWS, 2048) and b.rows_per_req == 2
    assert b.q.dtype == torch.uint8 and b.pages_per_cta >= 1


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(q=d["q"].float()), r"q: expected dtype torch.float8_e4m3fn, got torch.float32"),
    (lambda d: d.update(q=torch.zeros(ROWS, 32, 128).to(torch.float8_e4m3fn)),
     r"q: expected shape \(4, 16, 128\), got \(4, 32, 128\)"),
    (lambda d: d.update(weights=d["weights"].double()), r"weights: expected dtype torch.float32, got torch.float64"),
    (lambda d: d.update(weights=None), r"weights: expected a \[rows, Hi\] float32 tensor with q, got None"),
    (lambda d: d.update(lengths=d["lengths"].long()), r"lengths: expected dtype torch.int32, got torch.int64"),
    (lambda d: d.update(lengths=torch.zeros(9, dtype=torch.int32), q=None),
     r"lengths: expected at most Caps.max_rows=8 rows, got 9"),
    (lambda d: d.update(block_table=torch.zeros(3, 1024, dtype=torch.int32)),
     r"block_table: expected a number of requests dividing rows=4, got 3"),
    (lambda d: d.update(block_table=torch.zeros(2, 10, dtype=torch.int32)),
     r"block_table: expected at least ceil\(width / 64\) = 1024 pages per request, got 10"),
    (lambda d: d.update(block_table=None), r"block_table: expected a \[requests, pages\] int32 tensor, got None"),
    (lambda d: d.update(width=65537), r"width: expected an int in \[1, Caps.max_width=65536\]"),
    (lambda d: d.update(k=1000), r"k: expected a multiple of 128 in \[128, Caps.topk=2048\], got 1000"),
    (lambda d: d.update(indices=torch.zeros(ROWS, 2048, dtype=torch.int64)),
     r"indices: expected dtype torch.int32, got torch.int64"),
    (lambda d: d.update(logits=torch.zeros(ROWS, 100, dtype=torch.float32)[:, ::2]),
     r"logits: expected unit stride in the last dim"),
    (lambda d: d.update(active_width=torch.zeros(2, dtype=torch.int32)),
     r"active_width: expected shape \(1,\), got \(2,\)"),
    (lambda d: d.update(active_width=torch.zeros(1, dtype=torch.int64)),
     r"active_width: expected dtype torch.int32, got torch.int64"),
    (lambda d: d.update(num_blocks=0), r"num_blocks: expected an int >= 1"),
])
def test_bind_rejects_bad_tensors(plan, mutate, match):
    d = _inputs()
    mutate(d)
    with pytest.raises(InputError, match=match):
        ix.bind(plan, scratch=_scratch(plan), **d)


def test_bind_names_scratch_when_only_it_is_off_cuda(plan):
    """scratch sets the call's device: a CPU scratch beside CUDA inputs is named, not the first
    input compared with its device. (Fake CUDA tensors: bind only reads their metadata.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        on_cuda = {k: torch.zeros(v.shape, dtype=v.dtype, device="cuda") if isinstance(v, torch.Tensor) else v
                   for k, v in _inputs().items()}
    with pytest.raises(InputError, match=r"^scratch: expected a CUDA tensor, got device cpu \(the other inputs are on cuda"):
        ix.bind(plan, scratch=_scratch(plan), **on_cuda)


def test_bind_rejects_small_scratch(plan):
    with pytest.raises(InputError, match=r"scratch: expected at least \d+ bytes \(plan.scratch_bytes\(\)\), got 16"):
        ix.bind(plan, scratch=torch.empty(16, dtype=torch.uint8), **_inputs())


def test_scores_need_caps():
    p = ix.plan(ix.Caps(num_heads=8, max_rows=2, max_width=1024, arch="sm_90a", num_sms=132))
    with pytest.raises(InputError, match=r"scores: expected None \(plan with Caps\(with_scores=True\)"):
        ix.bind(p, scratch=torch.empty(p.scratch_bytes(), dtype=torch.uint8),
                lengths=torch.ones(2, dtype=torch.int32), logits=torch.zeros(2, 1024), scores=torch.zeros(2, 2048))


@pytest.mark.parametrize("mutate,match", [
    (lambda kv: kv.view(torch.int8), r"kv_cache: expected dtype torch.uint8"),
    (lambda kv: kv[:, :, :128], r"kv_cache: expected shape \(\*, 64, 132\)"),
    (lambda kv: torch.zeros(4, 64 * 132 + 4, dtype=torch.uint8)[:, :8448].view(4, 64, 132),
     r"kv_cache: expected a page stride >= 8448 bytes and a multiple of 16, got 8452"),
])
def test_kv_cache_validation(mutate, match):
    kv = torch.zeros(4, 64, 132, dtype=torch.uint8)
    with pytest.raises(InputError, match=match):
        ix.check_kv_cache(mutate(kv), "paged", torch.device("cpu"))


def test_topk_schedule_is_exact_cover():
    for chunk, cap in ((16384, 16384), (8192, 8192)):
        for width in (1, 2048, chunk, chunk + 1, 100_000, 262144):
            for k in (128, 512, 2048):
                steps = ix.topk_schedule(width, k, chunk, cap)
                assert steps[-1].entry.endswith("_final") and steps[-1].groups_out == 1
                for a, b in zip(steps, steps[1:]):
                    assert b.groups_in == a.groups_out and b.fan_in * k <= cap
                    assert -(-b.groups_in // b.fan_in) == b.groups_out


def test_fused_needs_paged():
    with pytest.raises(InputError, match="Caps.fused"):
        ix.plan(ix.Caps(mode="contiguous", fused=True, arch="sm_90a", num_sms=132))


# ---- ahead-of-time build ----------------------------------------------------------------------
AOT_SUBSET = [
    IndexerLogitsSpec(num_heads=64, compress_ratio=1, arch="sm_90a"),
    IndexerLogitsSpec(num_heads=64, compress_ratio=1, rows_per_unit=2, arch="sm_90a"),
    IndexerLogitsSpec(num_heads=32, mode="contiguous", arch="sm_90a"),
    TopKSpec(k=2048, with_scores=True, arch="sm_90a"),
    IndexerTopKSpec(num_heads=64, compress_ratio=4, arch="sm_90a"),
    IndexerLogitsSpec(num_heads=32, compress_ratio=4, arch="sm_120a"),
    TopKSpec(k=2048, arch="sm_120a"),
    IndexerTopKSpec(num_heads=16, arch="sm_120a", with_scores=True),
]


@pytest.mark.slow
def test_aot_build_without_gpu(tmp_cache):
    from b12x.artifact_cache import ArtifactCache
    from codegen.build import build_specs

    cache = ArtifactCache()
    results = build_specs(AOT_SUBSET, cache, jobs=2)
    for r in results:
        assert r.built and r.so_path.exists() and r.size > 0
        art, why = cache.check(r.key, r.spec.arch)
        assert why == "ok", why
        symbols = subprocess.run(["nm", "-D", str(r.so_path)], capture_output=True, text=True, check=True).stdout
        for name, rep in r.kernels.items():
            assert f"__tvm_ffi_{name}" in symbols
            assert rep["registers"] and rep["registers"] <= 255, (r.spec.name, name, rep)
            # the h64 logits kernel runs at 3 CTAs/SM (<= 168 registers) and may spill a few bytes
            assert rep["spill_bytes"] <= 32, f"{r.spec.name}/{name} spills {rep['spill_bytes']} bytes"


@pytest.mark.parametrize("arch", ("sm_90a", "sm_120a"))
def test_row_final_route(arch):
    """Rows between one chunk and row_chunk wide go one CTA per row only when there are enough of
    them to fill the SMs (sm_90a); otherwise, and above row_chunk, the wide top-k takes them."""
    p = ix.plan(ix.Caps(num_heads=64, topk=2048, max_rows=256, max_width=65536, arch=arch, num_sms=132))
    t = p.tiling
    many, few = t["row_min_rows"], t["row_min_rows"] - 1
    assert not p.row_final(many, t["chunk"])                       # one chunk: chunk_final
    if arch == "sm_90a":
        assert p.row_final(many, t["chunk"] + 1) and p.row_final(256, t["row_chunk"])
        assert not p.row_final(few, t["chunk"] + 1)
        assert not p.row_final(many, t["row_chunk"] + 1)
    else:
        assert t["row_chunk"] == 0 and not p.row_final(many, t["chunk"] + 1)


# ---- one unit for the active width: entries, from the metadata helper to every launch ----------
def _recording_kernels(monkeypatch):
    """Replace the plan's kernels by recorders of (which, entry, args): no artifacts needed."""
    calls = []

    class _Kernels:
        def __init__(self, which):
            self.which = which

        def __getitem__(self, entry):
            return lambda *args: calls.append((self.which, entry, args))

    monkeypatch.setattr(ix.IndexerPlan, "kernels", lambda self, which: _Kernels(which))
    return calls


def _active_flag_and_physical(which, entry, args):
    """(has_active_width, physical) of a recorded launch, by the kernels' argument order."""
    if which.startswith("logits"):
        return args[-2], None
    if entry.startswith("fused_"):
        return args[-3], args[-2]
    return args[-4], args[-3]       # top-k stages, wide_chunk, wide_ties


@pytest.mark.parametrize("fused,width", [(False, 8192), (False, 20000), (True, 20000)])
def test_active_width_from_metadata_reaches_every_launch_as_entries(monkeypatch, fused, width):
    """c = 4, longest row 16384 tokens: the helper writes 4096 entries (exact or graph-stable), and
    bind / run_index_topk hand that very buffer, unchanged, to the logits and every top-k launch
    (chunk_final at 8192, the wide top-k at 20000, the fused path and its merges)."""
    from b12x.metadata import decode_active_width

    buf = torch.zeros(1, dtype=torch.int32)
    shadow = torch.tensor([16384, 9001, 0, 77], dtype=torch.int32)
    assert decode_active_width(buf, max_seq_len=16384, compress_ratio=4, seq_lens_cpu=shadow) == 4096
    assert int(buf) == 4096
    assert decode_active_width(buf, max_seq_len=16383, compress_ratio=4, authoritative=False) == 4096
    assert int(buf) == 4096

    calls = _recording_kernels(monkeypatch)
    p = ix.plan(ix.Caps(num_heads=16, topk=2048, compress_ratio=4, max_rows=4, max_width=32768,
                        with_scores=True, fused=fused, arch="sm_90a", num_sms=132))
    rows = 4
    kv = torch.zeros(7, 64, 132, dtype=torch.uint8)
    b = ix.bind(p, scratch=_scratch(p), q=torch.zeros(rows, 16, 128).to(torch.float8_e4m3fn),
                weights=torch.ones(rows, 16), lengths=shadow, block_table=torch.zeros(rows, 313, dtype=torch.int32),
                width=width, active_width=buf)
    assert b.active_width is buf
    ix.run_index_topk(b, kv_cache=kv)
    entries = {(w, e) for w, e, _ in calls}
    assert any(e.startswith("fused") for _, e in entries) == fused
    assert ("logits", "logits") in entries or fused
    assert any(e in ("chunk_final", "wide_chunk", "merge_final", "fused_final") for _, e in entries)
    for which, entry, args in calls:
        assert sum(a is buf for a in args) == 1, f"{which}/{entry}: the active-width buffer itself, once"
        has_active, physical = _active_flag_and_physical(which, entry, args)
        assert has_active == 1, f"{which}/{entry}: has_active_width"
        assert physical in (None, 0), f"{which}/{entry}: row-relative positions, got physical={physical}"
    assert int(buf) == 4096                 # nothing rescales the caller's buffer


def test_rendered_kernels_use_the_active_width_as_entries():
    """Every kernel that reads the active-width buffer clamps it to the planned width and uses it
    as it is: no division by the compress ratio (lengths are the only thing divided)."""
    specs = [IndexerLogitsSpec(num_heads=64, compress_ratio=4), IndexerLogitsSpec(num_heads=16, compress_ratio=128,
                                                                                   arch="sm_120a"),
             IndexerLogitsSpec(num_heads=32, compress_ratio=4, rows_per_unit=2), TopKSpec(),
             IndexerTopKSpec(num_heads=64, compress_ratio=4), IndexerTopKSpec(num_heads=16, compress_ratio=128,
                                                                                arch="sm_120a")]
    for spec in specs:
        # the module's code and that of the building blocks it imports (codegen/cute_blocks/...),
        # transitively: a kernel block may take a shared piece from another block
        text, todo, seen = render(spec), [], set()
        todo += re.findall(r"^from (codegen\.cute_blocks\.[\w.]+) import", text, re.M)
        while todo:
            mod = todo.pop()
            if mod in seen:
                continue
            seen.add(mod)
            block = (ROOT / (mod.replace(".", "/") + ".py")).read_text()
            text += "\n" + block
            package = mod.rsplit(".", 1)[0]
            todo += [package + "." + m for m in re.findall(r"^from \.(\w+) import", block, re.M)]
        reads = [ln.strip() for ln in text.splitlines() if "ActiveWidth[0]" in ln]
        assert reads, f"{spec.name}: reads the active-width buffer"
        for ln in reads:
            assert "max(mActiveWidth[0], 0)" in ln and "min(width," in ln, f"{spec.name}: {ln}"
            assert "RATIO" not in ln and "ratio" not in ln and "//" not in ln, f"{spec.name}: {ln}"


def test_max_len_is_a_deprecated_alias_of_active_width(plan):
    buf = torch.full((1,), 500, dtype=torch.int32)
    with pytest.warns(DeprecationWarning, match="active_width"):
        b = ix.bind(plan, scratch=_scratch(plan), max_len=buf, **_inputs())
    assert b.active_width is buf
    with pytest.raises(InputError, match="max_len: expected None when active_width is given"), \
            pytest.warns(DeprecationWarning):
        ix.bind(plan, scratch=_scratch(plan), max_len=buf, active_width=buf, **_inputs())


def test_physical_slots_know_the_cache_size(monkeypatch):
    """run_index_topk checks physical slots against kv_cache's pages; run_topk against
    bind(num_blocks=...), or only against int32 overflow of the slot without it."""
    calls = _recording_kernels(monkeypatch)
    p = ix.plan(ix.Caps(num_heads=16, topk=2048, max_rows=2, max_width=4096, arch="sm_90a", num_sms=132))
    lengths = torch.full((2,), 4000, dtype=torch.int32)
    bt = torch.zeros(2, 64, dtype=torch.int32)
    logits = torch.zeros(2, 4096)
    for kw, want in ((dict(), ix.MAX_SLOT_BLOCKS), (dict(num_blocks=123), 123), (dict(num_blocks=1 << 30),
                                                                                   ix.MAX_SLOT_BLOCKS)):
        calls.clear()
        b = ix.bind(p, scratch=_scratch(p), lengths=lengths, block_table=bt, logits=logits, physical=True, **kw)
        ix.run_topk(b)
        assert [_active_flag_and_physical(*c)[1] for c in calls] == [want]
    assert ix.MAX_SLOT_BLOCKS * 64 - 1 == (1 << 31) - 1           # every slot fits int32
    # through run_index_topk (fused and not), the cache's own page count
    q, w = torch.zeros(2, 16, 128).to(torch.float8_e4m3fn), torch.ones(2, 16)
    for fused in (False, True):
        pf = ix.plan(ix.Caps(num_heads=16, topk=2048, max_rows=2, max_width=4096, fused=fused, arch="sm_90a",
                             num_sms=132))
        calls.clear()
        b = ix.bind(pf, scratch=_scratch(pf), q=q, weights=w, lengths=lengths, block_table=bt, width=4096,
                    physical=True, num_blocks=5)
        ix.run_index_topk(b, kv_cache=torch.zeros(9, 64, 132, dtype=torch.uint8))
        got = [_active_flag_and_physical(*c)[1] for c in calls]
        assert got and all(g in (None, 9) for g in got) and 9 in got
        calls.clear()
        with pytest.raises(InputError, match="kv_cache: expected at least one page for physical=True, got 0"):
            ix.run_index_topk(b, kv_cache=torch.zeros(0, 64, 132, dtype=torch.uint8))
        assert not calls                                   # refused before any launch
