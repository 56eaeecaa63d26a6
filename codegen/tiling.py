"""Tile parameters for the generated kernels (pure Python: no cutlass import).

`decode_tiling` feeds templates/sparse_mla_decode.py.j2 as the `tile` variable.
"""

# Largest dynamic shared memory one CTA may use (bytes).
_SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}

_Q_DIM = 576      # 512 latent (NoPE) + 64 RoPE
_V_DIM = 512


def _smem_bytes(head_block: int, tile_tokens: int, stages: int, warps_n: int) -> int:
    q = head_block * _Q_DIM * 2
    kv = stages * tile_tokens * _Q_DIM * 2
    p = head_block * tile_tokens * 2
    small = stages * tile_tokens * 4 + warps_n * head_block * 4
    # big members are 1024-byte multiples; small ones are 16-byte aligned
    return q + kv + p + small + 512


def decode_tiling(num_heads: int, kv_format: str, arch: str) -> dict:
    """Tile parameters for the sparse MLA decode split kernel.

    head_block:  heads per CTA; the MMA M dimension (16 per warp row).
    tile_tokens: gathered tokens per pipeline stage (online-softmax step).
    warps_m:     head_block // 16 warps along heads.
    warps_n:     warps along tokens for S = Q K^T and along the 512 value dims for O = P V.
    stages:      shared-memory KV buffers (2 = gather of tile t+1 overlaps math of tile t).
    combine_heads: heads merged per CTA in the combine kernel (one warp per head).
    """
    if num_heads not in (16, 32, 64, 128):
        raise ValueError(f"num_heads must be 16, 32, 64 or 128, got {num_heads}")
    if kv_format not in ("fp8_ds_mla", "bf16"):
        raise ValueError(f"unknown kv_format {kv_format!r}")
    if arch not in _SMEM_LIMIT:
        raise ValueError(f"unsupported arch {arch!r}")

    if arch == "sm_90a":
        # 227 KB of smem: Q for up to 64 heads plus two 64-token bf16 KV tiles.
        head_block = min(num_heads, 64)
        tile_tokens = 64
        stages = 2
        warps_m = head_block // 16
        # O accumulators per thread = 16 * (512 / warps_n) / 32: 128 registers at warps_n = 2
        # (64-head blocks, 8 warps), 64 at warps_n = 4 (16 or 32 heads: 4 or 8 warps).
        warps_n = 2 if warps_m == 4 else 4
    else:
        # sm_120a: 99 KB of smem. A 16-head block with two 32-token tiles fits.
        head_block = 16
        tile_tokens = 32
        stages = 2
        warps_m = 1
        warps_n = 4

    smem = _smem_bytes(head_block, tile_tokens, stages, warps_n)
    assert smem <= _SMEM_LIMIT[arch], (smem, arch)
    return {
        "head_block": head_block,
        "tile_tokens": tile_tokens,
        "warps_m": warps_m,
        "warps_n": warps_n,
        "num_threads": 32 * warps_m * warps_n,
        "stages": stages,
        "combine_heads": 4,
        "smem_bytes_estimate": smem,
    }
