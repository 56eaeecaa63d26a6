"""One facade shape for every op (b12x/plan.py): the same Caps field names, plans that are
b12x.plan.Plan with .bind, one prewarm signature, and the old names kept as deprecated aliases.
Also: the GPU test files import, and every b12x call in them binds against today's signatures
(they cannot run here)."""
import dataclasses
import importlib
import inspect
import warnings
from pathlib import Path

import pytest
import torch

import b12x.prewarm as pw
from b12x import dcp, indexer
from b12x.attention import sparse_mla
from b12x.errors import InputError
from b12x.plan import SHARED_CAPS_FIELDS, Plan
from readme_blocks import check_calls

ARCH = dict(arch="sm_90a", num_sms=132)
CAPS = {sparse_mla: sparse_mla.Caps, indexer: indexer.Caps, dcp: dcp.Caps}


def _plans():
    return {
        "sparse_mla decode": sparse_mla.plan(sparse_mla.Caps(num_heads=16, topk=256, max_rows=8, **ARCH)),
        "sparse_mla extend": sparse_mla.plan(sparse_mla.Caps(num_heads=16, topk=256, max_rows=8, mode="extend", **ARCH)),
        "indexer": indexer.plan(indexer.Caps(num_heads=16, topk=2048, max_rows=4, max_width=4096, **ARCH)),
        "dcp cpu": dcp.plan(dcp.Caps(topk=128, world=1, max_rows=4), device="cpu"),
        "dcp cuda": dcp.plan(dcp.Caps(topk=128, world=2, max_rows=4, **ARCH), device="cuda"),
    }


@pytest.mark.parametrize("module", list(CAPS), ids=lambda m: m.__name__)
def test_every_caps_uses_the_shared_field_names(module):
    caps = CAPS[module]
    assert module.Caps is caps
    names = [f.name for f in dataclasses.fields(caps)]
    shared = [n for n in SHARED_CAPS_FIELDS if n != "num_heads" or module is not dcp]  # DCP has no heads
    assert set(shared) <= set(names), (module.__name__, names)
    assert not {"max_batched", "k"} & set(names), names                                 # the old names are aliases only


@pytest.mark.parametrize("name", list(_plans()))
def test_every_plan_is_a_plan_with_bind_specs_and_scratch(name):
    p = _plans()[name]
    assert isinstance(p, Plan) and callable(p.bind)
    assert p.scratch_bytes() == max(r.offset + r.nbytes for r in p.scratch_specs()) > 0
    assert all(hasattr(s, "arch") for s in p.specs())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.caps = None
    assert "scratch" in inspect.signature(type(p).bind).parameters


def test_module_bind_is_an_alias_of_plan_bind():
    p = _plans()["sparse_mla decode"]
    s = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    kw = dict(q=torch.randn(3, 16, 576).bfloat16(), indices=torch.zeros(3, 128, dtype=torch.int32),
              lengths=torch.zeros(3, dtype=torch.int32))
    def shape(b):
        return [(f.name, tuple(v.shape) if isinstance(v, torch.Tensor) else v)
                for f in dataclasses.fields(b) if not isinstance(v := getattr(b, f.name), Plan)]
    assert shape(sparse_mla.bind(p, scratch=s, **kw)) == shape(p.bind(s, **kw)) == shape(p.bind(scratch=s, **kw))
    assert list(inspect.signature(sparse_mla.bind).parameters)[:3] == ["plan", "scratch", "q"]
    ip = _plans()["indexer"]
    lengths = torch.full((2,), 100, dtype=torch.int32)
    si = torch.empty(ip.scratch_bytes(), dtype=torch.uint8)
    assert indexer.bind(ip, scratch=si, lengths=lengths, width=4096).pages_per_cta == \
        ip.bind(si, lengths=lengths, width=4096).pages_per_cta
    with pytest.raises(InputError, match="plan: expected a IndexerPlan"):
        indexer.bind(p, scratch=si, lengths=lengths, width=4096)
    # nothing is allocated: every tensor of a binding is a view of the caller's scratch or input
    b = p.bind(s, **kw)
    assert b.partial_o.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()


