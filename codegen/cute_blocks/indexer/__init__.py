"""Building blocks of the lightning indexer and its top-k: fp8 scoring (fp8_mma), the paged K
cache's reads (k_pages), the logits kernels (logits: config and K sources; logits_wgmma and
logits_warp: the sm_90a and sm_120a MMA forms), sortable keys and the radix select (select),
the wide-row select (wide_select), and the fused score-and-select kernel (fused)."""
