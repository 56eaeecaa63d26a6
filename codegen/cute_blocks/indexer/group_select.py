"""The grouped top-k of wide rows: the row's top-k found among the logits of its best groups.

Cut a row into groups of GROUP consecutive logits and give each group its largest key. Let m be
the k-th largest group key. At least k groups reach m, so at least k logits do: the row's k-th
largest key T is >= m, and every winner (key > T, or key == T) lies in a group whose key is
>= m. Taking the top-k groups by (key descending, position ascending) - exactly the top-k of the
group keys, with the select's tie rule - keeps every group with key > m and the first ones with
key == m; when T == m, the winners tied at T are the lowest positions among the logits equal to
m, and each group with key == m before such a winner holds an earlier logit equal to m, so that
winner's group is among the first k groups with key == m, which the top-k keeps. So:

    group_max      maxima[r, g] = the largest key of logits [g GROUP, (g + 1) GROUP) of the row's
                   valid range ([start, end), clipped to the active width); -inf where none;
    (the top-k of the maxima rows: the plain top-k launches, over width / GROUP entries)
    group_final    the top-k of the k GROUP logits of those groups (TopKStage, source "groups"),

which reads each logit once for the maxima and k GROUP of them again, where the wide top-k reads
a row two or three times and waits across its CTAs (docs/notes/topk.md). Keys are the select's
sortable u32 keys, so NaN and signed zeros fall where they do over the whole row."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from .select import GROUP, bits_f32, key_to_score, row_bounds, score_to_key

GROUP_MAX_THREADS = 256


class GroupMax:
    """maxima[row, g] for g < maxima.shape[1]: a thread per group, its GROUP loads issued before
    the first use (a warp's loads cover GROUP x 32 consecutive logits). Grid: (group blocks, rows)."""

    num_threads = GROUP_MAX_THREADS

    @cute.jit
    def __call__(
        self,
        mLogits: cute.Tensor,      # [rows, width] f32, row stride >= width
        mStarts: cute.Tensor,      # [rows] i32 (has_starts != 0)
        mEnds: cute.Tensor,        # [rows] i32, row ends in tokens, divided by `ratio`
        mActiveWidth: cute.Tensor, # [1] i32, entries (has_active_width != 0)
        mMax: cute.Tensor,         # [rows, >= ceil(width / GROUP)] f32
        ratio: Int32,
        has_starts: Int32,
        has_active_width: Int32,
        stream,
    ):
        groups = mMax.shape[1]
        self.kernel(mLogits, mStarts, mEnds, mActiveWidth, mMax, ratio, has_starts, has_active_width).launch(
            grid=((groups + self.num_threads - 1) // self.num_threads, mMax.shape[0], 1),
            block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mLogits, mStarts, mEnds, mActiveWidth, mMax, ratio: Int32, has_starts: Int32,
               has_active_width: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        blk, row, _ = cute.arch.block_idx()
        g = blk * self.num_threads + tidx
        start, end = row_bounds(mLogits, mStarts, mEnds, mActiveWidth, row, ratio, has_starts, has_active_width)
        if g < mMax.shape[1]:
            lo = cutlass.max(g * GROUP, start)
            hi = cutlass.min(g * GROUP + GROUP, end)
            best = score_to_key(-Float32.inf)
            if lo < hi:
                gRow = cute.recast_tensor(mLogits[row, None], Uint32)
                rBits = cute.make_rmem_tensor((GROUP,), Uint32)
                for j in cutlass.range_constexpr(GROUP):
                    rBits[j] = gRow[cutlass.min(cutlass.max(g * GROUP + j, lo), hi - 1)]
                for j in cutlass.range_constexpr(GROUP):
                    key = score_to_key(bits_f32(rBits[j]))
                    best = key if key > best else best      # u32 compare: the select's key order
            mMax[row, g] = key_to_score(best)


def make_group_max_fakes():
    rows = cute.sym_int32()
    logits = cute.runtime.make_fake_tensor(Float32, (rows, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    starts = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    ends = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    active_width = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int32(),), assumed_align=4)
    maxima = cute.runtime.make_fake_tensor(Float32, (rows, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (logits, starts, ends, active_width, maxima, Int32(1), Int32(0), Int32(0), stream)
