"""Stage 2: fit a system's efficiency factors and collective curves, with uncertainty.

Reads runs (ingest's contract) and writes a versioned calibration JSON
(:mod:`calibrate.calibration`).  Never imports analytic, reports or the calib CLI.
"""
