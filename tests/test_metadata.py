import numpy as np
import pytest
import torch

from b12x.metadata import (decode_active_width, decode_topk_max_seq_len_from_cpu, graph_stable_active_width,
                           write_active_width)


def test_plain_decode_matches_device_max():
    seq = torch.randint(1, 5000, (37,), dtype=torch.int32)
    assert decode_topk_max_seq_len_from_cpu(seq) == int(seq.max())
    assert decode_topk_max_seq_len_from_cpu(seq.numpy()) == int(seq.max())


def test_native_mtp_shape():
    seq = torch.tensor([[10, 11, 12], [40, 41, 42]], dtype=torch.int32)  # (B, next_n)
    assert decode_topk_max_seq_len_from_cpu(seq) == 42


def test_flattened_mtp_with_pad_rows():
    seq = torch.tensor([10, 11, 0, 0, 30, 31, 0, 0], dtype=torch.int32)
    assert decode_topk_max_seq_len_from_cpu(seq) == 31
    assert decode_topk_max_seq_len_from_cpu(seq, num_rows=4) == 11
    assert decode_topk_max_seq_len_from_cpu(torch.zeros(4, dtype=torch.int32)) == 0


def test_dcp_local_shadow_is_preferred():
    seq = torch.tensor([1000, 2000], dtype=torch.int32)
    local = torch.tensor([500, 1001], dtype=torch.int32)
    assert decode_topk_max_seq_len_from_cpu(seq, dcp_local_seq_lens_cpu=local) == 1001


@pytest.mark.parametrize("c", [4, 128])
def test_compressed_rows_are_floor_divided(c):
    seq = torch.tensor([1023, 4096, 130], dtype=torch.int32)
    assert decode_topk_max_seq_len_from_cpu(seq, compress_ratio=c) == 4096 // c
    assert decode_topk_max_seq_len_from_cpu(torch.tensor([c - 1]), compress_ratio=c) == 0


def test_none_without_an_authoritative_cpu_shadow():
    assert decode_topk_max_seq_len_from_cpu(None) is None
    assert decode_topk_max_seq_len_from_cpu(torch.tensor([5]), authoritative=False) is None
    meta = torch.tensor([5], device="meta")  # stands in for a device tensor: never read
    assert decode_topk_max_seq_len_from_cpu(meta) is None


def test_fallback_writes_graph_stable_bound():
    buf = torch.zeros(1, dtype=torch.int32)
    assert graph_stable_active_width(1000, 128) == 8
    assert decode_active_width(buf, max_seq_len=1000, compress_ratio=128, seq_lens_cpu=None) == 8
    assert int(buf) == 8
    assert decode_active_width(buf, max_seq_len=1000, compress_ratio=4, seq_lens_cpu=np.array([17, 9])) == 4
    assert int(buf) == 4
    with pytest.raises(ValueError, match="buffer: expected a one-element int32 tensor"):
        write_active_width(torch.zeros(2), 3)
