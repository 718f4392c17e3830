"""Input bytes of a launching op from its recorded shapes (ingest.device_ops), hand-counted."""

from __future__ import annotations

import pytest
from calib.ingest.device_ops import _tensor_sizes


@pytest.mark.parametrize(
    ("dims", "types", "expected"),
    [
        # a [2, 3, 4] fp32 activation (24 elements, 96 B) and a [4, 5] bf16 weight (20, 40 B):
        # 136 B; the largest input is the activation, its leading dimensions 2 x 3 = 6
        ([[2, 3, 4], [4, 5]], ["float", "c10::BFloat16"], (136, 24, 6)),
        # a scalar argument ([]), a non-tensor (None) and an unknown dtype count nothing
        ([[8], [], None, [3]], ["float", "Scalar", "", "mystery"], (32, 8, 1)),
        # a negative dimension or more than 2^62 elements is not a tensor (no int64 overflow)
        ([[-1, 3], [2**40, 2**40], [5]], ["float", "float", "double"], (40, 5, 1)),
        ([[1, 2]], "not a list", (0, 0, 0)),
        ([[True, 2]], ["float"], (0, 0, 0)),
    ],
)
def test_tensor_sizes(dims, types, expected) -> None:
    assert _tensor_sizes(dims, types) == expected
