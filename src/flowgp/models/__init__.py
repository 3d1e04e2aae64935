"""GP models with an explicit `elbo(x, y, num_data)` and `predict(x)`."""
from .svgp import SVGP
from .tgp import TGP
from .warped import WarpedGP

__all__ = ["SVGP", "TGP", "WarpedGP"]
