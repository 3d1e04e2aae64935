"""`flowgp --help` and `--version`: defaults shown, models grouped by family, every bench subcommand listed."""
import argparse
import re
from pathlib import Path

import pytest

import flowgp
import flowgp.compat
from flowgp.cli import main

ROOT = Path(__file__).resolve().parents[2]


class _Parsed(Exception):
    pass


def _parser(monkeypatch) -> argparse.ArgumentParser:
    """The `flowgp` parser main() builds (caught when it would parse)."""
    captured = {}

    def catch(self, *args, **kwargs):
        captured["parser"] = self
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(_Parsed):
        main(["demo"])
    return captured["parser"]


def _subparsers(parser, path=("flowgp",)):
    """(command path, parser) of the whole tree."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _subparsers(child, path + (name,))


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"flowgp {flowgp.__version__} (torch ")


def test_version_is_the_packages(monkeypatch):
    from importlib import metadata

    assert flowgp.__version__ == _pyproject_version()

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)  # a source tree on sys.path, never installed
    assert flowgp.compat.library_version() == _pyproject_version()


def test_every_option_with_a_default_shows_it(monkeypatch, capsys):
    tree = list(_subparsers(_parser(monkeypatch)))
    monkeypatch.undo()
    checked = 0
    for path, parser in tree:
        text = "".join(parser.format_help().split())  # (argparse wraps lines at spaces and hyphens)
        for action in parser._actions:
            default = action.default
            if (not action.option_strings or default is None or default is False
                    or default == argparse.SUPPRESS):
                continue
            assert f"(default:{default})".replace(" ", "") in text or "default" in (action.help or "").lower(), \
                f"{' '.join(path)} {action.option_strings[0]}: default {default!r} not in --help"
            checked += 1
        assert "(default:None)" not in text and "(default:False)" not in text, " ".join(path)
    assert checked > 50  # every command and bench subcommand was looked at


def test_fit_help_lists_every_model_once_grouped_by_family(capsys):
    from flowgp.cli.commands import _csv_models, _multi_output_models
    from flowgp.registry import MODELS

    text = _help(["fit"], capsys)
    listing = text.split("--model names by family", 1)[1]
    blocks = re.findall(r"^  (\w+)(?: \(multi-output: with --output\))?:\n((?:    .*\n?)+)", listing, re.M)
    seen = {}
    for family, names in blocks:
        for item in " ".join(names.split()).split(", "):
            ranged = re.fullmatch(r"(.*?)\{(\d+)\.\.(\d+)\}(.*)", item)
            expanded = [f"{ranged[1]}{n}{ranged[4]}" for n in range(int(ranged[2]), int(ranged[3]) + 1)] \
                if ranged else [item]
            for name in expanded:
                assert name not in seen, f"{name} listed twice"
                seen[name] = family
    assert set(seen) == set(_csv_models())
    assert all(MODELS.get(name).regressor == family for name, family in seen.items())
    assert len(blocks) == len({MODELS.get(n).regressor for n in _csv_models()}) >= 5
    assert "AlignedMultiOutputGPRegressor (multi-output: with --output)" in listing
    assert set(_multi_output_models()) <= {n for n, f in seen.items() if f == "AlignedMultiOutputGPRegressor"}


def test_bench_help_lists_every_subcommand(monkeypatch, capsys):
    from flowgp.bench.cli import subcommand_summaries

    names = [name for name, _ in subcommand_summaries()]
    assert {"uci", "airquality", "rainfall", "timing", "report", "snr", "amogp", "images"} <= set(names)
    bench = dict(_subparsers(_parser(monkeypatch)))[("flowgp", "bench")]
    monkeypatch.undo()
    choices = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(choices) == names  # the description is generated from the parser's own list
    description = bench.description
    for name, help_text in subcommand_summaries():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(help_text)}$", description, re.M), name
    top = _help([], capsys)
    # (argparse wraps lines at spaces and hyphens: compare without whitespace)
    assert "".join(("run the benchmark suite: " + ", ".join(names)).split()) in "".join(top.split())


def test_the_package_ships_py_typed():
    assert (ROOT / "src" / "flowgp" / "py.typed").is_file()
    assert re.search(r'^"flowgp" = \["py.typed"\]', (ROOT / "pyproject.toml").read_text(), re.M)


def test_the_running_torch_is_in_the_declared_range():
    """pyproject's torch range is the tested one: the torch these tests run on must lie inside it."""
    version = pytest.importorskip("packaging.version")
    import torch

    spec = re.search(r'"torch>=([\d.]+),<=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert spec, "pyproject.toml must pin torch as >=LOWEST,<=NEWEST (the tested range)"
    running = version.Version(torch.__version__.split("+")[0])
    assert version.Version(spec[1]) <= running <= version.Version(spec[2])
