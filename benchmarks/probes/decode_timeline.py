"""Timeline of the 64-head fp8 decode split kernel, from a probe build (decode_timeline.patch):
each role's thread 0 writes clock deltas from kernel entry into the split's lse slots. Prints the
median over CTAs of each event, µs at 1.8 GHz, for one cold call (fresh indices)."""
import sys

import torch

sys.path.insert(0, ".")
from b12x.attention import sparse_mla as sm  # noqa: E402
from benchmarks.bench_sparse_mla_decode import make_pool  # noqa: E402

NAMES = {0: "wg0 griddep done, Q -> fp16 starts", 3: "wg1 griddep done", 1: "wg0 Q fp16 published",
         2: "producer: tile 0 records requested", 36: "wg0 epilogue start", 37: "wg0 partials issued",
         38: "wg1 epilogue start", 39: "wg1 partials issued"}
for t in range(4):
    b = 4 + 8 * t
    NAMES.update({b: f"t{t} wg0 FULL passed", b + 1: f"t{t} wg0 softmax + P published",
                  b + 2: f"t{t} wg0 PV done", b + 3: f"t{t} wg1 P passed, O rescaled", b + 4: f"t{t} wg1 PV done",
                  b + 5: f"t{t} producer dequant starts", b + 6: f"t{t} producer FULL arrived", b + 7: f"t{t} wg0 S done"})

g = torch.Generator(device="cuda").manual_seed(0)
pool = make_pool("fp8_ds_mla", 32768, g)
for batch in (4, 8):
    p = sm.plan(sm.Caps(num_heads=128, topk=2048, kv_format="fp8_ds_mla", max_batched=batch))
    scratch = torch.full((p.scratch_bytes(),), 0xFF, dtype=torch.uint8, device="cuda")
    q = torch.randn(batch, 128, 576, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, pool.shape[0] * 64, (batch, 2048), device="cuda", generator=g, dtype=torch.int32)
    lengths = torch.full((batch,), 2048, device="cuda", dtype=torch.int32)
    bnd = sm.bind(p, scratch=scratch, q=q, indices=idx, lengths=lengths)
    for _ in range(3):
        sm.run_decode(bnd, kv_cache=pool, sm_scale=576 ** -0.5)
    torch.cuda.synchronize()
    bnd.partial_lse.fill_(float("nan"))
    idx.copy_(torch.randint(0, pool.shape[0] * 64, (batch, 2048), device="cuda", generator=g, dtype=torch.int32))
    sm.run_decode(bnd, kv_cache=pool, sm_scale=576 ** -0.5)
    torch.cuda.synchronize()
    ev = bnd.partial_lse.reshape(-1, 64).float()
    med = ev.nanmedian(dim=0).values
    lo = torch.nanquantile(ev, 0.1, dim=0)
    hi = torch.nanquantile(ev, 0.9, dim=0)
    print(f"== B={batch} h=128, splits {bnd.partial_o.shape[1]}, CTAs {ev.shape[0]}: µs from kernel entry "
          "(median, 10%-90%)")
    for s in sorted(NAMES):
        v = med[s].item()
        if v == v:
            print(f"  {s:2d} {NAMES[s]:38s} {v / 1800:6.2f}  ({lo[s].item() / 1800:5.2f}-{hi[s].item() / 1800:5.2f})")
