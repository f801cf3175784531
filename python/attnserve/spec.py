"""Spec: builds the proto AttentionSpec (docs/DESIGN.md, "The math").

    Spec.dense(causal=True)
    Spec.window(256)
    Spec.dilated(segment_lengths=[2048, 4096], dilation_rates=[1, 2])
    Spec.block_sparse(local_window=2, block_size=128)
    Spec.block_sparse(random=0.05, seed=7) / csr=(row_ptr, col_idx) / strided=(8, 1) / ...
    Spec.from_json({"window": {"size": 256}, "causal": True})   # the proto3 JSON mapping

Every constructor takes `causal=` and `scale=` (0 or None: 1/sqrt(head_dim)).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence, Union

from google.protobuf import json_format

from ._proto import pb


class Spec:
    """An attention spec; `to_proto()` gives the attnserve.v1.AttentionSpec."""

    __slots__ = ("_proto",)

    def __init__(self, proto: "pb.AttentionSpec"):
        self._proto = proto

    # ---- patterns ----
    @classmethod
    def dense(cls, *, causal: bool = False, scale: float | None = None) -> "Spec":
        p = pb.AttentionSpec(dense=pb.Dense())
        return cls._finish(p, causal, scale)

    @classmethod
    def window(cls, size: int, *, causal: bool = False, scale: float | None = None) -> "Spec":
        p = pb.AttentionSpec(window=pb.Window(size=int(size)))
        return cls._finish(p, causal, scale)

    @classmethod
    def dilated(
        cls,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        causal: bool = False,
        scale: float | None = None,
    ) -> "Spec":
        p = pb.AttentionSpec(
            dilated=pb.Dilated(
                segment_lengths=_ints(segment_lengths), dilation_rates=_ints(dilation_rates)
            )
        )
        return cls._finish(p, causal, scale)

    @classmethod
    def block_sparse(
        cls,
        *,
        block_size: int = 128,
        local_window: int | None = None,
        dilated_sparse: Sequence[int] | None = None,
        global_local: tuple[int, int] | None = None,
        strided: tuple[int, int] | None = None,
        random: float | None = None,
        seed: int = 0,
        csr: tuple[Sequence[int], Sequence[int]] | None = None,
        causal: bool = False,
        scale: float | None = None,
    ) -> "Spec":
        """One generator: local_window=WIDTH, dilated_sparse=RATES, global_local=(G, WIDTH),
        strided=(STRIDE, WIDTH), random=KEEP (with seed=), csr=(ROW_PTR, COL_IDX); in blocks."""
        given = [
            n
            for n, v in (
                ("local_window", local_window),
                ("dilated_sparse", dilated_sparse),
                ("global_local", global_local),
                ("strided", strided),
                ("random", random),
                ("csr", csr),
            )
            if v is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "Spec.block_sparse: give exactly one generator (local_window, "
                f"dilated_sparse, global_local, strided, random, csr); got {given}"
            )
        bs = pb.BlockSparse(block_size=int(block_size))
        if local_window is not None:
            bs.local_window.width = int(local_window)
        elif dilated_sparse is not None:
            bs.dilated_sparse.rates.extend(_ints(dilated_sparse))
        elif global_local is not None:
            bs.global_local.global_blocks, bs.global_local.width = (int(x) for x in global_local)
        elif strided is not None:
            bs.strided.stride, bs.strided.width = (int(x) for x in strided)
        elif random is not None:
            bs.random.keep = float(random)
            bs.random.seed = int(seed)
        else:
            bs.csr.row_ptr.extend(_ints(csr[0]))
            bs.csr.col_idx.extend(_ints(csr[1]))
        return cls._finish(pb.AttentionSpec(block_sparse=bs), causal, scale)

    # Shorthands for the block-sparse generators.
    @classmethod
    def local_window(cls, width: int, block_size: int = 128, **kw) -> "Spec":
        return cls.block_sparse(local_window=width, block_size=block_size, **kw)

    @classmethod
    def dilated_sparse(cls, rates: Sequence[int], block_size: int = 128, **kw) -> "Spec":
        return cls.block_sparse(dilated_sparse=rates, block_size=block_size, **kw)

    @classmethod
    def global_local(cls, global_blocks: int, width: int, block_size: int = 128, **kw) -> "Spec":
        return cls.block_sparse(global_local=(global_blocks, width), block_size=block_size, **kw)

    @classmethod
    def strided(cls, stride: int, width: int = 0, block_size: int = 128, **kw) -> "Spec":
        return cls.block_sparse(strided=(stride, width), block_size=block_size, **kw)

    @classmethod
    def random(cls, keep: float, seed: int = 0, block_size: int = 128, **kw) -> "Spec":
        return cls.block_sparse(random=keep, seed=seed, block_size=block_size, **kw)

    @classmethod
    def csr(
        cls, row_ptr: Sequence[int], col_idx: Sequence[int], block_size: int = 128, **kw
    ) -> "Spec":
        return cls.block_sparse(csr=(row_ptr, col_idx), block_size=block_size, **kw)

    # ---- conversions ----
    @classmethod
    def from_json(cls, value: Union[str, Mapping[str, Any]]) -> "Spec":
        """The proto3 JSON mapping (camelCase or snake_case), as a dict or a JSON string."""
        if isinstance(value, (str, bytes)):
            value = json.loads(value)
        p = pb.AttentionSpec()
        try:
            json_format.ParseDict(dict(value), p)
        except json_format.ParseError as e:
            raise ValueError(f"spec: {e}") from None
        return cls(p)

    def to_proto(self) -> "pb.AttentionSpec":
        out = pb.AttentionSpec()
        out.CopyFrom(self._proto)
        return out

    def to_json(self) -> dict:
        return json_format.MessageToDict(self._proto)

    def replace(self, *, causal: bool | None = None, scale: float | None = None) -> "Spec":
        p = self.to_proto()
        if causal is not None:
            p.causal = bool(causal)
        if scale is not None:
            p.scale = float(scale)
        return Spec(p)

    @property
    def causal(self) -> bool:
        return self._proto.causal

    @property
    def kind(self) -> str:
        return self._proto.WhichOneof("pattern") or ""

    def __eq__(self, other) -> bool:
        return isinstance(other, Spec) and self._proto == other._proto

    def __repr__(self) -> str:
        return f"Spec({json.dumps(self.to_json(), sort_keys=True)})"

    @staticmethod
    def _finish(p, causal, scale) -> "Spec":
        p.causal = bool(causal)
        if scale:
            p.scale = float(scale)
        return Spec(p)


SpecLike = Union[Spec, "pb.AttentionSpec", Mapping[str, Any], str, None]


def to_spec_proto(
    spec: SpecLike, causal: bool | None = None, scale: float | None = None
) -> "pb.AttentionSpec":
    """Any accepted spec form (None: dense) with causal/scale overrides applied."""
    if spec is None:
        p = pb.AttentionSpec(dense=pb.Dense())
    elif isinstance(spec, Spec):
        p = spec.to_proto()
    elif isinstance(spec, pb.AttentionSpec):
        p = pb.AttentionSpec()
        p.CopyFrom(spec)
    elif isinstance(spec, (str, bytes, Mapping)):
        p = Spec.from_json(spec).to_proto()
    else:
        raise TypeError(
            f"spec: expected Spec, AttentionSpec, dict or JSON string, got "
            f"{type(spec).__name__}"
        )
    if causal is not None:
        p.causal = bool(causal)
    if scale is not None:
        p.scale = float(scale)
    return p


def _ints(values: Iterable[int]) -> list[int]:
    return [int(v) for v in values]
