"""Scores (NLL, RMSE, coverage, calibration) and the figures the CLI and the bench draw."""
