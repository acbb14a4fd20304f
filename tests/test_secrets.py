"""The SGLang API key: configured as where it is read from (``env:NAME`` / ``file:PATH``),
never as the key itself; stored and shown only as that reference. (That a whole run
writes it nowhere is checked by tests/test_loop.py::test_main_job_drives_an_sglang_fleet;
the launcher's command lines by tests/test_sglang_fleet.py::test_launch_commands.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from samplers.sglang_config import SGLangFleetConfig, read_api_key

KEY = "s3cret-api-key"
GPU = ["gsm8k_tools", "--model.path", "/models/none"]


def test_a_key_given_as_a_value_is_refused_without_repeating_it(entr_run, tmp_path):
    code, err = entr_run([*GPU, "--run_dir", str(tmp_path / "run"), "--sampler.api_key", KEY])
    assert code == 2
    assert ("sampler.api_key must say where the API key is read from, env:NAME (an environment "
            "variable) or file:PATH (a file holding the key)") in err
    assert KEY not in err and not (tmp_path / "run").exists()


def test_a_key_that_cannot_be_read_is_refused_at_parse_time(entr_run, tmp_path, monkeypatch):
    monkeypatch.delenv("ENTR_TEST_NO_KEY", raising=False)
    code, err = entr_run([*GPU, "--run_dir", str(tmp_path / "run"), "--sampler.api_key",
                          "env:ENTR_TEST_NO_KEY"])
    assert (code, err) == (2, "entr-run: error: sampler.api_key=env:ENTR_TEST_NO_KEY, but the "
                              "environment variable ENTR_TEST_NO_KEY is not set or empty: export "
                              "ENTR_TEST_NO_KEY=<the key> before starting")
    missing = tmp_path / "no_key_file"
    code, err = entr_run([*GPU, "--run_dir", str(tmp_path / "run"), "--sampler.api_key",
                          f"file:{missing}"])
    assert (code, err) == (2, f"entr-run: error: sampler.api_key=file:{missing}: cannot read "
                              "the key file (No such file or directory)")


def test_the_key_is_read_from_the_variable_or_the_files_first_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ENTR_TEST_KEY", f"  {KEY}\n")
    assert read_api_key("env:ENTR_TEST_KEY", "f") == KEY
    (tmp_path / "key").write_text(f"{KEY}\nsecond line\n")
    assert read_api_key(f"file:{tmp_path / 'key'}", "f") == KEY
    assert read_api_key("", "f") is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="the key file is empty"):
        read_api_key(f"file:{tmp_path / 'empty'}", "f")


def test_the_run_config_stores_the_reference_and_the_fleet_config_hides_the_key():
    from experiments.run.configs import GSM8K_TOOLS_GPU

    cfg = dataclasses.replace(GSM8K_TOOLS_GPU, sampler=dataclasses.replace(
        GSM8K_TOOLS_GPU.sampler, api_key="env:SGLANG_API_KEY"))
    assert json.loads(cfg.to_json())["sampler"]["api_key"] == "env:SGLANG_API_KEY"
    fleet = SGLangFleetConfig(api_key=KEY)
    assert fleet.api_key == KEY and KEY not in repr(fleet) and KEY not in str(fleet)
