"""GP models: `nn.Module`s that implement one declared interface, `flowgp.models.protocol.TrainableModel`.

Every model has `elbo(x, y, *, num_data, generator=None, batch_rows=None, indices=None, **rows)` (the minibatch
bound rescaled to N rows), `training_objective` with the same keywords (what `flowgp.training.train` maximises:
the bound, except for the latent deep GP's per-slot objective) and `predict(x, *, generator=None, **rows)`.
All take every keyword, used or not, so the training loop calls them alike; `**rows` are the named arrays the
data carry (AMO-GP's `output`). See `flowgp.models.protocol` for what each keyword means.
"""
from .protocol import TrainableModel, TrainsItsBound
from .svgp import SVGP
from .tgp import TGP
from .warped import WarpedGP
from .classification import TGPClassification
from .gsp import GSP
from .nonmarginal import InducingModulatedFlow, MarginalFlowAdapter, NonMarginalFlow, NonMarginalTGP
from .deep_gp import DeepGP, GPLayer, build_deep_gp

__all__ = ["TrainableModel", "TrainsItsBound", "SVGP", "TGP", "WarpedGP", "TGPClassification", "GSP", "NonMarginalTGP", "NonMarginalFlow", "MarginalFlowAdapter",
           "InducingModulatedFlow"]
__all__ += ["DeepGP", "GPLayer", "build_deep_gp"]
