"""Standard errors of the least-squares fits: the textbook OLS covariance, and no error at
all (not a false +-0) when a fit has as many data as parameters."""

import numpy as np
import pytest
from calib.calibrate.device_fit import _linear_in_layers
from calib.calibrate.params import lstsq_stderr, stderr_or_none


def test_ols_standard_errors_match_the_hand_worked_line():
    # y = a + b x through (0, 0), (1, 1), (2, 3): b = Sxy / Sxx = 3 / 2, a = -1/6,
    # RSS = 1/6 on one degree of freedom; se(b) = sqrt(s2 / Sxx) = sqrt(1/12),
    # se(a) = sqrt(s2 (1/n + xbar^2 / Sxx)) = sqrt(5/36)
    x, y = np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.0, 3.0])
    A = np.column_stack([np.ones_like(x), x])
    c, *_ = np.linalg.lstsq(A, y, rcond=None)
    assert c == pytest.approx([-1 / 6, 1.5])
    se = lstsq_stderr(A, A @ c - y)
    assert se == pytest.approx([np.sqrt(5 / 36), np.sqrt(1 / 12)])


def test_exact_fit_has_no_standard_error():
    # two points, two parameters: zero residual by construction; the old floor of one
    # degree of freedom reported +-0 (false certainty)
    A = np.column_stack([np.ones(2), np.array([1.0, 2.0])])
    se = lstsq_stderr(A, np.zeros(2))
    assert np.isnan(se).all()
    assert stderr_or_none(se[0]) is None
    assert stderr_or_none(0.25) == 0.25


def test_per_layer_fit_reports_no_error_from_two_layer_counts():
    # two layer counts: per-layer and per-step parts are exact, no stderr; a third count
    # off the line gives both a finite one
    per_layer, per_step = _linear_in_layers(np.array([8.0, 16.0]), np.array([1.0, 1.8]), None, "s")
    assert per_layer.value == pytest.approx(0.1) and per_step.value == pytest.approx(0.2)
    assert per_layer.stderr is None and per_step.stderr is None
    per_layer, per_step = _linear_in_layers(np.array([8.0, 16.0, 24.0]), np.array([1.0, 1.8, 2.7]), None, "s")
    assert per_layer.stderr > 0 and per_step.stderr > 0
