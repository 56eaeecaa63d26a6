"""Sparse MLA decode, second kernel: merge the per-split partials (fp16 o, base-2 lse) of each
(row, head) into bf16 out and its lse, with the optional attention sink."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, const_expr

from .fragments import part_col
from .softmax import LN_2, sink_scale, xor_allreduce

# Splits one thread streams at most: more splits add 128-thread groups to the CTA (each with
# its own loads in flight), whose sums meet in shared memory. The partials sit in L2, so load
# latency, not bandwidth, bounds this kernel.
SPLITS_PER_GROUP = 8


class SparseMlaCombine:
    """Merge the per-split partials: one CTA per (row, head) of 128 threads per group of up to
    SPLITS_PER_GROUP splits, 4 value dims per thread. Lane s of every warp loads split s's lse,
    so the max, the sum and each split's weight come from warp shuffles after one load.
    Thread (group g, dims 4d..4d+3) then streams splits g, g + G, ... of its dims, unrolled so
    several 16-byte loads are in flight, and group 0 adds the other groups' sums from smem.
    (One lse load per lane puts every split's weight a few shuffles away; walking the splits
    one after another would cost a round of load latency each. The partials are not copied to
    shared memory first: 64 KB per CTA costs occupancy from 8 splits on. docs/notes/combine.md.)

    Launched as a programmatic dependent of the split kernel: its CTAs are scheduled while the
    split's last wave still runs and wait (griddepcontrol.wait) for the split grid to finish and
    flush, so the launch gap between the two kernels is hidden.

    Config: num_heads; d_v (value dims of a head, 4 per thread); max_splits (splits per row: the
    planner never makes more than the top-k's 64-token tiles or 32, so one lane per split holds
    every split's lse in a single warp-wide load);
    few_splits (up to this many splits the early loads are clamped, codegen.tiling.
    COMBINE_FEW_SPLITS); many_splits (this entry point loads every split of a thread before the
    weights); part_block, when the partials are in wgmma O-fragment order (part_col), else None."""

    def __init__(self, num_heads: int, d_v: int, max_splits: int, few_splits: int, many_splits: bool,
                 part_block=None):
        assert 1 <= max_splits <= 32 and d_v % 4 == 0
        self.num_heads = num_heads
        self.d_v = d_v
        self.max_groups = (max_splits + SPLITS_PER_GROUP - 1) // SPLITS_PER_GROUP
        self.part_block = part_block
        # splits per thread whose partial o is loaded before the weights are known
        self.early = SPLITS_PER_GROUP if many_splits else few_splits

    def part_dims(self, mPartO, row, split, head, dslot):
        """This thread's 4 value dims (slot dslot) of one split's partial o of (row, head)."""
        return cute.local_tile(mPartO[row, split, head, None], (4,), (dslot,))

    @cute.jit
    def __call__(
        self,
        mPartO: cute.Tensor,      # [rows, splits, H, d_v] f16, splits <= topk // 64
        mPartLse: cute.Tensor,    # [rows, splits, H] f32
        mO: cute.Tensor,          # [rows, H, d_v] bf16
        mLse: cute.Tensor,        # [rows, H] f32
        mSink: cute.Tensor,       # [H] f32
        has_sink: Int32,
        lse_natural: Int32,
        stream,
    ):
        groups = (mPartLse.shape[1] + SPLITS_PER_GROUP - 1) // SPLITS_PER_GROUP
        grid = (self.num_heads, cute.size(mO.shape[0]), 1)
        self.kernel(mPartO, mPartLse, mO, mLse, mSink, has_sink, lse_natural).launch(
            grid=grid, block=[(self.d_v // 4) * groups, 1, 1], stream=stream, use_pdl=True,
            max_number_threads=[(self.d_v // 4) * self.max_groups, 1, 1],
        )

    @cute.kernel
    def kernel(
        self,
        mPartO: cute.Tensor,
        mPartLse: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        mSink: cute.Tensor,
        has_sink: Int32,
        lse_natural: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        head, row, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        n_splits = mPartLse.shape[1]
        n_groups = (n_splits + SPLITS_PER_GROUP - 1) // SPLITS_PER_GROUP
        dslot = tidx % (self.d_v // 4)           # this thread's 4 value dims
        group = tidx // (self.d_v // 4)
        smem = cutlass.utils.SmemAllocator()
        sSum = smem.allocate_tensor(Float32, cute.make_layout((self.d_v, self.max_groups)), byte_alignment=16)
        cute.arch.griddepcontrol_wait()          # the split grid's partials are complete and visible
        # The partial o loads do not depend on the weights: this thread's first self.early
        # splits are loaded before the lse reduction, so the two L2 round trips overlap. (ptxas
        # sinks clamped loads below the reduction; guarded ones it mostly keeps ahead of it.)
        early = [cute.make_rmem_tensor((4,), Float16) for _ in range(self.early)]
        for k in cutlass.range_constexpr(self.early):
            if const_expr(self.early == SPLITS_PER_GROUP):
                j = group + k * n_groups
                if j < n_splits:
                    cute.autovec_copy(self.part_dims(mPartO, row, j, head, dslot), early[k])
            else:
                j = cutlass.min(group + k * n_groups, n_splits - 1)     # in bounds; weighed 0 past the end
                cute.autovec_copy(self.part_dims(mPartO, row, j, head, dslot), early[k])
        # L = log2 sum_s 2^lse_s, with the max subtracted for range; lanes past the last split
        # hold -inf and weigh 0
        lse_s = -Float32.inf
        if lane < n_splits:
            lse_s = mPartLse[row, lane, head]
        mx = xor_allreduce(lse_s, True, 0, 5)
        mx_use = mx if mx != -Float32.inf else Float32(0.0)
        e = cute.math.exp2(lse_s - mx_use, fastmath=True)
        tot = xor_allreduce(e, False, 0, 5)
        lse2 = -Float32.inf
        w = Float32(0.0)                         # this lane's split weight 2^(lse_s - L)
        if tot > 0.0:
            lse2 = cute.math.log2(tot, fastmath=True) + mx_use
            w = e * cute.arch.rcp_approx(tot)

        # Empty splits hold finite zeros and weigh 0: no branch in the loop.
        acc = cute.make_rmem_tensor((4,), Float32)
        acc.fill(0.0)
        for k in cutlass.range_constexpr(self.early):
            j = group + k * n_groups
            if j < n_splits:
                acc.store(acc.load() + early[k].load().to(Float32) * cute.arch.shuffle_sync(w, j))
        for j in cutlass.range(group + self.early * n_groups, n_splits, n_groups, unroll=4):
            rv = cute.make_rmem_tensor((4,), Float16)
            cute.autovec_copy(self.part_dims(mPartO, row, j, head, dslot), rv)
            acc.store(acc.load() + rv.load().to(Float32) * cute.arch.shuffle_sync(w, j))
        if n_groups > 1:
            if group > 0:
                cute.autovec_copy(acc, cute.local_tile(sSum[None, group], (4,), (dslot,)))
            cute.arch.sync_threads()
            if group == 0:
                for g in cutlass.range(1, n_groups, unroll=1):
                    rv = cute.make_rmem_tensor((4,), Float32)
                    cute.autovec_copy(cute.local_tile(sSum[None, g], (4,), (dslot,)), rv)
                    acc.store(acc.load() + rv.load())

        if group == 0:
            # acc is already normalised (the weights sum to 1): only the sink scales it
            scale = sink_scale(Float32(1.0) if tot > 0.0 else Float32(0.0), lse2, has_sink, mSink, head)
            rb = cute.make_rmem_tensor((4,), BFloat16)
            rb.store((acc.load() * scale).to(BFloat16))
            if const_expr(self.part_block is not None):
                # positions 4 dslot .. + 3 hold dims c, c + 1, c + 8, c + 9 (part_col)
                c = part_col(dslot * 4, self.part_block)
                for h in cutlass.range_constexpr(2):
                    cute.autovec_copy(cute.local_tile(rb, (2,), (h,)),
                                      cute.local_tile(mO[row, head, None], (2,), (c // 2 + 4 * h,)))
            else:
                cute.autovec_copy(rb, cute.local_tile(mO[row, head, None], (4,), (dslot,)))
            if tidx == 0:
                mLse[row, head] = lse2 * LN_2 if lse_natural != 0 else lse2
