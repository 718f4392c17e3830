"""Stage 4: self-contained HTML, PNG and Markdown reports of runs, calibrations and
predictions.  Never imports the calib CLI.
"""
