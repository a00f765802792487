"""The build-time line: examples' seconds from sphinx-gallery's JUnit XML, pages' from MyST-NB."""

import pytest

from mpguide_build import buildtime

JUNIT = (
    '<?xml version="1.0" encoding="utf-8"?><testsuite errors="0" failures="0" name="sphinx-gallery" skipped="0" '
    'tests="2" time="30.5"><testcase classname="plot_01_porting_to_manual" file="plot_01_porting_to_manual.py" '
    'line="1" name="Porting" time="18.25"></testcase><testcase classname="plot_03_shared_backward" '
    'file="plot_03_shared_backward.py" line="1" name="Shared" time="12.25"></testcase></testsuite>'
)


def test_example_times_reads_each_testcase(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    assert buildtime.example_times(path) == [("plot_01_porting_to_manual", 18.25), ("plot_03_shared_backward", 12.25)]


@pytest.mark.parametrize("text", ["<testsuite><testcase classname='x' time='soon'/></testsuite>", "not xml", ""])
def test_a_malformed_junit_file_is_named_with_the_fix(tmp_path, text):
    path = tmp_path / "junit.xml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"junit\.xml: not sphinx-gallery's JUnit XML .*rebuild with a clean tree"):
        buildtime.example_times(path)


def test_page_times_count_only_pages_executed_in_this_build():
    nb_data = {
        "index": {"exec_data": {"method": "force", "runtime": 4.5, "succeeded": True}},
        "releases": {"exec_data": {"method": "cache", "runtime": 9.0, "succeeded": True}},  # not this build's work
        "api": {},  # not a notebook page
        "verification": {"exec_data": {"method": "force", "runtime": 2.0}},
    }
    assert buildtime.page_times(nb_data) == [("index", 4.5), ("verification", 2.0)]


def test_ratio_and_line():
    t = buildtime.BuildTime(wall_s=60.0, examples_s=100.0, examples=16, pages_s=20.0, pages=5, cores=2)
    assert t.ratio == pytest.approx(0.5)
    assert "wall / (examples + pages) = 0.50 on 2 core(s) (perfect overlap: 0.50)" in t.line()
    serial = buildtime.BuildTime(wall_s=125.0, examples_s=100.0, examples=16, pages_s=20.0, pages=5, cores=2)
    assert "= 1.04 on 2" in serial.line()  # nothing overlapped: the line says so, it does not hide it
    cached = buildtime.BuildTime(wall_s=4.0, examples_s=0.0, examples=0, pages_s=0.0, pages=0, cores=2)
    assert cached.ratio is None and "nothing executed, so no overlap ratio" in cached.line()


def test_phases_count_from_the_previous_mark_and_print_in_order():
    marks = {"gallery": 110.0, "reading": 130.5, "writing": 140.0, "finishing": 141.0}
    assert buildtime.phase_seconds(marks, started=10.0) == {
        "gallery": 100.0,
        "reading": 20.5,
        "writing": 9.5,
        "finishing": 1.0,
    }
    t = buildtime.BuildTime(60.0, 100.0, 16, 20.0, 5, 2, phases=buildtime.phase_seconds(marks, 10.0))
    assert t.line().endswith("phases: gallery 100.0 s, reading 20.5 s, writing 9.5 s, finishing 1.0 s")


def test_a_missing_phase_is_left_out_and_the_next_counts_from_the_last_mark():
    assert buildtime.phase_seconds({"gallery": 5.0, "writing": 9.0}, started=1.0) == {"gallery": 4.0, "writing": 4.0}


def test_an_unknown_phase_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown build phase 'compile'; one of gallery, reading, writing, finishing"):
        buildtime.mark("compile")


def test_a_page_this_build_did_not_read_keeps_old_execution_data_and_does_not_count():
    nb_data = {"index": {"exec_data": {"method": "force", "runtime": 4.5}}, "releases": {"exec_data": {"runtime": 3.0}}}
    assert buildtime.page_times(nb_data, read={"releases", "api"}) == [("releases", 3.0)]
    assert buildtime.page_times(nb_data, read=set()) == []


def test_a_second_build_in_one_process_counts_only_the_pages_it_reads():
    nb_data = {"index": {"exec_data": {"runtime": 4.5}}, "releases": {"exec_data": {"runtime": 3.0}}}
    buildtime.reading(["index", "releases"])
    buildtime.reading(["releases"])
    assert buildtime.page_times(nb_data, buildtime._READ) == [("releases", 3.0)]
