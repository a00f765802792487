import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from mpguide.verify import hardware
from mpguide.verify.hardware import ConfigurationError
from mpguide.verify.run import runner


def test_unknown_precision_is_rejected():
    with pytest.raises(ConfigurationError, match=r"unknown precision 'bf16'.*'32-true', 'bf16-mixed', '16-mixed'"):
        hardware.trainer_precision_kwargs("bf16", "cpu")


def test_cpu_16_mixed_goes_through_an_explicit_plugin_with_a_real_scaler():
    kwargs = hardware.trainer_precision_kwargs("16-mixed", "cpu")
    (plugin,) = kwargs["plugins"]
    assert isinstance(plugin, MixedPrecision) and plugin.precision == "16-mixed"
    assert plugin.scaler is not None and plugin.device == "cpu"


def test_plain_flags_elsewhere():
    assert hardware.trainer_precision_kwargs("32-true", "cpu") == {"precision": "32-true"}
    assert hardware.trainer_precision_kwargs("bf16-mixed", "cpu") == {"precision": "bf16-mixed"}
    assert hardware.trainer_precision_kwargs("16-mixed", "cuda") == {"precision": "16-mixed"}


def test_plugin_class_override():
    class Mine(MixedPrecision):
        pass

    (plugin,) = hardware.trainer_precision_kwargs("bf16-mixed", "cpu", Mine)["plugins"]
    assert type(plugin) is Mine


def test_env_selection(monkeypatch):
    monkeypatch.setenv("MPGUIDE_PRESET", "huge")
    with pytest.raises(ConfigurationError, match="unknown preset 'huge'"):
        hardware.select_preset()
    monkeypatch.setenv("MPGUIDE_DEVICE", "tpu")
    with pytest.raises(ConfigurationError, match="unknown device 'tpu'"):
        hardware.select_accelerator()
    monkeypatch.setenv("MPGUIDE_DEVICE", "cpu")
    assert hardware.select_accelerator() == "cpu"


def test_parse_swaps():
    assert runner.parse_swaps("ex:a=b, ex2 : c = d") == {("ex", "a"): "b", ("ex2", "c"): "d"}
    assert runner.parse_swaps("") == {}
    for bad in ("justaname", "a=b", "ex:=b", ":a=b"):
        with pytest.raises(ValueError, match="example:run_id=recipe"):
            runner.parse_swaps(bad)


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H200", "nvidia-h200"),
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
        ("  Tesla V100-SXM2-16GB ", "tesla-v100-sxm2-16gb"),
        ("NVIDIA GeForce RTX 4090 (Laptop)", "nvidia-geforce-rtx-4090-laptop"),
    ],
)
def test_device_slug(name, slug):
    assert hardware.device_slug(name) == slug


def test_device_slug_refuses_an_empty_result_and_a_missing_gpu(monkeypatch):
    with pytest.raises(ConfigurationError, match="no letter or digit"):
        hardware.device_slug(" -- ")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigurationError, match="needs a CUDA device"):
        hardware.device_slug()


def test_true_half_precisions_are_run_precisions_passed_as_the_flag():
    from mpguide.verify.claims import declarations

    for precision in hardware.TRUE_PRECISIONS:
        assert hardware.trainer_precision_kwargs(precision, "cpu") == {"precision": precision}
        assert precision in declarations.PRECISIONS
        with pytest.raises(hardware.ConfigurationError, match=f"unknown precision '{precision}'"):
            hardware.check_precision(precision)  # not for the throughput benchmark or Fabric runs
    assert hardware.check_precision("bf16-true", hardware.RUN_PRECISIONS) == "bf16-true"
    with pytest.raises(hardware.ConfigurationError, match="unknown precision 'bf16'"):
        hardware.trainer_precision_kwargs("bf16", "cpu")
