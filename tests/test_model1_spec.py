"""DeepSeek-V4's model1_fp8 format as a sparse MLA spec: validation names the field, the module
is the V3.2 kernel with the model1 format block, and the runtime checks the page tensor."""
import dataclasses

import pytest
import torch

from b12x.attention import sparse_mla as sm
from b12x.errors import InputError
from b12x.reference import model1_page_bytes, quantize_model1_fp8
from codegen.render import render
from codegen.specs import SparseMLASpec, SpecError

V4 = dict(q_head_dim=512, kv_lora_rank=448, rope_dim=64, v_head_dim=512, kv_format="model1_fp8")


def test_validation_names_the_field():
    with pytest.raises(SpecError, match=r"q_head_dim: got 576; allowed: 512 \(kv_format 'model1_fp8'\)"):
        SparseMLASpec(kv_format="model1_fp8", num_heads=16)
    with pytest.raises(SpecError, match=r"page_size: got 128; allowed: 64, 256"):
        SparseMLASpec(**V4, num_heads=16, page_size=128)
    for heads in (8, 16, 32, 64, 128):   # every head count on sm_90a
        SparseMLASpec(**V4, num_heads=heads)
    SparseMLASpec(**V4, num_heads=16, arch="sm_120a")     # the raw shared-memory form
    with pytest.raises(SpecError, match=r"page_size: got 256; allowed: 64 \(kv_format 'fp8_ds_mla'\)"):
        SparseMLASpec(num_heads=16, page_size=256)


@pytest.mark.parametrize("page", (64, 256))
def test_module_is_the_register_form_with_the_model1_block(page):
    spec = SparseMLASpec(**V4, num_heads=16, page_size=page)
    src = render(spec)
    assert "Model1RegsGather" in src and "Fp8RegsGather" not in src
    # 32 heads and more: the producer form, with P beside the K stages (V covers the RoPE block)
    big = render(SparseMLASpec(**V4, num_heads=32, page_size=page, extra_topk=1024, extra_page_size=64))
    assert "Model1TwoListsProducer" in big and "P_IN_ROPE = False" in big and "P_STAGES = 2" in big
    assert f"PAGE_SIZE = {page} " in src and "D_QK = 512" in src and "D_V = 512" in src
    assert spec.name == "sparse_mla_decode_h16_k2048_model1_fp8" + ("" if page == 64 else f"_p{page}") + "_sm_90a"


def test_runtime_checks_the_pages():
    caps = sm.Caps(num_heads=8, kv_format="model1_fp8", q_head_dim=512, kv_lora_rank=448, page_size=256,
                   arch="sm_90a", num_sms=132, max_rows=4)
    p = sm.plan(caps)
    pages = quantize_model1_fp8(torch.randn(2, 256, 512))
    assert pages.shape == (2, model1_page_bytes(256))
    sm.check_kv_cache(pages, "model1_fp8", pages.device, kv_lora_rank=448, rope_dim=64, page_size=256)
    wide = torch.zeros(2, model1_page_bytes(256) + 576, dtype=torch.uint8)[:, :model1_page_bytes(256)]
    sm.check_kv_cache(wide, "model1_fp8", wide.device, kv_lora_rank=448, rope_dim=64, page_size=256)  # a page-strided view
    with pytest.raises(InputError, match=r"kv_cache: expected shape \(\*, 37440\)"):
        sm.check_kv_cache(pages, "model1_fp8", pages.device, kv_lora_rank=448, rope_dim=64, page_size=64)
    with pytest.raises(InputError, match="q: expected shape"):
        p.bind(torch.empty(p.scratch_bytes(), dtype=torch.uint8), q=torch.zeros(2, 8, 576, dtype=torch.bfloat16),
               indices=torch.zeros(2, 64, dtype=torch.int32), lengths=torch.zeros(2, dtype=torch.int32))


