"""The torch custom ops exist, declare what they mutate, and trace under fake tensors (torch.compile)."""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import b12x.attention.sparse_mla  # noqa: F401  (registers b12x::sparse_mla_decode)
import b12x.indexer  # noqa: F401  (registers the indexer ops)


def test_ops_are_registered_with_their_mutations():
    schema = torch.ops.b12x.sparse_mla_decode.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"out", "lse", "scratch"}
    for name in ("indexer_logits", "indexer_topk", "indexer_index_topk"):
        assert hasattr(torch.ops.b12x, name), name


def test_sparse_mla_decode_fake_runs_without_a_gpu():
    with FakeTensorMode():
        q = torch.empty(4, 16, 576, dtype=torch.bfloat16)
        kv = torch.empty(8, 64, 656, dtype=torch.uint8)
        idx = torch.empty(4, 512, dtype=torch.int32)
        lengths = torch.empty(4, dtype=torch.int32)
        scratch = torch.empty(1 << 20, dtype=torch.uint8)
        out = torch.empty(4, 16, 512, dtype=torch.bfloat16)
        lse = torch.empty(4, 16)
        assert torch.ops.b12x.sparse_mla_decode(q, kv, idx, lengths, scratch, out, lse, 0.04, None, True,
                                                "fp8_ds_mla", 2048, 4) is None
