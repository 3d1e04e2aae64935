"""flowgp: scalable Gaussian processes reshaped by normalizing flows."""
__version__ = "0.1.0"
