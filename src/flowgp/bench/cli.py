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
import importlib
import sys

from ..cli.exit_codes import EPILOG, EXIT_BUSY, EXIT_INTERRUPTED, EXIT_USAGE, interrupted_line
from ..data.paths import check_distinct

__all__ = ["main", "add_bench_parser", "run_bench"]

# Explicit, closed list of subcommand modules (relative to flowgp.bench). One line per subcommand.
_SUBCOMMAND_MODULES = (
    "uci",
    "applications",   # `airquality` and `rainfall` are two NAMEs exported by this module via SUBCOMMANDS
    "timing",
    "report",
    "snr",
    "amogp",
    "images",
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


def add_bench_parser(parser: argparse.ArgumentParser) -> None:
    """Fill `parser` (the `flowgp bench` parser) with one sub-parser per subcommand."""
    sub = parser.add_subparsers(dest="bench_command", required=True)
    for name, help_text, add_arguments, run in _subcommands():
        p = sub.add_parser(name, help=help_text, description=help_text)
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


def run_bench(args) -> int:
    """Dispatch parsed `flowgp bench ...` arguments; bad input gives exit code 2 and a one-line message, an
    output that another run is writing exit code `EXIT_LOCKED` (75) and a one-line message naming its PID, an
    interruption (Ctrl-C) exit code 130 and one line saying what was saved (rows already written are kept, and an
    interrupted fit resumes from its checkpoint: rerunning the same command continues).

    Every subcommand's `--out` is a folder; it is checked here, before any work (a file there would
    otherwise surface only when the first row is written), and so is that it is none of the files read."""
    from .results import OutputLocked, check_output_folder

    label = f"flowgp bench {args.bench_command}"
    try:
        if getattr(args, "out", None) is not None:
            check_distinct({"--out": args.out}, _input_files(args))
            check_output_folder(args.out, "--out")
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
    """`flowgp bench` on its own (the same as `flowgp bench ...`); returns the exit status."""
    parser = argparse.ArgumentParser(prog="flowgp bench",
                                     description="the papers' benchmarks (resumable) and their tables",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_parser(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
