"""Prewarm bundles: make every kernel a model configuration can dispatch to built, loaded and
launched once, before CUDA-graph capture and before freeze().

`prewarm_preset(name, max_batched=...)` warms a catalog preset's whole bundle (for a model
preset: sparse MLA decode and extend, the indexer's logits, top-k and fused routes, the DCP
kernels). The per-family calls below it stay usable on their own: a sparse MLA bundle is keyed
by (q_head_dim, kv_lora_rank, topk, max_batched), qualified by arch, heads and KV format.
Prewarm binds caller-style scratch per call (plan.bind(scratch=...)), and a key is recorded only
after its warm-up launches succeeded."""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Optional

import torch

from codegen.catalog import DcpConfig, IndexerConfig, ModelConfig, get_preset
from codegen.indexer_specs import TOPK_WIDTH_MAX
from codegen.specs import KernelSpec

from . import dcp as _dcp
from . import indexer as _indexer
from . import registry
from . import scratch as _scratch
from .attention import sparse_mla
from .device import device_arch, num_sms as device_num_sms
from .validate import require

_lock = threading.Lock()
_done: set["PrewarmKey"] = set()


@dataclass(frozen=True)
class PrewarmKey:
    q_head_dim: int
    kv_lora_rank: int
    topk: int
    max_batched: int
    num_heads: int
    kv_format: str
    arch: str

    def caps(self, mode: str = "decode") -> sparse_mla.Caps:
        return sparse_mla.Caps(num_heads=self.num_heads, topk=self.topk, kv_format=self.kv_format,
                               max_batched=self.max_batched, mode=mode, q_head_dim=self.q_head_dim,
                               kv_lora_rank=self.kv_lora_rank, arch=self.arch)

    def specs(self) -> list[KernelSpec]:
        """Every artifact the bundle needs: decode (split + combine) and extend. Each serves all
        row counts and split plans up to max_batched: those are launch arguments, not
        compile-time constants, so `sparse_mla.route` can pick either at any row count."""
        return [self.caps(m).spec(self.arch) for m in sparse_mla.MODES]


def prewarmed_keys() -> set[PrewarmKey]:
    with _lock:
        return set(_done)


def _warm_inputs(p: sparse_mla.SparseMLAPlan, rows: int, device: torch.device):
    """Small random inputs that touch one page; every launch really runs."""
    caps = p.caps
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(rows, caps.num_heads, sparse_mla.Q_DIM, device=device, dtype=torch.bfloat16, generator=g)
    idx = torch.randint(0, 64, (rows, caps.topk), device=device, dtype=torch.int32, generator=g)
    lengths = torch.full((rows,), caps.topk, device=device, dtype=torch.int32)
    dtype, last = sparse_mla._KV_LAST[caps.kv_format]
    kv = torch.zeros(1, 64, last, device=device, dtype=dtype)
    return q, idx, lengths, kv


def prewarm_sparse_mla(*, num_heads: int, kv_format: str = "fp8_ds_mla", topk: int = 2048, max_batched: int = 256,
                       q_head_dim: int = 576, kv_lora_rank: int = 512, device: torch.device | str | None = None,
                       scratch: torch.Tensor | None = None) -> PrewarmKey:
    """Resolve the bundle's artifacts and launch each kernel at 1 and at max_batched rows.

    `scratch` is the engine's own workspace when it has one (bound per call, never kept)."""
    device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    key = PrewarmKey(q_head_dim, kv_lora_rank, topk, max_batched, num_heads, kv_format, device_arch(device))
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
        run = {"decode": sparse_mla.run_decode, "extend": sparse_mla.run_extend}
        for mode, p in plans.items():
            # decode's split plans change with rows, extend's grid does: warm the row counts an
            # engine's graphs use, binding the caller's scratch for every call
            for rows in sorted({1, 2, 4, max_batched}):
                q, idx, lengths, kv = _warm_inputs(p, rows, device)
                b = p.bind(scratch, q=q, indices=idx, lengths=lengths)
                run[mode](b, kv_cache=kv, sm_scale=q_head_dim ** -0.5)
        torch.cuda.synchronize(device)
    with _lock:
        _done.add(key)
    return key


