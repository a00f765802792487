"""An example run as a script prints its input errors in one line (mpguide.verify.errors), others keep a traceback."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from mpguide.verify import errors
from mpguide.verify.hardware import ConfigurationError

SWAP = "MPGUIDE_SWAP_RECIPE"


def _run_example(script, tmp_path, **settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPGUIDE_")}
    env.update(settings, MPGUIDE_RESULTS_DIR=str(tmp_path), MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MPGUIDE_PRESET", "huge", "error: unknown preset 'huge' (from MPGUIDE_PRESET); use one of"),
        ("MPGUIDE_DEVICE", "tpu", "error: unknown device 'tpu' (from MPGUIDE_DEVICE); use auto, cpu or cuda"),
        (SWAP, "plot_11_fp16_parameters", f"error: {SWAP} entry 'plot_11_fp16_parameters'"),
        (SWAP, "plot_11_fp16_parameters:no-such-run=x", f"error: {SWAP} names run(s) ['no-such-run'] that"),
        (SWAP, "plot_11_fp16_parameters:half-fp16=nonsense", f"error: {SWAP} names recipe(s) ['nonsense'] that"),
    ],
)
def test_a_bad_environment_variable_stops_the_script_in_one_line_before_it_prints(tmp_path, variable, value, message):
    """The example's first cell checks its settings (runner.check_settings): nothing trains or prints first."""
    proc = _run_example(ROOT / "examples" / "plot_11_fp16_parameters.py", tmp_path, **{variable: value})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("*.json"))
    assert proc.stdout == "", "the settings are checked before the example prints (or trains) anything"


def test_a_downloaded_example_checks_its_runs_from_its_own_file(tmp_path):
    """No examples/ folder (a reader's download): the swap's runs are checked against the script being run."""
    folder = tmp_path / "download"
    folder.mkdir()
    script = folder / "plot_11_fp16_parameters.py"
    script.write_text((ROOT / "examples" / script.name).read_text())
    no_checkout = str(tmp_path / "no-examples")
    proc = _run_example(script, folder, MPGUIDE_EXAMPLES_DIR=no_checkout, **{SWAP: f"{script.stem}:typo=x"})
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: {SWAP} names run(s) ['typo'] that plot_11_fp16_parameters does not have")
    assert "its runs: [" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_every_example_checks_its_settings_before_anything_else():
    """Before runner.check_settings("<its own name>") an example only imports, defines and assigns literals."""
    import ast

    for path in sorted((ROOT / "examples").glob("plot_*.py")):
        body = ast.parse(path.read_text()).body[1:]
        calls = [i for i, node in enumerate(body) if "runner.check_settings(" in ast.unparse(node)]
        assert len(calls) == 1, f"{path.name}: no runner.check_settings(...) call at module level"
        call = body[calls[0]].value
        assert [a.value for a in call.args] == [path.stem], f"{path.name}: checks another example's settings"
        for node in body[: calls[0]]:
            harmless = isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
            harmless |= ast.unparse(node) == "runner.quiet_lightning()"
            if isinstance(node, ast.Assign):
                try:
                    ast.literal_eval(node.value)
                    harmless = True
                except ValueError:
                    pass
            assert harmless, f"{path.name}:{node.lineno}: runs before the settings check: {ast.unparse(node)[:60]}"


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


def test_a_swap_recipe_is_checked_against_the_literal_table_only():
    """The early check reads the ``recipes = {...}`` keys with ``ast``; a table built otherwise is left to
    run_example, whose message then names the setting."""
    from mpguide.verify.run import runner

    assert "fp32 adapter" in runner._recipe_names(ROOT / "examples" / "plot_11_fp16_parameters.py")
    built = "recipes = dict(a=1)\nrecipes_too = {'b': 2}\n"
    assert runner._recipe_names(_write(built)) is None


def _write(text):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "plot_99_x.py"
    path.write_text(text)
    return path
