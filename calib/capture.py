"""Public capture and benchmark API (re-exported from :mod:`ingest.capture`).

::

    from calib.capture import capture
    with capture("traces/run1", system="polaris", model=dict(d=2048, l=24, a=16, s=2048, V=50304, b=4)) as cap:
        for batch in loader:
            train_step(batch)
            cap.step()

torch is imported only when a capture or benchmark runs.
"""

from calib.ingest.capture import *  # noqa: F403
from calib.ingest.capture import __all__  # noqa: F401
