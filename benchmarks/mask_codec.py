"""Mask-code sizes and speed: every candidate coding of random and real magnitude masks.

For each mask it prints the size of each candidate coding (header included), relative
to the entropy bound N·H(ρ)/8 and to the plain bitmap N/8, marks the one
:func:`~fedgmr.algorithm.encoding.encode_mask` picks, and times encoding (choosing
among all candidates) and decoding. Runs in a few seconds on a CPU::

    .venv/bin/python benchmarks/mask_codec.py
"""

from __future__ import annotations

import argparse

import math
import time

import torch

from fedgmr.algorithm.encoding import decode_mask, encode_mask, mask_code_kind, mask_code_sizes
from fedgmr.algorithm.masks import magnitude_ranking, nested_masks
from fedgmr.algorithm.params import ParamSpace
from fedgmr.models import build_model

KINDS = ("all", "rice", "rice-complement", "zlib", "bitmap")
LADDER = [0.05, 0.1, 0.2, 0.5, 1.0]


def entropy_bytes(n: int, k: int) -> float:
    rho = k / n
    if rho in (0.0, 1.0):
        return 0.0
    return n * -(rho * math.log2(rho) + (1 - rho) * math.log2(1 - rho)) / 8


def best_time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def report(label: str, mask: torch.Tensor) -> None:
    n, k = mask.numel(), int(mask.sum())
    h, bitmap = entropy_bytes(n, k), n / 8
    sizes = mask_code_sizes(mask)
    code = encode_mask(mask)
    assert torch.equal(decode_mask(code, n), mask)
    enc = best_time(lambda: encode_mask(mask))
    dec = best_time(lambda: decode_mask(code, n))
    print(f"\n{label}: N={n:,}  k={k:,}  rho={k / n:.4f}  N*H/8={h:,.0f} B  N/8={bitmap:,.0f} B  "
          f"chosen={mask_code_kind(code)} ({len(code):,} B)  encode {enc * 1e3:.1f} ms  decode {dec * 1e3:.1f} ms")
    print(f"  {'coding':<16}{'bytes':>10}{'/ (N*H/8)':>11}{'/ (N/8)':>9}")
    for kind in KINDS:
        if kind not in sizes:
            continue
        s = sizes[kind]
        rel_h = f"{s / h:.3f}" if h else "-"
        mark = "  <-" if kind == mask_code_kind(code) else ""
        print(f"  {kind:<16}{s:>10,}{rel_h:>11}{s / bitmap:>9.3f}{mark}")


def parser() -> argparse.ArgumentParser:
    """The command line: no options (tests parse the documented commands with it)."""
    return argparse.ArgumentParser(description=__doc__.splitlines()[0])


def main() -> None:
    parser().parse_args()
    t0 = time.perf_counter()
    n = 1_000_000
    g = torch.Generator().manual_seed(0)
    for rho in (0.05, 0.1, 0.2, 0.5):
        report(f"random Bernoulli({rho})", torch.rand(n, generator=g) < rho)

    torch.manual_seed(0)
    model = build_model("cnn", 10, (1, 16, 16), channels=[32, 64])
    space = ParamSpace(model)
    flat = space.flatten(model)
    ranking = magnitude_ranking(flat, space)
    for rho, mask in zip(LADDER, nested_masks(ranking, space, LADDER, basis="prunable")):  # the printed figures
        report(f"cnn magnitude mask, ladder level {rho}", mask)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
