"""Prewarm bundles: make every kernel a model configuration can dispatch to built, loaded and
launched once, before CUDA-graph capture and before freeze().

One signature for every op:

    prewarm(*plans_or_caps, max_rows=None, device=None, scratch=None, group=None) -> list[Plan]

takes plans (or their Caps) of `b12x.attention.sparse_mla`, `b12x.indexer` and `b12x.dcp`,
resolves every artifact they name (`plan.specs()`) before any launch, then launches each route
a call of up to `max_rows` rows (None: each plan's `caps.max_rows`) can take, binding `scratch`
(the engine's workspace; None: one buffer for the warm-up) per call. `group` is the DCP process
group: the DCP merge then runs for real (all-gather included) with a barrier after each pass, so
every rank must make the same call. It returns the plans, in order.

`prewarm_preset(name, max_rows=...)` warms a catalog preset's whole bundle (for a model preset:
sparse MLA decode and extend, the indexer's logits, top-k and fused routes, the DCP kernels).
The per-family forms (`prewarm_sparse_mla`, `prewarm_indexer`, `b12x.dcp.prewarm_dcp_merge`)
are what `prewarm` runs per op and stay usable. A sparse MLA bundle is keyed by (q_head_dim,
kv_lora_rank, topk, max_rows), qualified by arch, heads and KV format. A key is recorded only
after its warm-up launches succeeded."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Optional

import torch

from codegen.catalog import DcpConfig, IndexerConfig, ModelConfig, get_preset
from codegen.indexer_specs import TOPK_WIDTH_MAX
from codegen.cute_blocks.sparse_mla.kv_layout import kv_record
from codegen.specs import KernelSpec

from . import dcp as _dcp
from . import indexer as _indexer
from . import registry
from . import scratch as _scratch
from .attention import sparse_mla
from .device import device_arch, num_sms as device_num_sms
from .plan import Plan, renamed_fields, renamed_kw
from .validate import require

_lock = threading.Lock()
_done: set["PrewarmKey"] = set()


@renamed_fields(max_batched="max_rows")
@dataclass(frozen=True)
class PrewarmKey:
    q_head_dim: int
    kv_lora_rank: int
    topk: int
    max_rows: int
    num_heads: int
    kv_format: str
    arch: str
    rope_dim: int = 64
    v_head_dim: int = 512
    page_size: int = 64
    extra_topk: int = 0
    extra_page_size: int = 0

    def caps(self, mode: str = "decode") -> sparse_mla.Caps:
        return sparse_mla.Caps(num_heads=self.num_heads, topk=self.topk, kv_format=self.kv_format,
                               max_rows=self.max_rows, mode=mode, q_head_dim=self.q_head_dim,
                               kv_lora_rank=self.kv_lora_rank, rope_dim=self.rope_dim, v_head_dim=self.v_head_dim,
                               page_size=self.page_size, extra_topk=self.extra_topk,
                               extra_page_size=self.extra_page_size, arch=self.arch)

    def specs(self) -> list[KernelSpec]:
        """Every artifact the bundle needs: decode (split + combine) and extend. Each serves all
        row counts and split plans up to max_rows: those are launch arguments, not
        compile-time constants, so `sparse_mla.route` can pick either at any row count."""
        return [self.caps(m).spec(self.arch) for m in sparse_mla.MODES]


def prewarmed_keys() -> set[PrewarmKey]:
    with _lock:
        return set(_done)


def _warm_inputs(p: sparse_mla.SparseMLAPlan, rows: int, device: torch.device):
    """Small random inputs that touch one page; every launch really runs. Returns q, indices,
    lengths, the cache, and the extra list's bind and run arguments (empty without one)."""
    caps = p.caps
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(rows, caps.num_heads, caps.q_head_dim, device=device, dtype=torch.bfloat16, generator=g)
    idx = torch.randint(0, 64, (rows, caps.topk), device=device, dtype=torch.int32, generator=g)
    lengths = torch.full((rows,), caps.topk, device=device, dtype=torch.int32)
    if caps.kv_format == "model1_fp8":    # [blocks, page_bytes] pages
        rec = kv_record(caps.kv_format, caps.kv_lora_rank, caps.rope_dim)
        kv = torch.zeros(1, rec.page_bytes(caps.page_size), device=device, dtype=torch.uint8)
        bind_extra, run_extra = {}, {}
        if caps.extra_topk:
            bind_extra = dict(extra_indices=torch.randint(0, caps.extra_page_size, (rows, caps.extra_topk),
                                                          device=device, dtype=torch.int32, generator=g),
                              extra_lengths=torch.full((rows,), caps.extra_topk, device=device, dtype=torch.int32))
            run_extra = dict(extra_kv_cache=torch.zeros(1, rec.page_bytes(caps.extra_page_size), device=device,
                                                        dtype=torch.uint8))
        return q, idx % caps.page_size, lengths, kv, bind_extra, run_extra
    dtype, last = sparse_mla.kv_token(caps.kv_format, caps.kv_lora_rank, caps.rope_dim)
    kv = torch.zeros(1, 64, last, device=device, dtype=dtype)
    return q, idx, lengths, kv, {}, {}


