"""flowgp.training.natural_gradients.NaturalGradient: the closed-form optimum in one step on a conjugate model, agreement with the
natural gradient taken by autograd through the expectation parameters on a non-conjugate one."""
import math

import pytest
import torch
from torch.func import functional_call

from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import BernoulliLikelihood, GaussianLikelihood
from flowgp.models import SVGP
from flowgp.models.deep_gp import build_deep_gp
from flowgp.training.natural_gradients import NaturalGradient

pytestmark = pytest.mark.usefixtures("float64_default")


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.sin(2 * x) + 0.2 * torch.randn(n, 1, generator=g)
    return x, y


def _freeze_all_but_q(model):
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith("q_mu") or name.endswith("q_sqrt"))


def test_one_step_of_size_one_reaches_the_conjugate_optimum():
    """SVGP, Gaussian likelihood, full batch: q*(v) = N(S A y / σ², S), S = (I + A Aᵀ/σ²)⁻¹ (whitened), and the
    ELBO there equals Titsias' collapsed bound log N(y; 0, AᵀA + σ²I) - tr(K_XX - AᵀA)/(2σ²)."""
    x, y = _data()
    # well-spread inducing inputs keep K_ZZ well conditioned, so the model's own rounding stays far below 1e-8
    model = SVGP(make_kernel("rbf", 1), torch.linspace(-3, 3, 7)[:, None], GaussianLikelihood(0.1))
    _freeze_all_but_q(model)
    opt = NaturalGradient([model.gp], lr=1.0)
    loss = -model.elbo(x, y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        a, _ = model.gp.projection(x)
        a = a.reshape(a.shape[-2:])  # [M, N]
        noise = model.likelihood.noise.reshape(())
        m_dim = a.shape[0]
        s_opt = torch.linalg.inv(torch.eye(m_dim) + a @ a.T / noise)
        m_opt = s_opt @ a @ y[:, 0] / noise
        r = model.gp.q_sqrt_tril()[0]
        torch.testing.assert_close(model.gp.q_mu[0], m_opt, rtol=0, atol=1e-8)
        torch.testing.assert_close(r @ r.T, s_opt, rtol=0, atol=1e-8)
        kdiag = model.gp.kernel.diag(x).reshape(-1)
        cov = a.T @ a + noise * torch.eye(x.shape[0])
        collapsed = torch.distributions.MultivariateNormal(torch.zeros(x.shape[0]), cov).log_prob(y[:, 0])
        collapsed = collapsed - (kdiag - a.square().sum(0)).sum() / (2 * noise)
        torch.testing.assert_close(model.elbo(x, y), collapsed, rtol=0, atol=1e-8)
    # at the optimum a second step changes nothing
    model.zero_grad()
    (-model.elbo(x, y)).backward()
    before = (model.gp.q_mu.detach().clone(), model.gp.q_sqrt_tril().detach().clone())
    opt.step()
    torch.testing.assert_close(model.gp.q_mu, before[0], rtol=0, atol=1e-8)
    torch.testing.assert_close(model.gp.q_sqrt_tril(), before[1], rtol=0, atol=1e-8)


def _reference_step(module, gp, loss_fn, lr):
    """The natural-gradient step as latent_deep_gp._NaturalGradient took it before flowgp.training.natural_gradients: rebuild (m, R)
    from η = (m, S + mmᵀ), take ∇_η of the loss by autograd, θ ← θ - γ ∇_η loss."""
    names = [n for n, p in module.named_parameters() if p is gp.q_mu or p is gp.q_sqrt]
    m = gp.q_mu.detach()
    r = gp.q_sqrt_tril().detach()
    eta1 = m.clone().requires_grad_(True)
    eta2 = (r @ r.mT + m.unsqueeze(-1) * m.unsqueeze(-2)).clone().requires_grad_(True)
    s_eta = eta2 - eta1.unsqueeze(-1) * eta1.unsqueeze(-2)
    r_eta = torch.linalg.cholesky(0.5 * (s_eta + s_eta.mT))
    mu_name, sqrt_name = names if names[0].endswith("q_mu") else names[::-1]
    loss = loss_fn(lambda *a, **k: functional_call(module, {mu_name: eta1, sqrt_name: r_eta}, a, k))
    g1, g2 = torch.autograd.grad(loss, [eta1, eta2])
    g1, g2 = -g1, -0.5 * (g2 + g2.mT)
    with torch.no_grad():
        s = eta2 - eta1.unsqueeze(-1) * eta1.unsqueeze(-2)
        precision = torch.cholesky_inverse(torch.linalg.cholesky(s))
        theta1 = (precision @ m.unsqueeze(-1)).squeeze(-1)
        new_precision = precision - 2.0 * lr * g2
        new_s = torch.cholesky_inverse(torch.linalg.cholesky(0.5 * (new_precision + new_precision.mT)))
        new_m = (new_s @ (theta1 + lr * g1).unsqueeze(-1)).squeeze(-1)
    return new_m, new_s


def _randomise_q(gp, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        gp.q_mu.copy_(0.5 * torch.randn(gp.q_mu.shape, generator=g))
        r = 0.3 * torch.randn(gp.q_sqrt.shape, generator=g).tril()
        idx = torch.arange(r.shape[-1])
        r[..., idx, idx] = 0.2 + 0.5 * torch.rand(r.shape[:-1], generator=g)
        gp.q_sqrt.copy_(r)


@pytest.mark.parametrize("case", ["bernoulli_svgp", "deep_gp_last_layer"])
def test_update_agrees_with_autograd_through_expectation_parameters(case):
    x, y = _data(seed=3)
    if case == "bernoulli_svgp":
        model = SVGP(make_kernel("rbf", 1), x[::5].clone(), BernoulliLikelihood())
        y = (y > 0).to(x.dtype)
        gp = model.gp

        def loss_fn(elbo):
            return -elbo(x, y)
    else:
        model = build_deep_gp(x, 1, 2, num_inducing=6, hidden_width=2, kmeans_restarts=1, num_samples=3)
        gp = model.layers[-1].gp

        def loss_fn(elbo):
            return -elbo(x, y, generator=torch.Generator().manual_seed(7))
    _randomise_q(gp, seed=1)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *a, **k):
            return self.model.elbo(*a, **k)

    wrapper = Wrapper()
    ref_m, ref_s = _reference_step(wrapper, gp, loss_fn, lr=0.3)
    opt = NaturalGradient([gp], lr=0.3)
    loss_fn(model.elbo).backward()
    opt.step()
    r = gp.q_sqrt_tril().detach()
    torch.testing.assert_close(gp.q_mu.detach(), ref_m, rtol=1e-8, atol=1e-9)
    torch.testing.assert_close(r @ r.mT, ref_s, rtol=1e-8, atol=1e-9)
    assert torch.all(torch.diagonal(r, dim1=-2, dim2=-1) > 0)


def test_step_is_halved_until_the_precision_stays_positive_definite():
    q_mu = torch.nn.Parameter(torch.zeros(1, 2))
    q_sqrt = torch.nn.Parameter(torch.eye(2).unsqueeze(0).clone())
    opt = NaturalGradient([(q_mu, q_sqrt)], lr=1.0)
    # loss = -tr(S)·c gives G = ∂loss/∂S = -c I: the new precision I - 2γc I needs γ < 1/(2c)
    c = 3.0
    q_mu.grad = torch.zeros_like(q_mu)
    q_sqrt.grad = -c * 2 * q_sqrt.detach().tril()  # ∂(-c tr(RRᵀ))/∂R = -2cR
    opt.step()
    used = opt.state[q_mu]["last_step_size"]
    assert used == pytest.approx(1.0 / 8)  # 1, 1/2, 1/4 fail (precision <= 0), 1/8 passes
    s = q_sqrt.detach()[0] @ q_sqrt.detach()[0].T
    torch.testing.assert_close(s, torch.eye(2) / (1 - 2 * used * c))


def test_natural_gradient_arguments_and_schedulers():
    model = SVGP(make_kernel("rbf", 1), torch.zeros(3, 1), GaussianLikelihood(0.1))
    with pytest.raises(ValueError, match="lr"):
        NaturalGradient([model.gp], lr=0.0)
    with pytest.raises(ValueError, match="pair"):
        NaturalGradient([(model.gp.q_mu, model.gp.q_mu)])
    with pytest.raises(TypeError, match="natural_parameter_pair"):
        NaturalGradient([model.gp.q_mu])
    with pytest.raises(ValueError, match="no Gaussian"):
        NaturalGradient([])
    opt = NaturalGradient([model.gp], lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()  # no gradients yet: nothing moves
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)
    state = opt.state_dict()
    again = NaturalGradient([model.gp], lr=0.5)
    again.load_state_dict(state)
    assert again.param_groups[0]["lr"] == pytest.approx(0.25)
    assert math.isfinite(opt.param_groups[0]["lr"])


def test_annealed_steps_start_at_one_then_one_over_t_floored_at_lr():
    # γ_t = max(lr, 1/(t+1)): each annealed step equals a plain step of that size from the same state
    from flowgp.training.natural_gradients import NaturalGradient

    torch.manual_seed(0)
    m = 4
    q_mu = torch.zeros(1, m, dtype=torch.float64, requires_grad=True)
    q_sqrt = torch.eye(m, dtype=torch.float64).expand(1, m, m).clone().requires_grad_(True)
    target = torch.randn(1, m, dtype=torch.float64)

    def loss(mu, sqrt):  # a conjugate-like quadratic in the mean and a log-det term in the factor
        s = sqrt @ sqrt.mT
        return ((mu - target) ** 2).sum() + 0.5 * (s.diagonal(dim1=-2, dim2=-1).sum() - torch.logdet(s[0]))

    annealed = NaturalGradient([(q_mu, q_sqrt)], lr=0.3, anneal=True)
    for t, expected_gamma in enumerate([1.0, 0.5, 1 / 3, 0.3, 0.3]):
        mu0, sqrt0 = q_mu.detach().clone().requires_grad_(True), q_sqrt.detach().clone().requires_grad_(True)
        loss(mu0, sqrt0).backward()
        NaturalGradient([(mu0, sqrt0)], lr=expected_gamma).step()
        annealed.zero_grad()
        loss(q_mu, q_sqrt).backward()
        annealed.step()
        torch.testing.assert_close(q_mu.detach(), mu0.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(q_sqrt.detach(), sqrt0.detach(), rtol=0, atol=1e-12)
    assert annealed.state_dict()["param_groups"][0]["steps_taken"] == 5


def test_a_zero_gradient_leaves_an_ill_conditioned_q_where_it_is():
    """θ ← θ + γ·0 is the identity map: with S's eigenvalues spread over 24 orders of magnitude (a q(u) that has
    collapsed onto the data in some directions, as long fits do) the step must hand back R and m to rounding,
    which a step that inverts R and re-factors S⁻¹ cannot (cond(R) = 1e12 amplifies its rounding)."""
    from flowgp.training.natural_gradients import natural_gradient_step

    g = torch.Generator().manual_seed(3)
    size = 30
    r = 0.1 * torch.randn(1, size, size, generator=g, dtype=torch.float64).tril(-1)
    r = r + torch.diag_embed(torch.logspace(-12, 0, size, dtype=torch.float64))[None]
    m = torch.randn(1, size, generator=g, dtype=torch.float64)
    new_m, new_r, used = natural_gradient_step(m, r, torch.zeros_like(m), torch.zeros_like(r), 1.0)
    assert used == 1.0
    torch.testing.assert_close(new_r, r, rtol=0, atol=1e-14 * float(r.abs().max()))
    torch.testing.assert_close(new_m, m, rtol=0, atol=1e-13)


def test_step_matches_the_natural_parameter_update_written_out():
    """R_new R_newᵀ = (S⁻¹ + 2γG)⁻¹ and m_new = S_new (S⁻¹m - γ(∂m - 2Gm)): the update of the module doc's steps
    1-3 in natural parameters, formed explicitly with inverses on a well-conditioned case, against the step's
    factored form (negative diagonal entries of R included: S = RRᵀ all the same)."""
    from flowgp.training.natural_gradients import natural_gradient_step

    g = torch.Generator().manual_seed(5)
    size, gamma = 12, 0.3
    a = torch.randn(2, size, size, generator=g, dtype=torch.float64)
    r = torch.linalg.cholesky(a @ a.mT / size + 0.5 * torch.eye(size, dtype=torch.float64))
    r = r * torch.tensor([1.0, -1.0], dtype=torch.float64).view(2, 1, 1)
    m = torch.randn(2, size, generator=g, dtype=torch.float64)
    grad_m = 0.1 * torch.randn(2, size, generator=g, dtype=torch.float64)
    grad_s = 0.05 * torch.randn(2, size, size, generator=g, dtype=torch.float64)
    grad_s = 0.5 * (grad_s + grad_s.mT)  # G = ∂loss/∂S; ∂loss/∂R = 2GR seen through the lower-triangular mask
    grad_r = (2 * grad_s @ r).tril()
    new_m, new_r, used = natural_gradient_step(m, r, grad_m, grad_r, gamma)
    precision = torch.linalg.inv(r @ r.mT)
    new_s = torch.linalg.inv(precision + 2 * gamma * grad_s)
    expected_m = (new_s @ (precision @ m[..., None] - gamma * (grad_m[..., None] - 2 * grad_s @ m[..., None])))
    assert used == gamma
    torch.testing.assert_close(new_r @ new_r.mT, new_s, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(new_m, expected_m.squeeze(-1), rtol=1e-10, atol=1e-12)
