import math

import pytest
import torch

from flowgp.training.batches import ArrayBatches
from flowgp.training.checkpoint import CHECKSUM_KEY, safe_load
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP, TrainsItsBound
from flowgp.models.deep_gp import build_deep_gp
from flowgp.training.natural_gradients import NaturalGradient
from flowgp.training.loop import BestParameters, EarlyStop, checkpoint_training_seconds, step_lr, train

pytestmark = pytest.mark.usefixtures("float64_default")


def _problem(n=200, noise_std=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = torch.sin(2 * x) + noise_std * torch.randn(n, 1, generator=g)
    return x, y


def _model(x):
    return SVGP(make_kernel("rbf", 1), x[:15].clone(), GaussianLikelihood(0.5))


def _deep(x):
    return build_deep_gp(x, 1, 2, num_inducing=8, hidden_width=2, kmeans_restarts=1, num_samples=2)


def _assert_same_parameters(a, b, tol):
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb
        torch.testing.assert_close(pa, pb, rtol=tol, atol=tol, msg=na)


class _Interrupt:
    """A callback that raises KeyboardInterrupt after step `at` (0-based), as a user's Ctrl-C would."""

    def __init__(self, at):
        self.at = at

    def __call__(self, step, loss, model):
        if step == self.at:
            raise KeyboardInterrupt


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
    c = _model(x)
    assert train(c, x, y, epochs=5, batch_size=32, seed=4, verbose=False) != ha


def test_a_sampler_gives_the_same_run_as_tensors():
    x, y = _problem()
    a, b = _model(x), _model(x)
    ha = train(a, x, y, epochs=4, batch_size=48, seed=2, verbose=False)
    hb = train(b, ArrayBatches(x, y, 48, seed=2), epochs=4, seed=2, verbose=False)
    assert ha == hb
    _assert_same_parameters(a, b, 0.0)
    with pytest.raises(ValueError, match="sampler"):
        train(b, ArrayBatches(x, y, 48), y, epochs=1, verbose=False)


@pytest.mark.parametrize("interrupt_at", [6, 13])  # mid-epoch (4 steps per epoch) and on an epoch's last step
def test_interrupted_training_resumes_to_the_same_result(tmp_path, interrupt_at):
    x, y = _problem()
    reference = _model(x)
    h_ref = train(reference, x, y, epochs=6, batch_size=64, seed=1, verbose=False)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        train(_model(x), x, y, epochs=6, batch_size=64, seed=1, verbose=False, checkpoint_path=ckpt,
              checkpoint_every=1000, callback=_Interrupt(interrupt_at))
    state = safe_load(ckpt)
    assert state["step"] == interrupt_at + 1
    first = checkpoint_training_seconds(ckpt)
    assert first > 0
    fresh = _model(x)  # a new process would rebuild the model, then resume from the file
    h_res = train(fresh, x, y, epochs=6, batch_size=64, seed=1, verbose=False, checkpoint_path=ckpt)
    assert h_res == pytest.approx(h_ref, rel=1e-12)
    assert checkpoint_training_seconds(ckpt) > first  # the resumed loop's seconds are added to the first's
    _assert_same_parameters(reference, fresh, 1e-10)
    # the finished run's file is final: calling again changes nothing
    again = _model(x)
    assert train(again, x, y, epochs=6, batch_size=64, seed=1, verbose=False, checkpoint_path=ckpt) == h_res
    _assert_same_parameters(fresh, again, 0.0)


def test_interrupted_deep_gp_with_monte_carlo_draws_resumes_exactly(tmp_path):
    x, y = _problem(n=90)
    kwargs = dict(epochs=4, batch_size=40, lr=0.02, seed=5, verbose=False, fix_noise_fraction=0.3,
                  schedule=step_lr(3, 0.5))
    reference = _deep(x)
    h_ref = train(reference, x, y, **kwargs)
    ckpt = tmp_path / "deep.pt"
    with pytest.raises(KeyboardInterrupt):
        train(_deep(x), x, y, checkpoint_path=ckpt, checkpoint_every=1, callback=_Interrupt(4), **kwargs)
    fresh = _deep(x)
    h_res = train(fresh, x, y, checkpoint_path=ckpt, **kwargs)
    assert h_res == pytest.approx(h_ref, rel=1e-12)
    _assert_same_parameters(reference, fresh, 1e-10)
    # the draws come from the generator passed to elbo, not from the global RNG
    other = _deep(x)
    state = torch.get_rng_state()
    train(other, x, y, **kwargs)
    assert torch.equal(torch.get_rng_state(), state)
    _assert_same_parameters(reference, other, 0.0)


def test_resuming_refuses_a_different_batch_size_or_budget(tmp_path):
    x, y = _problem(n=50)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        train(_model(x), x, y, epochs=3, batch_size=10, verbose=False, checkpoint_path=ckpt,
              callback=_Interrupt(2))
    with pytest.raises(ValueError, match="batch_size=10 but this run has batch_size=20"):
        train(_model(x), x, y, epochs=3, batch_size=20, verbose=False, checkpoint_path=ckpt)
    with pytest.raises(ValueError, match="budget=3 but this run has budget=4"):
        train(_model(x), x, y, epochs=4, batch_size=10, verbose=False, checkpoint_path=ckpt)
    with pytest.raises(ValueError, match="unit"):
        train(_model(x), x, y, steps=3, batch_size=10, verbose=False, checkpoint_path=ckpt)


def test_checkpoint_is_a_plain_weights_only_file_and_detects_corruption(tmp_path):
    x, y = _problem(n=30)
    ckpt = tmp_path / "run.pt"
    train(_model(x), x, y, epochs=2, verbose=False, checkpoint_path=ckpt)
    raw = torch.load(ckpt, weights_only=True)
    assert CHECKSUM_KEY in raw and raw["step"] == 2
    raw["model"]["likelihood.raw_noise" if "likelihood.raw_noise" in raw["model"] else next(iter(raw["model"]))] += 1
    torch.save(raw, ckpt)
    with pytest.raises(ValueError, match="corrupted"):
        safe_load(ckpt)
    (tmp_path / "other.pt").write_bytes(b"")
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a flowgp training checkpoint"):
        train(_model(x), x, y, epochs=2, verbose=False, checkpoint_path=tmp_path / "other.pt")


def test_steps_budget_history_and_callback_stop():
    x, y = _problem(n=40)
    seen = []

    def callback(step, loss, model):
        seen.append((step, loss))
        return step == 6

    history = train(_model(x), x, y, steps=20, batch_size=16, verbose=False, callback=callback)
    assert len(history) == 7 and [s for s, _ in seen] == list(range(7))
    assert history == pytest.approx([loss / 40 for _, loss in seen], rel=1e-14)


def test_early_stop_on_a_plateau():
    x, y = _problem(n=40)
    history = train(_model(x), x, y, epochs=5000, lr=0.05, verbose=False,
                    early_stop=EarlyStop(window=50, rel_tol=1e-3))
    assert 50 <= len(history) < 5000 and len(history) % 50 == 0
    # the contract: the run stopped at the first window whose best entry improved by at most rel_tol on the
    # best before it (a plateau of the history), and the stopped run is the same trajectory as a longer one
    best_before, best_at_stop = min(history[:-50]), min(history)
    assert best_before - best_at_stop <= 1e-3 * (abs(best_at_stop) + 1e-8)
    for k in range(100, len(history), 50):  # every earlier window still improved by more than that
        assert min(history[:k - 50]) - min(history[:k]) > 1e-3 * (abs(min(history[:k])) + 1e-8)
    long = train(_model(x), x, y, epochs=len(history) + 50, lr=0.05, verbose=False)
    assert long[:len(history)] == pytest.approx(history, rel=1e-12)
    with pytest.raises(ValueError, match="window"):
        EarlyStop(window=0)


def test_schedule_decays_every_step_size():
    x, y = _problem(n=20)
    opt_rates = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            opt_rates.append(self.param_groups[0]["lr"])
            return super().step(closure)

    train(_model(x), x, y, steps=7, schedule=step_lr(3, 0.5), verbose=False, optimizer=lambda p: Spy(p, lr=1e-5))
    assert opt_rates == pytest.approx([1e-5] * 3 + [5e-6] * 3 + [2.5e-6])


def test_lbfgs_through_a_loss_hook_and_keep_best():
    target = torch.tensor([1.0, -2.0, 3.0])

    class Quadratic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3))

    model = Quadratic()

    def loss(m, batch, num_data, generator):
        return ((m.w - target) ** 2 * torch.tensor([1.0, 10.0, 100.0])).sum()

    best = BestParameters()
    x = torch.zeros(1, 1)
    history = train(model, x, steps=1, loss=loss, verbose=False, keep_best=best,
                    optimizer=lambda p: torch.optim.LBFGS(p, max_iter=50, line_search_fn="strong_wolfe",
                                                                tolerance_grad=1e-12, tolerance_change=1e-15))
    assert history[0] == pytest.approx(1 + 40 + 900)
    torch.testing.assert_close(model.w.detach(), target, atol=1e-8, rtol=0)
    assert best.loss < 1e-12


