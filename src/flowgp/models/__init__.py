"""GP models with an explicit `elbo(x, y, num_data)` and `predict(x)`."""
from .svgp import SVGP
from .tgp import TGP
from .warped import WarpedGP
from .classification import TGPClassification
from .gsp import GSP
from .nonmarginal import InducingModulatedFlow, MarginalFlowAdapter, NonMarginalFlow, NonMarginalTGP
from .deep_gp import DeepGP, GPLayer, build_deep_gp

__all__ = ["SVGP", "TGP", "WarpedGP", "TGPClassification", "GSP", "NonMarginalTGP", "NonMarginalFlow", "MarginalFlowAdapter",
           "InducingModulatedFlow"]
__all__ += ["DeepGP", "GPLayer", "build_deep_gp"]
