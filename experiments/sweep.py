"""``python -m experiments.sweep``: the sweep command line (`experiments.multirun.sweep`)."""
if __name__ == "__main__": __import__("runpy").run_module("experiments.multirun.sweep", run_name="__main__")  # noqa: E701,E501
