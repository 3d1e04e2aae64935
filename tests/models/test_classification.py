"""GP classification with transformed GPs: model (TGPClassification) and estimators (SVGP/TGPClassifier)."""
import math

import numpy as np
import pytest
import torch
from sklearn.base import clone

import flowgp
from flowgp import SVGPClassifier, TGPClassifier
from flowgp.flows.conditional import input_dependent_flows
from flowgp.training.initialisation import init_random
from flowgp.gp.kernels import make_kernel
from flowgp.models import TGPClassification


def _model(num_classes, flow="sal", n=12, m=5, d=2, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    num_latent = 1 if num_classes == 2 else num_classes
    kernel = make_kernel("rbf", d, batch_shape=() if num_latent == 1 else (num_latent,))
    z = torch.randn(m, d, generator=g, dtype=torch.float64)
    model = TGPClassification(kernel, z, num_classes, flow=flow, **kw).double()
    with torch.no_grad():
        model.gp.q_mu.copy_(torch.randn(model.gp.q_mu.shape, generator=g, dtype=torch.float64))
        noise = 0.2 * torch.randn(model.gp.q_sqrt.shape, generator=g, dtype=torch.float64)
        model.gp.q_sqrt.copy_(0.5 * torch.eye(m, dtype=torch.float64) + noise.tril())
    if any(True for _ in model.flow.parameters()):
        init_random(model.flow, std=0.3, generator=g)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, num_classes, (n,), generator=g)
    return model, x, y


def _within_se(estimate, draws, sigmas=4.0, floor=1e-6):
    mc = draws.mean(0)
    se = draws.std(0) / math.sqrt(draws.shape[0])
    assert torch.all((estimate - mc).abs() <= sigmas * se + floor), (estimate, mc, se)


# ------------------------------------------------------------------------------------------ model
def test_binary_quadrature_ell_agrees_with_monte_carlo():
    model, x, y = _model(2, flow="sal", quadrature_points=40)
    with torch.no_grad():
        quad = model.expected_log_likelihood(x, y)
        mean, var = model.gp.marginals(x)
        g = torch.Generator().manual_seed(3)
        f = mean + var.sqrt() * torch.randn((100000,) + mean.shape, generator=g, dtype=torch.float64)
        draws = torch.special.log_ndtr((2.0 * y.double().unsqueeze(-1) - 1.0) * model.flow(f))[..., 0]
    assert quad.shape == (12,)
    _within_se(quad, draws)


def test_multiclass_mc_ell_is_unbiased():
    model, x, y = _model(4, flow="sal", mc_samples=8)
    with torch.no_grad():
        mean, var = model.gp.marginals(x)
        g = torch.Generator().manual_seed(4)
        f = mean + var.sqrt() * torch.randn((200000,) + mean.shape, generator=g, dtype=torch.float64)
        reference = torch.log_softmax(model.flow(f), -1).gather(-1, y.expand(f.shape[:-1]).unsqueeze(-1))[..., 0]
        reference = reference.mean(0)
        gen = torch.Generator().manual_seed(5)
        small = torch.stack([model.expected_log_likelihood(x, y, generator=gen) for _ in range(500)])
    _within_se(reference, small)


@pytest.mark.parametrize("num_classes, likelihood", [(2, "softmax"), (3, "softmax"), (12, "softmax"),
                                                     (5, "robustmax")])
def test_probabilities_sum_to_one(num_classes, likelihood):
    model, x, _ = _model(num_classes, likelihood=likelihood, predict_samples=64)
    with torch.no_grad():
        probs = model.predict_proba(x)
    assert probs.shape == (x.shape[0], num_classes)
    assert torch.all(probs >= 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(x.shape[0], dtype=torch.float64), rtol=0, atol=1e-12)


