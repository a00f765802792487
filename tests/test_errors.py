"""An example run as a script prints its input errors in one line (mpguide.verify.errors), others keep a traceback."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from mpguide.verify import errors
from mpguide.verify.hardware import ConfigurationError


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MPGUIDE_PRESET", "huge", "error: unknown preset 'huge' (from MPGUIDE_PRESET); use one of"),
        ("MPGUIDE_DEVICE", "tpu", "error: unknown device 'tpu' (from MPGUIDE_DEVICE); use auto, cpu or cuda"),
    ],
)
def test_a_bad_environment_variable_stops_the_script_in_one_line(tmp_path, variable, value, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPGUIDE_")}
    env.update({variable: value, "MPGUIDE_RESULTS_DIR": str(tmp_path), "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)})
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "plot_03_shared_backward.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message)
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("*.json"))


def test_the_hook_prints_input_errors_alone_and_keeps_other_tracebacks(capsys):
    try:
        raise ConfigurationError("unknown preset 'x'; use one of ['quick']")
    except ConfigurationError as err:
        errors._hook(type(err), err, err.__traceback__)
    assert capsys.readouterr().err == "error: unknown preset 'x'; use one of ['quick']\n"
    try:
        raise KeyError("a bug, not bad input")
    except KeyError as err:
        errors._hook(type(err), err, err.__traceback__)
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_same_named_class_outside_mpguide_is_not_an_input_error():
    class ConfigurationError(Exception):  # another library's class of the same name
        pass

    assert not errors.is_input_error(ConfigurationError)
    from mpguide.verify.records import RecordError

    assert errors.is_input_error(RecordError)
