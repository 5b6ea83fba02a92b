"""`python -m attnmt ...` is the same as the `attnmt` command."""

import sys

from attnmt.cli.main import main

sys.exit(main())
