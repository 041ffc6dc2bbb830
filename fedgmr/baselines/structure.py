"""Width-structured sub-models as index lists over the full model's parameters.

A width-``r`` sub-model is the same architecture built with ``width=r`` (one definition
per architecture, :mod:`fedgmr.models`). For every parameter, the sub-model's tensor is
the block of the full tensor given by one index list per dimension; chaining (a layer's
kept inputs are the previous layer's kept outputs) follows because every hidden size of
the same full size gets the same index list. Four rules cover the registered models:

* default - a window of ``S`` of the ``F`` indices: the prefix for HeteroFL, a rolling
  window for FedRolex (``shift`` rounds, right-roll: round 1 of 8 keeps ``[7, 0]``);
* attention heads - a module with ``heads`` and ``q``/``k``/``v``/``out`` linears keeps
  the head count and a window of every head's dimensions (q/k/v outputs, ``out`` inputs);
* LSTM gates - the ``4H`` rows of an ``nn.LSTM`` are four gate blocks, windowed each;
* flattened features - a linear layer reading a flattened ``C x s`` feature map keeps
  whole spatial groups of the kept channels of the convolution before it.

Dimensions whose size does not change (the first layer's inputs, the classifier's
classes, embedding rows) keep everything.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from fedgmr.algorithm.params import ParamSpace
from fedgmr.device import module_device

IndexLists = dict[str, list[torch.Tensor]]
WidthBuilder = Callable[[float], nn.Module]


def window(full: int, size: int, shift: int = 0) -> torch.Tensor:
    """``size`` of ``full`` indices starting at ``(-shift) mod full`` (wrapping)."""
    if not 0 < size <= full:
        raise ValueError(f"window of {size} out of {full}")
    start = (-int(shift)) % full
    return (start + torch.arange(size)) % full


def _heads_rules(full: nn.Module) -> dict[tuple[str, int], tuple[str, int]]:
    rules: dict[tuple[str, int], tuple[str, int]] = {}
    for name, mod in full.named_modules():
        heads = getattr(mod, "heads", None)
        if isinstance(heads, int) and all(isinstance(getattr(mod, c, None), nn.Linear) for c in "qkv") \
                and isinstance(getattr(mod, "out", None), nn.Linear):
            pre = f"{name}." if name else ""
            for c in "qkv":
                rules[(f"{pre}{c}.weight", 0)] = ("heads", heads)
                if getattr(mod, c).bias is not None:
                    rules[(f"{pre}{c}.bias", 0)] = ("heads", heads)
            rules[(f"{pre}out.weight", 1)] = ("heads", heads)
        elif isinstance(mod, nn.LSTM):
            pre = f"{name}." if name else ""
            for pname, _ in mod.named_parameters(recurse=False):
                rules[(f"{pre}{pname}", 0)] = ("groups", 4)
    return rules


def _flatten_rules(full: nn.Module, sub: nn.Module) -> dict[tuple[str, int], tuple[str, int]]:
    """Linear layers reading a flattened conv feature map: ``in = channels x spatial``."""
    rules: dict[tuple[str, int], tuple[str, int]] = {}
    sub_mods = dict(sub.named_modules())
    last_conv: tuple[int, int] | None = None  # (full out channels, sub out channels)
    for name, mod in full.named_modules():
        if isinstance(mod, nn.modules.conv._ConvNd):
            last_conv = (mod.out_channels, sub_mods[name].out_channels)
        elif isinstance(mod, nn.Linear) and last_conv is not None:
            f_in, s_in = mod.in_features, sub_mods[name].in_features
            cf, cs = last_conv
            if f_in != s_in and f_in != cf and f_in % cf == 0 and s_in == cs * (f_in // cf):
                rules[(f"{name}.weight" if name else "weight", 1)] = ("spatial", f_in // cf)
            last_conv = None
    return rules


def _dim_index(rule: tuple[str, int] | None, full: int, size: int, shift: int) -> torch.Tensor:
    if full == size:
        return torch.arange(full)
    if rule is None:
        return window(full, size, shift)
    kind, n = rule
    if kind in ("heads", "groups"):
        if full % n or size % n:
            raise ValueError(f"{full} -> {size} is not divisible into {n} {kind}")
        fb, sb = full // n, size // n
        return torch.cat([g * fb + window(fb, sb, shift) for g in range(n)])
    # spatial: windows over channels, each expanded to its n spatial positions
    ch = window(full // n, size // n, shift)
    return (ch[:, None] * n + torch.arange(n)).reshape(-1)


def index_lists(full: nn.Module, sub: nn.Module, shift: int = 0) -> IndexLists:
    """Per parameter, one index list per dimension selecting ``sub``'s block of ``full``."""
    rules = {**_heads_rules(full), **_flatten_rules(full, sub)}
    sub_params = dict(sub.named_parameters())
    out: IndexLists = {}
    for name, p in full.named_parameters():
        if name not in sub_params:
            raise ValueError(f"sub-model has no parameter {name!r}")
        q = sub_params[name]
        if q.ndim != p.ndim:
            raise ValueError(f"{name}: sub-model tensor has {q.ndim} dims, full has {p.ndim}")
        lists = [_dim_index(rules.get((name, d)), p.shape[d], q.shape[d], shift) for d in range(p.ndim)]
        for d, idx in enumerate(lists):
            if idx.numel() != q.shape[d]:
                raise ValueError(f"{name} dim {d}: {idx.numel()} indices for size {q.shape[d]}")
        out[name] = lists
    return out


