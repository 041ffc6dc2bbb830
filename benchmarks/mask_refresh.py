"""FedGMR's mask refresh: the nested level masks from the global model's magnitudes.

Before: a full ranking of every prunable coordinate (``magnitude_ranking``: a stable sort
per layer, then an argsort and a stable sort of the merged scores) and the level masks as
its prefixes. After (``nested_ranked_masks``, what ``MagnitudePolicy`` refreshes with): one
selection per level, from the densest level down, each inside the previous selection.
The script checks that both give the same masks, times both side by side (alternating
repeats; process CPU time beside wall time, medians) and one local SGD step of the same
model (batch 20) for scale, and prints the ratios.

    python benchmarks/mask_refresh.py [--model conv2] [--repeats 5]
    python benchmarks/mask_refresh.py --profile-steps 20   # the refresh's share of a FedGMR run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedgmr.algorithm.masks import magnitude_ranking, nested_masks
from fedgmr.algorithm.params import ParamSpace
from fedgmr.models.registry import build_model

MODELS = {
    # the paper's FEMNIST model (6.5 M parameters) on 28x28 inputs, and the quickstart CNN
    "conv2": ("conv2", {}, (1, 28, 28)),
    "cnn": ("cnn", {"channels": [32, 64]}, (1, 16, 16)),
}
LADDER = [0.05, 0.1, 0.2, 0.5, 1.0]


def timed(fn) -> tuple[float, float, object]:
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - w0, out


def profile_run(model: str, steps: int, check_interval: int) -> None:
    """cProfile ``steps`` server steps of FedGMR (masks refreshed every ``check_interval``
    steps, restoration on) with the serial executor: the refresh's share of the run."""
    import cProfile
    import io
    import pstats

    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    arch, options, shape = MODELS[model]
    raw = {"method": "fedgmr", "seed": 0,
           "data": {"name": "digits", "partition": "iid", "options": {"image_size": shape[-1]}},
           "model": {"name": arch, "options": options},
           "clients": {"num_clients": 10, "heterogeneity": "high"},
           "training": {"lr": 0.05, "local_steps": 5, "batch_size": 20},
           "restoration": {"check_interval": check_interval, "patience": 2},
           "coordination": {"trigger": "k", "k": 3},
           "run": {"max_steps": steps, "eval_every": 10**9, "torch_threads": 1}}
    exp = build_experiment(resolve_config(raw))
    sim = exp.simulator
    sim.start()  # the first dispatch wave, outside the profile
    prof = cProfile.Profile(time.process_time)  # CPU time: the figure that holds on a busy machine
    c0, w0 = time.process_time(), time.perf_counter()
    prof.enable()
    sim.run(max_steps=steps)
    prof.disable()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    exp.executor.close()
    stats = pstats.Stats(prof)
    refresh = sum(v[3] for k, v in stats.stats.items() if k[2] == "refresh" and k[0].endswith("policies.py"))
    print(f"[{model}] FedGMR, {steps} server steps (masks refreshed every {check_interval}), serial executor: "
          f"CPU {cpu:.2f} s, wall {wall:.2f} s; MagnitudePolicy.refresh {refresh:.2f} s cumulative "
          f"({100 * refresh / stats.total_tt:.1f} % of the profile's {stats.total_tt:.2f} s)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(15)
    print(out.getvalue())


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), nargs="+", default=["conv2"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--basis", default="model", choices=["model", "prunable"])
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="instead: cProfile that many server steps of a FedGMR run (top 15 by cumulative CPU time)")
    ap.add_argument("--check-interval", type=int, default=5, help="with --profile-steps: steps between refreshes")
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    if args.profile_steps:
        for name in args.model:
            profile_run(name, args.profile_steps, args.check_interval)
        return
    from fedgmr.algorithm.masks import nested_ranked_masks  # not in a library from before it

    for name in args.model:
        arch, options, shape = MODELS[name]
        torch.manual_seed(0)
        model = build_model(arch, 10, shape, **options)
        space = ParamSpace(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(20, *shape), torch.randint(0, 10, (20,))

        def sgd_step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        sgd_step()  # warm-up
        old_c, old_w, new_c, new_w, step_c, step_w = [], [], [], [], [], []
        for r in range(args.repeats):
            flat = space.flatten(model).detach().clone()
            flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(r))[:flat.numel() // 10]] = 0.0
            c, w, old = timed(lambda: nested_masks(magnitude_ranking(flat, space, 0.02), space, LADDER, 0.02,
                                                   args.basis))
            old_c.append(c), old_w.append(w)
            c, w, new = timed(lambda: nested_ranked_masks(flat, space, LADDER, 0.02, args.basis))
            new_c.append(c), new_w.append(w)
            if not all(torch.equal(a, b) for a, b in zip(old, new)):
                raise SystemExit(f"[{name}] the masks differ on repeat {r}")
            c, w, _ = timed(lambda: [sgd_step() for _ in range(5)])
            step_c.append(c / 5), step_w.append(w / 5)
        med = statistics.median
        print(f"[{name}] {space.numel:,} parameters ({space.num_prunable:,} prunable), ladder {LADDER}, "
              f"basis={args.basis}, {args.repeats} repeats, torch_threads=1; masks identical on every repeat")
        print(f"  {'':36}{'CPU s':>9}{'wall s':>9}   per repeat (CPU s)")
        for label, cs, ws in (("refresh before (ranking + prefixes)", old_c, old_w),
                              ("refresh after (selection per level)", new_c, new_w),
                              ("one local SGD step (batch 20)", step_c, step_w)):
            print(f"  {label:36}{med(cs):9.4f}{med(ws):9.4f}   " + " ".join(f"{v:.4f}" for v in cs))
        ratio = [o / n for o, n in zip(old_c, new_c)]
        print(f"  CPU time before/after: {med(ratio):.1f}x (per repeat: {' '.join(f'{v:.1f}' for v in ratio)}); "
              f"refresh in local SGD steps: before {med(old_c) / med(step_c):.1f}, "
              f"after {med(new_c) / med(step_c):.2f}")


if __name__ == "__main__":
    main()
