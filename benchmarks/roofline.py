"""The H200 rooflines the benchmarks report against, the byte counts that put an op on them, and
what every result JSON records about its run (device, date, commit). Torch-free, so plot.py and
tables.py run anywhere."""
from __future__ import annotations

import os
import subprocess
import time

HBM_BYTES_PER_S = 4.3e12   # device-to-device copy measured on this H200 (bytes read + written)
BF16_FLOP_PER_S = 790e12   # dense bf16 matmul measured on this H200


def roofline_us(flops: float, nbytes: float) -> float:
    """The time an op cannot beat: the larger of its tensor-core and its HBM time."""
    return max(flops / BF16_FLOP_PER_S, nbytes / HBM_BYTES_PER_S) * 1e6


def topk_bytes(rows: int, width: int, k: int) -> int:
    """Top-k of fp32 logits: every logit read once, k int32 indices written per row."""
    return rows * (width + k) * 4


def dcp_local_bytes(rows: int, k: int, world: int) -> int:
    """The local part of a DCP merge: this rank's ids and scores read (8 B an entry), the
    world x k gathered (id, score) candidates read, the k winners' ids written."""
    return rows * k * (8 + 8 * world + 4)


def commit(root: str | None = None) -> str:
    """The commit a run measures: $B12X_COMMIT (set it on a GPU box that has no git checkout),
    else the short HEAD of the checkout, else "unknown"."""
    env = os.environ.get("B12X_COMMIT", "").strip()
    if env:
        return env
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def run_info(device: str, **extra) -> dict:
    """The header of a result JSON: device name, date, commit, plus any extra fields."""
    return {"device": device, "date": time.strftime("%Y-%m-%d"), "commit": commit(), **extra}


# DeepSeek-V4 (model1_fp8): a token's record is 448 e4m3 + 64 bf16 RoPE values + 8 scale bytes; q,
# out and V are 512 wide; a row's SWA window is 128 entries, its compressed list the kind's suffix.
MODEL1_TOKEN_BYTES = 448 + 64 * 2 + 8
V4_SWA_ENTRIES = 128
V4_D = 512


def v4_entries(kind: str) -> int:
    """A V4 decode row's entries: 'swa' 128, 'swa+c4_512' 128 + 512, 'swa+c128_1024' 128 + 1024."""
    return V4_SWA_ENTRIES + (int(kind.rsplit("_", 1)[1]) if "+" in kind else 0)


def v4_flops(rows: int, heads: int, entries: int) -> int:
    """QK (d 512) and PV (V 512) over a row's entries, for the caller's heads."""
    return 2 * rows * heads * entries * (V4_D + V4_D)


def v4_decode_bytes(rows: int, heads: int, entries: int) -> int:
    """Every entry's record read once per row, bf16 q read and out written, fp32 lse written."""
    return rows * entries * MODEL1_TOKEN_BYTES + 2 * rows * heads * V4_D * 2 + rows * heads * 4
