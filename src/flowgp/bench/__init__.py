"""`flowgp bench`: the TGP paper's experiments as a resumable benchmark suite.

Subcommands live in one module each (see `flowgp.bench.cli` for the interface); results are JSON lines
written by `flowgp.bench.results.ResultStore`; `flowgp.bench.models` maps model names to estimators.
"""
