import pytest
from conftest import make_record

from mpguide.verify import records
from mpguide_build import sphinx_ext


def layout(tmp_path, monkeypatch):
    examples, gallery, results = tmp_path / "examples", tmp_path / "gallery", tmp_path / "results"
    for d in (examples, gallery, results):
        d.mkdir()
    for name in ("plot_01_a", "plot_02_b"):
        (examples / f"{name}.py").write_text(f"# {name}\n")
        (gallery / f"{name}.py.md5").write_text("x")
    (examples / "helper.py").write_text("")
    monkeypatch.setenv("MPGUIDE_EXAMPLES_DIR", str(examples))
    for name in ("MPGUIDE_PRESET", "MPGUIDE_DEVICE", "MPGUIDE_SWAP_RECIPE"):
        monkeypatch.delenv(name, raising=False)
    return examples, gallery, results


def current_record(results, name):
    """A record of ``name`` made from the current example file, library and run environment."""
    record = make_record([], [], example=name)
    record["source"]["run_env"] = records.run_env({})
    records.write_record(
        dict(record, claims=[{"kind": "expect", "runs": ["x"], "key": "k", "expected": 1}]), results / f"{name}.json"
    )


def test_first_build_reruns_everything(tmp_path, monkeypatch):
    examples, gallery, results = layout(tmp_path, monkeypatch)
    stale = sphinx_ext.invalidate_stale_examples(examples, gallery, results)
    assert stale == {"plot_01_a": "no readable record", "plot_02_b": "no readable record"}
    assert not list(gallery.glob("*.md5"))


def test_unchanged_build_reruns_nothing_and_a_missing_record_reruns_its_example_only(tmp_path, monkeypatch):
    examples, gallery, results = layout(tmp_path, monkeypatch)
    current_record(results, "plot_01_a")
    current_record(results, "plot_02_b")
    assert sphinx_ext.invalidate_stale_examples(examples, gallery, results) == {}
    assert (gallery / "plot_01_a.py.md5").exists()
    (results / "plot_02_b.json").unlink()
    assert list(sphinx_ext.invalidate_stale_examples(examples, gallery, results)) == ["plot_02_b"]
    assert (gallery / "plot_01_a.py.md5").exists() and not (gallery / "plot_02_b.py.md5").exists()


def test_a_swap_reruns_only_the_swapped_example(tmp_path, monkeypatch):
    examples, gallery, results = layout(tmp_path, monkeypatch)
    current_record(results, "plot_01_a")
    current_record(results, "plot_02_b")
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "plot_02_b:run=other recipe")
    assert sphinx_ext.examples_to_rerun(examples, results) == {"plot_02_b": "run_env changed"}


@pytest.mark.parametrize("change", ["preset", "library", "example"])
def test_changed_inputs_rerun_what_they_affect(tmp_path, monkeypatch, change):
    examples, gallery, results = layout(tmp_path, monkeypatch)
    current_record(results, "plot_01_a")
    current_record(results, "plot_02_b")
    if change == "preset":
        monkeypatch.setenv("MPGUIDE_PRESET", "full")
        assert sphinx_ext.examples_to_rerun(examples, results) == {
            n: "run_env changed" for n in ("plot_01_a", "plot_02_b")
        }
    elif change == "library":
        monkeypatch.setattr(records, "library_code_digest", lambda: "an older library")
        assert set(sphinx_ext.examples_to_rerun(examples, results)) == {"plot_01_a", "plot_02_b"}
    else:
        (examples / "plot_01_a.py").write_text("EDITED = 1\n")
        assert sphinx_ext.examples_to_rerun(examples, results) == {"plot_01_a": "example_code changed"}


def test_deleted_example_leftovers_are_removed(tmp_path, monkeypatch):
    examples, gallery, results = layout(tmp_path, monkeypatch)
    (examples / "plot_02_b.py").unlink()
    (gallery / "images" / "thumb").mkdir(parents=True)
    for name in (
        "plot_02_b.py",
        "plot_02_b.ipynb",
        "plot_02_b.rst",
        "images/sphx_glr_plot_02_b_001.png",
        "images/thumb/sphx_glr_plot_02_b_thumb.png",
        "plot_01_a.py",
        "images/sphx_glr_plot_01_a_001.png",
    ):
        (gallery / name).write_text("x")
    for name in ("plot_02_b.json", "plot_02_b_curves.png", "plot_01_a.json"):
        (results / name).write_text("{}")
    assert sphinx_ext.remove_deleted_examples(examples, gallery, results) == ["plot_02_b"]
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*plot_02_b*"))
    assert left == [], left
    assert (gallery / "plot_01_a.py").exists() and (results / "plot_01_a.json").exists()


