"""calib: turn profiler traces of distributed transformer training into a calibrated
performance model, and predict how training scales.

The public Python API is re-exported here; the stages live in the top-level packages
``ingest``, ``calibrate``, ``analytic`` and ``reports`` (data flows one way).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("calib")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"

__all__ = ["__version__"]
