"""``python -m fairseq_insertion.export``."""

import sys

from .cli import main

sys.exit(main())