def prewarm_sparse_mla(*, num_heads: int, kv_format: str = "fp8_ds_mla", topk: int = 2048, max_rows: int | None = None,
                       q_head_dim: int = 576, kv_lora_rank: int = 512, device: torch.device | str | None = None,
                       scratch: torch.Tensor | None = None, max_batched: int | None = None) -> PrewarmKey:
    """Resolve the bundle's artifacts (decode and extend) and launch each kernel at 1, 2, 4 and
    max_rows (default 256) rows; `prewarm(sparse_mla.plan(caps))` does this for one plan.

    `scratch` is the engine's own workspace when it has one (bound per call, never kept).
    (`max_batched` is the deprecated name of `max_rows`.)"""
    max_rows = renamed_kw(max_rows, max_batched, "max_batched", "max_rows", "prewarm_sparse_mla")
    max_rows = 256 if max_rows is None else max_rows
    device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    key = PrewarmKey(q_head_dim, kv_lora_rank, topk, max_rows, num_heads, kv_format, device_arch(device))
    with _lock:
        if key in _done:
            return key
    for spec in key.specs():
        registry.resolve(spec)
    with torch.cuda.device(device):
        plans = {m: sparse_mla.plan(key.caps(m)) for m in sparse_mla.MODES}
        need = max(p.scratch_bytes() for p in plans.values())
        if scratch is None:
            scratch = torch.empty(need, dtype=torch.uint8, device=device)
        for p in plans.values():
            _warm_sparse_mla_plan(p, max_rows, device, scratch)
        torch.cuda.synchronize(device)
    with _lock:
        _done.add(key)
    return key


def _warm_sparse_mla_plan(p: sparse_mla.SparseMLAPlan, max_rows: int, device: torch.device,
                          scratch: torch.Tensor) -> None:
    """Decode's split plans change with rows, extend's grid does: warm the row counts an engine's
    graphs use (1, 2, 4, max_rows, capped at the plan), binding the caller's scratch every call."""
    run = {"decode": sparse_mla.run_decode, "extend": sparse_mla.run_extend}[p.caps.mode]
    for rows in sorted({r for r in (1, 2, 4, max_rows) if r <= p.caps.max_rows}):
        q, idx, lengths, kv, bind_extra, run_extra = _warm_inputs(p, rows, device)
        b = p.bind(scratch, q=q, indices=idx, lengths=lengths, **bind_extra)
        run(b, kv_cache=kv, sm_scale=p.caps.q_head_dim ** -0.5, **run_extra)
        if b.ordered is not None and rows >= sparse_mla.ORDER_MIN_ROWS:
            # the locality pass runs only over caches beyond L2, which the warm-up's is not
            sparse_mla.order_rows(b)


