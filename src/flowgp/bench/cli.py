"""`flowgp bench <subcommand>`: argparse wiring over an explicit tuple of subcommand modules.

Interface of a subcommand module (e.g. `flowgp/bench/uci.py`, `snr.py`, `amogp.py`):

    NAME = "uci"                       # the subcommand name on the command line
    HELP = "one-line help text"
    def add_arguments(parser): ...     # add options to the argparse sub-parser it is given
    def run(args) -> int: ...          # do the work; return a process exit code (0 = success)

To add a subcommand, write such a module and add one line naming it to `_SUBCOMMAND_MODULES` below
(a closed list: nothing else registers itself). Modules are imported lazily so a broken optional
subcommand cannot stop the others from running.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import sys

from ..cli.exit_codes import EPILOG, EXIT_BUSY, EXIT_INTERRUPTED, EXIT_USAGE, interrupted_line
from ..data.paths import check_distinct

__all__ = ["main", "add_bench_parser", "run_bench", "HelpFormatter", "subcommand_summaries"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """`--help` of the flowgp commands: every option with a default that says something shows it, "(default: X)",
    unless its help already says what the default is; descriptions and epilogs keep their line breaks.

    Defaults of None (an option that is off, or whose default the help explains) and False (a flag) are not
    shown; neither are defaults of positional arguments.

    See Also:
        ``argparse.HelpFormatter`` (its base, whose arguments it takes); :func:`flowgp.bench.cli.add_bench_parser`.
    """

    def _get_help_string(self, action):
        text = (action.help or "").strip()
        default = action.default
        if (not action.option_strings or default is None or default is False or default == argparse.SUPPRESS
                or "%(default)" in text or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)".strip()

    def _format_action(self, action):
        # argparse leaves options without help text out of the defaults; give them one so theirs are shown too
        if not action.help and action.option_strings and self._get_help_string(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

# Explicit, closed list of subcommand modules (relative to flowgp.bench). One line per subcommand.
_SUBCOMMAND_MODULES = (
    "uci",
    "applications",   # `airquality` and `rainfall` are two NAMEs exported by this module via SUBCOMMANDS
    "timing",
    "report",
    "snr",
    "amogp",
    "images",         # also `images-curve` (SUBCOMMANDS)
    "latent_demo",
    "dgp_tables",
    "ldgp_tables",
    "ldgp_authors",
)


def _load(name: str):
    return importlib.import_module(f"flowgp.bench.{name}")


def _subcommands():
    """Yield (name, help, add_arguments, run) for every subcommand in `_SUBCOMMAND_MODULES`.

    A module may expose several subcommands through `SUBCOMMANDS = ((NAME, HELP, add_arguments, run), ...)`;
    otherwise its module-level NAME/HELP/add_arguments/run are used.
    """
    for mod_name in _SUBCOMMAND_MODULES:
        try:
            mod = _load(mod_name)
        except ImportError as err:  # say so loudly, but keep the other subcommands usable
            print(f"flowgp bench: subcommand module '{mod_name}' failed to import: {err}", file=sys.stderr)
            continue
        entries = getattr(mod, "SUBCOMMANDS", None)
        if entries is None:
            entries = ((getattr(mod, "NAME", mod_name), getattr(mod, "HELP", ""), mod.add_arguments, mod.run),)
        yield from entries


def subcommand_summaries() -> list[tuple[str, str]]:
    """(name, one-line help) of every `flowgp bench` subcommand, in the order of `_SUBCOMMAND_MODULES`.

    See Also:
        :func:`flowgp.bench.cli.add_bench_parser`.
    """
    return [(name, help_text) for name, help_text, _, _ in _subcommands()]


#: what `flowgp bench --help` says above its generated list of subcommands
BENCH_DESCRIPTION = ("Resumable benchmark suite of the papers' experiments: one JSON line per finished row, re-running "
                     "skips finished rows.")


def add_bench_parser(parser: argparse.ArgumentParser) -> None:
    """Fill `parser` (the `flowgp bench` parser) with one sub-parser per subcommand; its description lists them
    all, generated from the same list, so it cannot leave one out.

    Args:
        parser: an argparse.ArgumentParser to fill (in place).

    See Also:
        :func:`flowgp.bench.cli.subcommand_summaries`.
    """
    entries = list(_subcommands())
    width = max((len(name) for name, *_ in entries), default=0)
    listing = "\n".join(f"  {name:<{width}}  {help_text}" for name, help_text, _, _ in entries)
    parser.description = f"{BENCH_DESCRIPTION}\n\nsubcommands ('flowgp bench NAME --help' for each one's options):\n{listing}"
    parser.formatter_class = HelpFormatter
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="SUBCOMMAND",
                                help="one of the subcommands listed above")
    for name, help_text, add_arguments, run in entries:  # (their help is the description's list)
        p = sub.add_parser(name, description=help_text, formatter_class=HelpFormatter)
        add_arguments(p)
        p.set_defaults(bench_run=run)


# Exit status when another process is writing the same output (sysexits' EX_TEMPFAIL: try again later).
EXIT_LOCKED = EXIT_BUSY


def _input_files(args) -> dict:
    """The files a subcommand reads that the user named: --data, and the CSV files of --datasets csv:PATH:TARGET."""
    inputs = {}
    if isinstance(getattr(args, "data", None), str):
        inputs["--data"] = args.data
    datasets = getattr(args, "datasets", None)
    if isinstance(datasets, str):
        for i, part in enumerate(p.strip() for p in datasets.split(",")):
            if part.startswith("csv:") and ":" in part[4:]:
                inputs[f"--datasets (entry {i + 1})"] = part[4:].rsplit(":", 1)[0]
    return inputs


def run_bench(args, argv=None) -> int:
    """Dispatch parsed `flowgp bench ...` arguments; bad input gives exit code 2 and a one-line message, an
    output that another run is writing exit code `EXIT_LOCKED` (75) and a one-line message naming its PID, an
    interruption (Ctrl-C) exit code 130 and one line saying what was saved (rows already written are kept, and an
    interrupted fit resumes from its checkpoint: rerunning the same command continues).

    Every subcommand's `--out` is a folder; it is checked here, before any work (a file there would
    otherwise surface only when the first row is written), and so is that it is none of the files read.
    A subcommand with `--nproc N` > 1 runs `python -m flowgp <argv>` in N processes.

    Args:
        args: the argparse.Namespace a parser filled by `add_bench_parser` returned.
        argv: the command line from "bench" on (what the N processes of `--nproc N` run).

    See Also:
        :func:`flowgp.bench.cli.main`.
    """
    from .results import OutputLocked, check_output_folder

    label = f"flowgp bench {args.bench_command}"
    try:
        if getattr(args, "out", None) is not None:
            check_distinct({"--out": args.out}, _input_files(args))
            check_output_folder(args.out, "--out")
        if hasattr(args, "nproc"):  # a subcommand on the training engine: --device, --nproc
            from .runner import check_engine, launch_engine

            check_engine(args)
            if args.nproc > 1:
                if argv is None:
                    raise ValueError("--nproc needs the command line: run it as `flowgp bench ...`")
                return launch_engine(argv, args.nproc)
        return int(args.bench_run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as err:
        print(f"{label}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OutputLocked as err:
        print(f"{label}: error: {err}", file=sys.stderr)
        return EXIT_LOCKED
    except KeyboardInterrupt as err:
        line = interrupted_line(err, kept="rows written so far are kept")
        print(f"{label}: {line}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def main(argv=None) -> int:
    """`flowgp bench` on its own (the same as `flowgp bench ...`); returns the exit status.

    Args:
        argv: the arguments after ``bench`` (None: sys.argv[1:]).

    See Also:
        :func:`flowgp.cli.main` (the whole command line).
    """
    parser = argparse.ArgumentParser(prog="flowgp bench", formatter_class=HelpFormatter, epilog=EPILOG)
    add_bench_parser(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_bench(parser.parse_args(argv), ["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
