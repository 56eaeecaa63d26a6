"""What the upstream-named layers share (sparse_mla_scratch, b12x.attention.indexer): the caps'
device and the scratch argument as upstream b12x takes them."""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..errors import InputError
from ..validate import check_tensor, require


def caps_device(device) -> torch.device:
    """Upstream's normalisation of a caps device: a bare "cuda" becomes the current CUDA device."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def checked_scratch(scratch, key: str, nbytes: int, device: torch.device) -> torch.Tensor:
    """The scratch argument as one contiguous uint8 buffer of at least `nbytes` on `device`."""
    buf = one_scratch(scratch, key)
    check_tensor("scratch", buf, dtype=torch.uint8, ndim=1, contiguous=True, device=device)
    require(buf.numel() >= nbytes, f"scratch: expected at least layout.nbytes={nbytes} bytes, got {buf.numel()}")
    return buf


def one_scratch(scratch, key: str) -> torch.Tensor:
    """One tensor, a mapping keyed `key`, or a 1-element sequence (what a workspace manager's
    get_simultaneous returns): the uint8 buffer, flattened when contiguous."""
    if isinstance(scratch, torch.Tensor):
        return scratch.reshape(-1) if scratch.is_contiguous() else scratch
    if isinstance(scratch, Mapping):
        require(key in scratch, f"scratch: expected a tensor under {key!r}, got keys {list(scratch)}")
        return one_scratch(scratch[key], key)
    if isinstance(scratch, Sequence) and len(scratch) == 1:
        return one_scratch(scratch[0], key)
    raise InputError(f"scratch: expected a uint8 tensor, a mapping with {key!r} or a 1-element sequence, "
                     f"got {type(scratch).__name__}")
