"""Indices outside the cache never fault the device: sparse MLA decode and extend mask any index
outside [0, blocks * 64) of the cache tensor passed exactly like -1.

An unmasked index past the cache is an illegal address (CUDA error 700) that poisons the CUDA
context for the rest of the process, so run this file in a pytest process of its own:
    python -m pytest -q -m gpu tests/gpu/test_sparse_mla_out_of_range_gpu.py"""
import math

import pytest
import torch

from .sparse_mla_cases import Case, check, random_case, random_kv, run_ours

pytestmark = pytest.mark.gpu

HEADS = (8, 16, 32, 64, 128)
FORMATS = ("fp8_ds_mla", "bf16")
MODES = ("decode", "extend")
INT32_MAX, INT32_MIN = 2**31 - 1, -2**31


def _wild_values(slots: int) -> torch.Tensor:
    """Out-of-range indices: just past the end, far past it, INT32_MAX, INT32_MIN and other
    negatives."""
    return torch.tensor([slots, slots + 1, slots + 63, slots * 50, INT32_MAX, INT32_MAX - 63, INT32_MIN,
                         INT32_MIN + 1, -2, -100, -65], dtype=torch.int32)


def _scatter_wild(indices: torch.Tensor, slots: int, frac: float, seed: int) -> torch.Tensor:
    g = torch.Generator(device=indices.device).manual_seed(seed)
    wild = _wild_values(slots).to(indices.device)
    pick = torch.rand(indices.shape, device=indices.device, generator=g) < frac
    which = torch.randint(0, len(wild), indices.shape, device=indices.device, generator=g)
    return torch.where(pick, wild[which], indices)


def _as_minus_one(indices: torch.Tensor, slots: int) -> torch.Tensor:
    return torch.where((indices >= 0) & (indices < slots), indices, torch.full_like(indices, -1))


def _rows(mode: str) -> int:
    return 9 if mode == "extend" else 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", HEADS)
def test_out_of_range_ids_are_masked_like_minus_one(mode, kv_format, heads):
    blocks = 64
    slots = blocks * 64
    case = random_case(_rows(mode), heads, 1024, kv_format, blocks=blocks, seed=heads * 3 + len(mode))
    case.indices = _scatter_wild(case.indices, slots, 0.3, seed=heads)
    case.indices[1] = _wild_values(slots).repeat(1024 // 11 + 1)[:1024].to(case.indices.device)  # no valid entry
    case.lengths[1] = 1024
    out, lse = run_ours(case, kv_format, mode=mode)
    masked = Case(case.q, case.kv, case.kv_ref, _as_minus_one(case.indices, slots), case.lengths)
    check(masked, out, lse)                       # the reference with those ids replaced by -1
    check(case, out, lse)                         # the reference itself masks them the same way
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -math.inf)
    # exactly the -1 path: bit for bit the output of the same call with -1 in their place
    out_m, lse_m = run_ours(masked, kv_format, mode=mode)
    assert torch.equal(out, out_m) and torch.equal(lse, lse_m)
    # the process is healthy: a normal call still works
    torch.cuda.synchronize()
    fresh = random_case(_rows(mode), heads, 512, kv_format, blocks=blocks, seed=7)
    check(fresh, *run_ours(fresh, kv_format, mode=mode))
    torch.cuda.synchronize()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("heads", (16, 128))
def test_bound_is_the_cache_tensor_passed(mode, kv_format, heads):
    """The cache is a view of the first `blocks` pages of a larger buffer whose other pages are
    poison (NaN / huge values): slots past the view are readable memory, but outside the cache
    passed, so they are masked (reading one would put NaN or inf into out)."""
    blocks, extra = 32, 32
    g = torch.Generator(device="cuda").manual_seed(heads)
    dense, ref = random_kv(blocks + extra, kv_format, "cuda", g)
    dense[blocks:] = 0x7F if dense.dtype == torch.uint8 else float("nan")
    kv = dense[:blocks]
    assert kv.shape[0] == blocks and kv.data_ptr() == dense.data_ptr()
    slots = blocks * 64
    base = random_case(_rows(mode), heads, 512, kv_format, blocks=blocks, seed=heads + 1)
    far = torch.randint(slots, (blocks + extra) * 64, base.indices.shape, device="cuda", generator=g,
                        dtype=torch.int32)
    pick = torch.rand(base.indices.shape, device="cuda", generator=g) < 0.4
    idx = torch.where(pick, far, base.indices)
    case = Case(base.q, kv, ref[:blocks], idx, base.lengths)
    out, lse = run_ours(case, kv_format, mode=mode)
    assert torch.isfinite(out.float()).all()
    check(Case(case.q, kv, ref[:blocks], _as_minus_one(idx, slots), case.lengths), out, lse)


@pytest.mark.parametrize("kv_format", FORMATS)
def test_page_strided_view_bound(kv_format):
    """A page-strided cache view counts its own blocks (shape[0]), not the stride's."""
    blocks = 48
    case = random_case(4, 64, 1024, kv_format, blocks=blocks, seed=13, page_stride_pad=4096)
    assert not case.kv.is_contiguous()
    case.indices = _scatter_wild(case.indices, blocks * 64, 0.25, seed=13)
    for mode in MODES:
        out, lse = run_ours(case, kv_format, mode=mode)
        check(Case(case.q, case.kv, case.kv_ref, _as_minus_one(case.indices, blocks * 64), case.lengths), out, lse)
    torch.cuda.synchronize()