def project(mask: torch.Tensor, space: ParamSpace) -> IndexLists:
    """Recover the per-dimension index lists of a structured (outer-product) mask."""
    out: IndexLists = {}
    for info in space.params:
        block = mask[info.slice].view(info.shape)
        lists = []
        for d in range(block.ndim):
            others = tuple(i for i in range(block.ndim) if i != d)
            lists.append((block.any(dim=others) if others else block).nonzero().view(-1))
        if math.prod(len(l) for l in lists) != int(block.sum()):
            raise ValueError(f"mask of {info.name} is not a product of index lists (not structured)")
        out[info.name] = lists
    return out


def gather_indices(space: ParamSpace, lists: IndexLists) -> torch.Tensor:
    """Full flat positions of the sub-model's flat vector, in the sub-model's order (on
    the index lists' device)."""
    device = next((l.device for ls in lists.values() for l in ls), torch.device("cpu"))
    parts = []
    for info in space.params:
        positions = torch.arange(info.offset, info.offset + info.numel, device=device).view(info.shape)
        parts.append(positions[torch.meshgrid(*lists[info.name], indexing="ij")].reshape(-1))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)


def mask_of(space: ParamSpace, lists: IndexLists) -> torch.Tensor:
    """The bool mask over the full flat vector that the index lists select."""
    gather = gather_indices(space, lists)
    mask = torch.zeros(space.numel, dtype=torch.bool, device=gather.device)
    mask[gather] = True
    return mask


@dataclass(frozen=True)
class Slice:
    """A width-``rate`` sub-model's place in the full flat vector."""

    rate: float
    shift: int
    mask: torch.Tensor  # bool over the full flat vector
    gather: torch.Tensor  # full positions in sub-model order: sub_flat = full_flat[gather]


#: slices a :class:`WidthStructure` keeps (every level of a ladder, FjORD's widths, a few
#: of FedRolex's rolling windows)
SLICE_CACHE = 32


class WidthStructure:
    """Builds and caches width-``r`` sub-models and their slices of the full model.

    Parameters
    ----------
    build: ``build(width) -> nn.Module``, the registered builder at a width rate.
    full: the width-1 model (its parameter layout defines the flat vector).
    device: where the sub-models and slices live (default: wherever ``full`` is, also
        after it moved).
    """

    def __init__(self, build: WidthBuilder, full: nn.Module, device: torch.device | str | None = None) -> None:
        self.build = build
        self.full = full
        self.space = ParamSpace(full)
        self._device = None if device is None else torch.device(device)
        self._models: dict[float, tuple[nn.Module, ParamSpace]] = {}
        self._slices: OrderedDict[tuple[float, int, str], Slice] = OrderedDict()

    @property
    def device(self) -> torch.device:
        return self._device if self._device is not None else module_device(self.full)

    def model(self, rate: float) -> tuple[nn.Module, ParamSpace]:
        """The (cached) width-``rate`` model, on :attr:`device`, and its layout; its
        weights are scratch."""
        key = round(float(rate), 12)
        if key not in self._models:
            m = self.build(rate)
            self._models[key] = (m, ParamSpace(m, self.space.output_layer))
        m, space = self._models[key]
        device = self.device
        if module_device(m) != device:
            m.to(device)
        return m, space

    def slice(self, rate: float, shift: int = 0) -> Slice:
        """The width-``rate`` sub-model's slice at window ``shift``: cached (the last
        :data:`SLICE_CACHE` asked for), since FjORD asks for every allowed width's at
        every job. A slice is shared: its tensors are not to be changed in place."""
        key = (float(rate), int(shift), str(self.device))
        hit = self._slices.get(key)
        if hit is not None:
            self._slices.move_to_end(key)
            return hit
        sub, _ = self.model(rate)
        lists = index_lists(self.full, sub, shift)
        gather = gather_indices(self.space, lists).to(self.device)
        mask = torch.zeros(self.space.numel, dtype=torch.bool, device=gather.device)
        mask[gather] = True
        out = Slice(float(rate), int(shift), mask, gather)
        self._slices[key] = out
        if len(self._slices) > SLICE_CACHE:
            self._slices.popitem(last=False)  # FedRolex's rolling windows: the oldest shift
        return out

    def slice_from_mask(self, mask: torch.Tensor, rate: float) -> Slice:
        """The slice a structured mask describes (the client side: no shift needed)."""
        _, sub_space = self.model(rate)
        lists = project(mask, self.space)
        gather = gather_indices(self.space, lists)
        if gather.numel() != sub_space.numel:
            raise ValueError(f"mask holds {gather.numel()} values; the width-{rate} model has {sub_space.numel}")
        return Slice(float(rate), -1, mask, gather)


def param_fraction(build: WidthBuilder, rate: float, full_numel: int) -> float:
    """Parameter fraction of the width-``rate`` model (built on the meta device: no memory)."""
    with torch.device("meta"):
        m = build(rate)
    return sum(p.numel() for p in m.parameters() if p.requires_grad) / full_numel


def rates_for_fractions(build: WidthBuilder, fractions: list[float], full_numel: int,
                        iters: int = 30) -> list[float]:
    """For each target parameter fraction, the largest width rate whose sub-model holds at
    most that fraction (bisection; at least the smallest buildable width)."""
    rates = []
    for target in fractions:
        if target >= 1.0:
            rates.append(1.0)
            continue
        lo, hi = 1e-4, 1.0  # fraction(lo) is the minimum (every hidden size 1)
        if param_fraction(build, lo, full_numel) > target:
            rates.append(lo)
            continue
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            if param_fraction(build, mid, full_numel) <= target:
                lo = mid
            else:
                hi = mid
        rates.append(math.floor(lo * 1e6) / 1e6)
    return rates
