"""The bad-input probe (`benchmarks.bad_inputs`) on a small slice, outcome by outcome, so
the tool cannot silently rot: its sentinel must still stop a valid run at the work, and
its cases must still reach the checks they are meant for."""

from __future__ import annotations

import pytest

from benchmarks import bad_input_cases
from benchmarks.bad_inputs import judged_valid, probe


@pytest.fixture(scope="module")
def result():
    return probe(kinds=["control", "config", "model_files"],
                 fields=["the base", "rl_steps", "sampler.server_urls", "NaN weights"])


def outcomes(result):
    return {(r["kind"], r["label"]): (r["outcome"], r.get("names_it")) for r in result["records"]}


def test_each_case_of_the_slice_has_its_exact_outcome(result):
    refused = ("refused_before_work", True)
    assert outcomes(result) == {
        ("control", "the base configuration"): ("reached_work_silently", None),
        **{("config", f"rl_steps={v!r}"): refused
           for v in ("-1", "2.5", "nan", "inf", "-inf", str(10**30), "abc")},
        ("config", "rl_steps='0'"): ("reached_work_silently", None),
        ("config", "sampler.server_urls=''"): refused,
        ("config", "sampler.server_urls='not-a-url'"): refused,
        ("model_files", "NaN weights"): ("refused_before_work", True),
    }
    assert result["faults"] == []
    assert [(v["label"], v["reason"]) for v in result["judged_valid"]] == [
        ("the base configuration", "the probe's base run, which must reach the work"),
        ("rl_steps='0'", "0 is a documented value of the field (off, never, all, no warm-up "
                         "or decay)")]
    assert result["counts"]["total"] == {
        "refused_before_work": 10, "reached_work_with_warning": 0,
        "reached_work_silently": 2, "crashed": 0, "refused_naming_it": 10}


def test_the_refusals_of_the_slice_say_what_is_wrong(result):
    messages = {r["label"]: r["message"] for r in result["records"]}
    assert (f"Error parsing RunConfig: rl_steps must be a 64-bit integer (in [-2**63, 2**63)), "
            f"got {10**30}") in messages[f"rl_steps={str(10**30)!r}"]
    assert ("Error parsing sampler: sampler.server_urls must be http(s):// URLs (e.g. "
            "http://127.0.0.1:30000), got ('not-a-url',)") in \
        messages["sampler.server_urls='not-a-url'"]
    assert "model.safetensors: tensor 'model.layers.1.self_attn.k_proj.bias' has 1 NaN/inf " \
           "values of 16" in messages["NaN weights"]


def test_the_probe_generates_every_kind_from_the_config_tree():
    """Every leaf field of RunConfig gets bad values of its type; every field some
    selection reads is also tried under another selection."""
    cases = bad_input_cases.all_cases(bad_input_cases.pathlib.Path("/m"), lambda run: "{}")
    fields = {c.names for c in cases if c.kind == "config"}
    assert fields == {name for name, _, _ in bad_input_cases.leaves()
                      if not name.startswith("objective.estr.")}
    unselected = {c.names for c in cases if c.kind == "unselected"}
    assert unselected == {name for name in fields if bad_input_cases.selector_of(name)}
    assert judged_valid("config", "rl_steps='-1'") is None
