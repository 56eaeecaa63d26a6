"""The tile step with warp-level MMA (mma.sync m16n8k16 + ldmatrix, sm_120a): the heads as M,
WARPS_M warps along heads and WARPS_N along tokens (S) and value dims (O)."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, const_expr
from cutlass.cute.nvgpu import warp

from .fragments import mn_view, with_unit_mode
from .softmax import max_step, quad_allreduce


class WarpMma:
    """S = Q K^T, the online softmax and O += P V of one tile, per warp. Config: head_block,
    tile_tokens, warps_n, tokens_per_warp, dims_per_warp, d_qk, d_v."""

    @cute.jit
    def compute_tile(
        self, tiled_mma_s, tiled_mma, thr_mma, sQ, sKs, sP, sBias, sRed, stage, wn, lane,
        acc_O, row_max, row_sum, sm_scale_log2,
    ):
        """S = Q K^T for this warp's tokens, online softmax, P -> smem, O += P V."""
        thr_mma_s = tiled_mma_s.get_slice(thr_mma.thr_idx)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), BFloat16)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), BFloat16)
        copy_A = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(thr_mma.thr_idx)
        # K fragments of S: ldmatrix.x4 covers 16 tokens x 16 dims, .x2 covers 8 tokens
        ldsm_k = cute.make_copy_atom(
            warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4 if self.tokens_per_warp % 16 == 0 else 2),
            BFloat16,
        )
        copy_B = cute.make_tiled_copy_B(ldsm_k, tiled_mma_s).get_slice(thr_mma.thr_idx)
        tiled_copy_Bt = cute.make_tiled_copy_B(ldsm_t, tiled_mma)
        copy_Bt = tiled_copy_Bt.get_slice(thr_mma.thr_idx)

        # ---- S = Q K^T over this warp's TILE_TOKENS / WARPS_N tokens -------------------------
        sK_w = cute.local_tile(sKs, (self.tokens_per_warp, self.d_qk), (wn, 0))
        tSrQ = thr_mma_s.make_fragment_A(thr_mma_s.partition_A(sQ))
        tSrK = thr_mma_s.make_fragment_B(thr_mma_s.partition_B(sK_w))
        tSsQ = copy_A.partition_S(sQ)
        tSsK = copy_B.partition_S(sK_w)
        tSrQ_v = copy_A.retile(tSrQ)
        tSrK_v = copy_B.retile(tSrK)
        acc_S = cute.make_rmem_tensor(
            thr_mma_s.partition_shape_C((self.head_block, self.tokens_per_warp)), Float32
        )
        acc_S.fill(0.0)
        n_k = cute.size(tSsQ.shape[2])
        cute.copy(copy_A, tSsQ[None, None, 0], tSrQ_v[None, None, 0])
        cute.copy(copy_B, tSsK[None, None, 0], tSrK_v[None, None, 0])
        for k in cutlass.range_constexpr(n_k):
            if const_expr(k + 1 < n_k):
                cute.copy(copy_A, tSsQ[None, None, k + 1], tSrQ_v[None, None, k + 1])
                cute.copy(copy_B, tSsK[None, None, k + 1], tSrK_v[None, None, k + 1])
            cute.gemm(tiled_mma_s, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

        # ---- mask and row max ------------------------------------------------------------
        acc_S_mn = mn_view(acc_S)
        cS = cute.make_identity_tensor((self.head_block, self.tokens_per_warp))
        tScS_mn = mn_view(thr_mma_s.partition_C(cS))
        for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
            bias = sBias[stage * self.tile_tokens + wn * self.tokens_per_warp + tScS_mn[0, c][1]]
            for r in cutlass.range_constexpr(2):
                acc_S_mn[r, c] = acc_S_mn[r, c] + bias
        tile_max = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            mx = acc_S_mn[r, None].load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
            tile_max[r] = quad_allreduce(mx, True)
        if const_expr(self.warps_n > 1):
            # all warps along N must agree on the running max of a row
            if lane % 4 == 0:
                for r in cutlass.range_constexpr(2):
                    sRed[wn * self.head_block + tScS_mn[r, 0][0]] = tile_max[r]
            self.cta_sync()
            for r in cutlass.range_constexpr(2):
                for w in cutlass.range_constexpr(self.warps_n):
                    tile_max[r] = cute.arch.fmax(tile_max[r], sRed[w * self.head_block + tScS_mn[r, 0][0]])

        # ---- online softmax in base 2 ----------------------------------------------------
        for r in cutlass.range_constexpr(2):
            new_max = cute.arch.fmax(row_max[r], tile_max[r])
            max_scaled, corr = max_step(row_max[r], new_max, sm_scale_log2)
            p = cute.math.exp2(acc_S_mn[r, None].load() * sm_scale_log2 - max_scaled, fastmath=True)
            acc_S_mn[r, None] = p
            row_sum[r] = row_sum[r] * corr + p.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
            for acc in acc_O:
                acc_mn = mn_view(acc)
                acc_mn[r, None] = acc_mn[r, None].load() * corr
            row_max[r] = new_max

        # ---- P (bf16) -> smem, so every warp sees the whole token tile for O = P V --------
        # Stored element-wise at (head, token) coordinates of the whole swizzled tile: a view of
        # sP offset by this warp's first token would place the offset inside the swizzle.
        for r in cutlass.range_constexpr(2):
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                sP[tScS_mn[r, c][0], wn * self.tokens_per_warp + tScS_mn[r, c][1]] = (
                    acc_S_mn[r, c].to(BFloat16)
                )
        self.cta_sync()

        # ---- O += P V over all tile tokens, this warp's d_v / WARPS_N value columns -------
        sVt = cute.composition(sKs, cute.make_layout((self.d_v, self.tile_tokens), stride=(self.tile_tokens, 1)))
        # sVt_w starts at a multiple of 64 value columns, i.e. on a swizzle-atom boundary, so it
        # can be partitioned directly; the 16-column chunks are picked from the partitions.
        sVt_w = cute.local_tile(sVt, (self.dims_per_warp, self.tile_tokens), (wn, 0))
        tOrP = thr_mma.make_fragment_A(thr_mma.partition_A(sP))
        tOsP = copy_A.partition_S(sP)
        tOrP_v = copy_A.retile(tOrP)
        tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(sVt_w))
        tOsV = copy_Bt.partition_S(sVt_w)
        tOrV_v = copy_Bt.retile(tOrV)
        copy_idx, mma_idx = self.v_chunk_maps(tiled_mma, tiled_copy_Bt)
        for k in cutlass.range_constexpr(cute.size(tOsP.shape[2])):
            cute.copy(copy_A, tOsP[None, None, k], tOrP_v[None, None, k])
            for j in cutlass.range_constexpr(len(acc_O)):
                # 16 value columns x 16 tokens of V^T via one ldmatrix.x4.trans, used at once
                cute.copy(copy_Bt, tOsV[None, copy_idx[j], k], tOrV_v[None, copy_idx[j], k])
                for h in cutlass.range_constexpr(2):
                    acc_h = with_unit_mode(acc_O[j][None, None, h])
                    cute.gemm(
                        tiled_mma, acc_h, tOrP[None, None, k],
                        with_unit_mode(tOrV[None, mma_idx[j][h], k]), acc_h,
                    )

    def v_chunk_maps(self, tiled_mma, tiled_copy_Bt):
        """Trace-time map from 16-column chunk j of this warp's value columns to the ldmatrix
        copy index and the two m16n8 B-fragment indices that hold it (read off thread 0's
        coordinate partitions, which differ from other threads' only by a per-thread offset)."""
        cV = cute.make_identity_tensor((self.dims_per_warp, self.tile_tokens))
        tOcV_mma = tiled_mma.get_slice(0).partition_B(cV)
        tOcV_cpy = tiled_copy_Bt.get_slice(0).partition_S(cV)
        n_chunks = self.dims_per_warp // 16
        copy_idx = [None] * n_chunks
        mma_idx = [[None, None] for _ in range(n_chunks)]
        for c in range(cute.size(tOcV_cpy, mode=[1])):
            d = tOcV_cpy[0, c, 0][0]
            copy_idx[d // 16] = c
        for n in range(cute.size(tOcV_mma, mode=[1])):
            d = tOcV_mma[0, n, 0][0]
            mma_idx[d // 16][(d % 16) // 8] = n
        assert all(x is not None for x in copy_idx), copy_idx
        assert all(x is not None for m in mma_idx for x in m), mma_idx
        return copy_idx, mma_idx
