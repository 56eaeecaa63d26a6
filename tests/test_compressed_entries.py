"""b12x.metadata.CompressedEntries: the extra list of a C128 layer (every compressed entry of a
row) against a per-row loop, on the CPU; the GPU file runs it under graph capture."""
import pytest
import torch

from b12x.errors import InputError
from b12x.metadata import CompressedEntries


def reference(seq_lens, block_table, width, page, ratio):
    rows = seq_lens.shape[0]
    idx = torch.full((rows, width), -1, dtype=torch.int32)
    n = torch.zeros(rows, dtype=torch.int32)
    for r in range(rows):
        count = min(max(int(seq_lens[r]) // ratio, 0), width)
        n[r] = count
        for j in range(count):
            idx[r, j] = int(block_table[r, j // page]) * page + j % page
    return idx, n


@pytest.mark.parametrize("width,page,ratio", [(64, 2, 128), (256, 2, 128), (128, 64, 4), (8192, 2, 128)])
def test_matches_the_per_row_reference(width, page, ratio):
    g = torch.Generator().manual_seed(width + page)
    rows = 9
    cols = -(-width // page) + 3
    # lengths: empty, below one group, exact multiples, a partial group, past the width
    seq_lens = torch.tensor([0, ratio - 1, ratio, 5 * ratio + 7, width * ratio, width * ratio + 999,
                             3 * ratio, 1, 2 * ratio - 1], dtype=torch.int32)
    block_table = torch.randperm(rows * cols, generator=g).to(torch.int32).reshape(rows, cols)
    e = CompressedEntries(max_rows=16, width=width, page=page, compress_ratio=ratio, device="cpu")
    out_idx = torch.full((rows, width), 12345, dtype=torch.int32)   # poisoned
    out_n = torch.full((rows,), 12345, dtype=torch.int32)
    e.fill(seq_lens, block_table, out_idx, out_n)
    ref_idx, ref_n = reference(seq_lens, block_table, width, page, ratio)
    assert torch.equal(out_n, ref_n)
    assert torch.equal(out_idx, ref_idx)


def test_rows_below_the_capacity_and_a_second_fill():
    e = CompressedEntries(max_rows=8, width=64, page=2, device="cpu")
    bt = torch.arange(4 * 40, dtype=torch.int32).reshape(4, 40)
    out_idx = torch.empty(4, 64, dtype=torch.int32)
    out_n = torch.empty(4, dtype=torch.int32)
    for lens in ([128 * 64, 0, 300, 1000], [1, 2, 3, 128 * 10]):
        seq = torch.tensor(lens, dtype=torch.int32)
        e.fill(seq, bt, out_idx, out_n)
        ref_idx, ref_n = reference(seq, bt, 64, 2, 128)
        assert torch.equal(out_idx, ref_idx) and torch.equal(out_n, ref_n)


def test_bad_inputs_name_the_tensor():
    e = CompressedEntries(max_rows=4, width=64, page=2, device="cpu")
    seq = torch.zeros(2, dtype=torch.int32)
    bt = torch.zeros(2, 32, dtype=torch.int32)
    oi, on = torch.empty(2, 64, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
    with pytest.raises(InputError, match="block_table: expected at least 32 columns"):
        e.fill(seq, bt[:, :31], oi, on)
    with pytest.raises(InputError, match="seq_lens: expected dtype torch.int32"):
        e.fill(seq.long(), bt, oi, on)
    with pytest.raises(InputError, match=r"out_indices: expected shape \(2, 64\)"):
        e.fill(seq, bt, oi[:, :32], on)
    with pytest.raises(InputError, match="seq_lens: expected at most max_rows = 4"):
        e.fill(torch.zeros(5, dtype=torch.int32), torch.zeros(5, 32, dtype=torch.int32),
               torch.empty(5, 64, dtype=torch.int32), torch.empty(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="page: expected a positive int"):
        CompressedEntries(max_rows=4, width=64, page=0, device="cpu")
