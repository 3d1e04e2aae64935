"""The exit codes of the `flowgp` command line (one table, used by `flowgp`, `flowgp bench` and their help), and
the one line a command prints when it is interrupted.

    0    success
    1    any other failure: a benchmark job that failed (its error is in <out>/<name>.errors.jsonl), or an
         unexpected error (its traceback is printed)
    2    usage error: a bad option or input, refused before any work, with a one-line message
    75   busy: another flowgp process is writing the same output (`flowgp bench`'s result files); rerun later,
         or pass --wait (sysexits' EX_TEMPFAIL)
    130  interrupted (Ctrl-C, SIGINT): one line says what was saved; rerun the same command to resume
"""
from __future__ import annotations

import os

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_BUSY", "EXIT_INTERRUPTED", "EPILOG", "interrupted_line"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BUSY = 75
EXIT_INTERRUPTED = 130

#: the exit codes as `flowgp --help` shows them (argparse's RawDescriptionHelpFormatter keeps the lines)
EPILOG = """exit codes:
  0    success
  1    any other failure (a benchmark job failed, or an unexpected error: its traceback is printed)
  2    usage error: a bad option or input, refused before any work with a one-line message
  75   busy: another flowgp process is writing the same output; rerun later or pass --wait
  130  interrupted (Ctrl-C): one line says what was saved; rerun the same command to resume"""


def interrupted_line(err: BaseException, checkpoint=None, kept: str | None = None) -> str:
    """The one line that reports a KeyboardInterrupt `err`.

    A training loop's interruption (`flowgp.training.loop.TrainingInterrupted`) carries the step it stopped at and
    the checkpoint it saved (None: nothing saved). Otherwise (interrupted outside the loop, e.g. while reading
    the data or predicting) `checkpoint` is the command's checkpoint file: its state, when it exists, is what a
    rerun resumes from. `kept`: what the command keeps whatever the fit in progress saved (a benchmark's rows)."""
    step = getattr(err, "step", None)
    saved = getattr(err, "checkpoint", None) if step is not None else (
        checkpoint if checkpoint is not None and os.path.isfile(checkpoint) else None)
    where = f"interrupted at step {step}" if step is not None else "interrupted"
    if saved is not None:
        return f"{where}; state saved to {os.fspath(saved)}; rerun the same command to resume"
    if kept is not None:
        return f"{where}; {kept}; rerun the same command to resume"
    return f"{where}; nothing saved"
