"""The tile loops of the sparse MLA attention kernel, one per pipeline: AttentionKernel.attend
(kernel.py) sets up the CTA (shared memory, token range, Q load, the first indices, the MMA
state), runs the loop of its form and writes the epilogue. Each loop takes that state as
bundles of the values attend made:

    cta    (tidx, row, wn, lane, q_thr_copy)
    smem   (storage, sQ_layout, sQ, sK, sP, sBias, sRed, sMax, raw_base); sMax and raw_base are
           None where the form has none
    rows   (mKV, mIdx, tok_begin, tok_end, n_tiles): this CTA's part of its row
    gather (gmem_tiled_copy, gmem_thr_copy, nope_thr_copy, tKcK, rIdx, n_slots); None in the
           producer form, whose producer warpgroup gathers
    mma    (tiled_mma_s, tiled_mma, thr_mma)
    acc    (acc_O, row_max, row_sum, sm_scale_log2), updated in place
"""
import cutlass
import cutlass.cute as cute
from cutlass import const_expr

from .barriers import BAR_EMPTY, BAR_FULL, named_arrive, named_sync


class TilePipelines:
    """The tile loops; const_expr on the config picks one (AttentionKernel.attend)."""

    @cute.jit
    def run_tiles_producer(self, cta, smem, rows, gather, mma, acc, role: cutlass.Constexpr = None):
        """fp8, the MMA warps beside producer warpgroups (ProducerPipeline.produce_tiles): each
        tile as the producers hand over its K stage (FULL), the stage given back (EMPTY) once
        its P V is done. 64-head blocks: role is this MMA warpgroup (S_ONE_WARPGROUP); heads as N:
        one MMA warpgroup runs the whole tile."""
        tidx, _, wn, lane, q_thr_copy = cta
        storage, sQ_layout, sQ, sK, sP, sBias, sRed, sMax, _ = smem
        n_tiles = rows[4]
        thr_mma = mma[2]
        acc_O, row_max, row_sum, sm_scale_log2 = acc

        # ---- MMA warps: Q -> fp16 once, then each tile as the producer fills its stage -----
        sQ = self.q_to_fp16(storage, sQ_layout, sQ, q_thr_copy, tidx)
        cute.arch.fence_view_async_shared()     # fp16 Q (st.shared) is read by wgmma
        self.mma_sync()
        # (Tile t + 1's S is not issued before tile t's softmax, the warpgroups do not alternate
        # tiles, and warpgroup 1 dequantises nothing: each makes the producer and the MMA warps wait
        # for each other or costs registers that serialise the wgmmas; docs/notes/mma-forms.md,
        # docs/notes/decode-pipeline.md.)
        for t in cutlass.range(n_tiles, unroll=1):
            stage = t % self.stages
            named_sync(BAR_FULL + stage, self.num_threads)
            if const_expr(self.heads_as_n):
                acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, stage], wn)
                self.compute_tile_wg(
                    thr_mma, sKs=sK[None, None, stage], sP=sP[None, None, stage], sBias=sBias, sRed=sRed,
                    stage=stage, wn=wn, lane=lane, acc_S=acc_S, acc_O=acc_O, row_max=row_max, row_sum=row_sum,
                    sm_scale_log2=sm_scale_log2,
                )
            else:
                acc_S = None
                if const_expr(role == 0):
                    acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, stage], 0)
                self.tile_by_role(role, thr_mma, sK[None, None, stage], sP[None, None, stage], sBias, sRed, sMax,
                                  stage, lane, acc_S, acc_O, row_max, row_sum, sm_scale_log2)
            if t + self.stages < n_tiles:            # the producer fills tile t + STAGES there
                named_arrive(BAR_EMPTY + stage, self.num_threads)

    @cute.jit
    def run_tiles_fp8_regs(self, cta, smem, rows, gather, mma, acc, role: cutlass.Constexpr = None):
        """fp8 records through registers (16 heads as N): one K stage, tile t+1's records loaded
        into registers row by row while tile t is dequantised and multiplied."""
        tidx, row, wn, lane, q_thr_copy = cta
        storage, sQ_layout, sQ, sK, sP, sBias, sRed, _, _ = smem
        mKV, mIdx, tok_begin, tok_end, n_tiles = rows
        _, gmem_thr_copy, nope_thr_copy, tKcK, rIdx, n_slots = gather
        thr_mma = mma[2]
        acc_O, row_max, row_sum, sm_scale_log2 = acc

        # ---- prologue: tile 0's records in registers; Q -> fp16 ----------------------------
        regs = self.make_fp8_regs()
        if n_tiles > 0:
            self.load_fp8_regs(mKV, tKcK, rIdx, self.tile_slots(n_slots, tok_begin, tok_end, 0), regs)
        self.load_indices(mIdx, row, tok_begin, 1, tok_end, tKcK, rIdx)
        sQ = self.q_to_fp16(storage, sQ_layout, sQ, q_thr_copy, tidx)

        # one K stage (two CTAs per SM): dequantise tile t, each row's registers reloaded with
        # t+1's record as soon as the row is stored, so they travel while tile t is multiplied
        for t in cutlass.range(n_tiles, unroll=1):
            self.cta_sync()            # everyone's PV of tile t-1 has read the stage
            self.dequant_fp8_regs(sK[None, None, 0], sBias, 0, (tKcK, nope_thr_copy, gmem_thr_copy), regs,
                                  (mKV, rIdx, mIdx, row, tok_begin, tok_end, n_slots), t + 1 < n_tiles, t + 2)
            cute.arch.fence_view_async_shared()
            self.cta_sync()
            acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, 0], wn)
            self.compute_tile_wg(
                thr_mma, sKs=sK[None, None, 0], sP=sP, sBias=sBias, sRed=sRed, stage=0,
                wn=wn, lane=lane, acc_S=acc_S, acc_O=acc_O, row_max=row_max, row_sum=row_sum,
                sm_scale_log2=sm_scale_log2,
            )

    @cute.jit
    def run_tiles_fp8_raw(self, cta, smem, rows, gather, mma, acc, role: cutlass.Constexpr = None):
        """fp8 records cp.async'd raw into RAW_STAGES shared-memory slots, each tile dequantised
        into the one K tile right before its MMAs."""
        _, row, wn, lane, _ = cta
        _, _, sQ, sK, sP, sBias, sRed, _, raw_base = smem
        mKV, mIdx, tok_begin, tok_end, n_tiles = rows
        _, gmem_thr_copy, nope_thr_copy, tKcK, rIdx, n_slots = gather
        tiled_mma_s, tiled_mma, thr_mma = mma
        acc_O, row_max, row_sum, sm_scale_log2 = acc

        # ---- prologue: RAW_STAGES tiles of raw records in flight ---------------------------
        # One commit group per tile, empty past the last tile, so wait_group counts stay fixed.
        for s in cutlass.range_constexpr(self.raw_stages):
            if s < n_tiles:
                self.issue_fp8_raw(mKV, raw_base, sBias, s, tKcK, rIdx, self.tile_slots(n_slots, tok_begin, tok_end, s))
            cute.arch.cp_async_commit_group()
            self.load_indices(mIdx, row, tok_begin, s + 1, tok_end, tKcK, rIdx)

        for t in cutlass.range(n_tiles, unroll=1):
            slot = t % self.raw_stages
            # raw tile t (and Q) landed for this thread; the barrier publishes every thread's
            # part and guarantees everyone finished tile t-1's MMAs, which read sK.
            cute.arch.cp_async_wait_group(self.raw_stages - 1)
            if const_expr(self.wgmma):
                cute.arch.fence_view_async_shared()     # Q (cp.async) is read by wgmma
            self.cta_sync()
            self.dequant_fp8_tile(raw_base, sK[None, None, 0], sBias, slot, tKcK, nope_thr_copy, gmem_thr_copy)
            if const_expr(self.wgmma):
                cute.arch.fence_view_async_shared()     # dequantised K (st.shared) is read by wgmma
            self.cta_sync()
            if const_expr(self.wgmma):
                # S = Q K^T runs on the tensor cores while this thread issues the next raw tile
                acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, 0], wn)
            # raw slot `slot` is free again: start tile t + RAW_STAGES there
            if t + self.raw_stages < n_tiles:
                self.issue_fp8_raw(mKV, raw_base, sBias, slot, tKcK, rIdx,
                                   self.tile_slots(n_slots, tok_begin, tok_end, t + self.raw_stages))
            cute.arch.cp_async_commit_group()
            self.load_indices(mIdx, row, tok_begin, t + self.raw_stages + 1, tok_end, tKcK, rIdx)
            if const_expr(self.wgmma):
                self.compute_tile_wg(
                    thr_mma, sKs=sK[None, None, 0], sP=sP, sBias=sBias, sRed=sRed, stage=self.raw_stages,
                    wn=wn, lane=lane, acc_S=acc_S, acc_O=acc_O, row_max=row_max, row_sum=row_sum,
                    sm_scale_log2=sm_scale_log2,
                )
            else:
                self.compute_tile(
                    tiled_mma_s, tiled_mma, thr_mma, sQ, sK[None, None, 0], sP, sBias, sRed, self.raw_stages, wn, lane,
                    acc_O, row_max, row_sum, sm_scale_log2,
                )

    @cute.jit
    def run_tiles_bf16_one_stage(self, cta, smem, rows, gather, mma, acc, role: cutlass.Constexpr = None):
        """bf16, one K stage (extend at 8-32 heads as N), P in its RoPE block or, where V covers
        that block, beside it: the gather of tile t+1 waits for tile t's P V (two CTAs per SM
        overlap one's gather with the other's math)."""
        _, row, wn, lane, _ = cta
        _, _, sQ, sK, sP, sBias, sRed, _, _ = smem
        if const_expr(self.p_in_rope):
            sP = sP[None, None, 0]
        mKV, mIdx, tok_begin, tok_end, n_tiles = rows
        gmem_tiled_copy, gmem_thr_copy, _, tKcK, rIdx, n_slots = gather
        thr_mma = mma[2]
        acc_O, row_max, row_sum, sm_scale_log2 = acc

        self.gather_first_bf16(cta, smem, rows, gather)
        for t in cutlass.range(n_tiles, unroll=1):
            # tile t (and Q) landed: publish every thread's part to wgmma
            cute.arch.cp_async_wait_group(0)
            cute.arch.fence_view_async_shared()
            self.cta_sync()
            acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, 0], wn)
            self.compute_tile_wg(
                thr_mma, sKs=sK[None, None, 0], sP=sP, sBias=sBias, sRed=sRed, stage=0,
                wn=wn, lane=lane, acc_S=acc_S, acc_O=acc_O, row_max=row_max, row_sum=row_sum,
                sm_scale_log2=sm_scale_log2,
            )
            if t + 1 < n_tiles:
                self.cta_sync()    # every PV of tile t is done reading the stage
                self.gather_bf16(mKV, sK[None, None, 0], sBias, 0, gmem_tiled_copy, gmem_thr_copy, tKcK, rIdx, n_slots)
                cute.arch.cp_async_commit_group()
                self.load_indices(mIdx, row, tok_begin, t + 2, tok_end, tKcK, rIdx)

    @cute.jit
    def run_tiles_bf16(self, cta, smem, rows, gather, mma, acc, role: cutlass.Constexpr = None):
        """bf16, two K stages: the gather of tile t+1 into the other stage overlaps the math of
        tile t. role: this MMA warpgroup (S_ONE_WARPGROUP)."""
        _, row, wn, lane, _ = cta
        _, _, sQ, sK, sP, sBias, sRed, sMax, _ = smem
        mKV, mIdx, tok_begin, tok_end, n_tiles = rows
        gmem_tiled_copy, gmem_thr_copy, _, tKcK, rIdx, n_slots = gather
        tiled_mma_s, tiled_mma, thr_mma = mma
        acc_O, row_max, row_sum, sm_scale_log2 = acc

        self.gather_first_bf16(cta, smem, rows, gather)
        for t in cutlass.range(n_tiles, unroll=1):
            stage = t % 2
            # Tile t (and Q) landed for this thread; the barrier publishes every thread's part,
            # and guarantees everyone finished tile t-1, whose stage we now overwrite.
            cute.arch.cp_async_wait_group(0)
            if const_expr(self.wgmma):
                cute.arch.fence_view_async_shared()     # Q and K (cp.async) are read by wgmma
            self.cta_sync()
            if const_expr(self.s_one_warpgroup):
                # warpgroup 0's S of tile t runs on the tensor cores while every thread issues the
                # gather of t + 1
                acc_S = None
                if const_expr(role == 0):
                    acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, stage], 0)
            elif const_expr(self.wgmma and self.s_before_gather):
                # S of tile t runs on the tensor cores while this thread issues the gather of t + 1
                acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, stage], wn)
            if t + 1 < n_tiles:
                self.gather_bf16(mKV, sK[None, None, 1 - stage], sBias, 1 - stage, gmem_tiled_copy, gmem_thr_copy, tKcK, rIdx, n_slots)
                cute.arch.cp_async_commit_group()
                self.load_indices(mIdx, row, tok_begin, t + 2, tok_end, tKcK, rIdx)
            if const_expr(self.wgmma and not self.s_before_gather):
                # the gather bounds this tile: its loads go out before the S wgmmas are issued
                acc_S = self.issue_s_wg(thr_mma, sQ, sK[None, None, stage], wn)

            if const_expr(self.s_one_warpgroup):
                self.tile_by_role(role, thr_mma, sK[None, None, stage], sP, sBias, sRed, sMax, stage, lane, acc_S,
                                  acc_O, row_max, row_sum, sm_scale_log2)
            elif const_expr(self.wgmma):
                self.compute_tile_wg(
                    thr_mma, sKs=sK[None, None, stage], sP=sP, sBias=sBias, sRed=sRed, stage=stage,
                    wn=wn, lane=lane, acc_S=acc_S, acc_O=acc_O, row_max=row_max, row_sum=row_sum,
                    sm_scale_log2=sm_scale_log2,
                )
            else:
                self.compute_tile(
                    tiled_mma_s, tiled_mma, thr_mma, sQ, sK[None, None, stage], sP, sBias, sRed, stage, wn, lane,
                    acc_O, row_max, row_sum, sm_scale_log2,
                )

    @cute.jit
    def gather_first_bf16(self, cta, smem, rows, gather):
        """The prologue of the bf16 loops: tile 0 gathered into stage 0, tile 1's indices."""
        row = cta[1]

        sK, sBias = smem[3], smem[5]
        mKV, mIdx, tok_begin, tok_end, n_tiles = rows
        gmem_tiled_copy, gmem_thr_copy, _, tKcK, rIdx, n_slots = gather

        if n_tiles > 0:
            self.gather_bf16(mKV, sK[None, None, 0], sBias, 0, gmem_tiled_copy, gmem_thr_copy, tKcK, rIdx, n_slots)
            cute.arch.cp_async_commit_group()
            self.load_indices(mIdx, row, tok_begin, 1, tok_end, tKcK, rIdx)
