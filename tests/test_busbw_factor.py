"""nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md of nccl-tests): all-reduce
2 (n - 1) / n, all-gather / reduce-scatter / all-to-all (n - 1) / n, broadcast and reduce 1.
The time model asks for one collective name at a time: that path must give what the
per-element path (a column of trace names) gives."""

from __future__ import annotations

import numpy as np
import pytest

from calib.core import collective_names as C


@pytest.mark.parametrize(
    ("name", "at8"),
    [
        (C.ALLREDUCE, 1.75),
        (C.ALLGATHER, 0.875),
        (C.REDUCESCATTER, 0.875),
        (C.ALLTOALL, 0.875),
        (C.REDUCE, 1.0),
    ],
)
def test_factors_by_hand(name, at8):
    assert C.busbw_factor(name, 8.0) == pytest.approx(at8)


def test_one_name_equals_the_per_element_path():
    n = np.array([0.0, 1.0, 2.0, 4.0, 8.0, 1536.0])
    names = sorted({*C._FACTOR_2, *C._FACTOR_N1, C.REDUCE, C.BARRIER, C.UNKNOWN, "broadcast"})
    for name in names:
        one = C.busbw_factor(name, n)
        col = C.busbw_factor(np.array([name] * len(n), dtype=object), n)
        np.testing.assert_array_equal(one, col)
    assert np.isnan(C.busbw_factor(C.BARRIER, 8.0))
