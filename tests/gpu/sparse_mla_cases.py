"""Random sparse-MLA problems shared by the GPU tests and the benchmarks."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from b12x.attention import sparse_mla as sm
from b12x.reference import dequantize_fp8_ds_mla, quantize_fp8_ds_mla, sparse_mla_reference


@dataclass
class Case:
    q: torch.Tensor
    kv: torch.Tensor          # what the kernel reads (uint8 records or bf16)
    kv_ref: torch.Tensor      # what the reference reads (dequantized, float32), same slots
    indices: torch.Tensor
    lengths: torch.Tensor
    sm_scale: float = 576 ** -0.5


def random_kv(blocks: int, kv_format: str, device, g: torch.Generator, page_stride_pad: int = 0):
    """A paged cache of random data; page_stride_pad > 0 makes it a page-strided view."""
    k = torch.randn(blocks, 64, 576, device=device, generator=g)
    if kv_format == "fp8_ds_mla":
        dense = quantize_fp8_ds_mla(k)
        ref = dequantize_fp8_ds_mla(dense)
    else:
        dense = k.bfloat16()
        ref = dense.float()
    if page_stride_pad:
        last = dense.shape[-1]
        big = torch.empty(blocks, 64 * last + page_stride_pad, dtype=dense.dtype, device=device)
        big.fill_(0x7F if dense.dtype == torch.uint8 else float("nan"))  # poison the gaps
        view = big[:, : 64 * last].view(blocks, 64, last)
        view.copy_(dense)
        dense = view
    return dense, ref


def random_case(rows: int, heads: int, width: int, kv_format: str, *, blocks: int = 64, seed: int = 0,
                device="cuda", invalid_frac: float = 0.1, page_stride_pad: int = 0) -> Case:
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(rows, heads, 576, device=device, generator=g).bfloat16()
    kv, ref = random_kv(blocks, kv_format, device, g, page_stride_pad)
    idx = torch.randint(0, blocks * 64, (rows, width), device=device, generator=g, dtype=torch.int32)
    idx[torch.rand(rows, width, device=device, generator=g) < invalid_frac] = -1
    lengths = torch.randint(width // 2, width + 1, (rows,), device=device, generator=g, dtype=torch.int32)
    return Case(q, kv, ref, idx, lengths)


def reference(case: Case, sink=None, chunk: int = 128):
    """The torch reference in row chunks (a [rows, width, 576] gather of 8192 rows would not fit)."""
    outs, lses = [], []
    for r0 in range(0, case.q.shape[0], chunk):
        o, l = sparse_mla_reference(case.q[r0:r0 + chunk], case.kv_ref, case.indices[r0:r0 + chunk],
                                    case.lengths[r0:r0 + chunk], case.sm_scale, sink)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def run_ours(case: Case, kv_format: str, *, sink=None, lse_base="e", topk=2048, max_rows=None, mode="decode",
             num_rows=None, num_sms=None):
    rows, heads = case.q.shape[:2]
    p = sm.plan(sm.Caps(num_heads=heads, topk=topk, kv_format=kv_format, max_rows=max_rows or max(rows, 1),
                        mode=mode, num_sms=num_sms))
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")  # NaN poison
    out = torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device="cuda")
    b = sm.bind(p, scratch=scratch, q=case.q, indices=case.indices, lengths=case.lengths, out=out, lse=lse,
                num_rows=num_rows)
    run = sm.run_extend if mode == "extend" else sm.run_decode
    run(b, kv_cache=case.kv, sm_scale=case.sm_scale, attn_sink=sink, lse_base=lse_base)
    torch.cuda.synchronize()
    return out, lse


def check(case: Case, out, lse, *, sink=None, lse_base="e"):
    ref, ref_lse = reference(case, sink)
    assert not out.isnan().any(), "out has unwritten (NaN) elements"
    assert not lse.isnan().any(), "lse has unwritten (NaN) elements"
    o = out.float()
    rel = ((o - ref).norm() / ref.norm().clamp(min=1e-6)).item()
    assert rel < 1e-2, f"relative error {rel:.2e}"
    torch.testing.assert_close(o, ref, atol=1e-2 * ref.abs().max().item() + 1e-4, rtol=5e-2)
    want = ref_lse if lse_base == "e" else ref_lse / math.log(2.0)
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse), fin), "lse is -inf exactly where the reference is"
    assert torch.all(lse[~fin] == -math.inf)
    torch.testing.assert_close(lse[fin], want[fin], atol=2e-3 * want[fin].abs().max().item() + 2e-3, rtol=1e-3)
    return rel


def assert_no_allocation(fn, what: str) -> None:
    """Run fn once more, between synchronizes, with the caching allocator's allocation count
    unchanged (fn already ran once, so lazy module loads are behind it)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    fn()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, f"{what} allocated"


def capture_allocation_free(run, what: str) -> torch.cuda.CUDAGraph:
    """run once (lazy module loads), once more allocating nothing, then captured into a graph."""
    run()
    assert_no_allocation(run, what)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph
