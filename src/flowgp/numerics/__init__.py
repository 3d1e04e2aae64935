"""Numerics with no model in them: stable Cholesky and triangular algebra, Gauss-Hermite quadrature, the
constrained-parameter convention, gradient-need queries and reproducible per-row random draws.

Everything else in flowgp builds on this layer; it imports nothing else from flowgp."""