def test_dcp_bind_then_run_equals_merge_topk():
    p = _plans()["dcp cpu"]
    s = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    ids = torch.randperm(200)[:128].view(1, 128).int().repeat(2, 1)
    scores = torch.randn(2, 128)
    out_a, out_b = torch.empty_like(ids), torch.empty_like(ids)
    dcp.run_merge(p.bind(s, local_ids=ids, local_scores=scores, out_ids=out_a, rank=0))
    dcp.merge_topk(p, scratch=s, local_ids=ids, local_scores=scores, out_ids=out_b, rank=0)
    assert torch.equal(out_a, out_b)
    with pytest.raises(InputError, match="run_convert"):
        dcp.run_convert(p.bind(s, local_ids=ids, local_scores=scores, out_ids=out_a, rank=0))


ALIASES = [
    (lambda **kw: sparse_mla.Caps(num_heads=16, **kw), "max_batched", "max_rows", 8),
    (lambda **kw: indexer.Caps(**kw), "max_batched", "max_rows", 8),
    (lambda **kw: dcp.DcpCaps(**kw), "k", "topk", 256),
    (lambda **kw: pw.PrewarmKey(576, 512, 2048, num_heads=16, kv_format="fp8_ds_mla", arch="sm_90a", **kw),
     "max_batched", "max_rows", 8),
]


@pytest.mark.parametrize("make, old, new, value", ALIASES)
def test_renamed_caps_fields_still_work_and_warn(make, old, new, value):
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}"):
        legacy = make(**{old: value})
    assert legacy == make(**{new: value}) and hash(legacy) == hash(make(**{new: value}))
    with pytest.warns(DeprecationWarning, match=old):
        assert getattr(legacy, old) == value
    with pytest.raises(InputError, match=f"expected None when {new} is given"), pytest.warns(DeprecationWarning):
        make(**{old: value, new: value})
    assert old in inspect.signature(type(legacy)).parameters       # the static checks accept the old name


def test_errors_name_the_field_as_the_caller_spelled_it():
    with pytest.warns(DeprecationWarning):
        old = sparse_mla.Caps(num_heads=16, max_batched=0, **ARCH)
    with pytest.raises(InputError, match=r"^Caps.max_batched: expected an int >= 1, got 0$"):
        sparse_mla.plan(old)
    with pytest.raises(InputError, match=r"^Caps.max_rows: expected an int >= 1, got 0$"):
        sparse_mla.plan(sparse_mla.Caps(num_heads=16, max_rows=0, **ARCH))
    with pytest.raises(InputError, match=r"^DcpCaps.topk: expected a multiple of 128"):
        dcp.plan(dcp.Caps(topk=100), device="cpu")


def test_renamed_function_arguments_still_work_and_warn():
    with pytest.warns(DeprecationWarning, match=r"preset_bundle\(max_batched=...\) is deprecated: use max_rows"):
        old = pw.preset_bundle("deepseek-v3.2-tp8", arch="sm_90a", num_sms=132, max_batched=16)
    new = pw.preset_bundle("deepseek-v3.2-tp8", arch="sm_90a", num_sms=132, max_rows=16)
    assert old == new and new.max_rows == 16 and all(c.max_rows == 16 for c in new.indexer)
    p = _plans()["dcp cpu"]
    s = torch.empty(p.scratch_bytes(), dtype=torch.uint8)
    with pytest.warns(DeprecationWarning, match="max_rows"):
        assert dcp.prewarm_dcp_merge(p, scratch=s, rank=0, max_batched=2, key="facade-alias") == [1, 2, 4]


