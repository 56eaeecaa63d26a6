"""Repeat runs of the 64-head-block sparse MLA kernels give the same bits every time: a race in a
staged epilogue or a missing barrier would corrupt some rows under some timings only. Each case
is captured in a CUDA graph and replayed hundreds of times, every other replay beside a matmul
on a second stream (other work on the SMs changes the timings), and every result is compared bit
for bit with the first (which is checked against the reference). Kernels: presets sparse-mla-all
and deepseek-v4-pro-tp1 (`b12x-codegen build --arch sm_90a`)."""
import pytest
import torch

from b12x.attention import sparse_mla as sm
from b12x.reference import V4_DIM, quantize_model1_fp8
from .sparse_mla_cases import check, random_case
from .test_sparse_mla_v4_bf16_gpu import check as check_v4_bf16

pytestmark = pytest.mark.gpu

REPLAYS = 300


def replay_and_compare(launch, outs, side_work) -> tuple[int, list]:
    """Capture `launch`, replay it REPLAYS times: (how many replays differ from the first, the first)."""
    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    graph.replay()
    first = [t.clone() for t in outs]
    side = torch.cuda.Stream()
    bad = torch.zeros((), dtype=torch.int32, device="cuda")
    for i in range(REPLAYS):
        for t in outs:
            t.fill_(float("nan"))
        if i % 2:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                side_work()
        graph.replay()
        for t, f in zip(outs, first):
            bits = torch.int16 if t.dtype == torch.bfloat16 else torch.int32    # NaN != NaN: compare bits
            bad += (t.view(bits) != f.view(bits)).any().int()
    torch.cuda.synchronize()
    return int(bad.item()), first


@pytest.fixture(scope="module")
def side_work():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return lambda: a @ a


@pytest.mark.parametrize("kv_format", ("fp8_ds_mla", "bf16"))
@pytest.mark.parametrize("heads", (64, 128))
@pytest.mark.parametrize("mode,rows", (("extend", 3), ("extend", 300), ("decode", 3), ("decode", 300)))
def test_v32_64_head_blocks_repeat_bit_for_bit(kv_format, heads, mode, rows, side_work):
    """Decode at 300 rows runs one split per row: the whole-row (extend) kernel, as large-batch
    decode does."""
    case = random_case(rows, heads, 512, kv_format, blocks=64, seed=rows + heads)
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format=kv_format, max_rows=rows, mode=mode))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")
    b = p.bind(scratch, q=case.q, indices=case.indices, lengths=case.lengths, out=out, lse=lse)
    run = sm.run_extend if mode == "extend" else sm.run_decode
    bad, first = replay_and_compare(lambda: run(b, kv_cache=case.kv, sm_scale=case.sm_scale), (out, lse), side_work)
    check(case, *first)
    assert bad == 0, f"{bad} of {REPLAYS} replays differ from the first"


@pytest.mark.parametrize("heads", (64, 128))
@pytest.mark.parametrize("mode,rows", (("extend", 3), ("extend", 300), ("decode", 3), ("decode", 300)))
def test_v4_64_head_blocks_repeat_bit_for_bit(heads, mode, rows, side_work):
    g = torch.Generator(device="cuda").manual_seed(heads + rows)
    main = quantize_model1_fp8(torch.randn(8, 256, V4_DIM, device="cuda", generator=g))
    extra = quantize_model1_fp8(torch.randn(32, 64, V4_DIM, device="cuda", generator=g))
    xtopk = 1024 if heads == 128 else 512
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 8 * 256, (rows, 128), device="cuda", generator=g, dtype=torch.int32)
    xidx = torch.randint(0, 32 * 64, (rows, xtopk), device="cuda", generator=g, dtype=torch.int32)
    lens = torch.full((rows,), 128, dtype=torch.int32, device="cuda")
    xlens = torch.randint(1, xtopk + 1, (rows,), device="cuda", generator=g, dtype=torch.int32)
    p = sm.plan(sm.v4_caps(num_heads=heads, topk=512, page_size=256, extra_topk=xtopk, extra_page_size=64,
                           max_rows=rows, mode=mode))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.empty(rows, heads, V4_DIM, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lens, out=out, lse=lse, extra_indices=xidx, extra_lengths=xlens)
    run = sm.run_extend if mode == "extend" else sm.run_decode
    bad, first = replay_and_compare(lambda: run(b, kv_cache=main, sm_scale=V4_DIM ** -0.5, extra_kv_cache=extra),
                                    (out, lse), side_work)
    assert not first[0].isnan().any() and not first[1].isnan().any()
    assert bad == 0, f"{bad} of {REPLAYS} replays differ from the first"


@pytest.mark.parametrize("heads", (64, 128))
@pytest.mark.parametrize("mode,rows", (("extend", 3), ("extend", 300), ("decode", 3), ("decode", 300)))
def test_v4_dims_bf16_64_head_blocks_repeat_bit_for_bit(heads, mode, rows, side_work):
    """bf16 KV at DeepSeek-V4's dims (V over the RoPE block). racecheck reports RAW hazards on the
    64-head extend's staged out tile, the arrive / sync pattern it misreads in every role form
    (docs/notes/sanitizers.md); this runs that seam under varied timings instead."""
    g = torch.Generator(device="cuda").manual_seed(heads + rows + 1)
    kv = torch.randn(48, 64, V4_DIM, device="cuda", generator=g).bfloat16()
    q = torch.randn(rows, heads, V4_DIM, device="cuda", generator=g).bfloat16()
    idx = torch.randint(0, 48 * 64, (rows, 2048), device="cuda", generator=g, dtype=torch.int32)
    idx[torch.rand(rows, 2048, device="cuda", generator=g) < 0.1] = -1
    lens = torch.randint(1024, 2049, (rows,), device="cuda", generator=g, dtype=torch.int32)
    p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format="bf16", **sm.V4_HEAD_DIMS, max_rows=rows, mode=mode))
    scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
    out = torch.empty(rows, heads, V4_DIM, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")
    b = p.bind(scratch, q=q, indices=idx, lengths=lens, out=out, lse=lse)
    run = sm.run_extend if mode == "extend" else sm.run_decode
    bad, first = replay_and_compare(lambda: run(b, kv_cache=kv, sm_scale=V4_DIM ** -0.5), (out, lse), side_work)
    check_v4_bf16(q, kv, idx, lens, *first)
    assert bad == 0, f"{bad} of {REPLAYS} replays differ from the first"
