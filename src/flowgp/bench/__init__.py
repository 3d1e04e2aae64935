"""`flowgp bench`: the papers' experiments (TGP, CNF-DGP, DGP-IWVI/DREG, AMO-GP) as a resumable benchmark
suite, and the tables that compare its rows with the papers' (`dgp-table`, `ldgp-table`, `ldgp-authors`).
`benchmarks/README.md` says which subcommand reproduces which table or figure.

Subcommands live in one module each (see `flowgp.bench.cli` for the interface); results are JSON lines
written by `flowgp.bench.results.ResultStore`; `flowgp.bench.models` maps model names to estimators.
"""
