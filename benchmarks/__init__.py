"""Scripts that measure flowgp (perf/), answer one question each (studies/), and what they share (lib/).

Run them from the repository root as modules, e.g. `python -m benchmarks.perf.step_time`; see README.md here.
The library and its tests never import this package."""
