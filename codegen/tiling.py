"""Tile parameters for the generated kernels (pure Python: no cutlass import).

`decode_tiling` feeds templates/sparse_mla.py.j2 as the `tile` variable (through
SparseMLASpec.tiling, which passes the spec's head dims and KV record size).
"""

# Largest dynamic shared memory one CTA may use (bytes).
_SMEM_LIMIT = {"sm_90a": 232448, "sm_120a": 101376}

# sm_90a 64-head blocks on wgmma (see decode_tiling). Switch for the experimental path.
WGMMA_ENABLED = True
# sm_90a fp8 64-head decode blocks: producer warpgroup + two fp16 K stages (see decode_tiling).
PRODUCER_ENABLED = True
# Sparse MLA decode's combine: above this many splits per row, "combine_many_splits" runs. It
# loads every split of a thread before the weights are known, guarded rather than clamped,
# because ptxas sinks clamped loads below the lse reduction and the kernel then waits for two or
# three L2 round trips instead of one. Its 62 registers halve the CTAs an SM holds, which only
# costs where a call has few splits and many CTAs; above this bound the grid fits one wave. Up to
# it, "combine" (34 registers) loads the first COMBINE_FEW_SPLITS, i.e. every split. The runtime
# picks by this bound (b12x.attention.sparse_mla.combine_entry); docs/notes/combine.md.
COMBINE_FEW_SPLITS = 4
# The combine holds one split's lse per lane of a warp, so a row has at most 32 splits; wider rows
# (top-k up to 8192) give each split more 64-token tiles instead of more splits.
MAX_SPLITS = 32
# sm_90a (mode, heads, kv_format) whose 16/32-head blocks run wgmma with the heads as N, so that
# 16 or 32 heads fill the wgmma N dimension instead of padding M to 64 (which doubles the tensor
# work and left the mma.sync kernels issue- and latency-bound). Fewer than 64 heads not listed
# run one 64-head block whose rows past the heads stay empty (docs/notes/mma-forms.md,
# docs/notes/launch-and-splits.md).
HEADS_AS_N = {(mode, heads, fmt) for mode in ("decode", "extend") for heads in (8, 16, 32)
              for fmt in ("fp8_ds_mla", "bf16")}