def test_nonfinite_loss_raises_or_backs_off():
    class Log(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(1.0))

    def loss(m, batch, num_data, generator):  # minimised at w = 0.5; undefined for w <= 0
        return m.w - 0.5 * torch.log(m.w)

    x = torch.zeros(1, 1)
    with pytest.raises(FloatingPointError, match="backoff"):
        train(Log(), x, steps=50, lr=2.0, loss=loss, verbose=False, optimizer=lambda p: torch.optim.SGD(p, lr=2.0))
    model = Log()
    seen = []
    train(model, x, steps=200, loss=loss, verbose=False, keep_best=True, nonfinite="backoff",
          optimizer=lambda p: torch.optim.SGD(p, lr=2.0), callback=lambda s, l, m: seen.append(l))
    assert any(not math.isfinite(v) for v in seen)  # some steps were undone
    assert model.w.item() == pytest.approx(0.5, abs=1e-6)


def test_model_keywords_generator_index_and_extra():
    calls = []

    class Probe(TrainsItsBound, torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def elbo(self, x, y, output, *, num_data=None, indices=None, generator=None, batch_rows=None):
            calls.append((indices.clone(), output.clone(), generator, num_data))
            return -(self.w - x.mean()) ** 2

        def predict(self, x, *, generator=None):
            return self.w.expand(len(x))

    x = torch.arange(10.0)[:, None]
    sampler = ArrayBatches(x, x, 4, extra={"output": 2 * torch.arange(10)}, seed=0)
    gen = torch.Generator().manual_seed(1)
    train(Probe(), sampler, epochs=1, generator=gen, verbose=False)
    assert len(calls) == 3 and all(c[2] is gen and c[3] == 10 for c in calls)
    rows = torch.cat([c[0] for c in calls])
    assert sorted(rows.tolist()) == list(range(10))
    assert torch.equal(torch.cat([c[1] for c in calls]), 2 * rows)

    class NoOutput(Probe):
        def elbo(self, x, y, *, num_data=None, indices=None, generator=None, batch_rows=None):
            return -self.w ** 2

    with pytest.raises(TypeError, match="output"):
        train(NoOutput(), ArrayBatches(x, x, extra={"output": x}), epochs=1, verbose=False)
    with pytest.raises(TypeError, match="loss="):
        train(torch.nn.Linear(1, 1), x, x, epochs=1, verbose=False)


def test_natural_gradient_next_to_adam_excludes_its_parameters():
    x, y = _problem(n=60)
    model = _model(x)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = {}

    class Spy(torch.optim.Adam):
        def __init__(self, params, **kw):
            params = list(params)
            seen["ids"] = {id(p) for p in params}
            super().__init__(params, **kw)

    natgrad = NaturalGradient([model.gp], lr=1.0)
    history = train(model, x, y, epochs=30, verbose=False, optimizer=lambda p: Spy(p, lr=0.01),
                    natural_gradient=natgrad)
    assert id(model.gp.q_mu) not in seen["ids"] and id(model.gp.q_sqrt) not in seen["ids"]
    assert history[-1] < history[0]
    assert not torch.equal(before["gp.q_mu"], model.gp.q_mu.detach())


def test_bad_training_arguments():
    x, y = _problem(n=10)
    with pytest.raises(ValueError, match="epochs"):
        train(_model(x), x, y, epochs=-1)
    with pytest.raises(ValueError, match="fix_noise_fraction"):
        train(_model(x), x, y, epochs=1, fix_noise_fraction=2.0)
    with pytest.raises(ValueError, match="batch_size"):
        train(_model(x), x, y, epochs=1, batch_size=0)
    with pytest.raises(ValueError, match="steps"):
        train(_model(x), x, y, steps=-2)
    with pytest.raises(ValueError, match="nonfinite"):
        train(_model(x), x, y, epochs=1, nonfinite="ignore")
    with pytest.raises(ValueError, match="checkpoint_every"):
        train(_model(x), x, y, epochs=1, checkpoint_every=0)
    with pytest.raises(TypeError, match="optimizer"):
        train(_model(x), x, y, epochs=1, optimizer="adam")
    with pytest.raises(ValueError, match="L-BFGS"):
        model = _model(x)
        train(model, x, y, epochs=1, optimizer=torch.optim.LBFGS, natural_gradient=NaturalGradient([model.gp]))


def test_a_ctrl_c_in_the_middle_of_a_step_is_held_until_the_step_is_done(tmp_path):
    import os
    import signal

    x, y = _problem(n=60)
    reference = _model(x)
    h_ref = train(reference, x, y, epochs=3, batch_size=16, seed=2, verbose=False)
    calls = [0]

    def loss(model, batch, num_data, generator):
        calls[0] += 1
        if calls[0] == 6:  # inside step 5, before its backward and update
            os.kill(os.getpid(), signal.SIGINT)
        return -model.elbo(batch.x, batch.y, num_data=num_data)

    ckpt = tmp_path / "run.pt"
    before = signal.getsignal(signal.SIGINT)  # not always Python's default: a background job starts with SIG_IGN
    with pytest.raises(KeyboardInterrupt):
        train(_model(x), x, y, epochs=3, batch_size=16, seed=2, verbose=False, checkpoint_path=ckpt, loss=loss)
    assert safe_load(ckpt)["step"] == 6  # step 5 finished, then the run stopped and saved
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back
    fresh = _model(x)
    h_res = train(fresh, x, y, epochs=3, batch_size=16, seed=2, verbose=False, checkpoint_path=ckpt, loss=loss)
    assert h_res == pytest.approx([h * 60 for h in h_ref], rel=1e-12)  # a loss hook's history is not per point
    _assert_same_parameters(reference, fresh, 1e-10)


def test_regulariser_is_added_to_the_loss_once_and_checked():
    # train(regulariser=): a global term of the parameters added to every evaluation of the loss (the robust TGP
    # fit anchors its flow refinement with it); a strong pull moves the noise to its target
    import math

    import pytest

    from flowgp import SVGP, GaussianLikelihood, make_kernel
    from flowgp.training.loop import train

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, generator=g, dtype=torch.float64)
    y = torch.sin(x) + 0.1 * torch.randn(40, 1, generator=g, dtype=torch.float64)
    model = SVGP(make_kernel("rbf", 1), x[:6].clone(), GaussianLikelihood(0.05)).double()
    target = math.log(0.5)

    def pull():
        return 1e6 * (model.likelihood.noise.log().sum() - target) ** 2

    seen = []
    history = train(model, x, y, epochs=200, lr=0.05, verbose=False, regulariser=pull,
                    callback=lambda step, loss, m: seen.append(loss))
    assert abs(float(model.likelihood.noise.log().sum()) - target) < 1e-2
    # the loss the loop reports includes the term: after the pull it is the bound plus a small remainder
    bound = float(-model.elbo(x, y, num_data=40))
    assert abs(seen[-1] - (bound + float(pull()))) < 1.0 and len(history) == 200
    with pytest.raises(TypeError, match="regulariser must be callable"):
        train(model, x, y, epochs=1, verbose=False, regulariser=1.0)


