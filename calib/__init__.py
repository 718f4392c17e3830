"""calib: turn profiler traces of distributed transformer training into a calibrated
performance model, and predict how training scales.

The public Python API (:mod:`calib.api`) is re-exported here, loaded on first use so that
``import calib`` and ``calib --help`` stay fast::

    import calib
    model = calib.SystemModel().fit(calib.load_runs(system="polaris"))

The stages install as ``calib.ingest``, ``calib.calibrate``, ``calib.analytic`` and
``calib.reports`` (data flows one way); their shared contracts are in ``calib.core``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("calib")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+src"

#: the public API: name -> defined in calib.api
_API = (
    "NotFittedError",
    "SystemModel",
    "demo",
    "ingest_run",
    "load_hardware",
    "load_model",
    "load_runs",
    "report",
    "validate",
)

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from calib import api

        return getattr(api, name)
    raise AttributeError(f"module 'calib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