def test_identity_sal_flow_reproduces_the_svgp_classifier():
    # SAL at its default parameters is exactly the identity: quadrature through it must give Φ(μ/√(1+σ²))
    plain, x, y = _model(2, flow="identity")
    warped = TGPClassification(plain.gp.kernel, plain.gp.inducing_points.detach(), 2, flow="sal",
                               predict_quadrature_points=100).double()
    warped.gp.load_state_dict(plain.gp.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(warped.predict_proba(x), plain.predict_proba(x), rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(warped.elbo(x, y), plain.elbo(x, y))


def test_robustmax_identity_flow_uses_quadrature_and_matches_monte_carlo_path():
    model, x, y = _model(3, flow="identity", likelihood="robustmax", quadrature_points=40, mc_samples=50000)
    with torch.no_grad():
        quad = model.expected_log_likelihood(x, y)
        model.flow = flowgp.make_flow("sal", param_shape=(3,)).double()  # identity values, forces the MC path
        mc = model.expected_log_likelihood(x, y, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(quad, mc, rtol=0, atol=0.05)


def test_elbo_gradients_by_gradcheck():
    model, x, y = _model(2, flow="sal", n=5, m=3)
    q_mu = model.gp.q_mu.detach().clone().requires_grad_(True)

    def fn(v):
        del model.gp.q_mu  # evaluate the ELBO as a plain function of the variational mean
        model.gp.q_mu = v
        return model.elbo(x, y)

    assert torch.autograd.gradcheck(fn, (q_mu,))


def test_minibatch_elbo_is_scaled_to_the_full_data_set():
    model, x, y = _model(2)
    with torch.no_grad():
        full = model.elbo(x, y)
        halves = sum(model.expected_log_likelihood(x[i:i + 6], y[i:i + 6]).sum() for i in (0, 6))
        torch.testing.assert_close(full, halves - model.gp.kl_divergence())
        batch = model.elbo(x[:6], y[:6], num_data=12)
        torch.testing.assert_close(batch, 2 * model.expected_log_likelihood(x[:6], y[:6]).sum()
                                   - model.gp.kl_divergence())


def test_model_refuses_bad_input():
    model, x, y = _model(3)
    with pytest.raises(ValueError, match="class indices"):
        model.elbo(x, torch.full_like(y, 3))
    with pytest.raises(ValueError, match="shape"):
        model.elbo(x, y[:-1])
    with pytest.raises(ValueError, match="NaN"):
        model.elbo(torch.full_like(x, float("nan")), y)
    kernel = make_kernel("rbf", 2)
    z = torch.zeros(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="num_classes"):
        TGPClassification(kernel, z, 1)
    with pytest.raises(ValueError, match="likelihood"):
        TGPClassification(kernel, z, 3, likelihood="logit")
    with pytest.raises(ValueError, match="positive inputs"):
        TGPClassification(kernel, z, 3, flow="log")
    with pytest.raises(ValueError, match="unknown flow"):
        TGPClassification(kernel, z, 3, flow="nope")


# ------------------------------------------------------------------------------------------ estimators
def _blobs(n=120, classes=2, seed=0):
    rng = np.random.default_rng(seed)
    # well separated centres on a circle of radius 4
    angle = 2 * np.pi * np.arange(classes) / classes
    centres = 4.0 * np.stack([np.cos(angle), np.sin(angle)], 1)
    y = rng.integers(0, classes, n)
    return centres[y] + rng.normal(size=(n, 2)), y


def test_binary_classifier_learns_separable_data_with_string_labels(tmp_path):
    X, y = _blobs()
    labels = np.array(["cat", "dog"])[y]
    est = TGPClassifier(num_inducing=10, epochs=60, lr=0.05, verbose=False, kmeans_restarts=1).fit(X, labels)
    assert list(est.classes_) == ["cat", "dog"]
    assert est.score(X, labels) > 0.9
    probs = est.predict_proba(X)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    assert set(est.predict(X)) <= {"cat", "dog"}
    lpd = est.log_predictive_density(X, labels)
    assert lpd.shape == (120,) and np.all(lpd <= 0)
    np.testing.assert_allclose(lpd, np.log(probs[np.arange(120), y]))
    path = est.save(tmp_path / "tgpc.pt")
    again = flowgp.load(path)
    assert isinstance(again, TGPClassifier)
    np.testing.assert_allclose(again.predict_proba(X), probs)
    np.testing.assert_array_equal(again.classes_, est.classes_)


def test_multiclass_classifier_twelve_classes_and_robustmax():
    X, y = _blobs(n=240, classes=12, seed=1)
    est = SVGPClassifier(num_inducing=12, epochs=15, lr=0.05, verbose=False, kmeans_restarts=1,
                         mc_samples=4, predict_samples=32).fit(X, y)
    probs = est.predict_proba(X)
    assert probs.shape == (240, 12)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    assert est.score(X, y) > 1.0 / 12 + 0.1  # well above chance after a few epochs
    rm = SVGPClassifier(num_inducing=8, epochs=10, lr=0.05, verbose=False, kmeans_restarts=1,
                        likelihood="robustmax").fit(X[:120], y[:120] % 3)
    np.testing.assert_allclose(rm.predict_proba(X).sum(1), 1.0, atol=1e-12)


def test_fix_variance_epochs_holds_the_covariance_then_releases_it():
    X, y = _blobs(n=60)
    frozen = SVGPClassifier(num_inducing=6, epochs=5, fix_variance_epochs=5, verbose=False, kmeans_restarts=1).fit(X, y)
    s0 = 1e-5 ** 0.5 * torch.eye(6, dtype=torch.float64)
    torch.testing.assert_close(frozen.model_.gp.q_sqrt_tril()[0], s0)
    assert frozen.model_.gp.q_sqrt.requires_grad  # released after training
    released = SVGPClassifier(num_inducing=6, epochs=8, fix_variance_epochs=5, verbose=False,
                              kmeans_restarts=1).fit(X, y)
    assert not torch.allclose(released.model_.gp.q_sqrt_tril()[0], s0)
    assert len(released.history_) == 8


def test_identity_flow_classifier_equals_svgp_classifier():
    X, y = _blobs(n=60)
    kw = dict(num_inducing=6, epochs=10, verbose=False, kmeans_restarts=1, seed=3)
    a = SVGPClassifier(**kw).fit(X, y)
    b = TGPClassifier(flow="identity", **kw).fit(X, y)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=1e-10)


def test_input_dependent_mc_dropout_with_zero_dropout_equals_point_estimate():
    X, y = _blobs(n=60)
    est = TGPClassifier(num_inducing=6, epochs=5, verbose=False, kmeans_restarts=1, input_dependent=True,
                        dropout=0.0, bayesian="mc_dropout", hidden=(8,), flow_init_epochs=5,
                        mc_samples_predict=7).fit(X, y)
    ba = est.predict_proba(X)
    for stage in input_dependent_flows(est.model_.flow):
        stage.network.bayesian = "point"
    np.testing.assert_allclose(est.predict_proba(X), ba, rtol=1e-10, atol=1e-12)
    Xm, ym = _blobs(n=60, classes=3)
    multi = TGPClassifier(num_inducing=6, epochs=3, verbose=False, kmeans_restarts=1, input_dependent=True,
                          hidden=(8,), flow_init_epochs=3, mc_samples=4, predict_samples=16).fit(Xm, ym)
    np.testing.assert_allclose(multi.predict_proba(Xm).sum(1), 1.0)
    assert np.isfinite(multi.elbo(Xm, ym))


def test_estimators_refuse_bad_input():
    X, y = _blobs(n=40)
    est = SVGPClassifier(num_inducing=4, epochs=1, verbose=False, kmeans_restarts=1)
    with pytest.raises(RuntimeError, match="not fitted"):
        est.predict(X)
    with pytest.raises(ValueError, match="at least two classes"):
        est.fit(X, np.zeros(40))
    with pytest.raises(ValueError, match="NaN"):
        est.fit(np.where(np.arange(80).reshape(40, 2) == 3, np.nan, X), y)
    with pytest.raises(ValueError, match="NaN"):
        est.fit(X, np.where(np.arange(40) == 0, np.nan, y.astype(float)))
    with pytest.raises(ValueError, match="labels"):
        est.fit(X, y[:-1])
    with pytest.raises(ValueError, match="likelihood"):
        SVGPClassifier(likelihood="logit").fit(X, y)
    with pytest.raises(ValueError, match="unknown flow"):
        TGPClassifier(flow="nope").fit(X, y)
    with pytest.raises(ValueError, match="positive inputs"):
        TGPClassifier(flow="log").fit(X, y)
    with pytest.raises(ValueError, match="flow_init"):
        TGPClassifier(flow_init="data").fit(X, y)
    with pytest.raises(ValueError, match="fix_variance_epochs"):
        SVGPClassifier(fix_variance_epochs=-1).fit(X, y)
    est.fit(X, y)
    with pytest.raises(ValueError, match="not seen in fit"):
        est.log_predictive_density(X, y + 5)
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :1])
    params = clone(TGPClassifier(flow="sal", epochs=3)).get_params()
    assert params["flow"] == "sal" and params["epochs"] == 3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_classifier_on_cuda_matches_cpu():
    X, y = _blobs(n=60, classes=3)
    kw = dict(num_inducing=6, epochs=3, verbose=False, kmeans_restarts=1, mc_samples=4, predict_samples=16)
    cpu = TGPClassifier(**kw).fit(X, y)
    gpu = TGPClassifier(device="cuda", **kw).fit(X, y)
    assert gpu.model_.gp.q_mu.device.type == "cuda"
    np.testing.assert_allclose(gpu.predict_proba(X).sum(1), 1.0)
    # different RNG streams on the two devices: compare loosely
    assert np.abs(gpu.predict_proba(X) - cpu.predict_proba(X)).max() < 0.2


