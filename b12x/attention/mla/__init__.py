"""Upstream b12x's `b12x.attention.mla` names that engines import (kernel.plan_unified_decode_splits);
the forwards are in b12x.integration.mla."""
