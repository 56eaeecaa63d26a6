"""Attention kernels: `b12x.attention.sparse_mla` (Caps -> plan -> bind -> run)."""