# Heads-as-N fp8 blocks in the producer form: two producer warpgroups gather and dequantise each
# tile into one of two K stages while one MMA warpgroup runs S^T, the softmax and all of O^T (one
# CTA an SM). Extend at 32 heads over both fp8 formats, where it replaced a 64-head producer block
# with 32 empty rows (fp8_ds_mla 5-12% faster, model1_fp8 14-16%; decode's one-split calls at 32
# heads run it too). At 8 and 16 heads the register form's two CTAs an SM stay 2-9% faster
# (docs/notes/mma-forms.md).
HEADS_N_PRODUCER = {("extend", 32, fmt) for fmt in ("fp8_ds_mla", "model1_fp8")}
# model1_fp8 (DeepSeek-V4): 8 and 16 heads in the register form (heads as N); decode at 32 heads
# splits in one 64-head producer block (the heads-as-N split form's raw shared-memory stages are
# not built for model1 pages), extend at 32 heads runs the heads-as-N producer form above.
HEADS_AS_N |= {(mode, heads, "model1_fp8") for mode in ("decode", "extend") for heads in (8, 16)}
HEADS_AS_N |= HEADS_N_PRODUCER      # the producer form is a heads-as-N form
FP8_FORMATS = ("fp8_ds_mla", "model1_fp8")
# Split planning by the share of the busiest SM (b12x.attention.sparse_mla.split_plan, sm_share):
# forms whose resident CTAs share one SM's throughput. A tile of a single wave that leaves the
# busiest SM k CTAs costs (c + k) / (c + ctas_per_sm) of one in a full wave, and the combine
# weighs w a partial row: SM_SHARE = (c, w). Fitted to forced split counts through the runtime
# (benchmarks/probe_splits.py; docs/notes/launch-and-splits.md):
#  - the 8/16-head register form over fp8_ds_mla (2 CTAs an SM): a second CTA adds ~10% to the
#    SM (16 heads at 40 rows: 3 splits of 11 tiles, one CTA an SM, 31.5 us; 4 splits of 8 tiles,
#    two on 28 SMs, 39.3); model1_fp8's 8/16-head plans keep the plain count (a short-split rule
#    measured slower there: B=32 h=16 + C128 28.8 -> 31.8 us);
#  - the 8-head warp group (4 CTAs an SM): a round of k CTAs' tiles took 4.6 / 5.55 / 6.75 us at
#    k = 2 / 3 / 4.
REGISTER_SM_SHARE = (0.25, 0.005)
WARP_GROUP_SM_SHARE = (2.0, 0.001)
# fp8 decode at 32 heads: one-split calls run the whole-row kernel, the producer form (a 64-head
# block until the heads-as-N producer replaced it, HEADS_N_PRODUCER), whose tile costs ~0.7-0.8 of
# the split form's (heads as N, raw stages): split_plan counts the one-split option at this
# factor (fitted on the 64-head block: 96 rows: 1 split 87.4 us against 4 splits 99.2; 160 rows:
# 4 splits 159.4 against 170.6 at 1, which a factor under 0.75 would get wrong).
PRODUCER_WHOLE_ROW_COST = 0.8
# bf16 decode at 8/16/32 heads (heads as N, one CTA an SM, bound by HBM): where the rows alone
# nearly fill the GPU, one split a row runs faster than the wave model counts (a wave of fewer
# CTAs shares HBM among fewer), so split_plan counts the one-split option at this factor. It moves
# 89-99 and 199-220 rows to one split; the window that does so and keeps 88 rows on three is
# 0.78-0.905 (docs/notes/launch-and-splits.md).
HEADS_N_BF16_WHOLE_ROW_COST = 0.85
# The 8-head fp8_ds_mla decode split also has a warp-group form on mma.sync (cute_blocks/
# sparse_mla/warp_group.py: 128 threads held to 128 registers, 4 CTAs an SM, no short-split
# rule). It runs calls of WARP_GROUP_MIN_ROWS rows or more: from there the register form's splits
# (one or two CTAs an SM) leave SMs with a second CTA while others hold one, and the warp group's
# finer grain fills them (40 / 48 / 56 x 8: 27.4 / 29.3 / 32.9 us against 35.4 / 37.8 / 38.8,
# 128 x 8 0.49 of FlashMLA against 0.58); at 32 rows the two tie, below it the 16-token steps lose
# to the register form's 64-token tiles (8 x 8: 13.2 against 10.6). docs/notes/mma-forms.md.
WARP_GROUP_MIN_ROWS = 33
WARP_GROUP_CTAS_PER_SM = 4      # warp_group.CTAS_PER_SM: its launch bound


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _smem_bytes(d_qk: int, record_bytes: int, head_block: int, tile_tokens: int, stages: int, warps_n: int,
                raw_stages: int = 0, p_in_rope: bool = False, p_stages: int = 1) -> int:
    # (P in the RoPE block needs HEAD_BLOCK <= 64: the block is TILE_TOKENS x 64)
    q = _align(head_block * d_qk * 2, 1024)
    kv = _align(stages * tile_tokens * d_qk * 2, 1024)
    p = 0 if p_in_rope else _align(p_stages * head_block * tile_tokens * 2, 1024)
    raw = _align(raw_stages * tile_tokens * record_bytes, 1024)
    bias_slots = raw_stages + 1 if raw_stages else stages
    small = bias_slots * tile_tokens * 4 + warps_n * head_block * 4
    # big members are 1024-byte aligned; small ones are 16-byte aligned
    return q + kv + p + raw + small + 512


# Extend calls of at least this many rows over a form that sorts its rows (sort_rows) put each
# row's entries in cache order first: below it the rows are MTP or small-chunk rows of different
# requests, which share no cache, and the order kernel's launch would be all cost.
ORDER_MIN_ROWS = 256


