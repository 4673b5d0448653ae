"""``python -m zerosiam``: the same as the ``zerosiam`` command."""

import sys

from zerosiam.cli import main

sys.exit(main())
