import pytest

from b12x import registry
from b12x.errors import ArtifactMissingError, KernelResolutionFrozenError
from codegen.specs import SparseMLASpec


@pytest.fixture
def frozen():
    registry.freeze()
    yield
    registry.unfreeze()


def test_frozen_resolution_names_the_missing_spec(tmp_cache, frozen):
    spec = SparseMLASpec(num_heads=64, kv_format="bf16")
    with pytest.raises(KernelResolutionFrozenError) as e:
        registry.resolve(spec)
    assert spec.name in str(e.value) and spec.canonical_json() in str(e.value)


def test_missing_artifact_without_dsl_is_a_clear_error(tmp_cache, monkeypatch):
    monkeypatch.setattr(registry, "dsl_available", lambda: False)
    with pytest.raises(ArtifactMissingError, match="no usable artifact .*missing.*b12x-codegen build"):
        registry.resolve(SparseMLASpec(num_heads=32))