def decode_tiling(num_heads: int, kv_format: str, arch: str, mode: str = "decode", *, d_qk: int,
                  record_bytes: int, v_in_rope: bool = False) -> dict:
    """Tile parameters for the sparse MLA kernels (decode split and extend share the template).
    d_qk: the dims of a q / K row (bf16 in shared memory); record_bytes: one token as the raw fp8
    stages hold it (kv_layout's raw_bytes); v_in_rope: V reaches into the RoPE block.

    head_block:  heads per CTA; the MMA M dimension (16 per warp row).
    tile_tokens: gathered tokens per pipeline stage (online-softmax step).
    warps_m:     head_block // 16 warps along heads.
    warps_n:     warps along tokens for S = Q K^T and along the value dims for O = P V.
    stages:      shared-memory bf16 K tiles (bf16 KV: 2, the gather of tile t+1 overlaps the
                 math of tile t; fp8 KV: 1, the raw records are what is double/triple buffered).
    raw_stages:  fp8 KV only: tiles of raw records in flight (cp.async into smem,
                 dequantised smem -> smem right before their math). 0 for bf16 KV.
    ctas_per_sm: CTAs one SM holds at this shared-memory size (the split policy's wave size).
    sm_share:    the split policy's per-SM share model (REGISTER_SM_SHARE for the register form over
                 fp8_ds_mla), else None.
    wgmma:       sm_90a, 64-head blocks: the main loop runs on Hopper warpgroup MMA (two
                 warpgroups; warpgroup g computes S for tokens [32g, 32g+32) with
                 wgmma 64x32x16 from smem Q/K (s_one_warpgroup: warpgroup 0 all 64 tokens,
                 64x64x16), and O[:, 256g:256g+256] += P V with wgmma 64x256x16, P from
                 smem). False: warp-level mma.sync m16n8k16 + ldmatrix.
    heads_as_n:  sm_90a, 16/32-head blocks listed in HEADS_AS_N: wgmma with the operands
                 swapped, S^T = K Q^T (64 tokens x heads) and O^T = V^T P^T (d_v dims x
                 heads), so 16 or 32 heads fill N instead of padding M to 64. warps_n counts
                 warpgroups here: warpgroup 0 runs S^T and the softmax, each holds d_v / warps_n
                 value dims of O^T.
    fp8_regs:    fp8 at 16 heads as N, and the producer form: records go global -> registers,
                 fp16 MMA operands.
    producer:    sm_90a, fp8, 64-head blocks (decode and extend) and the heads-as-N blocks of
                 HEADS_N_PRODUCER: producer warpgroups (producer_warpgroups: one beside a 64-head
                 block's two MMA warpgroups, two beside the one of the heads as N) load records
                 into registers and dequantise them (fp16) into two K stages, while the MMA warps
                 run S, the softmax and O; P lives in each stage's RoPE block so Q + two stages
                 fit.
    p_in_rope:   P lives in the K stage's RoPE block (bf16 extend at 8-32 heads as N; producer),
                 unless V reaches into it (v_in_rope: DeepSeek-V4's V is all of K).
    p_stages:    P buffers beside the K stages: the producer form's one per stage when P cannot
                 live in the RoPE block, else 1 (or none, p_in_rope).
    """
    if num_heads not in (8, 16, 32, 64, 128):
        raise ValueError(f"num_heads must be 8, 16, 32, 64 or 128, got {num_heads}")
    if kv_format not in FP8_FORMATS + ("bf16",):
        raise ValueError(f"unknown kv_format {kv_format!r}")
    if arch not in _SMEM_LIMIT:
        raise ValueError(f"unsupported arch {arch!r}")

    fp8 = kv_format in FP8_FORMATS
    producer = False
    # Hopper wgmma with the heads as N for the listed 16/32-head cases (see HEADS_AS_N)
    heads_as_n = arch == "sm_90a" and (mode, num_heads, kv_format) in HEADS_AS_N
    heads_n_producer = heads_as_n and (mode, num_heads, kv_format) in HEADS_N_PRODUCER
    if arch == "sm_90a":
        # 227 KB of smem: Q for up to 64 heads plus the KV tiles; a 64-head block unless the
        # heads are the N dimension
        head_block = num_heads if heads_as_n else 64
        tile_tokens = 64
        stages = 1 if fp8 else 2
        # 64 heads as M: 4 warps (one warpgroup) along heads, 2 warpgroups along tokens for S
        # and along the value columns for O (128 O accumulators per thread). fp8 without the
        # producer (PRODUCER_ENABLED off): one raw tile in flight beside 64-head Q (197 KB).
        warps_m, warps_n = 4, 2
        raw_stages = 1 if fp8 else 0
        if heads_as_n:
            # fp8: two warpgroups, M = 64 tokens for S^T (warpgroup 0), 4 blocks of 64 value dims
            # of O^T each, all 8 warps dequantise: with 4 the dequant sets the pace. bf16: one
            # warpgroup; with no dequant to share, a second one measured slower.
            warps_m, warps_n = 4, (2 if fp8 else 1)
            raw_stages = {32: 2, 16: 3, 8: 3}[head_block] if fp8 else 0
            if not fp8 and mode == "extend":
                # one K stage (P in its RoPE block unless V covers it): two CTAs per SM, one
                # gathers while the other multiplies. Decode keeps two stages: one stage measured
                # slower for its rows (docs/notes/extend.md).
                stages = 1
            if heads_n_producer:
                # the producer form (below) with one MMA warpgroup
                warps_n, raw_stages = 1, 0
            elif fp8 and head_block <= 16:
                # records go global -> registers while the tile before is multiplied (no raw
                # smem), one warpgroup, one K stage: 95 KB, so two CTAs share an SM and each fills
                # the other's serial chain. 32 heads do not fit it (128 O^T accumulators + the
                # record registers > 255), and with two stages they measured slower than raw
                # shared-memory stages.
                warps_n, stages, raw_stages = 1, 1, 0
        producer = fp8 and PRODUCER_ENABLED and (head_block == 64 or heads_n_producer)
        if producer:
            # a producer warpgroup dequantises tile t+1 while the MMA warps run tile t; without
            # it the dequant sits on the critical path between S, the softmax and P V of a tile
            # (docs/notes/decode-pipeline.md)
            stages, raw_stages = 2, 0
    else:
        # sm_120a: 99 KB of smem. A 16-head block with 32-token tiles fits.
        head_block = 16
        tile_tokens = 32
        warps_m = 1
        warps_n = 4
        stages = 1 if fp8 else 2
        raw_stages = 2 if fp8 else 0

    # Hopper warpgroup MMA: 64-head blocks (warps_m = 4 warps = one warpgroup along heads,
    # warps_n = 2 warpgroups along tokens / value columns), or 16/32 heads as N.
    fp8_regs = (heads_as_n and fp8 and raw_stages == 0) or producer
    producer_warpgroups = 2 if producer and heads_as_n else 1
    # (V4: V covers the RoPE block, so P cannot live there: the producer form keeps one P per
    # stage beside the stages, the bf16 extend at 8-32 heads one P beside its stage)
    p_in_rope = ((heads_as_n and not fp8 and stages == 1) or producer) and not v_in_rope
    p_stages = stages if producer and not p_in_rope else 1
    wgmma = arch == "sm_90a" and (head_block == 64 and WGMMA_ENABLED or heads_as_n)
    smem = _smem_bytes(d_qk, record_bytes, head_block, tile_tokens, stages, max(warps_m, warps_n), raw_stages,
                       p_in_rope, p_stages)
    # 64-head wgmma blocks (fp8 in the producer form, bf16): warpgroup 0 computes S over the
    # whole tile and the softmax, warpgroup 1 only adds P V for its value columns
    s_one_warpgroup = wgmma and head_block == 64 and not heads_as_n and (producer or not fp8)
    if producer:
        smem += 1024  # the 4-warp gather of 64 tokens leaves nothing else; slack for alignment
    if s_one_warpgroup:
        smem += stages * head_block * 4     # sMax: the running max, warpgroup 0 -> 1
    assert smem <= _SMEM_LIMIT[arch], (smem, arch)
    ctas_per_sm = max(1, (_SMEM_LIMIT[arch] + 1024) // (smem + 1024))
    warp_group = arch == "sm_90a" and mode == "decode" and num_heads == 8 and kv_format == "fp8_ds_mla"
    # bf16 extend at 8-32 heads is bound by its gather: each row's entries in cache order first
    # (cute_blocks/sparse_mla/order.py), so the rows' tiles sweep the cache together
    sort_rows = mode == "extend" and heads_as_n and not fp8 and stages == 1
    return {
        "sort_rows": sort_rows,
        "warp_group": warp_group,
        "warp_group_min_rows": WARP_GROUP_MIN_ROWS if warp_group else 0,
        "warp_group_ctas_per_sm": WARP_GROUP_CTAS_PER_SM,
        "head_block": head_block,
        "tile_tokens": tile_tokens,
        "warps_m": warps_m,
        "warps_n": warps_n,
        "num_threads": 32 * warps_m * warps_n + (128 * producer_warpgroups if producer else 0),
        # warpgroups of the producer form that gather and dequantise: two beside the one MMA
        # warpgroup of the heads as N, one beside the two of a 64-head block
        "producer_warpgroups": producer_warpgroups,
        "stages": stages,
        "raw_stages": raw_stages,
        "ctas_per_sm": ctas_per_sm,
        "sm_share": REGISTER_SM_SHARE if fp8_regs and heads_as_n and not producer and kv_format == "fp8_ds_mla" else None,
        "smem_bytes_estimate": smem,
        "wgmma": wgmma,
        "heads_as_n": heads_as_n,
        "fp8_regs": fp8_regs,
        "p_in_rope": p_in_rope,
        "p_stages": p_stages,
        "producer": producer,
        "s_one_warpgroup": s_one_warpgroup,
        # bf16 KV on wgmma: issue S of tile t before the gather of t + 1 (64-head blocks, where
        # the tensor work bounds a tile) or after it (16/32 heads, where the gather does).
        "s_before_gather": not heads_as_n,
    }
