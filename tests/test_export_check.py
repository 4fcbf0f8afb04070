"""The export check's bound (util_scripts/export.py), without a trained model:
float32 rounding grows with the logits, so the bound does too."""
from types import SimpleNamespace

import pytest
import torch

from util_scripts.export import allowed_difference, max_difference


def test_the_bound_is_atol_plus_rtol_times_the_largest_logit():
    assert allowed_difference(0.0) == pytest.approx(1e-4)
    assert allowed_difference(5.0) == pytest.approx(1.1e-4)  # a trained network's logits
    # an untrained network's logits in the hundreds: ONNX rounding reached 1.07e-4 there
    assert allowed_difference(250.0) == pytest.approx(6e-4)
    assert allowed_difference(250.0, atol=1e-4, rtol=0) == pytest.approx(1e-4)


def test_max_difference_reports_the_difference_and_the_largest_logit():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 2 * 4 * 4, 5))
    torch.nn.init.constant_(model[1].bias, 300.0)

    def exported(x):
        return model(x) + 2e-4

    options = SimpleNamespace(input_type='rgb', sample_duration=2, sample_size=4)
    difference, largest = max_difference(model, exported, options)
    assert difference == pytest.approx(2e-4, abs=3.1e-5)  # float32's step at 300: 3.05e-5
    assert largest > 299.0
    assert difference <= allowed_difference(largest)  # passes relative to logits of 300
    assert not difference <= allowed_difference(largest, rtol=0)  # not with the absolute bound