def prewarm_indexer(caps, *, device: torch.device | str | None = None, scratch: torch.Tensor | None = None) -> list:
    """Resolve an indexer plan's artifacts and launch every route a call with up to
    caps.max_batched rows can take: the fused path and logits + top-k, each at one row and at
    max_batched rows, at a one-chunk width and at caps.max_width (the wide top-k), plus MTP row
    pairs (the row-pair logits kernel) on paged sm_90a.

    Returns the (route, rows, width) triples that ran. `scratch` is the engine's workspace."""
    import dataclasses

    from . import indexer

    device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
    base = indexer.plan(caps)
    for spec in base.specs():
        registry.resolve(spec)
    routes = [("unfused", False)] + ([("fused", True)] if base.fused_spec is not None else [])
    plans = {name: indexer.plan(dataclasses.replace(caps, fused=flag)) for name, flag in routes}
    if scratch is None:
        scratch = torch.empty(max(p.scratch_bytes() for p in plans.values()), dtype=torch.uint8, device=device)
    ran = []
    t = base.tiling
    widths = sorted({min(caps.max_width, t["chunk"]), min(caps.max_width, max(t["chunk"], t["row_chunk"])),
                     caps.max_width})
    with torch.cuda.device(device):
        for name, p in plans.items():
            for rows in sorted({1, caps.max_batched}):
                for width in widths:
                    _warm_indexer_call(p, scratch, rows, width, device)
                    ran.append((name, rows, width))
        if base.logits_pair_spec is not None and caps.max_batched >= 2:
            # MTP: two query rows per request take the row-pair logits kernel
            p = plans["unfused"]
            for rows in sorted({2, caps.max_batched // 2 * 2}):
                for width in widths:
                    _warm_indexer_call(p, scratch, rows, width, device, rows_per_req=2)
                    ran.append(("mtp-pairs", rows, width))
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


@dataclass(frozen=True)
class PresetBundle:
    """What prewarm_preset warms for one catalog preset on one arch. Host data only: building it
    needs no device (num_sms is given), so the catalog can be checked against it on CPU."""

    preset: str
    arch: str
    num_sms: int
    max_batched: int
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


def preset_bundle(name: str, *, arch: str, num_sms: int, max_batched: int, max_width: int = DEFAULT_MAX_WIDTH,
                  dcp_world: int = 1, dcp_interleave: int = 1) -> PresetBundle:
    """The bundle of catalog preset `name` (codegen.catalog.PRESETS) for `arch`: what
    prewarm_preset resolves and launches. Raises codegen.catalog.PresetError for an unknown name."""
    preset = get_preset(name)
    require(isinstance(max_batched, int) and max_batched >= 1,
            f"max_batched: expected an int >= 1, got {max_batched!r}")
    require(isinstance(max_width, int) and 1 <= max_width <= TOPK_WIDTH_MAX,
            f"max_width: expected an int in [1, {TOPK_WIDTH_MAX}], got {max_width!r}")
    mla: list[PrewarmKey] = []
    ix: list[_indexer.Caps] = []
    dcp_caps = None
    for cfg in preset.configs:
        if isinstance(cfg, ModelConfig):
            mla.append(PrewarmKey(sparse_mla.Q_DIM, 512, cfg.topk, max_batched, cfg.num_heads, cfg.kv_format, arch))
        elif isinstance(cfg, IndexerConfig):
            shapes = [("paged", c) for c in cfg.compress_ratios] + [("contiguous", 1)]
            ix += [_indexer.Caps(num_heads=cfg.num_heads, topk=cfg.topk, compress_ratio=c, mode=mode,
                                 max_batched=max_batched, max_width=max_width, with_scores=scores, arch=arch,
                                 num_sms=num_sms)
                   for mode, c in shapes for scores in (False, True)]
        elif isinstance(cfg, DcpConfig):
            dcp_caps = _dcp.DcpCaps(k=cfg.topk, world=dcp_world, interleave=dcp_interleave, max_rows=max_batched,
                                    arch=arch, num_sms=num_sms)
    require(dcp_world == 1 or dcp_caps is not None,
            f"dcp_group: preset {name!r} has no DCP kernels (a model preset has them), got a group of {dcp_world} ranks")
    return PresetBundle(name, arch, num_sms, max_batched, max_width, tuple(mla), tuple(ix), dcp_caps)


_presets_done: set = set()


def prewarm_preset(name: str, *, max_batched: int, max_width: int = DEFAULT_MAX_WIDTH,
                   device: torch.device | str | None = None, dcp_group=None, dcp_interleave: int = 1,
                   scratch: torch.Tensor | None = None) -> PresetBundle:
    """Load every artifact of catalog preset `name` and launch each route once; then the engine
    calls b12x.freeze(). For a model preset (`b12x-codegen list`) that is everything its layers
    call: sparse MLA decode and extend (prewarm_sparse_mla), the indexer's paged, row-pair and
    contiguous logits, top-k with and without scores and the fused path (prewarm_indexer), and
    the DCP conversion, merge and owner filter.

    max_batched: most query rows per call (decode batch, extend chunk, indexer rows, DCP rows).
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
    bundle = preset_bundle(name, arch=device_arch(device), num_sms=device_num_sms(device), max_batched=max_batched,
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
                               max_batched=key.max_batched, q_head_dim=key.q_head_dim, kv_lora_rank=key.kv_lora_rank,
                               device=device, scratch=scratch)
        for caps in bundle.indexer:
            prewarm_indexer(caps, device=device, scratch=scratch)
        if bundle.dcp is not None:
            _prewarm_dcp(bundle.dcp, scratch, rank, max_batched, dcp_group, device)
        torch.cuda.synchronize(device)
    with _lock:
        _presets_done.add(memo)
    return bundle


def _prewarm_dcp(caps: _dcp.DcpCaps, scratch: torch.Tensor, rank: int, max_batched: int, group,
                 device: torch.device) -> None:
    """The merge path (convert + pack, all-gather when world > 1, candidate top-k, finalize) at
    the merge prewarm's row counts, then one conversion and one owner filter (no collective)."""
    p = _dcp.plan(caps, device=device)
    _dcp.prewarm_dcp_merge(p, scratch=scratch, rank=rank, max_batched=max_batched, group=group)
    k = caps.k
    ids = torch.full((1, k), -1, dtype=torch.int32, device=device)
    ids[0, :8] = torch.arange(8, dtype=torch.int32, device=device)
    scores = torch.where(ids >= 0, torch.zeros_like(ids, dtype=torch.float32), -math.inf)
    out_ids, out_scores = torch.empty_like(ids), torch.empty_like(scores)
    _dcp.convert_to_global(p, local_ids=ids, local_scores=scores, out_ids=out_ids, out_scores=out_scores, rank=rank)
    _dcp.filter_local(p, global_ids=out_ids, out_local=torch.empty_like(ids),
                      lengths=torch.empty(1, dtype=torch.int32, device=device), rank=rank)
