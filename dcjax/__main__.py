"""``python -m dcjax``: the ``dcjax`` command (see `dcjax.cli`)."""

import sys

from dcjax.cli import main

if __name__ == "__main__":
    sys.exit(main())
