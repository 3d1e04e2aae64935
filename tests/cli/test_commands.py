import json

import numpy as np
import pytest

from flowgp.cli import main


def _sine_csv(path, n, seed):
    """A CSV with features u, v and target = sin(u) + noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)
    path.write_text("u,v,target\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    return path


def test_fit_then_predict_on_a_csv(tmp_path, capsys):
    csv = _sine_csv(tmp_path / "train.csv", 60, 0)
    model = tmp_path / "m.pt"
    assert main(["fit", "--csv", str(csv), "--target", "target", "--model", "tgp", "--flow", "sal",
                 "--epochs", "30", "--num-inducing", "8", "--quiet", "--out", str(model)]) == 0
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(model), "--csv", str(csv), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert '"rmse"' in printed
    rows = out.read_text().strip().splitlines()
    assert rows[0] == "mean,std,lower,upper" and len(rows) == 61
    # features-only file (no target column)
    feats = tmp_path / "feats.csv"
    feats.write_text("u,v\n0.1,0.2\n1.0,-1.0\n")
    assert main(["predict", "--model", str(model), "--csv", str(feats), "--out", str(out)]) == 0
    assert len(out.read_text().strip().splitlines()) == 3


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n1,2\n3,4\n")
    assert main(["fit", "--csv", str(csv), "--target", "nope", "--out", str(tmp_path / "m.pt")]) == 2
    assert "target column 'nope'" in capsys.readouterr().err


def test_fit_takes_deep_models_and_their_options(tmp_path, capsys):
    import flowgp

    csv = _sine_csv(tmp_path / "train.csv", 50, 1)
    cases = [
        (["--model", "dgp", "--layers", "3", "--posterior", "cnf"], flowgp.DeepGPRegressor,
         {"layers": 3, "posterior": "cnf"}),
        (["--model", "ldgp", "--layers", "2", "--num-importance", "3", "--gradient", "reg"],
         flowgp.LatentDeepGPRegressor, {"layers": 2, "num_importance": 3, "gradient": "reg"}),
    ]
    for extra, cls, params in cases:
        model = tmp_path / f"{extra[1]}.pt"
        assert main(["fit", "--csv", str(csv), "--target", "target", *extra, "--epochs", "3", "--num-inducing", "6",
                     "--quiet", "--out", str(model)]) == 0
        est = flowgp.load(model)
        assert isinstance(est, cls) and all(getattr(est, k) == v for k, v in params.items())
        out = tmp_path / "pred.csv"
        assert main(["predict", "--model", str(model), "--csv", str(csv), "--out", str(out)]) == 0
        assert len(out.read_text().strip().splitlines()) == 51


def test_fit_posterior_choices_are_the_deep_gps_posteriors(capsys):
    from flowgp.models.deep_gp import POSTERIORS

    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "--posterior {" + ",".join(POSTERIORS) + "}" in capsys.readouterr().out


def test_fit_fails_before_training_on_a_bad_out_or_device(tmp_path, capsys, monkeypatch):
    import flowgp

    def no_training(*args, **kwargs):
        raise AssertionError("fit must not start")

    monkeypatch.setattr(flowgp.TGPRegressor, "fit", no_training)
    csv = _sine_csv(tmp_path / "train.csv", 20, 0)
    base = ["fit", "--csv", str(csv), "--target", "target", "--epochs", "2", "--quiet"]
    cases = [
        (["--out", str(tmp_path)], "is a folder"),
        (["--out", str(csv / "m.pt")], "is a file, not a folder"),
        (["--out", str(tmp_path / "m.pt"), "--device", "gpu7"], "is not a device"),
        (["--out", str(tmp_path / "m.pt"), "--checkpoint", str(tmp_path)], "--checkpoint"),
        (["--out", str(tmp_path / "m.pt"), "--layers", "3"], "does not take --layers"),
    ]
    import torch

    if not torch.cuda.is_available():
        cases.append((["--out", str(tmp_path / "m.pt"), "--device", "cuda"], "CUDA is not available"))
    else:
        cases.append((["--out", str(tmp_path / "m.pt"), "--device", f"cuda:{torch.cuda.device_count()}"],
                      "CUDA device"))
    for extra, message in cases:
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
    assert not (tmp_path / "m.pt").exists()


def test_fit_resolves_models_and_options_through_the_registry(tmp_path, capsys, monkeypatch):
    from dataclasses import replace

    from flowgp.bench.models import NamedModel
    from flowgp.registry import MODELS

    seen = {}

    class Recorder:
        def __init__(self, flow="x", flow_init="x", kernel="rbf", num_inducing=1, epochs=1, batch_size=None, lr=0.1,
                     seed=0, dtype="float64", device="cpu", verbose=True, checkpoint=None):
            seen.update({k: v for k, v in locals().items() if k != "self"})

        def get_params(self):
            return {"checkpoint": None}

        def fit(self, x, y):
            raise ValueError("stop after construction")

    entry = replace(MODELS.get("tgp"), name="recorder-tgp")
    monkeypatch.setattr(NamedModel, "estimator_class", lambda self, task="regression": Recorder)
    MODELS.register("recorder-tgp", entry)
    try:
        csv = _sine_csv(tmp_path / "train.csv", 20, 0)
        ckpt = tmp_path / "run" / "fit.ckpt"
        assert main(["fit", "--csv", str(csv), "--target", "target", "--model", "recorder-tgp", "--flow-init",
                     "data", "--epochs", "7", "--quiet", "--checkpoint", str(ckpt), "--out", str(tmp_path / "m.pt")]) == 2
    finally:
        MODELS.unregister("recorder-tgp")
    assert "stop after construction" in capsys.readouterr().err
    # the entry's option defaults, the flags given, the shared arguments and the checkpoint path reach the estimator
    assert seen["flow"] == "sal" and seen["flow_init"] == "data" and seen["epochs"] == 7
    assert seen["checkpoint"] == str(ckpt) and "layers" not in seen


def test_fit_checkpoint_resumes_an_interrupted_fit(tmp_path, monkeypatch, capsys):
    """`flowgp fit --checkpoint` killed half-way (Ctrl-C in the 5th of 12 full-batch epochs: exit code 130 and
    one line naming the step and the file) and run again with the same command ends where the uninterrupted fit
    ends."""
    import os
    import signal

    import pytest

    import flowgp
    from flowgp.models import SVGP

    csv = _sine_csv(tmp_path / "train.csv", 40, 3)
    args = ["fit", "--csv", str(csv), "--target", "target", "--model", "svgp", "--num-inducing", "6", "--quiet",
            "--epochs", "12"]
    ckpt = tmp_path / "fit.ckpt"
    assert main(args + ["--out", str(tmp_path / "full.pt")]) == 0
    original, calls = SVGP.elbo, {"n": 0}

    def interrupted_elbo(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(SVGP, "elbo", interrupted_elbo)
        capsys.readouterr()
        assert main(args + ["--checkpoint", str(ckpt), "--out", str(tmp_path / "resumed.pt")]) == 130
    assert capsys.readouterr().err == (f"flowgp fit: interrupted at step 5; state saved to {ckpt}; rerun the same "
                                       "command to resume\n")
    assert ckpt.exists() and not (tmp_path / "resumed.pt").exists()
    assert main(args + ["--checkpoint", str(ckpt), "--out", str(tmp_path / "resumed.pt")]) == 0
    full, resumed = flowgp.load(tmp_path / "full.pt"), flowgp.load(tmp_path / "resumed.pt")
    for (name, a), b in zip(full.model_.state_dict().items(), resumed.model_.state_dict().values()):
        assert (a - b).abs().max() <= 1e-10, name


def test_fit_refuses_the_target_as_a_feature_and_duplicate_columns(tmp_path, capsys):
    # was: `--features y --target y` used the target as a feature and a header `a,a,y` used the first `a`
    # twice, both without a word; each is now one line on stderr and exit 2, before any training
    csv = _sine_csv(tmp_path / "train.csv", 20, 0)
    dup = tmp_path / "dup.csv"
    dup.write_text("a,a,y\n1,2,3\n4,5,6\n7,8,9\n")
    cases = [(["--csv", str(csv), "--target", "target", "--features", "u,target"], "also listed as a feature"),
             (["--csv", str(csv), "--target", "target", "--features", "target"], "also listed as a feature"),
             (["--csv", str(csv), "--target", "target", "--features", "u,u"], "more than once"),
             (["--csv", str(dup), "--target", "y"], "duplicate column names ['a']"),
             (["--csv", str(dup), "--target", "y", "--features", "a"], "duplicate column names ['a']")]
    for args, message in cases:
        assert main(["fit", *args, "--epochs", "2", "--quiet", "--out", str(tmp_path / "m.pt")]) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.pt").exists()


def test_predict_refuses_a_named_target_absent_from_the_csv(tmp_path, capsys):
    # was: `flowgp predict --target zz` with no column zz was silently ignored (no score, exit 0)
    csv = _sine_csv(tmp_path / "train.csv", 30, 0)
    model = tmp_path / "m.pt"
    assert main(["fit", "--csv", str(csv), "--target", "target", "--model", "svgp", "--epochs", "3",
                 "--num-inducing", "4", "--quiet", "--out", str(model)]) == 0
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(model), "--csv", str(csv), "--target", "zz", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "target column 'zz'" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    # the training target absent from a features-only file is still fine (nothing to score)
    feats = tmp_path / "feats.csv"
    feats.write_text("u,v\n0.1,0.2\n")
    assert main(["predict", "--model", str(model), "--csv", str(feats), "--out", str(out)]) == 0
    # and a named target that is present is scored
    capsys.readouterr()
    assert main(["predict", "--model", str(model), "--csv", str(csv), "--target", "target", "--out", str(out)]) == 0
    assert '"rmse"' in capsys.readouterr().out


def test_demo_writes_json_rows_a_figure_and_one_progress_line_per_fit_on_stderr(tmp_path, capsys):
    # was: the demo printed nothing for minutes and looked hung; now a header and one line per fit on
    # stderr (which model, which restart), stdout keeps only the results; torch's thread setting is restored
    import torch

    from flowgp.cli import DEMO_PERIODS

    threads = torch.get_num_threads()
    assert main(["demo", "--out", str(tmp_path), "--json", "--epochs", "1"]) == 0
    assert torch.get_num_threads() == threads
    captured = capsys.readouterr()
    # stdout: one JSON row per model, the same rows in results.json, and the figure
    rows = [json.loads(line) for line in captured.out.strip().splitlines()]
    assert [r["model"] for r in rows] == ["SVGP", "TGP (tanh)", "v-WGP (sal)"]
    for row in rows:
        assert {"model", "nll", "rmse", "coverage95", "train_seconds"} <= set(row)
        assert np.isfinite(row["nll"]) and 0 <= row["coverage95"] <= 1
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "results.json").read_text()) == rows
    total = 3 * len(DEMO_PERIODS)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 + total and f"{total} fits" in lines[0]
    labels = [label for label in ("SVGP", "TGP (tanh)", "v-WGP (sal)") for _ in DEMO_PERIODS]
    for i, (line, label) in enumerate(zip(lines[1:], labels)):
        assert line.startswith(f"[{i + 1:>2}/{total}] {label}") and "ELBO" in line and line.endswith(" s)"), line
    assert len(captured.out.strip().splitlines()) == 3  # the JSON rows only
    assert main(["demo", "--out", str(tmp_path), "--json", "--epochs", "1", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    # a file where the output folder should be is refused before any fit
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "[ 1/" not in err


def test_demo_fits_run_with_the_estimators_thread_choice(tmp_path, monkeypatch, capsys):
    """The demo passes `threads` to every estimator (no helper of its own): "auto" gives its 150 x 30 problems one
    torch thread during each fit, an explicit count is used as given, torch's setting is restored after every
    fit, and a bad value is refused before any fit."""
    import torch

    import flowgp.cli.commands as commands

    seen = []
    real = commands._estimator

    def recording(name, **kw):
        seen.append(kw["threads"])
        return real(name, **kw)

    monkeypatch.setattr(commands, "_estimator", recording)
    during = []
    from flowgp.training import loop

    real_train = loop.train

    def train_recording(*args, **kwargs):
        during.append(torch.get_num_threads())
        return real_train(*args, **kwargs)

    monkeypatch.setattr(loop, "train", train_recording)
    for module in ("flowgp.estimators.regression", "flowgp.estimators.robust"):
        if hasattr(__import__(module, fromlist=["train"]), "train"):
            monkeypatch.setattr(f"{module}.train", train_recording)
    before = torch.get_num_threads()
    commands.demo(str(tmp_path / "a"), epochs=2, periods=(1.0,), progress=None)
    assert seen == ["auto"] * 3 and during and set(during) == {1}
    assert torch.get_num_threads() == before
    seen.clear()
    commands.demo(str(tmp_path / "b"), epochs=2, periods=(1.0,), progress=None, threads=1)
    assert seen == [1] * 3
    with pytest.raises(ValueError, match="threads"):
        commands.demo(str(tmp_path / "c"), threads=0)
    assert not (tmp_path / "c").exists() and len(seen) == 3
    with pytest.raises(SystemExit) as usage:
        main(["demo", "--out", str(tmp_path / "d"), "--threads", "0"])
    assert usage.value.code == 2 and "--threads" in capsys.readouterr().err


def test_fit_nproc_2_saves_the_model_of_nproc_1(tmp_path, capsys):
    """`flowgp fit --nproc 2 --no-shard-reads` (two gloo workers started by torch's elastic launcher, each reading
    the whole table and taking half of every global batch: exact mode) saves a model whose predictions agree with
    the one-process fit to 1e-6, and which records shard_reads=False."""
    import torch

    import flowgp

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        import pytest

        pytest.skip("torch.distributed with gloo is not available")
    csv = _sine_csv(tmp_path / "d.csv", 48, 4)
    common = ["fit", "--data", str(csv), "--target", "target", "--model", "tgp", "--epochs", "2", "--batch-size",
              "16", "--num-inducing", "5", "--quiet"]
    assert main(common + ["--nproc", "1", "--out", str(tmp_path / "one.pt")]) == 0
    assert main(common + ["--nproc", "2", "--no-shard-reads", "--out", str(tmp_path / "two.pt"),
                          "--checkpoint", str(tmp_path / "two.ckpt")]) == 0
    one, two = flowgp.load(tmp_path / "one.pt"), flowgp.load(tmp_path / "two.pt")
    assert (one.shard_reads, two.shard_reads) == ("auto", False)  # the saved models record --no-shard-reads
    grid = np.linspace(-2, 2, 9)[:, None].repeat(2, 1)
    a, b = one.predict(grid), two.predict(grid)
    assert np.max(np.abs(a - b)) <= 1e-6 * np.max(np.abs(a))
    assert np.max(np.abs(a - one.predict(grid[::-1])[::-1])) == 0  # (the comparison is of real predictions)
    assert (tmp_path / "two.ckpt").exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_fit_bad_data_gives_one_line_naming_the_argument(tmp_path, capsys):
    csv = _sine_csv(tmp_path / "d.csv", 20, 0)
    text = tmp_path / "text.csv"
    text.write_text("u,v,target\n1,a,2\n3,b,4\n")
    ckpt = tmp_path / "fit.ckpt"
    cases = [
        (["--data", str(csv), "--target", "nope"], "--target: target column 'nope'"),
        (["--data", str(tmp_path / "missing.parquet"), "--target", "target"], "--data"),
        (["--data", str(text), "--target", "target"], "column 'v'"),
        (["--data", str(csv), "--target", "target", "--nproc", "4", "--batch-size", "2"], "--nproc 4"),
        (["--data", str(csv), "--target", "target", "--nproc", "30"], "--nproc 30"),
    ]
    for args, message in cases:
        assert main(["fit", *args, "--epochs", "2", "--quiet", "--checkpoint", str(ckpt),
                     "--out", str(tmp_path / "m.pt")]) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.pt").exists() and not ckpt.exists()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_predict_streams_to_parquet(tmp_path, capsys):
    import pyarrow.parquet as pq

    import flowgp

    csv = _sine_csv(tmp_path / "d.csv", 30, 0)
    model = tmp_path / "m.pt"
    assert main(["fit", "--data", str(csv), "--target", "target", "--model", "svgp", "--epochs", "2",
                 "--num-inducing", "4", "--quiet", "--out", str(model)]) == 0
    out = tmp_path / "p.parquet"
    assert main(["predict", "--model", str(model), "--data", str(csv), "--out", str(out), "--chunk-rows", "7",
                 "--quiet"]) == 0
    table = pq.read_table(out)
    x = np.loadtxt(csv, delimiter=",", skiprows=1)[:, :2]
    np.testing.assert_allclose(table.column("mean").to_numpy(), flowgp.load(model).predict(x), rtol=1e-12)


def test_nproc_launch_restores_the_signal_handlers(tmp_path):
    # torch's elastic launcher installs handlers for SIGINT/SIGTERM; a Ctrl-C after `main([... --nproc 2])`
    # must again raise KeyboardInterrupt in the caller
    import signal

    from flowgp.training import distributed

    before = signal.getsignal(signal.SIGINT)
    assert distributed.launch(["--version-that-does-not-exist"], 1) == 1  # a worker that fails at once
    assert signal.getsignal(signal.SIGINT) is before


def test_nproc_refuses_a_text_column_before_launching(tmp_path, capsys):
    text = tmp_path / "text.csv"
    text.write_text("u,v,target\n1,a,2\n3,b,4\n5,c,6\n")
    assert main(["fit", "--data", str(text), "--target", "target", "--nproc", "2", "--quiet",
                 "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert "column 'v'" in err and len(err.strip().splitlines()) == 1, err


def test_fit_and_predict_a_multi_output_model_with_an_output_column(tmp_path, capsys):
    # AMO-GP from a long table (time, site, value): --output names the site column, the saved metadata keeps it
    # for `flowgp predict`, and the single-/multi-output flags are checked before any work
    rng = np.random.default_rng(0)
    rows = []
    for site in range(3):
        t = np.sort(rng.uniform(0, 10, 40))
        rows += [(ti, site, np.sin(ti + 0.3 * site) + 0.1 * rng.standard_normal()) for ti in t]
    csv = tmp_path / "long.csv"
    np.savetxt(csv, np.array(rows), delimiter=",", header="time,site,value", comments="")
    model = tmp_path / "amogp.pt"
    assert main(["fit", "--data", str(csv), "--target", "value", "--output", "site", "--model", "amogp",
                 "--epochs", "5", "--num-inducing", "8", "--quiet", "--out", str(model)]) == 0
    meta = json.loads((tmp_path / "amogp.pt.json").read_text())
    assert meta["output"] == "site" and meta["features"] == ["time", "site"]
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(model), "--data", str(csv), "--out", str(out), "--quiet"]) == 0
    pred = np.loadtxt(out, delimiter=",", skiprows=1)
    assert pred.shape == (120, 4) and np.all(pred[:, 1] > 0) and np.all(pred[:, 2] < pred[:, 3])
    from flowgp import estimators

    est = estimators.load(model)
    data = np.array(rows)
    np.testing.assert_allclose(pred[:, 0], est.predict(data[:, :1], data[:, 1].astype(int)), rtol=1e-10)
    capsys.readouterr()
    assert main(["fit", "--data", str(csv), "--target", "value", "--model", "amogp", "--out", str(model)]) == 2
    assert "--output COL" in capsys.readouterr().err
    assert main(["fit", "--data", str(csv), "--target", "value", "--output", "site", "--model", "svgp",
                 "--out", str(model)]) == 2
    assert "--output: --model svgp has one output" in capsys.readouterr().err
    assert main(["fit", "--data", str(csv), "--target", "value", "--output", "site", "--model", "amogp",
                 "--kernel", "matern32", "--out", str(model)]) == 2
    assert "does not take --kernel" in capsys.readouterr().err


def test_predict_takes_a_device_and_a_gpu_model_loads_on_a_cpu_only_machine(tmp_path, capsys, monkeypatch):
    # a model saved from CUDA (its device parameter) loads on the CPU, with a warning, where there is no GPU;
    # --device chooses explicitly and is checked before any work
    import torch

    import flowgp

    csv = _sine_csv(tmp_path / "train.csv", 40, 2)
    model = tmp_path / "m.pt"
    assert main(["fit", "--csv", str(csv), "--target", "target", "--model", "svgp", "--epochs", "5",
                 "--num-inducing", "5", "--quiet", "--out", str(model)]) == 0
    from flowgp.training.checkpoint import atomic_save, safe_load

    state = safe_load(model)
    state["params"]["device"] = "cuda"  # what a GPU fit saves
    atomic_save(state, model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="no CUDA device: loading it on the CPU"):
        back = flowgp.estimators.load(model)
    assert back.device == "cpu" and {p.device.type for p in back.model_.parameters()} == {"cpu"}
    out = tmp_path / "p.csv"
    with pytest.warns(UserWarning, match="no CUDA device"):
        assert main(["predict", "--model", str(model), "--data", str(csv), "--out", str(out), "--quiet"]) == 0
    assert len(out.read_text().strip().splitlines()) == 41
    assert main(["predict", "--model", str(model), "--data", str(csv), "--out", str(out), "--device", "cpu",
                 "--quiet"]) == 0
    assert main(["predict", "--model", str(model), "--data", str(csv), "--out", str(out), "--device", "cuda",
                 "--quiet"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_fit_compile_passes_the_mode_to_the_training_loop(tmp_path, monkeypatch, capsys):
    # `--compile default` (torch.compile's default mode), `--compile reduce-overhead` (CUDA graphs on a GPU) and
    # the bare `--compile` ("auto") reach train(compile=...); the compiler is swapped for a tracing backend here so that no kernels are built
    import flowgp.training.loop as training_module
    from flowgp.training.compiled import CompiledObjective
    from flowgp.training.loop import COMPILE_MODES

    modes = []

    def traced(*args, mode=None, **kwargs):
        modes.append(mode)
        return CompiledObjective(*args, backend="aot_eager", **kwargs)

    monkeypatch.setattr(training_module, "CompiledObjective", traced)
    csv = _sine_csv(tmp_path / "train.csv", 40, 3)
    for flag in (["--compile", "default"], ["--compile", "reduce-overhead"], ["--compile"]):
        assert main(["fit", "--csv", str(csv), "--target", "target", "--model", "svgp", "--epochs", "2",
                     "--num-inducing", "5", "--quiet", "--out", str(tmp_path / "m.pt"), *flag]) == 0
    # the bare flag is compile="auto": a two-epoch fit of 40 rows is far too short to repay a compilation
    assert modes == [None, "reduce-overhead"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--csv", str(csv), "--target", "target", "--out", str(tmp_path / "m.pt"), "--compile", "fast"])
    # the CLI's list (written out so that --help does not import torch) is the training loop's
    err = capsys.readouterr().err
    assert "invalid choice: 'fast'" in err and all(repr(mode) in err for mode in COMPILE_MODES)


def test_a_model_saved_from_another_gpu_index_loads_on_the_first(monkeypatch):
    # saved from cuda:3, loaded on a machine with one GPU: cuda:0, with a warning (the device resolution only;
    # nothing is built on a GPU here)
    import torch

    from flowgp.estimators.base import _device_here

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.warns(UserWarning, match="has 1 CUDA device"):
        assert _device_here("cuda:3", "m.pt") == "cuda:0"
    assert _device_here("cuda:0", "m.pt") == "cuda:0" and _device_here("cuda", "m.pt") == "cuda"
    assert _device_here("cpu", "m.pt") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="no CUDA device"):
        assert _device_here("cuda:1", "m.pt") == "cpu"
