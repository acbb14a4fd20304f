"""``python -m experiments.run``: the main-job command line (`experiments.run.cli`)."""
from experiments.run.cli import entry

entry()
