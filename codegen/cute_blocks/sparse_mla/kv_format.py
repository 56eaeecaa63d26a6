"""The sparse MLA KV cache formats: the dims of a token and the fp8_ds_mla record layout."""

D_QK = 576          # 512 latent (NoPE) + 64 RoPE
D_V = 512           # V = first 512 dims of K
D_ROPE = 64
PAGE_SIZE = 64
# fp8_ds_mla token record: 512 e4m3 | 4 fp32 scales (one per 128 values) | 64 bf16 RoPE
FP8_RECORD = 656
FP8_SCALE_OFF = 512
FP8_ROPE_OFF = 528
