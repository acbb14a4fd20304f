"""``python -m entr_jax.data``: the ``entr-data`` command (`entr_jax.data.cli`)."""

import sys

from entr_jax.data.cli import main

sys.exit(main())
