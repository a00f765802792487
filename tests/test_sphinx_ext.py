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
