"""The grouped top-k of wide rows: the row's top-k found among the logits of its best groups.

Cut a row's valid range [start, end) into groups of GROUP consecutive logits, on the grid of
positions (group g holds positions [g GROUP, (g + 1) GROUP)), from the group that holds `start`
on, and give each group its largest key. Let m be the k-th largest group key. At least k groups
reach m, so at least k logits do: the row's k-th largest key T is >= m, and every winner (key > T,
or key == T) lies in a group whose key is >= m. Taking the top-k groups by (key descending,
position ascending) - exactly the top-k of the group keys, with the select's tie rule - keeps
every group with key > m and the first ones with key == m; when T == m, the winners tied at T are
the lowest positions among the logits equal to m, and each group with key == m before such a
winner holds an earlier logit equal to m, so that winner's group is among the first k groups with
key == m, which the top-k keeps. So:

    group_max      maxima[r, j] = the largest key of group start // GROUP + j, its valid positions
                   only ([start, end), clipped to the active width); key 0, the lowest, for a
                   group with none;
    (the top-k of the maxima rows: one CTA a row, chunk_final or row_final over width / GROUP
    entries, whose winners come out in position order)
    group_final    the top-k of the k GROUP logits of those groups (TopKStage, source "groups"),

which reads each logit once for the maxima and k GROUP of them again, where the wide top-k reads
a row two or three times and waits across its CTAs (docs/notes/topk.md). Keys are the select's
sortable u32 keys, so NaN and signed zeros fall where they do over the whole row.

The maxima row starts at the group of `start`, so every group without a valid logit lies after
every group with one, and their key 0 (which a valid group has only when all its logits are the
NaN of all-ones bits) loses every tie to them: "at least k groups reach m" counts valid groups
only, whatever m is (an -inf or NaN m included). The maxima top-k's ids are then relative to
that first group; group_final adds it back, and takes the ids in the ascending order the
one-CTA selects give (its ties at T go to the lowest positions as they arrive)."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from .select import GROUP, bits_f32, first_group, key_to_score, row_bounds, score_to_key

GROUP_MAX_THREADS = 256


class GroupMax:
    """maxima[row, j] for j < maxima.shape[1]: the largest key of group first_group + j (key 0
    where the group has no valid logit), a thread per group, its GROUP loads issued before the
    first use (a warp's loads cover GROUP x 32 consecutive logits). Grid: (rows, group blocks):
    rows on x, which has no 65535 bound."""

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
            grid=(mMax.shape[0], (groups + self.num_threads - 1) // self.num_threads, 1),
            block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mLogits, mStarts, mEnds, mActiveWidth, mMax, ratio: Int32, has_starts: Int32,
               has_active_width: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        row, blk, _ = cute.arch.block_idx()
        j = blk * self.num_threads + tidx
        start, end = row_bounds(mLogits, mStarts, mEnds, mActiveWidth, row, ratio, has_starts, has_active_width)
        if j < mMax.shape[1]:
            g = first_group(start, end) + j
            lo = cutlass.max(g * GROUP, start)
            hi = cutlass.min(g * GROUP + GROUP, end)
            best = Uint32(0)                     # the lowest key: no valid logit
            if lo < hi:
                gRow = cute.recast_tensor(mLogits[row, None], Uint32)
                rBits = cute.make_rmem_tensor((GROUP,), Uint32)
                for e in cutlass.range_constexpr(GROUP):
                    rBits[e] = gRow[cutlass.min(cutlass.max(g * GROUP + e, lo), hi - 1)]
                for e in cutlass.range_constexpr(GROUP):
                    key = score_to_key(bits_f32(rBits[e]))
                    best = key if key > best else best      # u32 compare: the select's key order
            mMax[row, j] = key_to_score(best)


def make_group_max_fakes():
    rows = cute.sym_int32()
    logits = cute.runtime.make_fake_tensor(Float32, (rows, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    starts = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    ends = cute.runtime.make_fake_compact_tensor(Int32, (rows,), assumed_align=4)
    active_width = cute.runtime.make_fake_compact_tensor(Int32, (cute.sym_int32(),), assumed_align=4)
    maxima = cute.runtime.make_fake_tensor(Float32, (rows, cute.sym_int32()), (cute.sym_int64(), 1), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return (logits, starts, ends, active_width, maxima, Int32(1), Int32(0), Int32(0), stream)
