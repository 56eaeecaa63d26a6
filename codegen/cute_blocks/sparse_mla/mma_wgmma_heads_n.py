"""The tile step with Hopper warpgroup MMA and the heads as N (16/32-head blocks, no padding
to M = 64): S^T = K Q^T, O^T = V^T P^T, and the epilogue of that layout."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

from .epilogue import StagedStore
from .fragments import mn_view
from .softmax import head_out_scale, lanes_allreduce, max_step


class WgmmaHeadsAsN(StagedStore):
    """wgmma with the heads as N. Config: head_block, tile_tokens, warps_m, mma_dtype,
    out_dtype, dims_per_warp, d_v."""

    def make_wg_mmas(self):
        """(S^T = K Q^T, O^T = V^T P^T): M = 64 tokens | 64 value dims per wgmma, N = heads.
        The K tile is the K-major A of S^T and, viewed transposed, the MN-major A (V^T) of O^T."""
        mma_s = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (1, 1, 1), (self.tile_tokens, self.head_block),
        )
        mma_o = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype, self.mma_dtype, OperandMajorMode.MN, OperandMajorMode.K, Float32,
            (1, 1, 1), (64, self.head_block),
        )
        return mma_s, mma_o

    def o_acc_shape(self, thr_mma):
        """O^T accumulator: this warpgroup's d_v / WARPS_N value dims x HEAD_BLOCK heads."""
        return thr_mma.partition_shape_C((self.dims_per_warp, self.head_block))

    @cute.jit
    def issue_s_wg(self, thr_mma, sQ, sKs, wn):
        """Warpgroup 0: issue S^T = K Q^T (wgmma 64 x HEAD_BLOCK x 16, K and Q from smem) over
        the whole tile and commit it; compute_tile_wg waits for it. Other warpgroups commit an
        empty group (their acc_S is never read)."""
        mma_s, _ = self.make_wg_mmas()     # fresh: its ACCUMULATE field is set here
        thr_mma_s = mma_s.get_slice(thr_mma.thr_idx)
        tSrK = thr_mma_s.make_fragment_A(thr_mma_s.partition_A(sKs))
        tSrQ = thr_mma_s.make_fragment_B(thr_mma_s.partition_B(sQ))
        acc_S = cute.make_rmem_tensor(thr_mma_s.partition_shape_C((self.tile_tokens, self.head_block)), Float32)
        if wn == 0:
            mma_s.set(warpgroup.Field.ACCUMULATE, False)
            warpgroup.fence()
            for k in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
                cute.gemm(mma_s, acc_S, tSrK[None, None, k], tSrQ[None, None, k], acc_S)
                mma_s.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()
        return acc_S

    @cute.jit
    def compute_tile_wg(
        self, thr_mma, sKs, sP, sBias, sRed, stage, wn, lane,
        acc_S, acc_O, row_max, row_sum, sm_scale_log2,
    ):
        """Warpgroup 0 waits for S^T (issue_s_wg), takes the column (head) max over the 8
        lanes sharing a head and over its 4 warps through sRed, and stores P (MMA_DTYPE) to smem as
        [head, token]. Every warpgroup reads the same maxima from sRed, so all rescale their
        O^T identically, then accumulates O^T += V^T P^T for its d_v / WARPS_N value dims.
        row_max (every warpgroup) and row_sum (warpgroup 0) hold this thread's HEAD_BLOCK / 4
        heads: the accumulator columns of S^T and O^T match thread for thread."""
        mma_s, mma_o = self.make_wg_mmas()
        thr_mma_s = mma_s.get_slice(thr_mma.thr_idx)
        thr_mma_o = mma_o.get_slice(thr_mma.thr_idx)
        warp_m = thr_mma.thr_idx // 32          # warp within the warpgroup

        warpgroup.wait_group(0)

        # ---- mask and column (head) max -----------------------------------------------------
        acc_S_mn = mn_view(acc_S)                 # (2 tokens, HEAD_BLOCK / 4 heads)
        cS = cute.make_identity_tensor((self.tile_tokens, self.head_block))
        tScS_mn = mn_view(thr_mma_s.partition_C(cS))
        n_heads = cute.size(acc_S_mn, mode=[1])
        tile_max = cute.make_rmem_tensor((n_heads,), Float32)
        tile_max.fill(-Float32.inf)
        if wn == 0:
            for r in cutlass.range_constexpr(2):
                bias = sBias[stage * self.tile_tokens + tScS_mn[r, 0][0]]
                for c in cutlass.range_constexpr(n_heads):
                    acc_S_mn[r, c] = acc_S_mn[r, c] + bias
            for c in cutlass.range_constexpr(n_heads):
                tile_max[c] = lanes_allreduce(cute.arch.fmax(acc_S_mn[0, c], acc_S_mn[1, c]), True)
            if lane < 4:
                for c in cutlass.range_constexpr(n_heads):
                    sRed[warp_m * self.head_block + tScS_mn[0, c][1]] = tile_max[c]
        self.cta_sync()
        for c in cutlass.range_constexpr(n_heads):
            for w in cutlass.range_constexpr(self.warps_m):
                tile_max[c] = cute.arch.fmax(tile_max[c], sRed[w * self.head_block + tScS_mn[0, c][1]])

        # ---- online softmax in base 2, per head ----------------------------------------------
        acc_O_mn = mn_view(acc_O[0])              # (16 value dims, HEAD_BLOCK / 4 heads)
        for c in cutlass.range_constexpr(n_heads):
            new_max = cute.arch.fmax(row_max[c], tile_max[c])
            max_scaled, corr = max_step(row_max[c], new_max, sm_scale_log2)
            if wn == 0:
                p = cute.math.exp2(acc_S_mn[None, c].load() * sm_scale_log2 - max_scaled, fastmath=True)
                acc_S_mn[None, c] = p
                row_sum[c] = row_sum[c] * corr + p.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
            acc_O_mn[None, c] = acc_O_mn[None, c].load() * corr
            row_max[c] = new_max

        # ---- P (MMA_DTYPE) -> smem as [head, token]: the K-major B operand of O^T ---------------
        if wn == 0:
            for r in cutlass.range_constexpr(2):
                for c in cutlass.range_constexpr(n_heads):
                    sP[tScS_mn[r, c][1], tScS_mn[r, c][0]] = acc_S_mn[r, c].to(self.mma_dtype)
        cute.arch.fence_view_async_shared()     # P (st.shared) is read by wgmma
        self.cta_sync()

        # ---- O^T += V^T P^T over the tile's tokens, this warpgroup's value dims -------------
        sVt = cute.composition(sKs, cute.make_layout((self.d_v, self.tile_tokens), stride=(self.tile_tokens, 1)))
        sVt_w = cute.local_tile(sVt, (self.dims_per_warp, self.tile_tokens), (wn, 0))
        tOrV = thr_mma_o.make_fragment_A(thr_mma_o.partition_A(sVt_w))
        tOrP = thr_mma_o.make_fragment_B(thr_mma_o.partition_B(sP))
        mma_o.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.fence()
        for k in cutlass.range_constexpr(cute.size(tOrV, mode=[2])):
            cute.gemm(mma_o, acc_O[0], tOrV[None, None, k], tOrP[None, None, k], acc_O[0])
        warpgroup.commit_group()
        warpgroup.wait_group(0)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def head_totals(self, tOcO_mn, sRed, wn, lane, row_sum):
        """Per-head sums of 2^(s - max) (held by warpgroup 0): over the 8 lanes holding a head,
        then over its 4 warps through sRed; every warpgroup reads the totals."""
        warp_m = cute.arch.make_warp_uniform(cute.arch.warp_idx()) % self.warps_m
        n_heads = cute.size(row_sum)
        total = cute.make_rmem_tensor((n_heads,), Float32)
        for c in cutlass.range_constexpr(n_heads):
            total[c] = lanes_allreduce(row_sum[c], False)
        self.cta_sync()      # sRed may still hold the last tile's maxima
        if wn == 0:
            if lane < 4:
                for c in cutlass.range_constexpr(n_heads):
                    sRed[warp_m * self.head_block + tOcO_mn[0, c][1]] = total[c]
        self.cta_sync()
        for c in cutlass.range_constexpr(n_heads):
            acc = Float32(0.0)
            for w in cutlass.range_constexpr(self.warps_m):
                acc = acc + sRed[w * self.head_block + tOcO_mn[0, c][1]]
            total[c] = acc
        return total

    @cute.jit
    def epilogue(
        self, thr_mma, gRows, gLse, sRed, sStage, head_blk, wn, lane, acc_O, row_max, row_sum,
        sm_scale_log2, sink=None,
    ):
        """Normalise O^T per head and write this CTA's o (OUT_DTYPE, staged in smem) to gRows
        [HEAD_BLOCK, d_v] and each head's lse to gLse [H]; sink as in the 64-head epilogue."""
        tOcO_mn = mn_view(thr_mma.partition_C(cute.make_identity_tensor((self.dims_per_warp, self.head_block))))
        total = self.head_totals(tOcO_mn, sRed, wn, lane, row_sum)   # ends with a CTA barrier
        acc_mn = mn_view(acc_O[0])
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        d0 = wn * self.dims_per_warp
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            head = head_blk * self.head_block + tOcO_mn[0, c][1]
            inv, lse = head_out_scale(total[c], row_max[c], sm_scale_log2, sink, head)
            if warp == 0 and lane < 4:
                gLse[head] = lse
            for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
                sStage[tOcO_mn[0, c][1], d0 + tOcO_mn[r, c][0]] = (acc_mn[r, c] * inv).to(self.out_dtype)
        self.store_staged(sStage, gRows)
