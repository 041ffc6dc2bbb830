"""What a client method sends back beside its values, declared once.

A client method lists the vectors its replies carry as :class:`ExtraSpec` entries
(``reply_extras``, e.g. SCAFFOLD's ``delta_c``, FedNova's ``tau``, FedMD's ``logits``);
a part of the server may add its own (IFCA's ``model_losses``, which the client's choice
between several models sends). The strategy checks every reply against the schema with
:func:`validate_extras` - one function, whichever runtime delivered the reply - and
rejects a reply that breaks it with the spec's own message.

The expected length of an extra comes from the assignment: ``"values"``, one value per
coordinate of the reply's values (a ``Wire.reply_beside`` vector), or ``"whole"``, the
assignment's ``Wire.reply_plain`` values (a schema holds at most one such extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

import torch

from fedgmr.algorithm.params import all_finite
from fedgmr.errors import InvalidUpdateError

#: where an extra's length comes from: the reply's values, or the assignment's ``reply_plain``
ExtraSize = Literal["values", "whole"]


@dataclass(frozen=True)
class ExtraSpec:
    """One vector a reply carries beside its values.

    name: its key in ``Reply.extras`` (``extra.<name>`` on the Flower wire).
    size: ``"values"`` (one per coordinate of the reply's values) or ``"whole"`` (the
        assignment's ``Wire.reply_plain`` values).
    needs: the rejection line when it is missing or ill-shaped (``{n}``: the expected length).
    flat: it must be one-dimensional (False: any shape holding ``n`` values).
    finite: NaN or Inf rejects it (checked as ``dtype`` holds it).
    nonfinite: the rejection line for NaN/Inf (None: ``needs``).
    dtype: what the server keeps (None: as sent).
    check: a further test of the kept tensor, returning a rejection line or None.
    """

    name: str
    size: ExtraSize
    needs: str
    flat: bool = True
    finite: bool = True
    nonfinite: str | None = None
    dtype: torch.dtype | None = torch.float32
    check: Callable[[torch.Tensor], str | None] | None = None

    def __post_init__(self) -> None:
        if self.size not in ("values", "whole"):
            raise ValueError(f"extra {self.name!r}: size must be 'values' or 'whole', got {self.size!r}")


#: the extras of a reply, as a client method or a server part declares them
ExtrasSchema = tuple[ExtraSpec, ...]


def extra_names(schema: Sequence[ExtraSpec]) -> tuple[str, ...]:
    """The names a schema declares, in order."""
    return tuple(s.name for s in schema)


def merge_schemas(*schemas: Sequence[ExtraSpec]) -> ExtrasSchema:
    """One schema from several (the client method's and the server parts'): the same spec
    twice is kept once; two specs of one name, or two ``"whole"`` extras, raise ValueError."""
    out: dict[str, ExtraSpec] = {}
    for schema in schemas:
        for spec in schema:
            held = out.get(spec.name)
            if held is not None and held != spec:
                raise ValueError(f"two declarations of the reply extra {spec.name!r} differ")
            out[spec.name] = spec
    whole = [s.name for s in out.values() if s.size == "whole"]
    if len(whole) > 1:
        raise ValueError(f"the reply extras {whole} are each sent whole: at most one may be")
    return tuple(out.values())


def validate_extras(schema: Sequence[ExtraSpec], extras: Any, values: int, whole: int,
                    device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """The declared extras of a reply, checked and kept (``dtype``, on ``device``).

    ``values``: the number of the reply's values (-1 when unknown: the length check then
    fails); ``whole``: the assignment's ``Wire.reply_plain``. The first broken spec raises
    :class:`InvalidUpdateError` with its message; extras the schema does not name are
    ignored (the Flower decoder refuses them on the wire)."""
    got: Mapping[str, Any] = extras if isinstance(extras, dict) else {}
    out: dict[str, torch.Tensor] = {}
    for spec in schema:
        n = values if spec.size == "values" else whole
        t = got.get(spec.name)
        if not isinstance(t, torch.Tensor) or t.numel() != n or not t.is_floating_point() \
                or (spec.flat and t.ndim != 1):
            raise InvalidUpdateError(spec.needs.format(n=n))
        t = t.detach()
        if spec.dtype is not None or device is not None:
            t = t.to(device if device is not None else t.device, spec.dtype if spec.dtype is not None else t.dtype)
        if spec.finite and not all_finite(t):
            raise InvalidUpdateError((spec.nonfinite or spec.needs).format(n=n))
        if spec.check is not None:
            reason = spec.check(t)
            if reason is not None:
                raise InvalidUpdateError(reason.format(n=n))
        out[spec.name] = t
    return out


__all__ = ["ExtraSize", "ExtraSpec", "ExtrasSchema", "extra_names", "merge_schemas", "validate_extras"]
