"""`python -m flowgp ...` (and `torchrun -m flowgp ...`) runs the `flowgp` command line."""
import sys

from .cli import main

sys.exit(main())
