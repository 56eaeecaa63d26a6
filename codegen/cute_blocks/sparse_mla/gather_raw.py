"""The raw shared-memory gather form: records cp.async'd raw into RAW_STAGES shared-memory slots
and dequantised there into the K tile (fp8 at 32 heads as N on sm_90a, and sm_120a), for the
fp8_ds_mla records and the model1_fp8 pages."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Uint8, const_expr
from cutlass.cute.nvgpu import cpasync

from .gather import GatherRows
from .kv_format import Fp8DsMlaDequant, Model1Dequant, ue8m0_scale


class RawStages(GatherRows):
    """What the raw forms share: the 16-byte cp.async of a row's chunks into its raw slot."""

    @cute.jit
    def copy_chunks(self, atom, gaddr, raw_base, dst_off, q, chunks: cutlass.Constexpr):
        """A row's 16-byte chunks q, q + 8, ... of `chunks` by its thread q: gaddr and dst_off
        point at chunk q (global address, byte offset into the raw slots)."""
        for j in cutlass.range_constexpr((chunks + 7) // 8):
            if const_expr(8 * j + 8 <= chunks):
                self.cp16(atom, gaddr + 128 * j, raw_base + (dst_off + 128 * j))
            else:
                if 8 * j + q < chunks:
                    self.cp16(atom, gaddr + 128 * j, raw_base + (dst_off + 128 * j))

    @cute.jit
    def cp16(self, atom, gaddr, sptr):
        cute.copy(atom, self.gmem_vec(gaddr, Uint8, 16), cute.make_tensor(sptr, cute.make_layout((16,))))


class Fp8RawGather(Fp8DsMlaDequant, RawStages):
    """fp8_ds_mla records cp.async'd raw into raw_stages shared-memory slots, then dequantised
    into the K tile. Config: tile_tokens, raw_stages, head_block, wgmma, gather_threads."""

    # records staged raw in shared memory by cp.async
    @cute.jit
    def issue_fp8_raw(self, mKV, raw_base, sBias, slot, tKcK, rIdx, n_slots):
        """cp.async the records of one tile into raw slot `slot` (656 bytes: 41 16-byte chunks),
        chunk q + 8 j by the row's thread q. Masked rows issue nothing (bias -inf)."""
        self.write_bias(sBias, slot, tKcK, rIdx, n_slots)
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Uint8, num_bits_per_copy=128,
        )
        q = self.col_slot(tKcK)
        record_bytes = self.record.bytes
        for m in cutlass.range_constexpr(cute.size(rIdx)):
            slot_idx = rIdx[m]
            if self.live_slot(slot_idx, n_slots):
                addr = self.row_address(mKV, slot_idx, record_bytes)
                r = tKcK[0, m, 0][0]
                dst_off = cute.assume((slot * self.tile_tokens + r) * record_bytes + 16 * q, divby=16)
                self.copy_chunks(atom, addr + 16 * q, raw_base, dst_off, q, record_bytes // 16)

    @cute.jit
    def dequant_fp8_tile(self, raw_base, sKs, sBias, slot, tKcK, nope_thr_copy, gmem_thr_copy):
        """Raw slot -> bf16 K tile: value * per-128 scale for the NoPE columns, RoPE copied;
        masked rows become zeros. The tile's biases move to slice RAW_STAGES of sBias."""
        tNs, tRs = self.k_tile_parts(sKs, nope_thr_copy, gmem_thr_copy)
        q = self.col_slot(tKcK)
        rec_layout = self.record
        # 64-head blocks: a rolled loop over this thread's rows, so fewer loop-invariant smem
        # addresses are held across the MMA loop (they spilled when unrolled)
        n_rows = cute.size(tNs, mode=[1])
        for m in cutlass.range(n_rows, unroll=1 if (self.head_block == 64 and not self.wgmma) else n_rows):
            r = tKcK[0, 0, 0][0] + m * (self.gather_threads // 8)
            bias = sBias[slot * self.tile_tokens + r]
            rec = cute.assume((slot * self.tile_tokens + r) * rec_layout.bytes, divby=16)
            if bias == Float32(0.0):
                rS = cute.make_rmem_tensor((rec_layout.n_scales,), Float32)
                cute.autovec_copy(
                    cute.make_tensor(cute.recast_ptr(raw_base + (rec + rec_layout.scale_off), dtype=Float32),
                                     cute.make_layout((rec_layout.n_scales,))),
                    rS,
                )
                for k in cutlass.range_constexpr(rec_layout.n_scales):
                    rV = cute.make_rmem_tensor((16,), cutlass.Float8E4M3FN)
                    cute.autovec_copy(
                        cute.make_tensor(
                            cute.recast_ptr(raw_base + cute.assume(rec + 128 * k + 16 * q, divby=16),
                                            dtype=cutlass.Float8E4M3FN),
                            cute.make_layout((16,)),
                        ),
                        rV,
                    )
                    self.store_dequant(rV, rS[k], tNs[None, m, k])
                rR = cute.make_rmem_tensor((8,), BFloat16)
                cute.autovec_copy(
                    cute.make_tensor(
                        cute.recast_ptr(raw_base + cute.assume(rec + rec_layout.rope_off + 16 * q, divby=16),
                                        dtype=BFloat16),
                        cute.make_layout((8,)),
                    ),
                    rR,
                )
                cute.autovec_copy(rR, tRs[None, m, 0])
            else:
                self.zero_row((tNs, tRs), m)
            if q == 0:
                sBias[self.raw_stages * self.tile_tokens + r] = bias


class Model1RawGather(Model1Dequant, RawStages):
    """model1_fp8 records cp.async'd raw into RAW_STAGES shared-memory slots (raw_bytes a token:
    its token data, then its scale bytes), dequantised there into the K tile; the thread layout
    of Model1Dequant (chunk q of each 64-column atom). Config as Fp8RawGather."""

    @cute.jit
    def issue_fp8_raw(self, mKV, raw_base, sBias, slot, tKcK, rIdx, n_slots):
        """cp.async one tile's tokens into raw slot `slot`: 16-byte chunk q + 8 j of the token
        data by the row's thread q, the 8 scale bytes by thread 0. Masked rows issue nothing."""
        self.write_bias(sBias, slot, tKcK, rIdx, n_slots)
        atom = cute.make_copy_atom(
            cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), Uint8, num_bits_per_copy=128,
        )
        atom8 = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.ALWAYS), Uint8,
                                    num_bits_per_copy=64)
        q = self.col_slot(tKcK)
        rec = self.record
        for m in cutlass.range_constexpr(cute.size(rIdx)):
            slot_idx = rIdx[m]
            if self.live_slot(slot_idx, n_slots):
                tok, scales = self.model1_rows(mKV, slot_idx, n_slots)
                r = tKcK[0, m, 0][0]
                row_off = cute.assume((slot * self.tile_tokens + r) * rec.raw_bytes, divby=16)
                self.copy_chunks(atom, tok + 16 * q, raw_base, row_off + 16 * q, q, rec.token_bytes // 16)
                if q == 0:
                    cute.copy(atom8, self.gmem_vec(scales, Uint8, rec.SCALE_BYTES, align=8),
                              cute.make_tensor(raw_base + (row_off + rec.token_bytes), cute.make_layout((rec.SCALE_BYTES,))))

    @cute.jit
    def dequant_fp8_tile(self, raw_base, sKs, sBias, slot, tKcK, nope_thr_copy, gmem_thr_copy):
        """Raw slot -> K tile: chunk q of each scale group times its scale, RoPE chunk q copied;
        masked rows zero. The tile's biases move to slice RAW_STAGES of sBias."""
        (tKs,) = self.k_tile_parts(sKs, nope_thr_copy, gmem_thr_copy)
        q = self.col_slot(tKcK)
        rec = self.record
        n_rows = cute.size(tKs, mode=[1])
        for m in cutlass.range_constexpr(n_rows):
            r = tKcK[0, m, 0][0]
            bias = sBias[slot * self.tile_tokens + r]
            row_off = cute.assume((slot * self.tile_tokens + r) * rec.raw_bytes, divby=16)
            if bias == Float32(0.0):
                rE = cute.make_rmem_tensor((rec.SCALE_BYTES,), Uint8)
                cute.autovec_copy(cute.make_tensor(raw_base + (row_off + rec.token_bytes),
                                                   cute.make_layout((rec.SCALE_BYTES,))), rE)
                for k in cutlass.range_constexpr(rec.n_scales):
                    rV = cute.make_rmem_tensor((8,), cutlass.Float8E4M3FN)
                    cute.autovec_copy(
                        cute.make_tensor(cute.recast_ptr(raw_base + cute.assume(row_off + rec.SCALE_GROUP * k + 8 * q,
                                                                                divby=8),
                                                         dtype=cutlass.Float8E4M3FN), cute.make_layout((8,))),
                        rV,
                    )
                    self.store_dequant(rV, ue8m0_scale(rE[k]), tKs[None, m, k])
                rR = cute.make_rmem_tensor((8,), BFloat16)
                cute.autovec_copy(
                    cute.make_tensor(cute.recast_ptr(raw_base + cute.assume(row_off + rec.rope_off + 16 * q, divby=16),
                                                     dtype=BFloat16), cute.make_layout((8,))),
                    rR,
                )
                tKs[None, m, rec.n_scales].store(rR.load().to(tKs.element_type))
            else:
                self.zero_row((tKs,), m)
            if q == 0:
                sBias[self.raw_stages * self.tile_tokens + r] = bias
