import pytest
import torch

from flowgp.kernels import make_kernel
from flowgp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP
from flowgp.training import train

pytestmark = pytest.mark.usefixtures("float64_default")


def _problem(n=200, noise_std=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.sin(2 * x) + noise_std * torch.randn(n, 1, generator=g)
    return x, y


def _model(x):
    return SVGP(make_kernel("rbf", 1), x[:15].clone(), GaussianLikelihood(0.5))


def test_training_recovers_the_noise_level():
    x, y = _problem(noise_std=0.1)
    model = _model(x)
    history = train(model, x, y, epochs=600, lr=0.03, verbose=False)
    assert history[-1] < history[0]
    assert model.likelihood.noise.item() == pytest.approx(0.01, rel=0.35)


def test_fixed_noise_schedule_holds_noise_then_releases_it():
    x, y = _problem()
    model = _model(x)
    train(model, x, y, epochs=50, fix_noise_fraction=1.0, verbose=False)
    assert model.likelihood.noise.item() == pytest.approx(0.5, rel=1e-12)
    train(model, x, y, epochs=50, fix_noise_fraction=0.5, verbose=False)
    assert model.likelihood.noise.item() != pytest.approx(0.5, rel=1e-3)


def test_minibatch_training_is_reproducible_for_a_seed():
    x, y = _problem()
    a, b = _model(x), _model(x)
    ha = train(a, x, y, epochs=5, batch_size=32, seed=3, verbose=False)
    hb = train(b, x, y, epochs=5, batch_size=32, seed=3, verbose=False)
    assert ha == hb
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)


def test_interrupted_training_resumes_to_the_same_result(tmp_path):
    x, y = _problem()
    reference = _model(x)
    h_ref = train(reference, x, y, epochs=12, batch_size=64, seed=1, verbose=False)
    resumed = _model(x)
    ckpt = tmp_path / "run.pt"
    train(resumed, x, y, epochs=5, batch_size=64, seed=1, verbose=False, checkpoint_path=ckpt, checkpoint_every=1)
    fresh = _model(x)  # a new process would rebuild the model, then resume from the file
    h_res = train(fresh, x, y, epochs=12, batch_size=64, seed=1, verbose=False, checkpoint_path=ckpt)
    assert h_res == pytest.approx(h_ref, rel=1e-12)
    for pa, pb in zip(reference.parameters(), fresh.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-12)


def test_bad_training_arguments():
    x, y = _problem(n=10)
    with pytest.raises(ValueError, match="epochs"):
        train(_model(x), x, y, epochs=-1)
    with pytest.raises(ValueError, match="fix_noise_fraction"):
        train(_model(x), x, y, epochs=1, fix_noise_fraction=2.0)
    with pytest.raises(ValueError, match="batch_size"):
        train(_model(x), x, y, epochs=1, batch_size=0)
