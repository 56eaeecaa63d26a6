"""The sparse MLA KV cache formats on the device: the page of a cache, and the dequantisation
of a record (its layout from the head dims: kv_layout.py) into the MMA operand type (fp16 or
bf16). The head dims come from the spec, as kernel config: d_qk = d_nope + d_rope, d_v."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Int64, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .kv_layout import Fp8DsMlaRecord, Model1Fp8Record

PAGE_SIZE = 64


class Fp8Dequant:
    """What the fp8 format blocks share: a gather thread's column slot and the dequant store of
    e4m3 values times their scale into the K tile's type."""

    def col_slot(self, tKcK):
        """This gather thread's 16-byte column slot (0..7) in a token row: its NoPE chunks, the
        scale chunk it loads and its RoPE chunk follow from it."""
        return tKcK[0, 0, 0][1] // 8

    @cute.jit
    def store_dequant(self, rV, scale, dst):
        """16 e4m3 values * scale -> the K tile's type -> one 32-byte smem store. fp16: one exact
        conversion and one packed multiply per pair; bf16: through f32."""
        rB = cute.make_rmem_tensor(dst.shape, dst.element_type)
        if const_expr(dst.element_type == Float16):
            rB.store(rV.load().to(Float16) * scale.to(Float16))
        else:
            rB.store((rV.load().to(Float32) * scale).to(BFloat16))
        cute.autovec_copy(rB, dst)


