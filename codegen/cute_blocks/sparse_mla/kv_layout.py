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

    @property
    def raw_bytes(self) -> int:
        """Bytes of a token staged raw in shared memory: the record as it is."""
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

    @property
    def raw_bytes(self) -> int:
        """bf16 rows go straight into the K tile: nothing is staged raw."""
        return 0


@dataclass(frozen=True)
class Model1Fp8Record:
    """model1_fp8 (FlashMLA's MODEL1 layout, DeepSeek-V4): a uint8 [blocks, page_bytes] cache
    of pages of P tokens. The first P x token_bytes bytes hold each token's d_nope e4m3 NoPE
    values then its d_rope bf16 RoPE values; then P x SCALE_BYTES bytes hold each token's UE8M0
    exponents, one per SCALE_GROUP NoPE values, and pad bytes. The page stride is
    page_bytes(P), P x bytes rounded up to a multiple of token_bytes, or more (a view)."""

    d_nope: int
    d_rope: int

    SCALE_GROUP = 64
    SCALE_BYTES = 8
    dtype = "uint8"

    def __post_init__(self):
        assert self.d_nope % self.SCALE_GROUP == 0 and self.n_scales < self.SCALE_BYTES, (self.d_nope,)

    @property
    def n_scales(self) -> int:
        return self.d_nope // self.SCALE_GROUP

    @property
    def token_bytes(self) -> int:
        return self.d_nope + 2 * self.d_rope

    @property
    def rope_off(self) -> int:
        return self.d_nope

    @property
    def bytes(self) -> int:
        """Bytes of one token in its page (token data and scales, which are not adjacent)."""
        return self.token_bytes + self.SCALE_BYTES

    @property
    def raw_bytes(self) -> int:
        """Bytes of a token staged raw in shared memory: its token data, then its scale bytes in
        a 16-byte chunk."""
        return self.token_bytes + 16

    def scale_off(self, page: int) -> int:
        """Byte offset of the scales in a page of `page` tokens."""
        return page * self.token_bytes

    def page_bytes(self, page: int) -> int:
        return -(-page * self.bytes // self.token_bytes) * self.token_bytes


RECORDS = {"fp8_ds_mla": Fp8DsMlaRecord, "bf16": Bf16Record, "model1_fp8": Model1Fp8Record}


def kv_record(kv_format: str, d_nope: int, d_rope: int):
    """The token record of kv_format for these dims."""
    return RECORDS[kv_format](d_nope, d_rope)
