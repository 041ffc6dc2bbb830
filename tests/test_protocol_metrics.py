"""Evaluation protocol (docs/reference.md §9): MRI, Acc@t*, time-to-accuracy, on the
hand-computed vectors of docs/reference.md Appendix A."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedgmr.experiment.metrics import acc_at_t, mri, time_to_accuracy


def test_mri_vector():
    # 100/2 * (10/70 + 5/75) = 10.476...
    value = mri(80.0, [70.0, 75.0])
    assert value == pytest.approx(50.0 * (10.0 / 70.0 + 5.0 / 75.0), rel=1e-12)
    assert round(value, 2) == 10.48


def test_mri_single_baseline_and_negative():
    assert mri(80.0, [80.0]) == 0.0
    assert mri(60.0, [80.0]) == pytest.approx(-25.0)
    assert math.isnan(mri(80.0, []))


def test_acc_at_t_vector():
    times = list(range(101))
    accs = [float(t) for t in times]
    mean, std = acc_at_t(times, accs, 50.5)
    # first eval past 50.5 is index 51; window 41..60
    assert mean == pytest.approx(50.5, abs=1e-12)
    assert std == pytest.approx(math.sqrt((20 ** 2 - 1) / 12), rel=1e-12)  # population std
    assert std == pytest.approx(5.766, abs=5e-4)
    assert std == pytest.approx(float(np.std(np.arange(41, 61))), rel=1e-12)


def test_acc_at_t_strictly_exceeds():
    times = list(range(101))
    accs = [float(t) for t in times]
    # t* = 50 exactly: the first eval whose time *exceeds* it is 51 -> same window
    assert acc_at_t(times, accs, 50.0)[0] == pytest.approx(50.5)


def test_acc_at_t_window_clipped_at_start():
    times = list(range(101))
    accs = [float(t) for t in times]
    mean, std = acc_at_t(times, accs, 2.5)  # i = 3 -> window [0, 13)
    assert mean == pytest.approx(6.0)
    assert std == pytest.approx(float(np.std(np.arange(0, 13))))


def test_acc_at_t_window_clipped_at_end():
    times = list(range(101))
    accs = [float(t) for t in times]
    mean, _ = acc_at_t(times, accs, 95.5)  # i = 96 -> window [86, 101)
    assert mean == pytest.approx(float(np.mean(np.arange(86, 101))))


def test_acc_at_t_nan_when_run_never_passes_t_star():
    times = list(range(101))
    accs = [float(t) for t in times]
    mean, std = acc_at_t(times, accs, 100.0)
    assert math.isnan(mean) and math.isnan(std)
    mean, std = acc_at_t([], [], 1.0)
    assert math.isnan(mean) and math.isnan(std)


def test_time_to_accuracy():
    times = [0.0, 10.0, 20.0, 30.0]
    accs = [0.1, 0.5, 0.4, 0.7]
    assert time_to_accuracy(times, accs, 0.5) == 10.0  # reaching = >=
    assert time_to_accuracy(times, accs, 0.45) == 10.0
    assert time_to_accuracy(times, accs, 0.6) == 30.0
    assert time_to_accuracy(times, accs, 0.05) == 0.0
    assert math.isnan(time_to_accuracy(times, accs, 0.9))
    assert math.isnan(time_to_accuracy([], [], 0.1))