def test_swap_naming_an_unknown_example_stops_the_build(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import pytest
    from sphinx.errors import ConfigError

    examples, gallery, results = layout(tmp_path, monkeypatch)
    config = SimpleNamespace(
        mpguide_results_dir=str(results),
        mpguide_reference_dir="",
        mpguide_gate=True,
        mpguide_examples_dir=str(examples),
        mpguide_gallery_dir=str(gallery),
    )
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "plot_01_porting:manual-bf16=x")  # misspelled example
    with pytest.raises(ConfigError, match=r"names example\(s\) \['plot_01_porting'\]"):
        sphinx_ext._on_builder_inited(SimpleNamespace(config=config))
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "no equals sign")
    with pytest.raises(ConfigError, match="example:run_id=recipe"):
        sphinx_ext._on_builder_inited(SimpleNamespace(config=config))
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "plot_01_a:run=recipe")
    sphinx_ext._on_builder_inited(SimpleNamespace(config=config))  # a known example passes
    monkeypatch.setenv("MPGUIDE_PRESET", "huge")
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        sphinx_ext._on_builder_inited(SimpleNamespace(config=config))
    monkeypatch.setenv("MPGUIDE_PRESET", "test")
    monkeypatch.setenv("MPGUIDE_DEVICE", "tpu")
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        sphinx_ext._on_builder_inited(SimpleNamespace(config=config))


def test_the_source_a_run_writes_is_what_the_build_compares(tmp_path, monkeypatch):
    """record_build.source_info and examples_to_rerun build the input fields in one place (records.source_inputs)."""
    from mpguide.verify.claims import declarations
    from mpguide.verify.records import build as record_build

    examples, gallery, results = layout(tmp_path, monkeypatch)
    decl = declarations.from_tables("plot_01_a", [("x", "r", "32-true")], [("expect", "x", "k", 1)])
    source = record_build.source_info("plot_01_a", decl, {}, "cpu")
    assert {k: source[k] for k in records.INPUT_FIELDS} == records.source_inputs(examples / "plot_01_a.py", {})
    assert source["declaration_sha256"] == decl.digest("cpu")
    for name in ("plot_01_a", "plot_02_b"):
        current_record(results, name)
    record = records.load_record(results / "plot_01_a.json")
    records.write_record(dict(record, source=source), results / "plot_01_a.json")
    assert sphinx_ext.examples_to_rerun(examples, results) == {}
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "plot_01_a:x=other")
    assert sphinx_ext.examples_to_rerun(examples, results) == {"plot_01_a": "run_env changed"}
    assert record_build.source_info("plot_01_a", decl, {"x": "other"}, "cpu")["run_env"]["swaps"] == {"x": "other"}


def test_the_extension_imports_without_torch():
    """The build's first step (and an unchanged rebuild) must not pay for importing torch or Lightning."""
    import subprocess
    import sys

    code = (
        "import sys, mpguide_build.sphinx_ext, mpguide.verify.gate, mpguide.verify.records\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning'))\n"
        "print(heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_an_example_that_does_not_parse_reruns_with_the_reason(tmp_path, monkeypatch):
    examples, gallery, results = layout(tmp_path, monkeypatch)
    current_record(results, "plot_01_a")
    current_record(results, "plot_02_b")
    (examples / "plot_02_b.py").write_text("def broken(:\n")
    reasons = sphinx_ext.examples_to_rerun(examples, results)
    assert list(reasons) == ["plot_02_b"]
    assert "plot_02_b.py: not valid Python (line 1" in reasons["plot_02_b"]


def test_pages_that_quote_the_matrix_depend_on_its_files():
    """An incremental build after a matrix refresh must read the releases page again (a reader's trial saw the
    previous matrix's "not re-run" rows on a page built before the refresh)."""
    from types import SimpleNamespace

    from mpguide_build import matrix_summary, sphinx_ext

    noted = []
    config = SimpleNamespace(mpguide_record_pages=[], mpguide_matrix_pages=["releases"])
    app = SimpleNamespace(config=config, env=SimpleNamespace(note_dependency=noted.append))
    sphinx_ext._on_source_read(app, "releases", [])
    assert noted and set(noted) == {str(p) for p in matrix_summary.MATRIX_DIR.glob("*.json")}
    noted.clear()
    sphinx_ext._on_source_read(app, "api", [])
    assert noted == []
