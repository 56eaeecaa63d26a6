"""Token records of the sparse MLA KV formats, laid out from the head dims. Pure Python: the
tiling (raw record stages in shared memory), the runtime's cache checks and the format blocks
in kv_format.py read the same numbers, and this file is hashed with the blocks, so a layout
change is a new artifact key."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Fp8DsMlaRecord:
    """fp8_ds_mla (FlashMLA's V3.2 format): d_nope e4m3 NoPE values, one fp32 scale per
    SCALE_GROUP of them, then d_rope bf16 RoPE values; a uint8 [blocks, page, bytes] cache."""

    d_nope: int
    d_rope: int

    SCALE_GROUP = 128
    dtype = "uint8"

    @property
    def n_scales(self) -> int:
        return self.d_nope // self.SCALE_GROUP

    @property
    def scale_off(self) -> int:
        return self.d_nope

    @property
    def rope_off(self) -> int:
        return self.scale_off + 4 * self.n_scales

    @property
    def bytes(self) -> int:
        return self.rope_off + 2 * self.d_rope

    @property
    def last_dim(self) -> int:
        """Elements of one token in the cache tensor's last dim."""
        return self.bytes


@dataclass(frozen=True)
class Bf16Record:
    """bf16: the d_nope + d_rope latent dims as they are; a bf16 [blocks, page, d_qk] cache."""

    d_nope: int
    d_rope: int

    dtype = "bfloat16"

    @property
    def bytes(self) -> int:
        return 2 * self.last_dim

    @property
    def last_dim(self) -> int:
        return self.d_nope + self.d_rope


RECORDS = {"fp8_ds_mla": Fp8DsMlaRecord, "bf16": Bf16Record}


def kv_record(kv_format: str, d_nope: int, d_rope: int):
    """The token record of kv_format for these dims."""
    return RECORDS[kv_format](d_nope, d_rope)
