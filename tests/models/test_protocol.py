"""Every model implements the one declared model interface, `flowgp.models.protocol.TrainableModel`, fully: the
training loop calls every model's objective with the same keywords and sniffs no signature."""
import importlib
import inspect
import pkgutil

import pytest
import torch

import flowgp.models
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import GSP, SVGP, TGP, DeepGP, NonMarginalTGP, TGPClassification, TrainableModel, WarpedGP
from flowgp.models.amogp.model import AMOGP
from flowgp.models.latent.model import LatentDeepGP
from flowgp.training import train

MODELS = [SVGP, TGP, WarpedGP, GSP, NonMarginalTGP, TGPClassification, DeepGP, AMOGP, LatentDeepGP]
#: the named arrays of the rows a model needs besides x and y (passed by keyword, from the sampler's `extra`)
ROWS = {AMOGP: {"output"}}
OBJECTIVE_KEYWORDS = ("num_data", "generator", "batch_rows", "indices")

pytestmark = pytest.mark.usefixtures("float64_default")


def _model_classes():
    """Every class defined under flowgp.models with an `elbo` method."""
    found = set()
    for info in pkgutil.walk_packages(flowgp.models.__path__, "flowgp.models."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ == module.__name__ and callable(getattr(cls, "elbo", None))
                    and cls is not TrainableModel):
                found.add(cls)
    return found


def test_every_model_class_is_listed_here():
    assert _model_classes() == set(MODELS)


def _keyword_defaults(function, names):
    params = inspect.signature(function).parameters
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {name: (name in params and params[name].kind in kinds and params[name].default is None) for name in names}


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_every_model_implements_the_protocol_with_every_keyword(cls):
    assert issubclass(cls, TrainableModel)
    for method in ("elbo", "training_objective"):
        function = getattr(cls, method)
        assert all(_keyword_defaults(function, OBJECTIVE_KEYWORDS).values()), (method,
                                                                             _keyword_defaults(function, OBJECTIVE_KEYWORDS))
        params = inspect.signature(function).parameters
        required = {n for n, p in list(params.items())[3:] if p.default is inspect.Parameter.empty
                    and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
        assert required <= ROWS.get(cls, set()), (method, required)
        if ROWS.get(cls):  # `training_objective` passes the rows on to `elbo`
            assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) or ROWS[cls] <= set(params)
    assert all(_keyword_defaults(cls.predict, ("generator",)).values())


def test_the_training_objective_of_a_bound_trained_model_is_its_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 1, generator=g)
    y = torch.sin(3 * x)
    model = SVGP(make_kernel("rbf", 1), x[:6].clone(), GaussianLikelihood(0.1))
    kwargs = dict(num_data=90, generator=None, batch_rows=(0, 30), indices=torch.arange(30))
    assert torch.equal(model.training_objective(x, y, **kwargs), model.elbo(x, y, num_data=90))


def test_a_model_without_the_protocol_is_refused_naming_it():
    class ElboOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def elbo(self, x, y, num_data=None):
            return -self.w ** 2

    x = torch.zeros(4, 1)
    with pytest.raises(TypeError, match="TrainableModel.*loss="):
        train(ElboOnly(), x, x, epochs=1, verbose=False)
