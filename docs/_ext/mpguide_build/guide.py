"""What the guide pages compute: the few measured numbers the guide quotes, each section's closing
"verified / Lightning releases" lines, and the check that every quoted message was captured.

Build-only: the Sphinx pages call it; no example does. The pages call one
function per cell, so that their hidden cells stay one line long and the computation lives here,
where it is tested (``tests/test_guide_page.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

#: Where each guide section's evidence is: section key -> (example, the claims its releases line
#: rests on, as ``(example, claim id)`` pairs of the version matrix).
#: What is different on a release where a section's claims do not hold (the applies-to line's reason; the
#: generic "the behaviour differs there" otherwise). Autocast cache: Lightning opens its autocast with
#: ``cache_enabled=True`` up to 2.5.4 (2.5.5 passes False) and again on its master branch (pull request
#: #21616), ``lightning/pytorch/plugins/precision/amp.py``.
DIFFERS: dict[str, str] = {
    "autocast_cache": "Lightning's own autocast keeps a cast cache there, so a forward after `opt.step()` "
    "inside `training_step` sees the weights from before the step",
}

SECTIONS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "porting": (
        "plot_01_porting_to_manual",
        [
            ("plot_01_porting_to_manual", "diverge(sched-bf16, auto-bf16)"),
            ("plot_01_porting_to_manual", "diverge(teacher-bf16, auto-bf16)"),
        ],
    ),
    "drift_20970": (
        "plot_17_issue_20970_bf16_drift",
        [("plot_17_issue_20970_bf16_drift", "match(reporter-bf16, towers-auto-bf16)")],
    ),
    "autocast_cache": (
        "plot_08_autocast_cache",
        [
            ("plot_08_autocast_cache", "expect(caching-bf16) [stale_after_step]"),
            ("plot_08_autocast_cache", "expect(lightning-bf16) [stale_after_step]"),
            ("plot_08_autocast_cache", "expect(nocache-bf16) [stale_after_step]"),
        ],
    ),
    "optimizer_math": (
        "plot_09_optimizer_under_autocast",
        [("plot_09_optimizer_under_autocast", "expect(manual-fp16) [identical_to_automatic]")],
    ),
    "backward_flags": ("plot_07_backward_and_flags", [("plot_07_backward_and_flags", "raises(fp16-loss-backward)")]),
    "accumulation": (
        "plot_06_accumulation",
        [
            ("plot_06_accumulation", "diverge(zero-grad, manual-fp32)"),
            ("plot_06_accumulation", "expect(overflow-fp16) [overflow_window_skipped]"),
        ],
    ),
    "clipping": (
        "plot_04_gradient_clipping",
        [
            ("plot_04_gradient_clipping", "diverge(sgd-fp16, sgd-fp32)"),
            ("plot_04_gradient_clipping", "match(sgd-fp16-hook, sgd-fp32)"),
        ],
    ),
    "no_gradient_step": (  # the section's footer cites #20116's own example (its figure is the section's)
        "plot_18_issue_20116_alternating_optimizers",
        [
            ("plot_02_two_optimizers", "raises(bug-fp16)"),
            ("plot_18_issue_20116_alternating_optimizers", "raises(unreached-fp16)"),
        ],
    ),
    "scale_changes": (
        "plot_03_shared_backward",
        [("plot_03_shared_backward", "expect(fp16-stock) [predicted_at_overflow]")],
    ),
    "schedulers": ("plot_05_skipped_steps", [("plot_05_skipped_steps", "warns(fp16-naive) [UserWarning]")]),
    "gradient_penalty": ("plot_10_gradient_penalty", [("plot_10_gradient_penalty", "match(scaled-fp16, naive-fp32)")]),
    "fp16_parameters": ("plot_11_fp16_parameters", [("plot_11_fp16_parameters", "raises(half-fp16)")]),
    "nonfinite_guard": (
        "plot_12_nonfinite_guard",
        [("plot_12_nonfinite_guard", "expect(habit-fp16) [updates_applied]")],
    ),
    "ddp": (
        "plot_13_ddp_accumulation",
        [("plot_13_ddp_accumulation", "expect(ddp-16-window-end) [skipped_batches_per_rank]")],
    ),
    "fabric": (
        "plot_14_fabric_manual_loop",
        [
            ("plot_14_fabric_manual_loop", "raises(unused-fp16-stock)"),
            ("plot_14_fabric_manual_loop", "expect(fp16-stock) [predicted_first_three]"),
        ],
    ),
    "throughput": ("plot_15_throughput", []),
}

#: Every message the guide quotes, and the run of this build that must have produced it:
#: ``(example, run id, exact text)``. The page fails to build when a run stops producing one.
QUOTED: list[tuple[str, str, str]] = [
    ("plot_02_two_optimizers", "bug-fp16", "No inf checks were recorded for this optimizer."),
    (
        "plot_04_gradient_clipping",
        "unscale-fp16",
        "unscale_() has already been called on this optimizer since the last update().",
    ),
    (
        "plot_04_gradient_clipping",
        "fused-bf16",
        "The current optimizer, AdamW, does not allow for gradient clipping because it performs unscaling of "
        "gradients internally.",
    ),
    ("plot_05_skipped_steps", "fp16-naive", "Detected call of `lr_scheduler.step()` before `optimizer.step()`."),
    ("plot_07_backward_and_flags", "fp16-loss-backward", "Attempted unscale_ but _scale is None."),
    (
        "plot_06_accumulation",
        "trainer-flag",
        "Automatic gradient accumulation is not supported for manual optimization.",
    ),
    (
        "plot_04_gradient_clipping",
        "trainer-flag",
        "Automatic gradient clipping is not supported for manual optimization.",
    ),
    ("plot_11_fp16_parameters", "half-fp16", "Attempting to unscale FP16 gradients."),
    ("plot_11_fp16_parameters", "half-bf16", "Unexpected floating ScalarType in at::autocast::prioritize"),
    ("plot_14_fabric_manual_loop", "manual-plugin-in-fabric", "'NoneType' object has no attribute 'trainer'"),
    ("plot_14_fabric_manual_loop", "unused-fp16-stock", "No inf checks were recorded for this optimizer"),
]
#: Quoted only where the build ran on a CPU (Lightning warns this on a CPU only).
QUOTED_ON_CPU = [
    (
        "plot_07_backward_and_flags",
        "flag-16-mixed",
        "AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'` instead.",
    )
]


def _records(names: Sequence[str]) -> dict[str, dict[str, Any]]:
    from mpguide.verify.records import load_record, record_path

    return {name: load_record(record_path(name)) for name in names}


def _run(record: dict[str, Any], run_id: str) -> dict[str, Any]:
    run = next((r for r in record["runs"] if r["id"] == run_id), None)
    if run is None:
        raise KeyError(
            f"{record['example']}: the guide reads run {run_id!r}, which the record does not have; "
            f"update docs/_ext/mpguide_build/guide.py (numbers) or the example"
        )
    return run


def check_quoted() -> None:
    """Fail the page when a message it quotes was not captured by this build (see :data:`QUOTED`).

    Raises:
        ValueError: from :func:`mpguide_build.pages.check_quoted_messages`, one line per missing message.
        mpguide.verify.records.RecordError: a record is missing.
    """
    from .pages import check_quoted_messages

    names = sorted({q[0] for q in QUOTED + QUOTED_ON_CPU})
    recs = _records(names)
    quoted = QUOTED + (QUOTED_ON_CPU if recs["plot_07_backward_and_flags"]["env"]["accelerator"] == "cpu" else [])
    check_quoted_messages(recs, quoted)


def numbers() -> dict[str, Any]:
    """The measured numbers the guide quotes, by glue key (this build's records; see the page).

    Raises:
        mpguide.verify.records.RecordError: a record is missing or unreadable.
        KeyError: a record lacks a run or value the guide reads (the message names them).
    """
    import torch

    from mpguide.verify.claims.declarations import example_names
    from mpguide.verify.claims.metrics import relative_gap
    from mpguide.verify.claims.verdicts import hardware_label

    from .pages import counted_checks, page_entries

    names = example_names()
    entries = {name: page_entries(name)[0] for name in names}
    recs = {name: e.record for name, e in entries.items()}

    def gap(name: str, a: str, b: str) -> float:  # largest smoothed gap, in percent
        return 100 * float(relative_gap(_run(recs[name], a)["loss"], _run(recs[name], b)["loss"]).max())

    def extra(name: str, run_id: str) -> dict[str, Any]:
        return _run(recs[name], run_id)["extra"]

    judged = [v for e in entries.values() for v in counted_checks(e.verdicts)[0]]
    port, drift = "plot_01_porting_to_manual", "plot_17_issue_20970_bf16_drift"
    tp = recs["plot_15_throughput"]

    def rate(run_id: str, variant: str) -> float:
        return statistics.median(extra("plot_15_throughput", run_id)[f"{variant}_round_steps_per_s"])

    def paired(run_id: str, a: str, b: str) -> float:
        e = extra("plot_15_throughput", run_id)
        return statistics.median(x / y for x, y in zip(e[f"{a}_round_steps_per_s"], e[f"{b}_round_steps_per_s"]))

    def column_gap(example: str, lightning: str, torch_pin: str | None, claim_id: str) -> float:
        """A match claim's measured gap (percent) in a committed matrix column.

        A measurement quoted as the cell last ran, not a verdict: it is quoted even when that cell is stale
        (:func:`mpguide_build.matrix_summary.cell_staleness`), where the releases page marks the cell
        "not re-run since <date>, <commit>"; the section's status line never shows a stale cell's verdict.
        """
        from . import matrix_summary

        columns = matrix_summary.load_matrix() + matrix_summary.load_torch_matrix()
        for summary in columns:
            if summary["lightning"] == lightning and summary.get("torch_pin") == torch_pin:
                for claim in summary["examples"].get(example, {}).get("claims", []):
                    if claim["id"] == claim_id and str(claim.get("observed", "")).startswith("max "):
                        return 100 * float(claim["observed"].split()[1])
        where = f"Lightning {lightning}" + (f", torch {torch_pin}" if torch_pin else "")
        raise KeyError(f"the version matrix has no measured {claim_id} of {example} ({where}): run nox -s matrix")

    scaler = torch.amp.GradScaler("cpu")
    sk = extra("plot_05_skipped_steps", "fp16-naive")
    ddp = recs["plot_13_ddp_accumulation"]
    every, window_end = _run(ddp, "ddp-fp32-every")["extra"], _run(ddp, "ddp-fp32-window-end")["extra"]
    guard = extra("plot_12_nonfinite_guard", "habit-fp16")
    return {
        "hw": hardware_label(recs[port]["env"]),
        "n_pass": sum(v.passed for v in judged),
        "n_checks": len(judged),
        "port_gap": max(gap(port, f"manual-{p}", f"auto-{p}") for p in ("fp32", "bf16", "fp16")),
        "bf16_gap": gap(port, "auto-bf16", "auto-fp32"),
        "rep_bf16_gap": gap(drift, "reporter-bf16", "reporter-fp32"),
        "rep_cache_gap": gap(drift, "cache2-bf16", "plain2-bf16"),
        "rep_seed_gap": gap(drift, "reporter-bf16-seed1", "reporter-bf16"),
        # Lightning 2.5.4's own autocast caches: two updates drift without any own autocast (torch 2.13)
        "old_cache_gap": column_gap(drift, "2.5.4", None, "match(plain2-bf16, plain2-fp32)"),
        # torch 2.10 with Lightning 2.5.4: the predictor shared by the no_grad teacher loses its gradient
        "old_torch_shared_gap": column_gap(port, "2.5.4", "2.10.0", "match(auto-bf16, auto-fp32)"),
        "fp16_gap": gap(port, "auto-fp16", "auto-fp32"),
        "sched_final": _run(recs[port], "sched-fp32")["loss"][-1],
        "teacher_final": _run(recs[port], "teacher-fp32")["loss"][-1],
        "auto_final": _run(recs[port], "auto-fp32")["loss"][-1],
        "init_scale": _run(recs["plot_05_skipped_steps"], "fp16-naive")["loss_scale"][0],
        "backoff": scaler.get_backoff_factor(),
        "growth": scaler.get_growth_factor(),
        "growth_interval": scaler.get_growth_interval(),
        "muon_drift": max(extra("plot_09_optimizer_under_autocast", "manual-fp16")["max_abs_diff_vs_automatic"]),
        "clip_update_fp16": extra("plot_04_gradient_clipping", "sgd-fp16")["update_norm"][0],
        "clip_update_fp32": extra("plot_04_gradient_clipping", "sgd-fp32")["update_norm"][0],
        "gan_hook_calls": extra("plot_04_gradient_clipping", "gan-trap-fp16")["hook_calls"],
        "gan_wrapper_true": extra("plot_04_gradient_clipping", "gan-trap-fp16")["wrapper_comparison_true"],
        "overflow_factor": extra("plot_03_shared_backward", "fp16-stock")["head_update_factor"][0],
        "skipped": sk["skipped_steps"],
        "skip_batches": sk["batches"],
        "naive_first_lr": sk["first_applied_lr"],
        "aware_first_lr": extra("plot_05_skipped_steps", "fp16-skip-aware")["first_applied_lr"],
        "gp_naive_fp16_gap": gap("plot_10_gradient_penalty", "naive-fp16", "naive-fp32"),
        "gp_scaled_fp16_gap": gap("plot_10_gradient_penalty", "scaled-fp16", "naive-fp32"),
        "guard_applied": guard["updates_applied"],
        "guard_batches": guard["batches"],
        "ddp_saved_pct": 100 * (1 - window_end["allreduce_bytes"] / every["allreduce_bytes"]),
        "fab_stock": ", ".join(
            f"{f:.3g}" for f in extra("plot_14_fabric_manual_loop", "fp16-stock")["head_update_factor"][:3]
        ),
        "tp_bf16_ratio": paired("bench-bf16", "manual", "automatic"),
        "tp_fp32_ratio": paired("bench-fp32", "manual", "automatic"),
        "tp_bf16_step_ms": 1000 / rate("bench-bf16", "manual"),
        "tp_hw": hardware_label(tp["env"]),
    }


def _example_number(example: str) -> str:
    return example.split("_")[1]


def footer(section: str, prefix: str = "../") -> str:
    """The two closing lines of a guide section, as MyST Markdown with HTML links:

    * **Verified**: how many of the section's example's checks hold in this build, linking to the
      example's verdicts;
    * **Lightning releases**: ``mpguide_build.matrix_page.applies_sentence`` of the section's claims,
      linking to the releases page.

    Args:
        section: a key of :data:`SECTIONS`.
        prefix: from the page to the site root (``"../"`` for ``model/manual_optimization``).

    Raises:
        KeyError: unknown section (the message lists the known ones).
        mpguide.verify.records.RecordError: the example's record is missing.
        mpguide_build.matrix_summary.MatrixError: a claim of the section is missing from the matrix.
    """
    from . import matrix_page, matrix_summary
    from .pages import counted_checks, page_entries

    if section not in SECTIONS:
        raise KeyError(f"unknown guide section {section!r}; known: {sorted(SECTIONS)}")
    example, claims = SECTIONS[section]
    entry = page_entries(example)[0]
    judged, not_applicable = counted_checks(entry.verdicts)
    held = sum(v.passed for v in judged)
    word = "hold" if held == len(judged) else "hold; the build reports the others as failures"
    if not_applicable:
        word += f" ({not_applicable} not applicable on this release)"
    lines = [
        f"**Verified** in this build: {held} of {len(judged)} checks of "
        f'<a href="{prefix}auto_examples/{example}.html#evidence-the-verdicts">'
        f"example {_example_number(example)}</a> {word}."
    ]
    if claims:
        differs = {"differs": DIFFERS[section]} if section in DIFFERS else {}
        lines.append(
            f'**<a href="{prefix}releases.html">Lightning releases</a>**: '
            f"{matrix_page.applies_sentence(matrix_summary.load_matrix(), claims, **differs)}"
        )
    return "  \n".join(lines)  # a hard line break between the two lines


# ------------------------------------------------------------------------- the evidence pages


def _example_link(example: str, prefix: str) -> str:
    return f'<a href="{prefix}auto_examples/{example}.html">{example}</a>'


def verification_summary(prefix: str = "") -> str:
    """Markdown table of this build, one row per example: checks that hold, runs, where and when it ran."""
    from mpguide.verify.claims.declarations import example_names
    from mpguide.verify.claims.verdicts import hardware_label

    from .pages import counted_checks, markdown_table, page_entries

    rows = []
    for name in example_names():
        entry = page_entries(name)[0]
        judged, not_applicable = counted_checks(entry.verdicts)
        rows.append(
            {
                "example": _example_link(name, prefix),
                "checks that hold": f"{sum(v.passed for v in judged)} of {len(judged)}"
                + (f" ({not_applicable} not applicable)" if not_applicable else ""),
                "training runs": str(len(entry.record["runs"])),
                "ran on": hardware_label(entry.record["env"]),
                "date": entry.record["created"][:10],
            }
        )
    return markdown_table(rows, ("example", "checks that hold", "training runs", "ran on", "date"))


def verdict_tables(entries: Sequence[Any], prefix: str = "", tolerance_href: str = "") -> str:
    """Worded verdict tables (``mpguide.verify.show.report.WORD_COLUMNS``), one per results file of ``entries``
    (:class:`mpguide_build.pages.PageRecord`), each headed by its example and where it ran."""
    from mpguide.verify.show.report import WORD_COLUMNS, count_line, verdict_rows

    from .pages import markdown_table

    out = []
    for entry in entries:
        name = entry.record["example"]
        from mpguide.verify.claims.verdicts import hardware_label

        where = "this build" if entry.source == "this build" else "reference run"
        note = (
            " *Made before its example last changed: only the checks it already held, on unchanged runs, are judged.*"
            if entry.stale
            else ""
        )
        ran = f"{hardware_label(entry.record['env'])}, {entry.record['created'][:10]}"
        out.append(
            f"**{_example_link(name, prefix)}** ({where}, {ran}): "
            f"{count_line(entry.verdicts)}.{note}\n\n"
            + markdown_table(verdict_rows(entry.verdicts, tolerance_href=tolerance_href), WORD_COLUMNS)
        )
    return "\n\n".join(out)


def build_verdict_tables(prefix: str = "") -> str:
    """:func:`verdict_tables` of this build's results, every example."""
    from mpguide.verify.claims.declarations import example_names

    from .pages import page_entries

    return verdict_tables([page_entries(name)[0] for name in example_names()], prefix)


def reference_entries() -> list[Any]:
    """The committed GPU reference results of every example, judged as the build judges them."""
    from mpguide.verify.claims.declarations import example_names

    from .pages import page_entries

    return [e for name in example_names() for e in page_entries(name)[1:]]


def gpu_overview() -> str:
    """One plain paragraph for the top of the GPU page: which examples have a committed GPU record, on
    which device, when it was made and whether its example changed since, and which have none."""
    from mpguide.verify.claims.declarations import example_names

    from .pages import page_entries

    with_record, without = [], []
    for name in example_names():
        refs = page_entries(name)[1:]
        number = _example_number(name)
        if not refs:
            without.append(number)
            continue
        for ref in refs:
            made = ref.record.get("created", "")[:10]
            age = "older than its example" if ref.stale else "made from the current example"
            with_record.append(f"{number} ({ref.record['env'].get('device', '?')}, {made}, {age})")
    if not with_record:
        return "No example has a GPU record: everything on this site ran on a CPU."
    stale = sum("older than" in s for s in with_record)
    return (
        f"{len(with_record)} of {len(with_record) + len(without)} examples have a committed GPU record: "
        + "; ".join(with_record)
        + f". {stale} of them are older than their example, so they are judged only on the checks they "
        f"already held. Examples {', '.join(without)} have no GPU record: they ran on a CPU only, and "
        "nothing on this site says they were verified on a GPU."
    )


def tolerance_table() -> str:
    """Markdown table of every tolerance: its name (the anchor ``tol-<name>`` that verdict rows link
    to), the bound, its value and the measurements behind it (``mpguide.verify.claims.tolerances.TOLERANCES``)."""
    from mpguide.verify.claims.tolerances import TOLERANCES
    from mpguide.verify.show.report import TOLERANCE_ANCHOR

    from .pages import markdown_table

    rows = [
        {
            "tolerance": f'<span id="{TOLERANCE_ANCHOR.format(t.name)}">{t.name}</span>',
            "requires": ("at most " if t.bound == "max" else "at least ")
            + (f"{t.value:g}x" if t.name.endswith("speedup") else f"{100 * t.value:g} %"),
            "why this value": t.reason,
        }
        for t in TOLERANCES.values()
    ]
    return markdown_table(rows, ("tolerance", "requires", "why this value"))


def warmup_numbers() -> dict[str, Any]:
    """The warm-up of the porting example's curves: steps skipped by the curve checks, and the largest
    gaps inside them (bf16-mixed and 16-mixed against fp32, in percent)."""
    from mpguide.verify.claims.metrics import warmup_gap, warmup_steps
    from mpguide.verify.records import load_record, record_path

    rec = load_record(record_path("plot_01_porting_to_manual"))
    fp32 = _run(rec, "auto-fp32")["loss"]
    return {
        "warmup_n": warmup_steps(len(fp32)),
        "steps": len(fp32),
        "warmup_bf16": 100 * warmup_gap(_run(rec, "auto-bf16")["loss"], fp32),
        "warmup_fp16": 100 * warmup_gap(_run(rec, "auto-fp16")["loss"], fp32),
    }
