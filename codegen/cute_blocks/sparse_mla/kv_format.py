"""The sparse MLA KV cache formats on the device: the page of a cache, and the dequantisation
of a record (its layout from the head dims: kv_layout.py) into the MMA operand type (fp16 or
bf16). The head dims come from the spec, as kernel config: d_qk = d_nope + d_rope, d_v."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, const_expr

from .kv_layout import Fp8DsMlaRecord

PAGE_SIZE = 64


class Fp8DsMlaDequant:
    """fp8_ds_mla: a record row (NoPE e4m3 * per-128 scale, RoPE bf16) into the K tile.
    Config: tile_tokens, d_nope, d_rope."""

    @property
    def record(self) -> Fp8DsMlaRecord:
        """The record layout: bytes, scale_off, rope_off, n_scales (one per 128 NoPE values,
        which is also the 16-byte NoPE chunks of a gather thread: 8 threads cover 128 values)."""
        return Fp8DsMlaRecord(self.d_nope, self.d_rope)

    def col_slot(self, tKcK):
        """This gather thread's 16-byte column slot (0..7) in a token row: its NoPE chunks, the
        scale chunk it loads and its RoPE chunk follow from it."""
        return tKcK[0, 0, 0][1] // 8

    def k_tile_parts(self, sKs, nope_thr_copy, gmem_thr_copy):
        """This thread's destinations in a K tile: ((8,2), rows, n_scales) NoPE and (8, rows, 1)
        RoPE."""
        sNope = cute.local_tile(sKs, (self.tile_tokens, self.d_nope), (0, 0))
        tNs = nope_thr_copy.partition_D(sNope)
        tRs = gmem_thr_copy.partition_D(
            cute.local_tile(sKs, (self.tile_tokens, self.d_rope), (0, self.d_nope // self.d_rope)))
        return tNs, tRs

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

    @cute.jit
    def zero_row(self, tNs, tRs, m):
        for k in cutlass.range_constexpr(self.record.n_scales):
            tNs[None, m, k].fill(0.0)
        tRs[None, m, 0].fill(0.0)
