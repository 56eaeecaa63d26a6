"""The 8-head form whose S^T takes K from registers (cute_blocks/sparse_mla/gather_rs.py) reduces
the 576 dims in a permuted order: Q is stored in it (permute_q), and each thread converts the record
bytes of its own rows into the A fragment in it. Both sides must use the same bijection, and a
thread's columns must be the contiguous record ranges it loads."""
import pytest

pytest.importorskip("cutlass")

from codegen.cute_blocks.sparse_mla.gather_rs import CHUNK_STEPS, Fp8RsGather  # noqa: E402
from codegen.tiling import decode_tiling  # noqa: E402


def _gather(head_block: int = 8) -> Fp8RsGather:
    g = object.__new__(Fp8RsGather)
    g.d_nope, g.d_rope, g.head_block, g.num_threads = 512, 64, head_block, 128
    return g


def test_q_order_is_a_bijection():
    g = _gather()
    n_nope = 8 * 512 // 2 // 128
    dims = [g.q_dim(L, 0 if L < 512 else n_nope, n_nope) for L in range(576)]
    assert sorted(dims) == list(range(576))
    # adjacent logical columns (a pair) are adjacent dims: permute_q moves pairs
    assert all(dims[L + 1] == dims[L] + 1 for L in range(0, 576, 2))


def test_thread_columns_are_its_loaded_ranges():
    """The A fragment gives quad lane q columns 2q + v0 + 8 v2 of each 16-dim step k; rs_tile
    takes them from rH[b], b = 4 kk + v0 + 2 v2, of chunk c (k = 8 c + kk), which holds the
    record dims the thread loaded: 128 c + 16 q + (0..16) then 128 c + 64 + 16 q + (0..16)
    (NoPE), or 512 + 8 q + (0..8) then 512 + 32 + 8 q + (0..8) (RoPE, the last chunk)."""
    g = _gather()
    n_nope = 8 * 512 // 2 // 128
    for q in range(4):
        loaded_nope = [128 * c + 64 * i + 16 * q + x for c in range(4) for i in range(2) for x in range(16)]
        loaded_rope = [512 + 32 * i + 8 * q + x for i in range(2) for x in range(8)]
        for k in range(36):
            c, kk = divmod(k, CHUNK_STEPS)
            for v0 in range(2):
                for v2 in range(2):
                    L = 16 * k + 2 * q + v0 + 8 * v2
                    b = 4 * kk + v0 + 2 * v2
                    dim = g.q_dim(L, 0 if k < 32 else n_nope, n_nope)
                    if k < 32:
                        assert dim == loaded_nope[32 * c + b]
                    else:
                        assert dim == loaded_rope[b]


@pytest.mark.parametrize("head_block", [8])
def test_q_pairs_cover_every_column_once(head_block):
    g = _gather(head_block)
    n_nope = head_block * 512 // 2 // 128
    n_rope = head_block * 64 // 2 // 128
    seen = []
    for tidx in range(128):
        for p in range(n_nope + n_rope):
            h, L = g.q_pair(tidx, p, n_nope)
            seen += [(h, L), (h, L + 1)]
    assert sorted(seen) == [(h, L) for h in range(head_block) for L in range(576)]


def test_s_regs_tiling():
    t8 = decode_tiling(8, "fp8_ds_mla", "sm_90a", d_qk=576, record_bytes=656)
    assert t8["s_regs"] and t8["fp8_regs"] and t8["heads_as_n"] and t8["num_threads"] == 128
    for heads, fmt, arch in ((16, "fp8_ds_mla", "sm_90a"), (8, "bf16", "sm_90a"), (8, "model1_fp8", "sm_90a"),
                             (8, "fp8_ds_mla", "sm_120a")):
        assert not decode_tiling(heads, fmt, arch, d_qk=576, record_bytes=656)["s_regs"]
