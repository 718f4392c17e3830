"""Stage 3: the analytical model: predict iteration time, memory and scaling of any
parallel strategy on any hardware, from a calibration or from a hardware spec alone.

Never imports reports or the calib CLI.
"""