def prewarm_indexer(caps, *, device: torch.device | str | None = None, scratch: torch.Tensor | None = None,
                    max_rows: int | None = None) -> list:
    """Resolve an indexer plan's artifacts and launch every route a call with up to max_rows
    (None: caps.max_rows) rows can take: the plan's path (fused with Caps.fused=True, else logits +
    top-k, in row batches with Caps.logits_rows) at one row and at max_rows rows, at a one-chunk
    width and at caps.max_width (the wide top-k), plus row pairs (the row-pair logits kernel; MTP
    rows when paged) on sm_90a; `prewarm(indexer.plan(caps))` runs this.

    Returns the (route, rows, width) triples that ran. `scratch` is the engine's workspace."""

    from . import indexer

    top = caps.max_rows if max_rows is None else min(max_rows, caps.max_rows)
    device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    base = indexer.plan(caps)
    for spec in base.specs():
        registry.resolve(spec)
    # a plan takes the fused path exactly when Caps.fused is True (IndexerPlan.use_fused): its own
    # route is the only one its calls take, and the caller's scratch (plan(caps)'s size) fits it
    route = "fused" if base.use_fused(1, caps.max_width) else "unfused"
    if scratch is None:
        scratch = torch.empty(base.scratch_bytes(), dtype=torch.uint8, device=device)
    ran = []
    t = base.tiling
    widths = sorted({min(caps.max_width, t["chunk"]), min(caps.max_width, max(t["chunk"], t["row_chunk"])),
                     caps.max_width})
    with torch.cuda.device(device):
        for rows in sorted({1, top}):
            for width in widths:
                _warm_indexer_call(base, scratch, rows, width, device)
                ran.append((route, rows, width))
        if base.logits_pair_spec is not None and top >= 2 and route == "unfused":
            # row pairs take the row-pair logits kernel: paged, two rows per request (MTP);
            # contiguous, any even row count
            pairs = "mtp-pairs" if caps.mode == "paged" else "row-pairs"
            for rows in sorted({2, top // 2 * 2}):
                for width in widths:
                    _warm_indexer_call(base, scratch, rows, width, device, rows_per_req=2)
                    ran.append((pairs, rows, width))
        torch.cuda.synchronize(device)
    return ran


def _warm_indexer_call(p, scratch: torch.Tensor, rows: int, width: int, device: torch.device,
                       rows_per_req: int = 1) -> None:
    """One index + top-k call on a tiny cache (every page of the block table is page 0)."""
    from . import indexer

    caps = p.caps
    h = caps.num_heads
    q = torch.zeros(rows, h, indexer.INDEX_DIM, device=device).to(torch.float8_e4m3fn)
    w = torch.ones(rows, h, device=device)
    if caps.mode == "paged":
        pages = -(-width // indexer.PAGE)
        bt = torch.zeros(rows // rows_per_req, pages, dtype=torch.int32, device=device)
        lengths = torch.full((rows,), width * caps.compress_ratio, dtype=torch.int32, device=device)
        kv = torch.zeros(1, indexer.PAGE, indexer.K_RECORD, dtype=torch.uint8, device=device)
        b = indexer.bind(p, scratch=scratch, q=q, weights=w, lengths=lengths, block_table=bt, width=width)
    else:
        kv = (torch.zeros(width, indexer.INDEX_DIM, device=device).to(torch.float8_e4m3fn),
              torch.ones(width, device=device))
        starts = torch.zeros(rows, dtype=torch.int32, device=device)
        ends = torch.full((rows,), width, dtype=torch.int32, device=device)
        b = indexer.bind(p, scratch=scratch, q=q, weights=w, lengths=ends, starts=starts, width=width)
    indexer.run_index_topk(b, kv_cache=kv)


# -- a catalog preset's whole bundle ---------------------------------------------------------
DEFAULT_MAX_WIDTH = 131072    # widest indexer row the warm-up launches, in cache entries (128K tokens at c = 1)


@renamed_fields(max_batched="max_rows")
@dataclass(frozen=True)
class PresetBundle:
    """What prewarm_preset warms for one catalog preset on one arch. Host data only: building it
    needs no device (num_sms is given), so the catalog can be checked against it on CPU."""

    preset: str
    arch: str
    num_sms: int
    max_rows: int
    max_width: int
    sparse_mla: tuple[PrewarmKey, ...]        # one per attention config: decode and extend
    indexer: tuple[_indexer.Caps, ...]        # paged per compress ratio and contiguous, with and without scores
    dcp: Optional[_dcp.DcpCaps]               # None: the preset has no DCP kernels

    def _mla_plans(self) -> list[sparse_mla.SparseMLAPlan]:
        return [sparse_mla.plan(replace(k.caps(m), num_sms=self.num_sms)) for k in self.sparse_mla
                for m in sparse_mla.MODES]

    def _dcp_plan(self) -> Optional[_dcp.DcpPlan]:
        return None if self.dcp is None else _dcp.plan(self.dcp, device="cuda")

    def specs(self) -> list[KernelSpec]:
        """Every artifact the warm-up resolves, in order, without duplicates. The DCP merge
        resolves its own kernels and the top-k with scores (not its plan's logits kernels)."""
        out: list[KernelSpec] = []
        for key in self.sparse_mla:
            out += key.specs()
        for caps in self.indexer:
            out += _indexer.plan(caps).specs()
        d = self._dcp_plan()
        if d is not None:
            out += [_dcp.DcpSpec(arch=self.arch), d.topk_plan.topk_spec]
        return list(dict.fromkeys(out))

    def scratch_bytes(self) -> int:
        """The largest scratch any warm-up plan binds: one buffer serves them all in turn."""
        plans = [*self._mla_plans(), *(_indexer.plan(c) for c in self.indexer)]
        d = self._dcp_plan()
        return max([p.scratch_bytes() for p in plans] + ([d.scratch_bytes()] if d is not None else []), default=0)


def preset_bundle(name: str, *, arch: str, num_sms: int, max_rows: int | None = None,
                  max_width: int = DEFAULT_MAX_WIDTH, dcp_world: int = 1, dcp_interleave: int = 1,
                  max_batched: int | None = None) -> PresetBundle:
    """The bundle of catalog preset `name` (codegen.catalog.PRESETS) for `arch`: what
    prewarm_preset resolves and launches. Raises codegen.catalog.PresetError for an unknown name.
    (`max_batched` is the deprecated name of `max_rows`.)"""
    spelt = "max_rows" if max_batched is None else "max_batched"
    max_rows = renamed_kw(max_rows, max_batched, "max_batched", "max_rows", "preset_bundle")
    preset = get_preset(name)
    require(isinstance(max_rows, int) and max_rows >= 1, f"{spelt}: expected an int >= 1, got {max_rows!r}")
    require(isinstance(max_width, int) and 1 <= max_width <= TOPK_WIDTH_MAX,
            f"max_width: expected an int in [1, {TOPK_WIDTH_MAX}], got {max_width!r}")
    mla: list[PrewarmKey] = []
    ix: list[_indexer.Caps] = []
    dcp_caps = None
    require(arch in preset.archs, f"arch: preset {name!r} has kernels for {', '.join(preset.archs)} only, got {arch!r}")
    for cfg in preset.configs:
        if isinstance(cfg, ModelConfig):
            q_dim, nope, rope, v_dim = cfg.head_dims
            mla.append(PrewarmKey(q_dim, nope, cfg.topk, max_rows, cfg.num_heads, cfg.kv_format, arch, rope, v_dim,
                                  cfg.page_size, cfg.extra_topk, cfg.extra_page_size))
        elif isinstance(cfg, IndexerConfig):
            shapes = [("paged", c) for c in cfg.compress_ratios] + [("contiguous", 1)]
            ix += [_indexer.Caps(num_heads=cfg.num_heads, topk=cfg.topk, compress_ratio=c, mode=mode,
                                 max_rows=max_rows, max_width=max_width, with_scores=scores, arch=arch,
                                 num_sms=num_sms)
                   for mode, c in shapes for scores in (False, True)]
        elif isinstance(cfg, DcpConfig):
            dcp_caps = _dcp.DcpCaps(topk=cfg.topk, world=dcp_world, interleave=dcp_interleave, max_rows=max_rows,
                                    arch=arch, num_sms=num_sms)
    require(dcp_world == 1 or dcp_caps is not None,
            f"dcp_group: preset {name!r} has no DCP kernels (a model preset has them), got a group of {dcp_world} ranks")
    return PresetBundle(name, arch, num_sms, max_rows, max_width, tuple(mla), tuple(ix), dcp_caps)


_presets_done: set = set()


def prewarm_preset(name: str, *, max_rows: int | None = None, max_width: int = DEFAULT_MAX_WIDTH,
                   device: torch.device | str | None = None, dcp_group=None, dcp_interleave: int = 1,
                   scratch: torch.Tensor | None = None, max_batched: int | None = None) -> PresetBundle:
    """Load every artifact of catalog preset `name` and launch each route once; then the engine
    calls b12x.freeze(). For a model preset (`b12x-codegen list`) that is everything its layers
    call: sparse MLA decode and extend (prewarm_sparse_mla), the indexer's paged, row-pair and
    contiguous logits, top-k with and without scores and the fused path (prewarm_indexer), and
    the DCP conversion, merge and owner filter.

    max_rows:    most query rows per call (decode batch, extend chunk, indexer rows, DCP rows);
                 `max_batched` is its deprecated name.
    max_width:   widest indexer logits row launched, in cache entries (default 131072); any width
                 up to 262144 runs on the same artifacts, this only sizes the warm-up.
    device:      a CUDA device; None: the current one.
    dcp_group:   the DCP process group; None: DCP world 1 (no collective; the DCP kernels still
                 run once). With a group, every rank must call this with the same arguments: the
                 real merge path runs (all-gather included) with a barrier after each pass.
    dcp_interleave: the DCP interleave I of the KV shards.
    scratch:     the engine's workspace (uint8, at least bundle.scratch_bytes()); None: one
                 buffer is allocated for the warm-up and freed after it.

    Memoised per (bundle, device, rank), recorded only after every launch succeeded. Returns the
    bundle (bundle.specs() lists the artifacts now loaded)."""
    max_rows = renamed_kw(max_rows, max_batched, "max_batched", "max_rows", "prewarm_preset")
    require(max_rows is not None, "max_rows: expected an int >= 1 (most query rows per call), got None")
    get_preset(name)  # an unknown name fails before the device is touched
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    require(device.type == "cuda", f"device: expected a CUDA device, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    world, rank = 1, 0
    if dcp_group is not None:
        import torch.distributed as dist

        world, rank = dist.get_world_size(dcp_group), dist.get_rank(dcp_group)
    bundle = preset_bundle(name, arch=device_arch(device), num_sms=device_num_sms(device), max_rows=max_rows,
                           max_width=max_width, dcp_world=world, dcp_interleave=dcp_interleave)
    memo = (bundle, device, rank)
    with _lock:
        if memo in _presets_done:
            return bundle
    with torch.cuda.device(device):
        for spec in bundle.specs():   # everything loaded first: a missing artifact fails before any launch
            registry.resolve(spec)
        need = bundle.scratch_bytes()
        if scratch is None:
            scratch = torch.empty(need, dtype=torch.uint8, device=device)
        _scratch.check(scratch, need, device)
        for key in bundle.sparse_mla:
            prewarm_sparse_mla(num_heads=key.num_heads, kv_format=key.kv_format, topk=key.topk,
                               max_rows=key.max_rows, q_head_dim=key.q_head_dim, kv_lora_rank=key.kv_lora_rank,
                               device=device, scratch=scratch)
        for caps in bundle.indexer:
            prewarm_indexer(caps, device=device, scratch=scratch)
        if bundle.dcp is not None:
            _prewarm_dcp(bundle.dcp, scratch, rank, max_rows, dcp_group, device)
        torch.cuda.synchronize(device)
    with _lock:
        _presets_done.add(memo)
    return bundle


def _prewarm_dcp(caps_or_plan, scratch: torch.Tensor, rank: int, max_rows: int, group,
                 device: torch.device) -> None:
    """The merge path (convert + pack, all-gather when world > 1, candidate top-k, finalize) at
    the merge prewarm's row counts, then one conversion and one owner filter (no collective)."""
    p = caps_or_plan if isinstance(caps_or_plan, _dcp.DcpPlan) else _dcp.plan(caps_or_plan, device=device)
    _dcp.prewarm_dcp_merge(p, scratch=scratch, rank=rank, max_rows=max_rows, group=group)
    k = p.caps.topk
    ids = torch.full((1, k), -1, dtype=torch.int32, device=device)
    ids[0, :8] = torch.arange(8, dtype=torch.int32, device=device)
    scores = torch.where(ids >= 0, torch.zeros_like(ids, dtype=torch.float32), -math.inf)
    out_ids, out_scores = torch.empty_like(ids), torch.empty_like(scores)
    _dcp.convert_to_global(p, local_ids=ids, local_scores=scores, out_ids=out_ids, out_scores=out_scores, rank=rank)
    _dcp.filter_local(p, global_ids=out_ids, out_local=torch.empty_like(ids),
                      lengths=torch.empty(1, dtype=torch.int32, device=device), rank=rank)


# -- one signature for every op ----------------------------------------------------------------
_FAMILIES = {sparse_mla.Caps: sparse_mla.plan, _indexer.Caps: _indexer.plan}


def _as_plan(target, device: torch.device) -> Plan:
    if isinstance(target, Plan):
        return target
    if isinstance(target, _dcp.DcpCaps):
        return _dcp.plan(target, device=device)
    make = _FAMILIES.get(type(target))
    require(make is not None, "prewarm: expected plans or Caps of b12x.attention.sparse_mla, b12x.indexer or "
                              f"b12x.dcp, got {type(target).__name__}")
    return make(target)


def prewarm(*plans, max_rows: int | None = None, device: torch.device | str | None = None,
            scratch: torch.Tensor | None = None, group=None) -> list[Plan]:
    """Prewarm every route of each plan (or Caps) of any op, then return the plans in order.

    max_rows: the most rows the warm-up launches (capped at each plan's caps.max_rows); None:
              each plan's caps.max_rows. Row counts below it (1, 2, 4, ...) are launched too.
    device:   a CUDA device (None: the current one); a DCP plan made for CPU runs there.
    scratch:  the engine's uint8 workspace, at least max(plan.scratch_bytes()); None: one buffer
              is allocated for the warm-up and freed after it. Bound per call, never kept.
    group:    the DCP process group (None: the default one when initialised). DCP plans with
              world > 1 run the real merge (all-gather included), a barrier after each pass, with
              this rank's rank in the group: every rank must make the same call.

    Every artifact is resolved (`plan.specs()`) before the first launch, so a missing one fails
    before anything runs."""
    require(max_rows is None or (isinstance(max_rows, int) and max_rows >= 1),
            f"max_rows: expected None or an int >= 1, got {max_rows!r}")
    cpu_only = bool(plans) and all(isinstance(t, _dcp.DcpPlan) and t.device_type == "cpu" for t in plans)
    if device is None:
        device = torch.device("cpu") if cpu_only else torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    out = [_as_plan(t, device) for t in plans]
    for p in out:
        for spec in p.specs():
            registry.resolve(spec)
    need = max((p.scratch_bytes() for p in out), default=0)
    if scratch is None:
        scratch = torch.empty(need, dtype=torch.uint8, device=device)
    _scratch.check(scratch, need, device)
    for p in out:
        rows = p.caps.max_rows if max_rows is None else min(max_rows, p.caps.max_rows)
        if isinstance(p, sparse_mla.SparseMLAPlan):
            with torch.cuda.device(device):
                _warm_sparse_mla_plan(p, rows, device, scratch)
        elif isinstance(p, _indexer.IndexerPlan):
            prewarm_indexer(p.caps, device=device, scratch=scratch, max_rows=rows)
        else:
            _prewarm_dcp(p, scratch, _group_rank(p.caps.world, group), rows, group, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out


def _group_rank(world: int, group) -> int:
    import torch.distributed as dist

    if world > 1 or group is not None:
        require(dist.is_available() and dist.is_initialized(),
                f"group: expected an initialised torch.distributed process group for DCP world={world}, got none")
        return dist.get_rank(group)
    return 0
