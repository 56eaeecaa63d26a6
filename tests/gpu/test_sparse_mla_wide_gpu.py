"""Sparse MLA over index rows wider than 2048 (top-k up to 8192), decode and extend, against the
torch reference. Build first: `b12x-codegen build --preset sparse-mla-wide --arch sm_90a`."""
import pytest
import torch

from b12x.attention import sparse_mla as sm

from .sparse_mla_cases import check, random_case, run_ours

pytestmark = pytest.mark.gpu

WIDTHS = (2560, 4096, 8192)


@pytest.mark.parametrize("mode", ("decode", "extend"))
@pytest.mark.parametrize("kv_format", ("fp8_ds_mla", "bf16"))
@pytest.mark.parametrize("heads", (16, 128))
@pytest.mark.parametrize("width", WIDTHS)
def test_wide_rows_match_reference(width, heads, kv_format, mode):
    # rows of 1, 3 and 40: one split per row up to the 32-split cap at the widest rows
    for rows in (1, 3, 40):
        case = random_case(rows, heads, width, kv_format, blocks=256, seed=width + heads + rows)
        out, lse = run_ours(case, kv_format, topk=8192, mode=mode)
        check(case, out, lse)


@pytest.mark.parametrize("kv_format", ("fp8_ds_mla", "bf16"))
def test_wide_rows_edge_cases_and_sink(kv_format):
    """-1 and out-of-range ids, a zero-length row and an all-invalid row at width 8192, with a sink
    and lse in base 2."""
    case = random_case(4, 16, 8192, kv_format, blocks=256, seed=5)
    case.indices[1, ::3] = 2**31 - 1
    case.lengths[2] = 0
    case.indices[3] = -1
    sink = torch.randn(16, device="cuda")
    out, lse = run_ours(case, kv_format, topk=8192, sink=sink, lse_base="2")
    clean = case.indices.clone()
    clean[1, ::3] = -1
    check(type(case)(case.q, case.kv, case.kv_ref, clean, case.lengths, case.sm_scale), out, lse, sink=sink,
          lse_base="2")


def test_wide_plan_caps_splits():
    p = sm.plan(sm.Caps(num_heads=16, topk=8192, max_rows=4))
    for rows in (1, 2, 4):
        splits, tokens = p.splits(rows, 8192)
        assert splits <= 32 and splits * tokens >= 8192
