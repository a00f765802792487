from mpguide import sphinx_ext


def layout(tmp_path):
    examples, gallery, results = tmp_path / "examples", tmp_path / "gallery", tmp_path / "results"
    for d in (examples, gallery, results):
        d.mkdir()
    for name in ("plot_01_a", "plot_02_b"):
        (examples / f"{name}.py").write_text("")
        (gallery / f"{name}.py.md5").write_text("x")
    (examples / "helper.py").write_text("")
    return examples, gallery, results


def test_first_build_reruns_everything(tmp_path):
    examples, gallery, results = layout(tmp_path)
    assert sphinx_ext.invalidate_stale_examples(examples, gallery, results) == ["plot_01_a", "plot_02_b"]
    assert not list(gallery.glob("*.md5"))


def test_unchanged_build_reruns_nothing_but_missing_records_rerun(tmp_path):
    examples, gallery, results = layout(tmp_path)
    sphinx_ext.invalidate_stale_examples(examples, gallery, results)
    for name in ("plot_01_a", "plot_02_b"):
        (gallery / f"{name}.py.md5").write_text("x")
    (results / "plot_01_a.json").write_text("{}")
    assert sphinx_ext.invalidate_stale_examples(examples, gallery, results) == ["plot_02_b"]
    assert (gallery / "plot_01_a.py.md5").exists()


def test_changed_library_or_preset_reruns_everything(tmp_path, monkeypatch):
    examples, gallery, results = layout(tmp_path)
    for name in ("plot_01_a", "plot_02_b"):
        (results / f"{name}.json").write_text("{}")
    sphinx_ext.invalidate_stale_examples(examples, gallery, results)
    (gallery / "plot_01_a.py.md5").write_text("x")
    assert sphinx_ext.invalidate_stale_examples(examples, gallery, results) == []
    monkeypatch.setenv("MPGUIDE_PRESET", "full")
    assert sphinx_ext.invalidate_stale_examples(examples, gallery, results) == ["plot_01_a", "plot_02_b"]
    monkeypatch.delenv("MPGUIDE_PRESET")
    (results / sphinx_ext.STAMP).write_text("an older library\n")
    assert sphinx_ext.invalidate_stale_examples(examples, gallery, results) == ["plot_01_a", "plot_02_b"]


def test_deleted_example_leftovers_are_removed(tmp_path):
    examples, gallery, results = layout(tmp_path)
    (examples / "plot_02_b.py").unlink()
    (gallery / "images" / "thumb").mkdir(parents=True)
    for name in ("plot_02_b.py", "plot_02_b.ipynb", "plot_02_b.rst", "images/sphx_glr_plot_02_b_001.png",
                 "images/thumb/sphx_glr_plot_02_b_thumb.png", "plot_01_a.py", "images/sphx_glr_plot_01_a_001.png"):
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
    from sphinx.errors import ExtensionError

    examples, gallery, results = layout(tmp_path)
    config = SimpleNamespace(mpguide_results_dir=str(results), mpguide_reference_dir="", mpguide_gate=True,
                             mpguide_examples_dir=str(examples), mpguide_gallery_dir=str(gallery))
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "plot_01_porting:manual-bf16=x")  # misspelled example
    with pytest.raises(ExtensionError, match=r"names example\(s\) \['plot_01_porting'\]"):
        sphinx_ext._on_builder_inited(SimpleNamespace(config=config))
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "no equals sign")
    with pytest.raises(ExtensionError, match="example:run_id=recipe"):
        sphinx_ext._on_builder_inited(SimpleNamespace(config=config))
    monkeypatch.setenv("MPGUIDE_SWAP_RECIPE", "plot_01_a:run=recipe")
    sphinx_ext._on_builder_inited(SimpleNamespace(config=config))  # a known example passes
