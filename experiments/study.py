"""``python -m experiments.study``: the study command line (`experiments.multirun.study`)."""
if __name__ == "__main__": __import__("runpy").run_module("experiments.multirun.study", run_name="__main__")  # noqa: E701,E501