def test_extra_list_fields_and_binding():
    with pytest.raises(SpecError, match=r"extra_page_size: got 4; allowed: 0, 64, 2"):
        SparseMLASpec(**V4, num_heads=16, extra_topk=512, extra_page_size=4)
    with pytest.raises(SpecError, match="extra_topk: got 0"):
        SparseMLASpec(**V4, num_heads=16, extra_page_size=64)
    with pytest.raises(SpecError, match="extra_page_size: got 64; allowed: 0"):
        SparseMLASpec(num_heads=16, extra_topk=512, extra_page_size=64)      # fp8_ds_mla has no extra list
    spec = SparseMLASpec(**V4, num_heads=8, topk=512, page_size=256, extra_topk=8192, extra_page_size=2)
    src = render(spec)
    assert "Model1TwoListsGather" in src and "TwoListsSplitKernel" in src and "EXTRA_PAGE_SIZE = 2" in src
    assert spec.name == "sparse_mla_decode_h8_k512_x8192p2_model1_fp8_p256_sm_90a"
    assert "MAX_SPLITS = 32" in src

    caps = sm.Caps(num_heads=16, topk=512, kv_format="model1_fp8", q_head_dim=512, kv_lora_rank=448, page_size=256,
                   extra_topk=1024, extra_page_size=64, arch="sm_90a", num_sms=132, max_rows=8)
    p = sm.plan(caps)
    scr = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    q = torch.zeros(4, 16, 512, dtype=torch.bfloat16)

    def z(*shape):
        return torch.zeros(*shape, dtype=torch.int32)

    b = p.bind(scr, q=q, indices=z(4, 128), lengths=z(4), extra_indices=z(4, 512), extra_lengths=z(4))
    # the splits cover the main entries then the extra ones: 640 positions over the partials
    assert b.partial_o.shape[1] * b.tokens_per_split >= 640
    assert len(b.lists("main", "extra")) == 6 and b.lists("main", "extra")[3] == "extra"
    with pytest.raises(InputError, match="extra_indices, extra_lengths: expected tensors"):
        p.bind(scr, q=q, indices=z(4, 128), lengths=z(4))
    with pytest.raises(InputError, match=r"extra_indices: expected a width that is a multiple of 64 in \[64, 1024\]"):
        p.bind(scr, q=q, indices=z(4, 128), lengths=z(4), extra_indices=z(4, 2048), extra_lengths=z(4))
    one = sm.plan(sm.Caps(num_heads=16, kv_format="model1_fp8", q_head_dim=512, kv_lora_rank=448, arch="sm_90a",
                          num_sms=132, max_rows=8))
    with pytest.raises(InputError, match="extra_indices, extra_lengths: expected None"):
        one.bind(torch.empty(one.scratch_bytes(), dtype=torch.uint8), q=q, indices=z(4, 128), lengths=z(4),
                 extra_indices=z(4, 64), extra_lengths=z(4))


def test_run_checks_the_extra_cache_before_launch():
    caps = sm.Caps(num_heads=16, topk=512, kv_format="model1_fp8", q_head_dim=512, kv_lora_rank=448, page_size=256,
                   extra_topk=1024, extra_page_size=64, arch="sm_90a", num_sms=132, max_rows=8)
    p = sm.plan(caps)
    scr = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    z = torch.zeros(2, 128, dtype=torch.int32)
    b = p.bind(scr, q=torch.zeros(2, 16, 512, dtype=torch.bfloat16), indices=z, lengths=z[:, 0].contiguous(),
               extra_indices=torch.zeros(2, 64, dtype=torch.int32), extra_lengths=z[:, 0].contiguous())
    main = quantize_model1_fp8(torch.randn(1, 256, 512))
    with pytest.raises(InputError, match="extra_kv_cache: expected the extra list's cache"):
        sm.run_decode(b, kv_cache=main, sm_scale=1.0)
    with pytest.raises(InputError, match=r"extra_kv_cache: expected shape \(\*, 37440\)"):
        sm.run_decode(b, kv_cache=main, sm_scale=1.0, extra_kv_cache=main)      # pages of 256, not 64
    one = sm.plan(sm.Caps(num_heads=16, kv_format="model1_fp8", q_head_dim=512, kv_lora_rank=448, page_size=256,
                          arch="sm_90a", num_sms=132, max_rows=8))
    b1 = one.bind(torch.empty(one.scratch_bytes(), dtype=torch.uint8), q=torch.zeros(2, 16, 512, dtype=torch.bfloat16),
                  indices=z, lengths=z[:, 0].contiguous())
    with pytest.raises(InputError, match="extra_kv_cache: expected None for a plan without an extra list"):
        sm.run_decode(b1, kv_cache=main, sm_scale=1.0, extra_kv_cache=main)


def test_prewarm_inputs_pass_every_check_but_the_device():
    """prewarm's warm-up inputs for a two-list plan bind and pass run's checks up to the launch
    (on the CPU only the CUDA-device check stops them)."""
    from b12x.prewarm import _warm_inputs

    caps = sm.v4_caps(num_heads=16, topk=512, page_size=256, extra_topk=8192, extra_page_size=2, max_rows=8)
    p = sm.plan(dataclasses.replace(caps, arch="sm_90a", num_sms=132))
    q, idx, lengths, kv, bind_extra, run_extra = _warm_inputs(p, 4, torch.device("cpu"))
    b = p.bind(torch.empty(p.scratch_bytes(), dtype=torch.uint8), q=q, indices=idx, lengths=lengths, **bind_extra)
    with pytest.raises(InputError, match="q: expected a CUDA tensor to launch on"):
        sm.run_decode(b, kv_cache=kv, sm_scale=512 ** -0.5, **run_extra)
