"""Experiment tooling: building runs from configs, run directories, metrics, tables, sweeps, plots, loggers."""