class Fp8DsMlaDequant(Fp8Dequant):
    """fp8_ds_mla: a record row (NoPE e4m3 * per-128 scale, RoPE bf16) into the K tile.
    Config: tile_tokens, d_nope, d_rope, rows_per_pass. The gather threads of a row pair up
    two rows per 8 threads (paired_rows: kernel.gather_copies), which keeps the 32-byte NoPE
    stores free of bank conflicts."""

    paired_rows = True

    @property
    def record(self) -> Fp8DsMlaRecord:
        """The record layout: bytes, scale_off, rope_off, n_scales (one per 128 NoPE values,
        which is also the 16-byte NoPE chunks of a gather thread: 8 threads cover 128 values)."""
        return Fp8DsMlaRecord(self.d_nope, self.d_rope)

    # records gathered into registers, one tile ahead (Fp8RegsPipeline)
    def make_fp8_regs(self):
        """Registers for one tile of this thread's token rows: its 16 NoPE e4m3 of each 128-block,
        the 4 fp32 scales, its 8 bf16 of RoPE, and the row's slot (-1: masked)."""
        n = self.tile_tokens // self.rows_per_pass
        k = self.record.n_scales
        return (cute.make_rmem_tensor((16, k, n), cutlass.Float8E4M3FN), cute.make_rmem_tensor((k, n), Float32),
                cute.make_rmem_tensor((8, n), BFloat16), cute.make_rmem_tensor((n,), Int32))

    @cute.jit
    def load_fp8_row(self, mKV, q, slot, n_slots, regs, m: cutlass.Constexpr):
        """Global -> registers (make_fp8_regs) for row m of this thread, 16-byte loads that are
        not waited on here: column chunk q of the 4 NoPE blocks, the scales and RoPE chunk q."""
        rV, rS, rR, rSlot = regs
        rSlot[m] = slot                       # dequant_fp8_regs masks the row by the same bound
        if self.live_slot(slot, n_slots):
            rec = self.record
            addr = self.row_address(mKV, slot, rec.bytes)
            for k in cutlass.range_constexpr(rec.n_scales):
                cute.autovec_copy(self.gmem_vec(addr + (128 * k + 16 * q), cutlass.Float8E4M3FN, 16), rV[None, k, m])
            cute.autovec_copy(self.gmem_vec(addr + rec.scale_off, Float32, rec.n_scales), rS[None, m])
            cute.autovec_copy(self.gmem_vec(addr + (rec.rope_off + 16 * q), BFloat16, 8), rR[None, m])

    @cute.jit
    def store_row(self, regs, parts, m: cutlass.Constexpr):
        """Row m of the registers, dequantised into the K tile (parts: k_tile_parts)."""
        rV, rS, rR, _ = regs
        tNs, tRs = parts
        for k in cutlass.range_constexpr(self.record.n_scales):
            self.store_dequant(rV[None, k, m], rS[k, m], tNs[None, m, k])
        tRs[None, m, 0].store(rR[None, m].load().to(self.mma_dtype))

    def k_tile_parts(self, sKs, nope_thr_copy, gmem_thr_copy):
        """This thread's destinations in a K tile: ((8,2), rows, n_scales) NoPE and (8, rows, 1)
        RoPE."""
        sNope = cute.local_tile(sKs, (self.tile_tokens, self.d_nope), (0, 0))
        tNs = nope_thr_copy.partition_D(sNope)
        tRs = gmem_thr_copy.partition_D(
            cute.local_tile(sKs, (self.tile_tokens, self.d_rope), (0, self.d_nope // self.d_rope)))
        return tNs, tRs

    @cute.jit
    def zero_row(self, parts, m):
        tNs, tRs = parts
        for k in cutlass.range_constexpr(self.record.n_scales):
            tNs[None, m, k].fill(0.0)
        tRs[None, m, 0].fill(0.0)


@dsl_user_op
def ue8m0_scale(e, *, loc=None, ip=None) -> Float32:
    """The power of two a UE8M0 exponent byte stands for, 2^(e - 127), as f32: the byte placed in
    the f32 exponent field (e = 0, 2^-127, reads as 0: below anything the quantiser writes)."""
    bits = Uint32(e) << Uint32(23)
    return Float32(llvm.bitcast(T.f32(), bits.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


class Model1Dequant(Fp8Dequant):
    """model1_fp8 (DeepSeek-V4, FlashMLA's MODEL1 pages): a token's d_nope e4m3 NoPE values
    times their per-64 UE8M0 scale, then its bf16 RoPE values, into the K tile. The token data
    and the scales sit apart in the page (kv_layout.Model1Fp8Record).

    Gather thread q (0..7) of a token row holds 16-byte column chunk q of every 64-column swizzle
    atom of the K tile: 8 NoPE values of each scale group (one 8-byte load each: 8 threads read a
    group's 64 contiguous bytes) and the RoPE chunk q, so one row's 8 threads store the 8 chunks
    of a 128-byte swizzled row, free of bank conflicts, one row per 8 threads (paired_rows
    False). Config: tile_tokens, d_nope, d_rope, page_size, rows_per_pass, mma_dtype."""

    paired_rows = False

    @property
    def record(self) -> Model1Fp8Record:
        return Model1Fp8Record(self.d_nope, self.d_rope)

    def make_fp8_regs(self):
        """Registers for one tile of this thread's token rows: 8 e4m3 of each scale group, the 8
        scale bytes (n_scales exponents and pad), 8 bf16 of RoPE, and the row's slot."""
        n = self.tile_tokens // self.rows_per_pass
        return (cute.make_rmem_tensor((8, self.record.n_scales, n), cutlass.Float8E4M3FN),
                cute.make_rmem_tensor((8, n), Uint8), cute.make_rmem_tensor((8, n), BFloat16),
                cute.make_rmem_tensor((n,), Int32))

    @cute.jit
    def load_fp8_row(self, mKV, q, slot, n_slots, regs, m: cutlass.Constexpr):
        """Global -> registers for row m of this thread, loads that are not waited on here: chunk
        q of each scale group, the token's scale bytes (the same 8 bytes for the row's 8 threads)
        and RoPE chunk q."""
        regs[-1][m] = slot
        if self.live_slot(slot, n_slots):
            addr, scales = self.model1_rows(mKV, slot, n_slots)
            rV, rE, rR, _ = regs
            rec = self.record
            for k in cutlass.range_constexpr(rec.n_scales):
                cute.autovec_copy(self.gmem_vec(addr + (rec.SCALE_GROUP * k + 8 * q), cutlass.Float8E4M3FN, 8,
                                                align=8), rV[None, k, m])
            cute.autovec_copy(self.gmem_vec(addr + (rec.rope_off + 16 * q), BFloat16, 8), rR[None, m])
            cute.autovec_copy(self.gmem_vec(scales, Uint8, rec.SCALE_BYTES, align=8), rE[None, m])

    @cute.jit
    def model1_rows(self, mKV, slot, n_slots):
        """(token data, scales) byte addresses of a live slot; (0, 0) for a masked one."""
        tok, scales = Int64(0), Int64(0)
        if self.live_slot(slot, n_slots):
            tok = self.row_address(mKV, slot, self.record.token_bytes)
            scales = self.scale_address(tok, slot, self.page_size)
        return tok, scales

    def scale_address(self, tok: Int64, slot, page: int) -> Int64:
        """The scales of the token at `tok` follow its page's tokens: tok - off * token_bytes +
        page * token_bytes + off * SCALE_BYTES."""
        rec = self.record
        return tok + (Int64(rec.scale_off(page)) - Int64(slot % page) * (rec.token_bytes - rec.SCALE_BYTES))

    @cute.jit
    def store_row(self, regs, parts, m: cutlass.Constexpr):
        rV, rE, rR, _ = regs
        (tKs,) = parts
        n = self.record.n_scales
        for k in cutlass.range_constexpr(n):
            self.store_dequant(rV[None, k, m], ue8m0_scale(rE[k, m]), tKs[None, m, k])
        tKs[None, m, n].store(rR[None, m].load().to(self.mma_dtype))

    def k_tile_parts(self, sKs, nope_thr_copy, gmem_thr_copy):
        """This thread's destinations in a K tile: (8, rows, d_qk / 64), chunk q of each atom."""
        return (gmem_thr_copy.partition_D(sKs),)

    @cute.jit
    def zero_row(self, parts, m):
        (tKs,) = parts
        for k in cutlass.range_constexpr(cute.size(tKs, mode=[2])):
            tKs[None, m, k].fill(0.0)
