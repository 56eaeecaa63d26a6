"""The sparse MLA KV cache formats: the dims of a token, the fp8_ds_mla record layout, and the
dequantisation of a record into the MMA operand type (fp16 or bf16)."""
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, const_expr

D_QK = 576          # 512 latent (NoPE) + 64 RoPE
D_V = 512           # V = first 512 dims of K
D_ROPE = 64
PAGE_SIZE = 64
# fp8_ds_mla token record: 512 e4m3 | 4 fp32 scales (one per 128 values) | 64 bf16 RoPE
FP8_RECORD = 656
FP8_SCALE_OFF = 512
FP8_ROPE_OFF = 528


class Fp8DsMlaDequant:
    """fp8_ds_mla: a record row (NoPE e4m3 * per-128 scale, RoPE bf16) into the K tile.
    Config: tile_tokens."""

    def col_slot(self, tKcK):
        """This gather thread's 16-byte column slot (0..7) in a token row: its NoPE chunks, the
        scale chunk it loads and its RoPE chunk follow from it."""
        return tKcK[0, 0, 0][1] // 8

    def k_tile_parts(self, sKs, nope_thr_copy, gmem_thr_copy):
        """This thread's destinations in a K tile: ((8,2), rows, 4) NoPE and (8, rows, 1) RoPE."""
        sNope = cute.local_tile(sKs, (self.tile_tokens, D_V), (0, 0))
        tNs = nope_thr_copy.partition_D(sNope)
        tRs = gmem_thr_copy.partition_D(cute.local_tile(sKs, (self.tile_tokens, D_ROPE), (0, D_V // D_ROPE)))
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
        for k in cutlass.range_constexpr(4):
            tNs[None, m, k].fill(0.0)
        tRs[None, m, 0].fill(0.0)
