"""fp8_ds_mla records as the register A operand of S^T = K Q^T (8 heads as N on sm_90a).

At 8 heads the register form (gather.Fp8RegsPipeline) is bound by the SM, not by HBM: per 64-token
tile its wgmmas read the dequantised K tile from shared memory twice (as the A of S^T and, viewed
transposed, of O^T), about 140 KB beside the 74 KB the dequant writes, for a few MFLOP with N = 8;
a second CTA on the SM adds no throughput (docs/notes/mma-forms.md, "8 heads per rank"). Here each
thread loads exactly the K values its wgmma A fragment of S^T holds, dequantises them in registers
and issues S^T from them (wgmma with A from registers); only the NoPE part, which is V, goes to
shared memory, for O^T. S^T's K dimension (the 576 dims) is reduced in an order of our choosing,
so it is chosen to make each thread's loads of a row wide and contiguous: Q is stored in
shared memory in the same permuted order (permute_q), and the sum is the same.

A's fragment gives thread (warp w, lane 4 g + q) the rows 16 w + g and 16 w + g + 8 of the tile
and, in each 16-dim K step k, the columns 2 q + (0, 1) and 2 q + 8 + (0, 1): 4 values, e = 0..3
in that order. With k = 8 c + kk, b = 4 kk + e, logical column 16 k + j maps to the record dim

    NoPE (k < 32):  128 c + 16 qq + b % 16 + 64 (b // 16)       qq = (j % 8) // 2
    RoPE (k >= 32): 512 + 8 qq + b % 8 + 32 (b // 8)            b = 4 (k - 32) + e

so thread q holds, of each 128-dim scale block c, the 16 bytes at 16 q and at 64 + 16 q, and the
RoPE dims 8 q and 32 + 8 q onwards: one 16-byte load covers 64 contiguous bytes of each of a
warp's 8 rows (the lines a load touches set the gather's cost in the load unit). The rows are
the thread's own rows of the S^T accumulator as well. Config: tile_tokens (64), d_nope (512),
d_rope (64), head_block."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Int64, const_expr
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

from .gather import GatherRows
from .kv_format import Fp8DsMlaDequant

CHUNK_STEPS = 8       # K steps of S^T per group of wgmmas: 32 NoPE bytes of each of the 2 rows
ROWS = 2              # token rows of a thread


class Fp8RsGather(Fp8DsMlaDequant, GatherRows):
    """fp8_ds_mla records -> registers -> S^T's A fragment (and V to the K stage)."""

    def rs_coords(self):
        """(warp, g, q) of this thread in the S^T fragment."""
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % 32
        return tidx // 32, lane // 4, lane % 4

    def rs_row(self, h: int):
        w, g, _ = self.rs_coords()
        return 16 * w + g + 8 * h

    # ---- indices ----------------------------------------------------------------------------
    @cute.jit
    def load_indices(self, mIdx, row, tok_begin, tile, tok_end, tKcK, rIdx):
        """Indices of `tile` for this thread's two rows (rIdx[0], rIdx[1])."""
        for h in cutlass.range_constexpr(ROWS):
            rIdx[h] = self.index_at(mIdx, row, tok_begin, tile, tok_end, self.rs_row(h))

    # ---- registers ----------------------------------------------------------------------------
    def make_rs_regs(self):
        """A tile's records for this thread: 32 NoPE e4m3 of each scale block of each row, the
        row's scales, its 16 RoPE bf16, and the row's slot."""
        n = self.d_nope // 128
        return (cute.make_rmem_tensor((32, n, ROWS), cutlass.Float8E4M3FN),
                cute.make_rmem_tensor((n, ROWS), Float32), cute.make_rmem_tensor((16, ROWS), BFloat16),
                cute.make_rmem_tensor((ROWS,), Int32))

    @cute.jit
    def rs_address(self, mKV, slot, n_slots) -> Int64:
        """The thread's part of a record: the record address plus 16 q (0 for a masked slot)."""
        addr = Int64(0)
        if self.live_slot(slot, n_slots):
            _, _, q = self.rs_coords()
            addr = self.row_address(mKV, slot, self.record.bytes) + 16 * q
        return addr

    @cute.jit
    def load_rs_part(self, addr: Int64, live, regs, h: cutlass.Constexpr, part: cutlass.Constexpr):
        """Global -> registers of row h (addr: rs_address), not waited on: NoPE chunk `part`
        (0..3: 32 bytes) or, part 4, the scales and the RoPE dims."""
        rN, rS, rR, _ = regs
        if live:
            rec = self.record
            if const_expr(part < self.d_nope // 128):
                for i in cutlass.range_constexpr(2):
                    cute.autovec_copy(self.gmem_vec(addr + (128 * part + 64 * i), cutlass.Float8E4M3FN, 16),
                                      cute.local_tile(rN[None, part, h], (16,), (i,)))
            else:
                _, _, q = self.rs_coords()
                cute.autovec_copy(self.gmem_vec(addr + (rec.scale_off - 16 * q), Float32, rec.n_scales), rS[None, h])
                for i in cutlass.range_constexpr(2):
                    cute.autovec_copy(self.gmem_vec(addr + (rec.rope_off + 64 * i), BFloat16, 8),
                                      cute.local_tile(rR[None, h], (8,), (i,)))

    @cute.jit
    def load_rs_tile(self, mKV, slots, n_slots, regs):
        for h in cutlass.range_constexpr(ROWS):
            regs[-1][h] = slots[h]
            addr = self.rs_address(mKV, slots[h], n_slots)
            for part in cutlass.range_constexpr(self.d_nope // 128 + 1):
                self.load_rs_part(addr, self.live_slot(slots[h], n_slots), regs, h, part)

    # ---- Q in the permuted column order -------------------------------------------------------
    @cute.jit
    def permute_q(self, storage, sQ_layout, sQ, tidx):
        """Wait for Q (bf16, cp.async) and rewrite it as fp16 in shared memory with column L
        holding dim q_dim(L) (the module docstring's map), pairs of adjacent columns at a time (both halves of a pair are
        adjacent dims). Every thread reads its pairs, the CTA syncs, then writes them."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        sQ16 = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner, dtype=Float16)
        n_nope = self.head_block * self.d_nope // 2 // self.num_threads
        n_rope = self.head_block * self.d_rope // 2 // self.num_threads
        vals = cute.make_rmem_tensor((2, n_nope + n_rope), Float16)
        for p in cutlass.range_constexpr(n_nope + n_rope):
            h, L = self.q_pair(tidx, p, n_nope)
            pair = cute.make_rmem_tensor((2,), BFloat16)
            cute.autovec_copy(cute.local_tile(sQ, (1, 2), (h, self.q_dim(L, p, n_nope) // 2))[0, None], pair)
            vals[None, p].store(pair.load().to(Float16))
        cute.arch.sync_threads()
        for p in cutlass.range_constexpr(n_nope + n_rope):
            h, L = self.q_pair(tidx, p, n_nope)
            cute.autovec_copy(vals[None, p], cute.local_tile(sQ16, (1, 2), (h, L // 2))[0, None])
        cute.arch.fence_view_async_shared()     # fp16 Q (st.shared) is read by wgmma
        return sQ16

    def q_pair(self, tidx, p: int, n_nope: int):
        """(head, first logical column) of this thread's pair p: NoPE pairs first, then RoPE."""
        if p < n_nope:
            pi = tidx + self.num_threads * p
            per = self.d_nope // 2
            return pi // per, 2 * (pi % per)
        pi = tidx + self.num_threads * (p - n_nope)
        per = self.d_rope // 2
        return pi // per, self.d_nope + 2 * (pi % per)

    def q_dim(self, L, p: int, n_nope: int):
        """The record dim of logical column L (the module docstring's map), branch-free so that
        it also runs on DSL integers; p < n_nope: a NoPE pair."""
        k, j = L // 16, L % 16
        qq, e = (j % 8) // 2, j % 2 + 2 * (j // 8)
        if p < n_nope:
            b = 4 * (k % CHUNK_STEPS) + e
            return 128 * (k // CHUNK_STEPS) + 16 * qq + b % 16 + 64 * (b // 16)
        b = 4 * (k - self.d_nope // 16) + e
        return self.d_nope + 8 * qq + b % 8 + 32 * (b // 8)

    # ---- the tile: dequant in registers, S^T from them, V to the K stage -----------------------
    def make_rs_mma_s(self):
        """S^T = K Q^T with K from registers: M = 64 tokens, N = heads."""
        return sm90_utils.make_trivial_tiled_mma(
            Float16, Float16, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1),
            (self.tile_tokens, self.head_block), a_source=warpgroup.OperandSource.RMEM,
        )

    @cute.jit
    def rs_tile(self, sQ, sKs, sBias, regs, src, has_next, ahead, mma_tidx):
        """Tile t of this CTA: its records (regs) dequantised chunk by chunk into S^T's A
        fragment, a group of wgmmas issued per chunk (the next chunk converts while they run),
        the NoPE values stored to the K stage for O^T, the rows' biases to sBias; each register
        chunk is refilled with tile t + 1's record once converted (has_next), and rIdx moves on
        to tile `ahead`. Returns S^T's accumulator (committed, not waited on)."""
        mKV, rIdx, mIdx, row, tok_begin, tok_end, n_slots = src
        rN, rS, rR, rSlot = regs
        _, _, q = self.rs_coords()
        mma_s = self.make_rs_mma_s()
        thr = mma_s.get_slice(mma_tidx)
        tSrA = thr.make_fragment_A(thr.partition_shape_A((self.tile_tokens, self.d_qk)))
        tSrQ = thr.make_fragment_B(thr.partition_B(sQ))
        acc_S = cute.make_rmem_tensor(thr.partition_shape_C((self.tile_tokens, self.head_block)), Float32)
        live = [self.live_slot(rSlot[h], n_slots) for h in range(ROWS)]
        nxt = [self.live_slot(rIdx[h], n_slots) for h in range(ROWS)]
        nxt_addr = [self.rs_address(mKV, rIdx[h], n_slots) for h in range(ROWS)]
        if q == 0:
            for h in cutlass.range_constexpr(ROWS):
                sBias[self.rs_row(h)] = Float32(0.0) if live[h] else -Float32.inf
        # V stores: the thread's two 16-byte slots of a 64-dim swizzle atom per row, found once;
        # the other atoms of the row sit whole atom strides (8 KB, which the swizzle does not
        # touch) further on
        v_dst = [[cute.local_tile(sKs, (1, 8), (self.rs_row(h), 2 * q + i))[0, None] for i in range(2)]
                 for h in range(ROWS)]
        atom = cute.cosize(cute.make_layout((self.tile_tokens, 64)))
        n_chunks = self.d_nope // 128
        mma_s.set(warpgroup.Field.ACCUMULATE, False)
        for c in cutlass.range_constexpr(n_chunks + 1):
            if const_expr(c >= 2):
                warpgroup.wait_group(1)     # chunk c - 2's wgmmas are done: its registers are reused
            steps = CHUNK_STEPS if c < n_chunks else self.d_rope // 16
            width = 4 * steps
            rH = [cute.make_rmem_tensor((width,), Float16) for _ in range(ROWS)]
            for h in cutlass.range_constexpr(ROWS):
                if live[h]:
                    if const_expr(c < n_chunks):
                        rH[h].store(rN[None, c, h].load().to(Float16) * rS[c, h].to(Float16))
                    else:
                        rH[h].store(rR[None, h].load().to(Float16))
                else:
                    rH[h].fill(0.0)
                if const_expr(c < n_chunks):
                    # V: dims 128 c + 16 q and 128 c + 64 + 16 q onwards of the row, 16 each
                    for i in cutlass.range_constexpr(width // 8):
                        base = v_dst[h][i % 2]
                        dst = cute.make_tensor(base.iterator + (2 * c + i // 2) * atom, base.layout)
                        cute.autovec_copy(cute.local_tile(rH[h], (8,), (i,)), dst)
            for kk in cutlass.range_constexpr(steps):
                for v in cutlass.range_constexpr(8):
                    v0, v1, v2 = v % 2, (v // 2) % 2, v // 4
                    tSrA[v + 8 * (CHUNK_STEPS * c + kk)] = rH[v1][4 * kk + v0 + 2 * v2]
            # the chunk's registers are free: tile t + 1's part goes in flight
            if has_next:
                for h in cutlass.range_constexpr(ROWS):
                    self.load_rs_part(nxt_addr[h], nxt[h], regs, h, c)
            warpgroup.fence()
            for kk in cutlass.range_constexpr(steps):
                k = CHUNK_STEPS * c + kk
                cute.gemm(mma_s, acc_S, tSrA[None, None, k], tSrQ[None, None, k], acc_S)
                mma_s.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
        for h in cutlass.range_constexpr(ROWS):
            rSlot[h] = rIdx[h]
            rIdx[h] = self.index_at(mIdx, row, tok_begin, ahead, tok_end, self.rs_row(h))
        return acc_S
