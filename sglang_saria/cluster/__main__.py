"""`python -m sglang_saria.cluster`: see cli.py."""

import sys

from sglang_saria.cluster.cli import main

sys.exit(main())
