"""The sparse MLA attention kernel, split (decode: one CTA per row, split and head block, writing a
normalised partial o and its base-2 lse) or extend (one CTA per row and head block over the
whole row, writing out and lse). What every form shares lives in AttentionKernel: the host
setup (shared-memory layouts, tiled MMAs), the split of the CTA into roles, the Q load, the token
range and the epilogue call; the tile loop of each pipeline is in pipelines.py. A kernel class composes it with a gather block
(gather.py), an MMA form (mma_warp.py, mma_wgmma.py, mma_wgmma_heads_n.py) and an epilogue
(epilogue.py); the generated module sets the config in __init__, and const_expr on it picks
the code at trace time."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Uint8, const_expr
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from .barriers import BAR_MMA, named_sync
from .fragments import swizzled_atom
from .pipelines import TilePipelines

# setmaxnreg split of the CTA's registers in the producer form: the producer holds a tile of
# records (~104) and sets the pace at large batches, so it must not spill (at 120 it does). The
# MMA warpgroups have different roles (s_one_warpgroup): warpgroup 0 holds O (128) and a whole
# tile's S (32), warpgroup 1 only O. 200 / 152 for them is refused by ptxas (C7507: every
# setmaxnreg ignored), 184 / 168 serialises warpgroup 0's wgmmas (C7512). The pool is what the
# launch granted (168 per thread at 384 threads), not the SM's 64K: asking for more leaves an
# allocation waiting forever.
PRODUCER_REGS = 152
S_WG_REGS = 192
V_WG_REGS = 160
# The heads as N with producers: the one MMA warpgroup holds all of O^T (d_v x heads / 128: up to
# 128 at 32 heads) and S^T; each of the two producer warpgroups half a tile of records.
HEADS_N_MMA_REGS = 240
HEADS_N_PRODUCER_REGS = 128


def role_registers(heads_as_n: bool) -> tuple:
    """setmaxnreg of each warpgroup of the producer form, MMA warpgroups first."""
    if heads_as_n:
        return (HEADS_N_MMA_REGS, HEADS_N_PRODUCER_REGS, HEADS_N_PRODUCER_REGS)
    return (S_WG_REGS, V_WG_REGS, PRODUCER_REGS)


class AttentionKernel(TilePipelines):
    """The shared part of the split (decode) and extend kernel classes. Config (set by the
    generated module): the spec (num_heads, fp8, extend; the head dims d_qk = d_nope + d_rope
    of q and K, d_v of V, the first d_v columns of K), the tiling (head_block, tile_tokens,
    warps_m, warps_n, stages, raw_stages), the form (wgmma, heads_as_n, producer, fp8_regs,
    p_in_rope, s_one_warpgroup, s_before_gather) and what follows from them."""

    def smem_and_mmas(self):
        """Host side of every form: the shared-memory layouts of Q, the K stages and P, the
        SharedStorage struct, and the tiled MMAs (S, O)."""
        # Shared memory: Q for the head block, STAGES gathered K tiles, P, and small arrays.
        if const_expr(self.wgmma):
            # wgmma: 128-byte-swizzled K-major atoms (8 rows x 64 bf16). The same K tile is the
            # K-major B operand of S = Q K^T and, viewed transposed, the MN-major B operand V of O.
            atom_k = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
            sQ_layout = cute.tile_to_shape(atom_k, (self.head_block, self.d_qk), (0, 1))
            sK_layout = cute.tile_to_shape(atom_k, (self.tile_tokens, self.d_qk, self.stages), (0, 1, 2))
            sP_layout = cute.tile_to_shape(atom_k, (self.head_block, self.tile_tokens), (0, 1))
        else:
            sQ_layout = cute.tile_to_shape(swizzled_atom(64), (self.head_block, self.d_qk), (0, 1))
            sK_layout = cute.tile_to_shape(
                swizzled_atom(64), (self.tile_tokens, self.d_qk, self.stages), (0, 1, 2)
            )
            sP_layout = cute.tile_to_shape(
                swizzled_atom(min(self.tile_tokens, 64)), (self.head_block, self.tile_tokens), (0, 1)
            )

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.mma_dtype, cute.cosize(sK_layout)], 1024]
            if const_expr(not self.p_in_rope):
                # P beside the K stages: the bf16 forms' one P, or, where V covers the RoPE block,
                # the producer form's one per stage and the 8-32-head extend's single one
                sP: cute.struct.Align[cute.struct.MemRange[self.mma_dtype, cute.cosize(sP_layout) * self.p_stages],
                                      1024]
            if const_expr(self.raw_stages > 0):
                # raw fp8_ds_mla records of RAW_STAGES tiles, landed by cp.async, dequantised to sK
                sRaw: cute.struct.Align[cute.struct.MemRange[Uint8, self.raw_stages * self.tile_tokens * self.record.bytes], 1024]
            # 0 for a valid gathered token, -inf for a masked one (per stage)
            sBias: cute.struct.Align[cute.struct.MemRange[Float32, self.bias_slots * self.tile_tokens], 16]
            # cross-warp row max / row sum exchange
            sRed: cute.struct.Align[cute.struct.MemRange[Float32, self.red_slots], 16]
            if const_expr(self.s_one_warpgroup):
                # each stage's running row max after its tile, from warpgroup 0 to warpgroup 1
                sMax: cute.struct.Align[cute.struct.MemRange[Float32, self.stages * self.head_block], 16]

        if const_expr(self.wgmma):
            # One warpgroup per (64 heads) x (its token half for S | its value-column half for O).
            tiled_mma_s, tiled_mma = self.make_wg_mmas()
        else:
            # Warp MMA over WARPS_M warps along heads; warps along N pick their own slice of smem.
            tiled_mma = cute.make_tiled_mma(
                warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)),
                (self.warps_m, 1, 1),
                permutation_mnk=(self.warps_m * 16, 16, 16),
            )
            # S = Q K^T: same warps; N tile of 8 when a warp owns only 8 tokens
            tiled_mma_s = cute.make_tiled_mma(
                warp.MmaF16BF16Op(BFloat16, Float32, (16, 8, 16)),
                (self.warps_m, 1, 1),
                permutation_mnk=(self.warps_m * 16, 16 if self.tokens_per_warp % 16 == 0 else 8, 16),
            )
        return sQ_layout, sK_layout, sP_layout, SharedStorage, tiled_mma_s, tiled_mma

    @cute.jit
    def attend(
        self,
        mQ: cute.Tensor,
        mKV: cute.Tensor,
        mIdx: cute.Tensor,
        mLen: cute.Tensor,
        outs,                     # extend: (mO, mLse, mSink, has_sink, lse_natural); split: (mPartO, mPartLse, tokens_per_split)
        sm_scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        tiled_mma_s: cute.TiledMma,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        storage=None,             # the kernel's allocation when a producer warpgroup shares it
        role: cutlass.Constexpr = None,   # S_ONE_WARPGROUP: this MMA warpgroup (0: S, softmax, P V; 1: P V)
    ):
        if const_expr(self.extend):
            mO, mLse, mSink, has_sink, lse_natural = outs
        else:
            mPartO, mPartLse, tokens_per_split = outs
        tidx, _, _ = cute.arch.thread_idx()
        split, head_blk, row = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        wn = 0                                    # warp position along tokens / value dims
        if const_expr(role is not None):
            wn = role
        elif const_expr(self.warps_n > 1):             # (a constant 0 keeps its branches static)
            wn = warp_idx // self.warps_m
        mma_tidx = tidx % (self.warps_m * 32)          # thread index inside the WARPS_M-warp MMA

        if const_expr(storage is None):
            storage = cutlass.utils.SmemAllocator().allocate(SharedStorage)
        if const_expr(self.wgmma):
            # wgmma descriptors want the swizzle on the pointer and an affine layout
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            if const_expr(self.p_in_rope):
                # P of each K stage in that stage's RoPE block (the columns past d_nope, dead once S
                # is done): 1 KB swizzle atoms, tokens first; the last mode picks the stage
                p_base = storage.sK.data_ptr() + (self.d_nope // 64) * self.tile_tokens * 64
                sP = cute.make_tensor(
                    cute.recast_ptr(p_base, sP_layout.inner, dtype=self.mma_dtype),
                    cute.append(sP_layout.outer, cute.make_layout(self.stages, stride=self.tile_tokens * self.d_qk)),
                )
            elif const_expr(self.p_stages > 1):
                # one P per K stage beside the stages (V4: V is all of K, RoPE block included)
                sP = cute.make_tensor(
                    cute.recast_ptr(storage.sP.data_ptr(), sP_layout.inner, dtype=self.mma_dtype),
                    cute.append(sP_layout.outer, cute.make_layout(self.stages, stride=cute.cosize(sP_layout.outer))),
                )
            else:
                sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        else:
            sQ = storage.sQ.get_tensor(sQ_layout)
            sK = storage.sK.get_tensor(sK_layout)
            sP = storage.sP.get_tensor(sP_layout)
        sBias = storage.sBias.get_tensor(cute.make_layout(self.bias_slots * self.tile_tokens))
        raw_base = None
        if const_expr(self.raw_stages > 0):
            raw_base = storage.sRaw.data_ptr()
        sRed = storage.sRed.get_tensor(cute.make_layout(self.red_slots))
        sMax = None
        if const_expr(self.s_one_warpgroup):
            sMax = storage.sMax.get_tensor(cute.make_layout(self.stages * self.head_block))

        # ---- token range of this split ----------------------------------------------------
        if const_expr(self.extend):
            tokens_per_split = self.row_width(mIdx)    # extend: one CTA covers the whole row
        tok_begin, tok_end, n_tiles = self.token_range(mIdx, mLen, row, split, tokens_per_split)

        if const_expr(not self.producer):
            gmem_tiled_copy, gmem_thr_copy, nope_thr_copy, tKcK = self.gather_copies(tidx)

        # Q of this (row, head block): once, asynchronously, 8 threads per head row.
        gQ = self.head_rows(mQ[row, None, None], head_blk, self.d_qk)
        q_tiled_copy = cute.make_tiled_copy_tv(
            cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16,
                                num_bits_per_copy=128),
            cute.make_ordered_layout((self.q_threads // 8, 8), order=(1, 0)), cute.make_layout((1, 8)),
        )
        q_thr_copy = q_tiled_copy.get_slice(tidx % self.q_threads)
        if const_expr(self.q_threads == self.num_threads):
            self.load_q(q_tiled_copy, q_thr_copy, gQ, sQ)
        else:
            if tidx < self.q_threads:
                self.load_q(q_tiled_copy, q_thr_copy, gQ, sQ)
        cute.arch.cp_async_commit_group()

        if const_expr(not self.producer):
            # slots of the next tile this thread gathers (one token row per pass)
            rIdx = cute.make_rmem_tensor((self.tile_tokens // self.rows_per_pass,), Int32)
            self.load_indices(mIdx, row, tok_begin, 0, tok_end, tKcK, rIdx)
            n_slots = self.cache_slots(mKV)     # the cache bound, once per CTA (gathers test it per row)

        # ---- per-thread MMA state -----------------------------------------------------------
        thr_mma = tiled_mma.get_slice(mma_tidx)
        if const_expr(self.wgmma):
            # wgmma: one 64 x (d_v / WARPS_N) accumulator per warpgroup (128 f32 per thread).
            acc_O = [cute.make_rmem_tensor(self.o_acc_shape(thr_mma), Float32)]
            acc_O[0].fill(0.0)
        else:
            # O accumulators as one fragment per 16 value columns: the B operand of each chunk is
            # loaded right before its MMAs, so B never competes with O for registers.
            acc_O = []
            for _ in cutlass.range_constexpr(self.dims_per_warp // 16):
                acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.head_block, 16)), Float32)
                acc.fill(0.0)
                acc_O.append(acc)
        row_max = cute.make_rmem_tensor((self.row_vals,), Float32)   # raw q.k max of this thread's rows (heads)
        row_sum = cute.make_rmem_tensor((self.row_vals,), Float32)   # this thread's partial sums of 2^(s - max)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)

        cta = (tidx, row, wn, lane, q_thr_copy)
        smem = (storage, sQ_layout, sQ, sK, sP, sBias, sRed, sMax, raw_base)
        rows = (mKV, mIdx, tok_begin, tok_end, n_tiles)
        gather = None                             # the producer form's producer warpgroup gathers
        if const_expr(not self.producer):
            gather = (gmem_tiled_copy, gmem_thr_copy, nope_thr_copy, tKcK, rIdx, n_slots)
        # the tile loop of this form (pipelines.py), over the state above
        state = (cta, smem, rows, gather, (tiled_mma_s, tiled_mma, thr_mma), (acc_O, row_max, row_sum, sm_scale_log2))
        if const_expr(self.producer):
            self.run_tiles_producer(*state, role=role)
        elif const_expr(self.fp8_regs):
            self.run_tiles_fp8_regs(*state)
        elif const_expr(self.fp8):
            self.run_tiles_fp8_raw(*state)
        elif const_expr(self.stages == 1):
            self.run_tiles_bf16_one_stage(*state)
        else:
            self.run_tiles_bf16(*state, role=role)

        cute.arch.cp_async_wait_group(0)
        if const_expr(self.extend):
            self.epilogue(
                thr_mma, self.head_rows(mO[row, None, None], head_blk, self.d_v), mLse[row, None],
                sRed, self.out_stage(storage), head_blk, wn, lane, acc_O, row_max, row_sum, sm_scale_log2,
                sink=(has_sink, mSink, lse_natural),
            )
        else:
            self.epilogue(
                thr_mma, self.head_rows(mPartO[row, split, None, None], head_blk, self.d_v),
                mPartLse[row, split, None], sRed, self.out_stage(storage), head_blk, wn, lane, acc_O, row_max,
                row_sum, sm_scale_log2,
            )

    @cute.jit
    def split_roles(self, mKV, mIdx, mLen, tokens_per_split, sK_layout, SharedStorage, attend_args):
        """A role per warpgroup, fixed at trace time so that no accumulator crosses a branch:
        warpgroup 0 attends with S and the softmax, warpgroup 1 with P V only (s_one_warpgroup),
        and in the producer form the warpgroups past the MMA warps gather and dequantise
        (produce_tiles); with the heads as N one MMA warpgroup runs the whole tile beside two
        producers. One shared-memory allocation serves every role (one per branch would be
        summed); setmaxnreg gives the producers' registers to the MMA warps."""
        storage = cutlass.utils.SmemAllocator().allocate(SharedStorage)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if const_expr(self.producer and self.heads_as_n):
            # one MMA warpgroup (S^T, the softmax, O^T), the rest producers
            if warp >= self.mma_threads // 32:
                cute.arch.setmaxregister_decrease(HEADS_N_PRODUCER_REGS)
                self.produce_tiles(mKV, mIdx, mLen, tokens_per_split, sK_layout, storage)
            else:
                cute.arch.setmaxregister_increase(HEADS_N_MMA_REGS)
                self.attend(*attend_args, SharedStorage, storage)
        elif const_expr(self.producer):
            if warp >= self.mma_threads // 32:
                cute.arch.setmaxregister_decrease(PRODUCER_REGS)
                self.produce_tiles(mKV, mIdx, mLen, tokens_per_split, sK_layout, storage)
            elif warp >= 4:
                cute.arch.setmaxregister_decrease(V_WG_REGS)
                self.attend(*attend_args, SharedStorage, storage, role=1)
            else:
                cute.arch.setmaxregister_increase(S_WG_REGS)
                self.attend(*attend_args, SharedStorage, storage, role=0)
        else:
            if warp >= 4:
                self.attend(*attend_args, SharedStorage, storage, role=1)
            else:
                self.attend(*attend_args, SharedStorage, storage, role=0)

    def launch_bound(self) -> dict:
        """The heads-as-N producer form launches with a bound of one CTA an SM: without it ptxas
        cannot tell the register count at entry and ignores every setmaxnreg (C7508)."""
        if self.producer and self.heads_as_n:
            return {"min_blocks_per_mp": 1, "preferred_smem_carveout": 100}
        return {}

    @cute.jit
    def mma_sync(self):
        """Barrier over the MMA warps: every thread, unless a producer warpgroup runs apart."""
        if const_expr(self.producer):
            named_sync(BAR_MMA, self.mma_threads)
        else:
            self.cta_sync()

    @cute.jit
    def cta_sync(self):
        """Barrier over every thread (over the MMA warps where producers run apart). Where the
        warpgroups run role code of their own (s_one_warpgroup) they meet there from different
        instructions: the unaligned form (barriers.py)."""
        if const_expr(self.producer):
            self.mma_sync()
        elif const_expr(self.s_one_warpgroup):
            named_sync(0, self.num_threads)
        else:
            cute.arch.sync_threads()

    def head_rows(self, t: cute.Tensor, head_blk, cols: int) -> cute.Tensor:
        """Rows [head_blk * HEAD_BLOCK, + HEAD_BLOCK) of a per-row [H, cols] tensor. With fewer
        heads than a block the view runs past the last head: only its first Q_ROWS rows are
        read or written."""
        if const_expr(self.q_rows < self.head_block):
            return cute.make_tensor(t.iterator, cute.make_layout((self.head_block, cols), stride=t.layout.stride))
        return cute.local_tile(t, (self.head_block, cols), (head_blk, 0))

    @cute.jit
    def load_q(self, q_tiled_copy, q_thr_copy, gQ, sQ):
        """cp.async this thread's chunks of the block's Q; rows past Q_ROWS are zero-filled."""
        if const_expr(self.q_rows == self.head_block):
            cute.copy(q_tiled_copy, q_thr_copy.partition_S(gQ), q_thr_copy.partition_D(sQ))
        else:
            tQg = q_thr_copy.partition_S(gQ)
            tQs = q_thr_copy.partition_D(sQ)
            for p in cutlass.range_constexpr(cute.size(tQs, mode=[1])):
                if const_expr((p + 1) * (self.q_threads // 8) <= self.q_rows):
                    cute.copy(q_tiled_copy, tQg[None, p, None], tQs[None, p, None])
                else:
                    tQs[None, p, None].fill(0.0)

    @cute.jit
    def q_to_fp16(self, storage, sQ_layout, sQ, q_thr_copy, tidx):
        """Wait for Q (cp.async) and convert it to fp16 in place, each thread over the chunks it
        copied; returns the fp16 view the MMAs read (the caller publishes it)."""
        cute.arch.cp_async_wait_group(0)
        sQ16 = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner, dtype=Float16)
        if tidx < self.q_threads:
            tQh = q_thr_copy.partition_D(sQ16)
            tQh.store(q_thr_copy.partition_D(sQ).load().to(Float16))
        return sQ16

    @cute.jit
    def token_range(self, mIdx, mLen, row, split, tokens_per_split):
        """(first token, end, 64-token tiles) of this CTA's part of the row."""
        width = mIdx.shape[1]
        length = cutlass.max(mLen[row], 0)
        tok_begin = split * tokens_per_split
        tok_end = cutlass.min(cutlass.min(tok_begin + tokens_per_split, width), length)
        n_tiles = (cutlass.max(tok_end - tok_begin, 0) + (self.tile_tokens - 1)) // self.tile_tokens
        return tok_begin, tok_end, n_tiles

    def gather_copies(self, gtid):
        """Gather thread gtid's copies: 8 threads per token row, 16-byte chunks. Returns the
        tiled cp.async copy, its slice, the fp8 dequant store slice (None for bf16 KV) and the
        slice's (token, column) coordinates in a K tile (identical for every tile). A format block
        whose dequant stores 32-byte pieces pairs two rows per 8 threads (paired_rows)."""
        atom_cp_async = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16,
            num_bits_per_copy=128,
        )
        if const_expr(self.paired_rows):
            # fp8_ds_mla: a dequantised 16-value piece is two 16-byte chunks of one 128-byte swizzled row,
            # stored one after the other; 16-byte stores are served 8 threads at a time. With
            # the 8 threads of one row, threads q and q + 4 hit the same chunk slot of two
            # swizzle atoms (a 2-way bank conflict on every NoPE store). Each group of 8 threads takes two
            # adjacent rows instead (q = 0-3 or 4-7 of each): odd rows' swizzle flips the
            # chunk parity, so the 8 chunks of a store fall in 8 distinct slots.
            thr_layout = cute.make_layout(((2, self.gather_threads // 16), (4, 2)), stride=((4, 16), (1, 8)))
        else:
            thr_layout = cute.make_ordered_layout((self.gather_threads // 8, 8), order=(1, 0))
        gmem_tiled_copy = cute.make_tiled_copy_tv(atom_cp_async, thr_layout, cute.make_layout((1, 8)))
        gmem_thr_copy = gmem_tiled_copy.get_slice(gtid)
        tKcK = gmem_thr_copy.partition_S(cute.make_identity_tensor((self.tile_tokens, self.d_qk)))
        nope_thr_copy = None
        if const_expr(self.paired_rows):
            # each thread dequantises 16 e4m3 per 128-column block of its rows to the K tile
            store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
            nope_thr_copy = cute.make_tiled_copy_tv(store_atom, thr_layout, cute.make_layout((1, 16))).get_slice(gtid)
        return gmem_tiled_copy, gmem_thr_copy, nope_thr_copy, tKcK


class SplitKernel(AttentionKernel):
    """Decode: per-split partial attention; the combine (combine.py) merges the splits."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,          # [rows, H, d_qk] bf16
        mKV: cute.Tensor,         # [blocks, 64, record] u8  |  [blocks, 64, d_qk] bf16
        mIdx: cute.Tensor,        # [rows, width] i32
        mLen: cute.Tensor,        # [rows] i32
        mPartO: cute.Tensor,      # [rows, splits, H, d_v] f16
        mPartLse: cute.Tensor,    # [rows, splits, H] f32
        sm_scale_log2: Float32,
        tokens_per_split: Int32,
        stream,
    ):
        sQ_layout, sK_layout, sP_layout, SharedStorage, tiled_mma_s, tiled_mma = self.smem_and_mmas()
        grid = (
            cute.size(mPartO.shape[1]),                 # splits
            self.head_blocks,                                # head blocks
            cute.size(mQ.shape[0]),                     # rows
        )
        self.kernel(
            mQ, mKV, mIdx, mLen, mPartO, mPartLse, sm_scale_log2, tokens_per_split,
            sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True, **self.launch_bound())

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mKV: cute.Tensor,
        mIdx: cute.Tensor,
        mLen: cute.Tensor,
        mPartO: cute.Tensor,
        mPartLse: cute.Tensor,
        sm_scale_log2: Float32,
        tokens_per_split: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        tiled_mma_s: cute.TiledMma,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        # Launched as a programmatic dependent of whatever ran before on the stream, so this
        # grid's launch overlaps that kernel's tail; every input (q, indices, lengths, the cache,
        # the row count) and the outputs are touched only after the wait.
        cute.arch.griddepcontrol_wait()
        # let the combine grid (a programmatic dependent) be scheduled as soon as every split CTA
        # has started; it waits for this grid's end before reading the partials
        cute.arch.griddepcontrol_launch_dependents()
        if const_expr(self.s_one_warpgroup or self.producer):
            self.split_roles(mKV, mIdx, mLen, tokens_per_split, sK_layout, SharedStorage, (
                mQ, mKV, mIdx, mLen, (mPartO, mPartLse, tokens_per_split), sm_scale_log2,
                sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma,
            ))
        else:
            self.attend(
                mQ, mKV, mIdx, mLen, (mPartO, mPartLse, tokens_per_split), sm_scale_log2,
                sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
            )


class ExtendKernel(AttentionKernel):
    """Extend: attention over whole rows, out and lse written directly (sink folded in)."""

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,          # [rows, H, d_qk] bf16
        mKV: cute.Tensor,         # [blocks, 64, record] u8  |  [blocks, 64, d_qk] bf16
        mIdx: cute.Tensor,        # [rows, width] i32
        mLen: cute.Tensor,        # [rows] i32
        mO: cute.Tensor,          # [rows, H, d_v] bf16
        mLse: cute.Tensor,        # [rows, H] f32
        mSink: cute.Tensor,       # [H] f32, read only when has_sink != 0
        mNumRows: cute.Tensor,    # [1] i32: rows in use; the rest of the capacity grid exits
        sm_scale_log2: Float32,
        has_sink: Int32,
        lse_natural: Int32,
        has_num_rows: Int32,      # 0: every grid row is live and mNumRows is not read
        stream,
    ):
        sQ_layout, sK_layout, sP_layout, SharedStorage, tiled_mma_s, tiled_mma = self.smem_and_mmas()
        # Extend: one CTA per (head block, row) over the whole row; the grid is the capacity.
        grid = (1, self.head_blocks, cute.size(mQ.shape[0]))
        self.kernel(
            mQ, mKV, mIdx, mLen, mO, mLse, mSink, mNumRows, sm_scale_log2, has_sink, lse_natural,
            has_num_rows, sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, use_pdl=True, **self.launch_bound())

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mKV: cute.Tensor,
        mIdx: cute.Tensor,
        mLen: cute.Tensor,
        mO: cute.Tensor,
        mLse: cute.Tensor,
        mSink: cute.Tensor,
        mNumRows: cute.Tensor,
        sm_scale_log2: Float32,
        has_sink: Int32,
        lse_natural: Int32,
        has_num_rows: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        tiled_mma_s: cute.TiledMma,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        # Launched as a programmatic dependent of whatever ran before on the stream, so this
        # grid's launch overlaps that kernel's tail; every input (q, indices, lengths, the cache,
        # the row count) and the outputs are touched only after the wait.
        cute.arch.griddepcontrol_wait()
        _, _, row = cute.arch.block_idx()
        live_rows = cute.size(mQ.shape[0])
        if has_num_rows != 0:
            live_rows = mNumRows[0]
        if row < live_rows:        # capacity grid: rows past the live count exit at once
            if const_expr(self.s_one_warpgroup or self.producer):
                self.split_roles(mKV, mIdx, mLen, self.row_width(mIdx), sK_layout, SharedStorage, (
                    mQ, mKV, mIdx, mLen, (mO, mLse, mSink, has_sink, lse_natural), sm_scale_log2,
                    sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma,
                ))
            else:
                self.attend(
                    mQ, mKV, mIdx, mLen, (mO, mLse, mSink, has_sink, lse_natural), sm_scale_log2,
                    sQ_layout, sK_layout, sP_layout, tiled_mma_s, tiled_mma, SharedStorage,
                )
