"""The end of the split kernel: normalise O by its row sums and write o (the fp16 partial of
a decode split, or extend's bf16 out) and each head's lse, staged in the idle K stages or
straight from the wgmma fragments."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .barriers import BAR_TOTALS, named_arrive, named_sync
from .fragments import mn_view
from .softmax import head_out_scale, quad_allreduce


class StagedStore:
    """o assembled in shared memory, stored in 16-byte chunks. Config: head_block,
    out_dtype, stage_pad, mma_threads, q_rows, d_v."""

    def out_stage(self, storage):
        """[HEAD_BLOCK, d_v] 16-bit view of the (then idle) K stages where the epilogue assembles
        this CTA's o (fp16 partial in decode, bf16 out in extend), rows padded by 16 bytes so
        the fragment stores spread over the banks."""
        base = cute.recast_ptr(storage.sK.data_ptr(), dtype=self.out_dtype)
        return cute.make_tensor(base, cute.make_layout((self.head_block, self.d_v), stride=(self.d_v + self.stage_pad, 1)))

    @cute.jit
    def store_staged(self, sStage, gRows):
        """Copy the staged o to its [HEAD_BLOCK, d_v] global rows in 16-byte chunks, consecutive
        threads on consecutive chunks: whole sectors per store instead of the MMA fragments' 2-,
        4- and 8-byte pieces, which write partial sectors."""
        self.mma_sync()               # every thread's fragment is in sStage
        tidx, _, _ = cute.arch.thread_idx()
        chunks = self.d_v // 8        # 16-byte chunks per head row
        rows_per_pass = self.mma_threads // chunks
        for i in cutlass.range_constexpr(self.head_block * chunks // self.mma_threads):
            if const_expr(i * rows_per_pass < self.q_rows):    # rows past the real heads are not stored
                chunk = i * self.mma_threads + tidx
                r = chunk // chunks
                c = chunk % chunks
                rv = cute.make_rmem_tensor((8,), self.out_dtype)
                cute.autovec_copy(cute.local_tile(sStage[r, None], (8,), (c,)), rv)
                cute.autovec_copy(rv, cute.local_tile(gRows[r, None], (8,), (c,)))


class RowsEpilogue(StagedStore):
    """The epilogue of the forms with the heads as the MMA M (rows of the
    accumulators). Config: head_block, num_heads, warps_n, wgmma, part_permuted, part_block,
    s_one_warpgroup, q_rows."""

    @cute.jit
    def epilogue(
        self, thr_mma, gRows, gLse, sRed, sStage, head_blk, wn, lane, acc_O, row_max, row_sum,
        sm_scale_log2, sink=None,
    ):
        """Normalise O and write this CTA's o (OUT_DTYPE; staged in smem, or PART_PERMUTED) to
        gRows [HEAD_BLOCK, d_v] and each head's lse to gLse [H]: decode's split partial with a
        base-2 lse, or extend's out, where sink = (has_sink, mSink, lse_natural) folds in the
        attention sink and picks the lse base (what combine does for a single split)."""
        cO = cute.make_identity_tensor((self.head_block, self.dims_per_warp))
        tOcO_mn = mn_view(thr_mma.partition_C(cO))
        total = self.row_totals(tOcO_mn, sRed, wn, lane, row_sum)
        for r in cutlass.range_constexpr(2):
            head = head_blk * self.head_block + tOcO_mn[r, 0][0]
            inv, lse = head_out_scale(total[r], row_max[r], sm_scale_log2, sink, cutlass.min(head, self.num_heads - 1))
            for acc in acc_O:
                acc_mn = mn_view(acc)
                acc_mn[r, None] = acc_mn[r, None].load() * inv
            if wn == 0 and lane % 4 == 0 and head < self.num_heads:   # (a block's rows past the real heads)
                gLse[head] = lse
        if const_expr(self.part_permuted):
            self.store_fragments(tOcO_mn, gRows, wn, acc_O[0])
        else:
            sO = cute.local_tile(sStage, (self.head_block, self.dims_per_warp), (0, wn))
            for j in cutlass.range_constexpr(len(acc_O)):
                rh = cute.make_rmem_tensor_like(acc_O[j], self.out_dtype)
                rh.store(acc_O[j].load().to(self.out_dtype))
                if const_expr(self.wgmma):
                    cute.autovec_copy(rh, thr_mma.partition_C(sO))
                else:
                    cute.autovec_copy(rh, thr_mma.partition_C(cute.local_tile(sO, (self.head_block, 16), (0, j))))
            self.store_staged(sStage, gRows)

    @cute.jit
    def store_fragments(self, tOcO_mn, gRows, wn, acc):
        """PART_PERMUTED: this thread's normalised O straight to its partial rows, 16 bytes a
        store. Quad lane q holds pairs j = 0, 1, ... of dims 8 j + 2 q of each row; pairs
        4 m .. 4 m + 3 go to positions [32 m + 8 q, + 8) of its warpgroup's block, so a quad's
        four stores are 64 contiguous bytes (whole sectors) and part_col (fragments) inverts the order."""
        rh = cute.make_rmem_tensor_like(acc, self.out_dtype)
        rh.store(acc.load().to(self.out_dtype))
        rh_mn = mn_view(rh)
        q = tOcO_mn[0, 0][1] // 2               # column of the first value: 2 q
        for r in cutlass.range_constexpr(2):
            hrow = tOcO_mn[r, 0][0]
            if hrow < self.q_rows:                   # (a block's rows past the real heads)
                for m in cutlass.range_constexpr(self.part_block // 32):
                    rv = cute.make_rmem_tensor((8,), self.out_dtype)
                    for i in cutlass.range_constexpr(8):
                        rv[i] = rh_mn[r, 8 * m + i]
                    chunk = wn * (self.part_block // 8) + 4 * m + q
                    cute.autovec_copy(rv, cute.local_tile(gRows[hrow, None], (8,), (chunk,)))

    @cute.jit
    def row_totals(self, tOcO_mn, sRed, wn, lane, row_sum):
        """Row sums of 2^(s - max) over the quad and across the WARPS_N warps. Unless only
        warpgroup 0 has sums and nothing is staged, this ends with a barrier of the MMA warps,
        after which the K stages are free for the staged store."""
        total = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            total[r] = quad_allreduce(row_sum[r], False)
        if const_expr(self.s_one_warpgroup and self.part_permuted):
            # only warpgroup 0 holds row sums: it publishes them and goes on to its stores at
            # once; warpgroup 1 (still in its last P V) picks them up. (A staged epilogue must
            # wait for both: it writes into the K stages warpgroup 1's P V reads.)
            if const_expr(wn == 0):
                if lane % 4 == 0:
                    for r in cutlass.range_constexpr(2):
                        sRed[tOcO_mn[r, 0][0]] = total[r]
                named_arrive(BAR_TOTALS, self.mma_threads)
            else:
                named_sync(BAR_TOTALS, self.mma_threads)
                for r in cutlass.range_constexpr(2):
                    total[r] = sRed[tOcO_mn[r, 0][0]]
        elif const_expr(self.warps_n > 1):
            self.mma_sync()               # sRed may still hold the last tile's maxima
            if lane % 4 == 0:
                for r in cutlass.range_constexpr(2):
                    sRed[wn * self.head_block + tOcO_mn[r, 0][0]] = total[r]
            self.mma_sync()
            for r in cutlass.range_constexpr(2):
                acc = Float32(0.0)
                for w in cutlass.range_constexpr(self.warps_n):
                    acc = acc + sRed[w * self.head_block + tOcO_mn[r, 0][0]]
                total[r] = acc
        return total