@pytest.mark.parametrize("unit", ["steps", "epochs"])
def test_extending_a_finished_run_is_the_longer_run(tmp_path, unit):
    x, y = _problem(n=50)
    budget = (lambda n: dict(steps=n)) if unit == "steps" else (lambda n: dict(epochs=n))
    kwargs = dict(batch_size=20, lr=0.02, seed=3, verbose=False, schedule=step_lr(4, 0.7))
    reference = _model(x)
    h_ref = train(reference, x, y, **budget(12), **kwargs)
    ckpt = tmp_path / "run.pt"
    short = _model(x)
    h_short = train(short, x, y, **budget(5), checkpoint_path=ckpt, **kwargs)
    assert safe_load(ckpt)["finished"]
    assert h_short == pytest.approx(h_ref[:5], rel=1e-12)
    with pytest.raises(ValueError, match="extend_budget=True allows a larger budget"):
        train(_model(x), x, y, **budget(12), checkpoint_path=ckpt, **kwargs)
    with pytest.raises(ValueError, match="only grows a budget"):
        train(_model(x), x, y, **budget(4), checkpoint_path=ckpt, extend_budget=True, **kwargs)
    # extended in two legs, the second one interrupted and resumed: the 12-unit run, step for step
    longer = _model(x)
    train(longer, x, y, **budget(8), checkpoint_path=ckpt, extend_budget=True, **kwargs)
    with pytest.raises(KeyboardInterrupt):
        train(_model(x), x, y, **budget(12), checkpoint_path=ckpt, extend_budget=True, checkpoint_every=1000,
              callback=_Interrupt(9 if unit == "steps" else 30), **kwargs)  # epochs: 3 steps each
    fresh = _model(x)
    h_ext = train(fresh, x, y, **budget(12), checkpoint_path=ckpt, extend_budget=True, **kwargs)
    assert h_ext == pytest.approx(h_ref, rel=1e-12)
    _assert_same_parameters(reference, fresh, 1e-10)
    # extend_budget with the checkpoint's own budget is a plain resume of the finished run
    again = _model(x)
    assert train(again, x, y, **budget(12), checkpoint_path=ckpt, extend_budget=True, **kwargs) == h_ext
    _assert_same_parameters(fresh, again, 0.0)


