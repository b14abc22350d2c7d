"""``1e-3`` is a number everywhere a value is read: config files, overrides, sweep spaces, and the sweep plot
(PyYAML's YAML 1.1 resolver alone would leave it the string ``'1e-3'``)."""

from __future__ import annotations

import pytest

from elastic_train.config import load, load_yaml, parse_overrides
from elastic_train.sweep.results import TrialRow, sweep_figure


@pytest.mark.parametrize("text, value", [
    ("1e-3", 1e-3), ("3e-4", 3e-4), ("3E4", 3e4), ("-2e+5", -2e5), ("1.0e-3", 1e-3), ("5", 5), ("0.5", 0.5),
    ("[1e-4, 1e-3]", [1e-4, 1e-3]),
])
def test_exponents_without_a_dot_are_floats(text, value):
    parsed = load_yaml(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("text", ["1e", "e3", "1e-3.5", "abc", "2026-12-01x"])
def test_other_words_stay_strings(text):
    assert isinstance(load_yaml(text), str)


def test_overrides():
    assert parse_overrides(["train.lr=1e-3", "train.weight_decay=3e-4"]) == {"train.lr": 1e-3,
                                                                            "train.weight_decay": 3e-4}
    cfg = load(None, ["train.lr=1e-3", "sweep.space.train.lr={type: loguniform, low: 1e-5, high: 1e-2}"])
    assert cfg.train.lr == 1e-3 and cfg.sweep.space["train.lr"].low == 1e-5


def test_files_and_sweep_spaces(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("train:\n  lr: 3e-4\n  weight_decay: 1e-2\nsweep:\n  space:\n"
                 "    train.lr: {type: choice, values: [1e-4, 1e-3, 1e-2]}\n"
                 "    train.weight_decay: {type: grid, values: [0, 1e-5]}\n"
                 "    train.min_lr_ratio: {type: loguniform, low: 1e-3, high: 1e-1}\n")
    cfg = load(f)
    assert cfg.train.lr == 3e-4 and cfg.train.weight_decay == 1e-2
    space = cfg.sweep.space
    assert space["train.lr"].values == [1e-4, 1e-3, 1e-2]
    assert all(isinstance(v, float) for v in space["train.lr"].values)
    assert space["train.weight_decay"].values == [0, 1e-5] and isinstance(space["train.weight_decay"].values[1], float)
    assert (space["train.min_lr_ratio"].low, space["train.min_lr_ratio"].high) == (1e-3, 1e-1)


@pytest.mark.parametrize("stored_as_text", [False, True])
def test_sweep_plot_puts_every_trial_on_a_numeric_log_axis(tmp_path, stored_as_text):
    """Log-spaced lr values from a choice space: every trial is a point at its lr on a log-scaled axis (also for
    values a run stored as text before they parsed as numbers)."""
    import matplotlib.pyplot as plt

    f = tmp_path / "s.yaml"
    f.write_text("sweep:\n  space:\n    train.lr: {type: choice, values: [1e-4, 1e-3, 1e-2, 1e-1]}\n")
    cfg = load(f)
    lrs = cfg.sweep.space["train.lr"].values
    rows = [TrialRow(f"t{i}", f"trial-t{i}", {"train.lr": f"{lr:g}" if stored_as_text else lr,
                                             "train.global_batch_size": 64 if i % 2 else 128},
                     "FINISHED", 1.0 / (i + 1), 2, [(1, 2.0), (2, 1.0 / (i + 1))]) for i, lr in enumerate(lrs)]
    fig = sweep_figure(rows, cfg)
    try:
        left = fig.axes[0]
        assert left.get_xscale() == "log"
        xs = sorted(float(x) for c in left.collections for x, _ in c.get_offsets())
        assert xs == pytest.approx(sorted(lrs))  # all four trials, at their numeric lr
        lo, hi = left.get_xlim()
        assert lo < min(lrs) and hi > max(lrs)
    finally:
        plt.close(fig)
