"""The flow initialisers the estimators use (TGP appendix B.2-B.4), from wherever they live.

Transitional: they move from `flowgp.flows` / `flowgp.flows.conditional` to `flowgp.initialisation`; this
module imports them from the new place when it exists, so the estimators work before and after the move.
"""
from __future__ import annotations

try:
    from ..initialisation import init_from_data, init_identity, init_input_dependent, init_random
except ImportError:  # flowgp.initialisation not merged yet
    from ..flows import init_from_data, init_identity, init_random
    from ..flows.conditional import init_input_dependent

__all__ = ["init_from_data", "init_identity", "init_input_dependent", "init_random"]