# ----- robust max under warped latents ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["sal", "sal+softplus"])
def test_warped_robustmax_argmax_probability_matches_monte_carlo_and_has_a_gradient(spec):
    import torch

    from flowgp import make_kernel
    from flowgp.models import TGPClassification

    gen = torch.Generator().manual_seed(0)
    c, n = 3, 6
    model = TGPClassification(make_kernel("rbf", 2, batch_shape=(c,)), torch.randn(5, 2, dtype=torch.float64,
                              generator=gen), c, flow=spec, likelihood="robustmax").double()
    with torch.no_grad():  # distinct per-class warpings, so that argmax G(f) differs from argmax f
        for p in model.flow.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype, generator=gen))
    model.quadrature_points = 60
    x = torch.randn(n, 2, dtype=torch.float64, generator=gen)
    y = torch.randint(0, c, (n,), generator=gen)
    mean = torch.randn(n, c, dtype=torch.float64, generator=gen)
    var = torch.rand(n, c, dtype=torch.float64, generator=gen) + 0.2
    prob = model.warped_argmax_probability(x, y, mean, var)
    f = mean + var.sqrt() * torch.randn((200_000, n, c), dtype=torch.float64, generator=gen)
    monte_carlo = (model.flow(f, x, validate=False).argmax(-1) == y).double().mean(0)
    torch.testing.assert_close(prob, monte_carlo, rtol=0, atol=4e-3)  # MC standard error <= 1.2e-3
    grads = torch.autograd.grad(prob.sum(), list(model.flow.parameters()))
    assert all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_warped_robustmax_gradient_stays_finite_when_a_class_is_far_out(dtype):
    """A steep warp of one latent puts G_c⁻¹(G_y(f_y)) billions of standard deviations below μ_c (a robust-max
    TGP classifier reached it after ~270 epochs on three blobs); torch's log Φ has an infinite gradient there,
    which turned the training step into NaN. Such a factor makes the probability exactly 0 (value and
    gradient), and the other rows keep their own."""
    model, x, _ = _model(3, flow="sal", likelihood="robustmax", n=3)
    model = model.to(dtype)
    x, y = x.to(dtype), torch.zeros(3, dtype=torch.long)
    mean = torch.tensor([[0.0, 1e4, 0.0], [0.0, 3e3, 0.0], [0.5, 0.0, -0.5]], dtype=dtype, requires_grad=True)
    var = torch.tensor([[1.0, 1e-12, 1.0], [1.0, 1e-10, 1.0], [1.0, 1.0, 1.0]], dtype=dtype)
    prob = model.warped_argmax_probability(x, y, mean, var)
    grads = torch.autograd.grad(prob.sum(), [mean] + list(model.flow.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)
    assert prob[0] == 0 and prob[1] == 0 and 0 < prob[2] < 1
    assert torch.all(grads[0][:2] == 0) and torch.any(grads[0][2] != 0)


def test_tgp_classifier_with_a_flow_and_the_robust_max_learns_three_classes():
    """Monte Carlo through the argmax had no gradient, so such a classifier stayed at chance (accuracy ~1/3)."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    X = np.concatenate([c + 0.5 * rng.standard_normal((40, 2)) for c in centers])
    y = np.repeat([0, 1, 2], 40)
    clf = TGPClassifier(flow="sal", likelihood="robustmax", num_inducing=10, epochs=150, lr=0.03,
                        verbose=False).fit(X, y)
    assert clf.score(X, y) >= 0.95
