"""Shared by the checkpoint and model-selection tests: weights compared with numpy."""

import numpy as np


def assert_weights(model, expected):
    """`model.weights` equal `expected` (float32 arrays in that order)."""
    assert len(model.weights) == len(expected)
    for var, value in zip(model.weights, expected):
        np.testing.assert_allclose(var.numpy(), value, rtol=1e-6, atol=1e-7, err_msg=var.path)


def mean_weights(arrays_by_step, steps):
    """The float64 mean over `steps` of each weight in {step: [arrays]}."""
    return [np.mean([arrays_by_step[s][i].astype(np.float64) for s in steps], axis=0)
            for i in range(len(arrays_by_step[steps[0]]))]
