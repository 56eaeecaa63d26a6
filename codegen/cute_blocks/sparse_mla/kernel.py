"""What every form of the sparse MLA attention kernel shares: the split of the CTA into roles
(s_one_warpgroup, with or without a producer warpgroup), the MMA-warp barrier, the Q load
(and its fp16 conversion for fp8 records in registers), the token range of a CTA and the
gather threads' copies."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, const_expr
from cutlass.cute.nvgpu import cpasync

from .barriers import BAR_MMA
from .kv_format import D_QK

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


class AttentionKernel:
    """The shared part of the split (decode) and extend kernel classes. Config: producer,
    head_block, q_rows, q_threads, mma_threads, tile_tokens, gather_threads, fp8."""

    @cute.jit
    def split_roles(self, mKV, mIdx, mLen, tokens_per_split, sK_layout, SharedStorage, attend_args):
        """A role per warpgroup, fixed at trace time so that no accumulator crosses a branch:
        warpgroup 0 attends with S and the softmax, warpgroup 1 with P V only, and in the
        producer form the last warpgroup gathers and dequantises (produce_tiles). One
        shared-memory allocation serves every role (one per branch would be summed); setmaxnreg
        gives the producer's registers to the MMA warps."""
        storage = cutlass.utils.SmemAllocator().allocate(SharedStorage)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if const_expr(self.producer):
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

    @cute.jit
    def mma_sync(self):
        """Barrier over the MMA warps: every thread, unless a producer warpgroup runs apart."""
        if const_expr(self.producer):
            cute.arch.barrier(barrier_id=BAR_MMA, number_of_threads=self.mma_threads)
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
        slice's (token, column) coordinates in a K tile (identical for every tile)."""
        atom_cp_async = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), BFloat16,
            num_bits_per_copy=128,
        )
        if const_expr(self.fp8):
            # A dequantised 16-value piece is two 16-byte chunks of one 128-byte swizzled row,
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
        tKcK = gmem_thr_copy.partition_S(cute.make_identity_tensor((self.tile_tokens, D_QK)))
        nope_thr_copy = None
        if const_expr(self.fp8):
            # each thread dequantises 16 e4m3 per 128-column block of its rows to the K tile
            store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
            nope_thr_copy = cute.make_tiled_copy_tv(store_atom, thr_layout, cute.make_layout((1, 16))).get_slice(gtid)
        return gmem_tiled_copy, gmem_thr_copy, nope_thr_copy, tKcK