def test_extending_refuses_what_a_longer_run_would_not_continue(tmp_path):
    x, y = _problem(n=40)
    stopped = tmp_path / "stopped.pt"
    train(_model(x), x, y, steps=20, batch_size=16, verbose=False, checkpoint_path=stopped,
          callback=lambda step, loss, model: step == 6)
    with pytest.raises(ValueError, match="stopped at step 7 of 20"):
        train(_model(x), x, y, steps=30, batch_size=16, verbose=False, checkpoint_path=stopped, extend_budget=True)
    best = tmp_path / "best.pt"
    train(_model(x), x, y, steps=5, batch_size=16, verbose=False, checkpoint_path=best, keep_best=True)
    with pytest.raises(ValueError, match="keep_best"):
        train(_model(x), x, y, steps=9, batch_size=16, verbose=False, checkpoint_path=best, keep_best=True,
              extend_budget=True)
    frozen = tmp_path / "frozen.pt"
    train(_model(x), x, y, steps=10, batch_size=16, verbose=False, checkpoint_path=frozen, fix_noise_fraction=0.3)
    with pytest.raises(ValueError, match="noise freeze"):
        train(_model(x), x, y, steps=20, batch_size=16, verbose=False, checkpoint_path=frozen,
              fix_noise_fraction=0.3, extend_budget=True)
    with pytest.raises(TypeError, match="extend_budget"):
        train(_model(x), x, y, steps=2, verbose=False, extend_budget="yes")
