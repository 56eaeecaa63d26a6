"""Views of MMA fragments and shared-memory atoms, and the value-dim order of a partial o
stored straight from wgmma O fragments (part_col)."""
import cutlass.cute as cute


def swizzled_atom(cols: int):
    """8-row smem atom of bf16 with an XOR swizzle so ldmatrix rows hit distinct banks."""
    bits = {64: 3, 32: 2, 16: 1}[cols]
    return cute.make_composed_layout(
        cute.make_swizzle(bits, 3, 3), 0, cute.make_layout((8, cols), stride=(cols, 1))
    )


def part_col(p, part_block: int):
    """Value dim of position p of a partial stored in fragment order (PART_PERMUTED). A wgmma O
    fragment gives quad lane q the dims 8 j + 2 q + (0, 1) of each 8-dim group j of its
    warpgroup's part_block dims; the pairs j = 4 m .. 4 m + 3 are stored as one 16-byte chunk at
    32 m + 8 q (the split epilogue's store_fragments)."""
    blk, p = p // part_block * part_block, p % part_block
    return blk + (p // 32) * 32 + ((p % 8) // 2) * 8 + ((p % 32) // 8) * 2 + p % 2


def with_unit_mode(t: cute.Tensor) -> cute.Tensor:
    """Append a size-1 mode, e.g. one MMA's fragment (V, M) -> (V, M, N=1) for cute.gemm."""
    return cute.make_tensor(t.iterator, cute.append(t.layout, cute.make_layout(1)))


def mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an m16n8 accumulator fragment ((2,2),M,N), or a wgmma 64xN one ((2,2,N/8),1,1),
    as (rows, cols) of this thread (2 rows either way: lane/4 and lane/4 + 8 of its warp)."""
    lay = cute.make_layout(acc.layout.shape)
    if cute.rank(lay.shape[0]) == 3:
        mn = cute.make_layout(
            ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[0][2], lay.shape[2])),
            stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[0][2], lay.stride[2])),
        )
    else:
        mn = cute.make_layout(
            ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
            stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])),
        )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))