def test_one_prewarm_signature():
    sig = inspect.signature(pw.prewarm)
    assert [(n, p.kind, p.default) for n, p in sig.parameters.items()] == [
        ("plans", inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty),
        ("max_rows", inspect.Parameter.KEYWORD_ONLY, None), ("device", inspect.Parameter.KEYWORD_ONLY, None),
        ("scratch", inspect.Parameter.KEYWORD_ONLY, None), ("group", inspect.Parameter.KEYWORD_ONLY, None)]
    # the per-family forms and the preset one name rows the same way
    for fn in (pw.prewarm_sparse_mla, pw.prewarm_indexer, pw.prewarm_preset, dcp.prewarm_dcp_merge):
        assert "max_rows" in inspect.signature(fn).parameters, fn.__name__


def test_prewarm_runs_a_cpu_dcp_plan_and_returns_the_plans(monkeypatch):
    """The whole DCP warm-up (merge, convert, filter) runs on CPU; Caps are planned on the way."""
    calls = []
    real = dcp.prewarm_dcp_merge
    monkeypatch.setattr(dcp, "prewarm_dcp_merge", lambda p, **kw: calls.append(kw["max_rows"]) or real(p, **kw))
    p = _plans()["dcp cpu"]
    assert pw.prewarm(p, max_rows=2) == [p] and calls == [2]
    with pytest.raises(InputError, match="prewarm: expected plans or Caps"):
        pw.prewarm("not a plan", device="cpu")
    with pytest.raises(InputError, match="max_rows: expected None or an int >= 1, got 0"):
        pw.prewarm(p, max_rows=0)


def test_prewarm_resolves_every_artifact_before_any_launch(monkeypatch):
    events = []
    monkeypatch.setattr(pw.registry, "resolve", lambda spec: events.append(("resolve", spec)))
    monkeypatch.setattr(pw, "_warm_sparse_mla_plan", lambda p, rows, device, scratch: events.append(("mla", rows)))
    monkeypatch.setattr(pw, "prewarm_indexer", lambda caps, **kw: events.append(("indexer", kw["max_rows"])))
    monkeypatch.setattr(pw._scratch, "check", lambda scratch, need, device: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    plans = _plans()
    ws = torch.empty(1, dtype=torch.uint8)
    out = pw.prewarm(plans["sparse_mla decode"], indexer.Caps(num_heads=16, max_rows=4, max_width=4096, **ARCH),
                     max_rows=6, device="cuda:0", scratch=ws)
    assert isinstance(out[1], indexer.IndexerPlan)
    kinds = [e[0] for e in events]
    assert kinds.index("mla") > max(i for i, k in enumerate(kinds) if k == "resolve")
    assert ("mla", 6) in events and ("indexer", 4) in events                 # capped at each plan's max_rows


# -- the GPU tests cannot run here: they import, and their b12x calls bind -----------------------
GPU_DIR = Path(__file__).resolve().parent / "gpu"


@pytest.mark.parametrize("path", sorted(GPU_DIR.glob("*.py")), ids=lambda p: p.name)
def test_gpu_test_files_import_and_their_calls_bind(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mod = importlib.import_module(f"gpu.{path.stem}")
    # the module's own names pre-bound (its relative imports, helpers); what counts is every call of
    # a b12x function, class or method binding against its signature, and b12x attributes existing
    env = {n: v for n, v in vars(mod).items() if not n.startswith("__")}
    errors, checked = check_calls(path.read_text(), f"tests/gpu/{path.name}", env)
    errors = [e for e in errors if "b12x" in e.split(": ", 1)[1]]
    assert not errors, "\n".join(errors)
    assert checked or "b12x." not in path.read_text(), f"no b12x call of {path.name} was checked"


def test_the_gpu_call_check_catches_a_renamed_keyword():
    mod = importlib.import_module("gpu.test_integration_vllm_gpu")
    src = (GPU_DIR / "test_integration_vllm_gpu.py").read_text()
    env = {n: v for n, v in vars(mod).items() if not n.startswith("__")}
    assert "max_rows=rows" in src
    errors, _ = check_calls(src.replace("max_rows=rows", "max_rowz=rows"), "mutated", env)
    assert any("max_rowz" in e for e in errors), errors
