"""`python -m flowgp ...` (and `torchrun -m flowgp ...`) runs the `flowgp` command line."""
import os
import sys

from .cli import main

code = main()
if "--launched-by-nproc" in sys.argv[1:]:
    # a worker that `--nproc` started has written and closed its files and left the process group: it ends
    # now rather than after the interpreter's teardown of torch (5-6 s on a busy 2-core machine), which the
    # launcher - and a Ctrl-C - would otherwise wait for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
