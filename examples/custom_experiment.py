"""A custom experiment in ~20 lines: your own model, FedGMR with GA instead of MA.

    python examples/custom_experiment.py
"""

import torch.nn as nn

from fedgmr import MODELS, build_experiment, resolve_config


@MODELS.register("tiny_mlp")
def tiny_mlp(num_classes, input_shape, width=1.0):
    hidden = max(1, round(48 * width))
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))


cfg = resolve_config({
    "method": "fedgmr_ga",  # FedGMR with gradient averaging
    "model": {"name": "tiny_mlp"},
    "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.3},
    "clients": {"num_clients": 20, "heterogeneity": "medium"},
    "training": {"lr": 0.2},
    "restoration": {"check_interval": 5, "patience": 2},
    "run": {"max_steps": 60, "eval_every": 20},
})
exp = build_experiment(cfg, on_record=lambda r: print(f"t={r['time']:7.1f}s step {r['step']:3d} "
                                                      f"acc {r['accuracy']:.3f} density {r['avg_density']:.2f}"))
exp.simulator.run(max_steps=cfg.run.max_steps)
print("final densities:", exp.strategy.densities())
