"""Upstream b12x's `b12x.cute` names that engines import (runtime_control)."""
