"""BatchPlan arithmetic and the data order: disjoint, complete, independent of the world size."""

from __future__ import annotations

import pytest
import torch

from elastic_train.config import load
from elastic_train.data import build_data
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.data.sampler import ElasticSampler, epoch_permutation, steps_per_epoch


@pytest.mark.parametrize(
    "g, w, cap",
    [(128, 1, None), (128, 2, None), (128, 3, None), (128, 3, 16), (10, 4, 1), (7, 7, None), (256, 5, 32)],
)
def test_plan_slices_cover_the_global_batch_exactly_once(g, w, cap):
    plan = BatchPlan(g, w, cap)
    covered = []
    for r in range(w):
        micro = plan.micro_slices(r)
        assert len(micro) == plan.accum_steps  # same number of backward passes on every worker
        assert micro[-1][1] > micro[-1][0]  # the gradient-syncing micro-batch is never empty
        for a, b in micro:
            assert b - a <= plan.micro_batch_size
            covered.extend(range(a, b))
    assert covered == list(range(g))
    sizes = [plan.local_batch_size(r) for r in range(w)]
    assert max(sizes) - min(sizes) <= 1
    assert plan.even == (g % w == 0)


def test_loss_scale_makes_the_gradient_a_global_mean():
    # sum over workers of (local sum * W/G), then DDP's mean over W  ==  global sum / G
    g, w = 10, 3
    plan = BatchPlan(g, w)
    per_sample = torch.arange(g, dtype=torch.float64)
    ddp_mean = sum(per_sample[a:b].sum() * plan.loss_scale for a, b in (plan.slice_bounds(r) for r in range(w))) / w
    assert ddp_mean.item() == pytest.approx(per_sample.mean().item())


def test_plan_refuses_more_workers_than_samples():
    with pytest.raises(ValueError, match="smaller than the world size"):
        BatchPlan(2, 4)


def test_epoch_permutation_is_a_pure_function_of_seed_and_epoch():
    assert torch.equal(epoch_permutation(3, 5, 100), epoch_permutation(3, 5, 100))
    assert not torch.equal(epoch_permutation(3, 5, 100), epoch_permutation(3, 6, 100))
    assert not torch.equal(epoch_permutation(3, 5, 100), epoch_permutation(4, 5, 100))


@pytest.mark.parametrize("w", [1, 2, 3])
def test_sampler_epoch_is_disjoint_and_complete_for_any_world_size(w):
    n, g = 103, 20
    plan = BatchPlan(g, w, micro_batch_cap=4)
    per_step: dict[int, list[int]] = {}
    for r in range(w):
        for step, micro in ElasticSampler(n, plan, r, seed=7).steps_from(epoch=2, start_step=0):
            per_step.setdefault(step, []).extend(torch.cat(micro).tolist())
    assert len(per_step) == steps_per_epoch(n, g) == 5
    seen = [i for ids in per_step.values() for i in ids]
    assert len(seen) == len(set(seen)) == 5 * g  # no repeats; only the ragged tail (3) is dropped
    # world-size independent: step s is always the same global batch
    perm = epoch_permutation(7, 2, n)
    for s, ids in per_step.items():
        assert sorted(ids) == sorted(perm[s * g : (s + 1) * g].tolist())


def test_resume_mid_epoch_continues_at_the_exact_global_batch():
    n, g = 50, 10
    full = [torch.cat(m).tolist() for _, m in ElasticSampler(n, BatchPlan(g, 2), 0, 1).steps_from(0, 0)]
    resumed = [torch.cat(m).tolist() for _, m in ElasticSampler(n, BatchPlan(g, 2), 0, 1).steps_from(0, 3)]
    assert resumed == full[3:]


def test_worker_data_serves_slices_and_val_shards_cover_val_once():
    cfg = load(None, ["train.global_batch_size=64"])
    bundle = build_data(cfg)
    val_seen = 0
    for r in range(3):
        data = WorkerData(bundle, BatchPlan(64, 3, 8), r, 0, torch.device("cpu"), loader_workers=0)
        step, micro = next(data.epoch(0))
        assert step == 0 and len(micro) == 3 and all(x.shape[1:] == (1, 8, 8) for x, _ in micro)
        val_seen += sum(len(y) for _, y in data.val_batches(50))
    assert val_seen == len(bundle.val)


def test_map_style_datasets_go_through_a_dataloader_in_the_same_order():
    from torch.utils.data import TensorDataset

    from elastic_train.data import DataBundle, DataSpec, TensorSet

    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    spec = DataSpec("classification", (3,), 2)
    tensor_bundle = DataBundle(TensorSet(x, y), TensorSet(x[:8], y[:8]), spec)
    map_bundle = DataBundle(TensorDataset(x, y), TensorDataset(x[:8], y[:8]), spec)
    plan = BatchPlan(8, 2, 2)
    a = WorkerData(tensor_bundle, plan, 1, 5, torch.device("cpu"), loader_workers=0)
    b = WorkerData(map_bundle, plan, 1, 5, torch.device("cpu"), loader_workers=2)
    for (sa, ma), (sb, mb) in zip(a.epoch(1, 2), b.epoch(1, 2), strict=True):
        assert sa == sb
        for (xa, ya), (xb, yb) in zip(ma, mb, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_user_import_paths_are_validated():
    from elastic_train.config import ConfigError

    for name, fragment in [("no_such_module:f", "cannot import"), ("math:nope", "no callable"),
                           ("math:pi", "no callable"),
                           ("tests.helpers.user_code:not_a_dataset", "must return")]:
        with pytest.raises(ConfigError, match=fragment) as info:
            build_data(load(None, [f"data.name={name}"]))
        assert info.value.field == "data.name"
    bundle = build_data(load(None, ["data.name=tests.helpers.user_code:blobs", "train.global_batch_size=16"]))
    assert len(bundle.train) > 0 and bundle.spec.num_classes == 3


def test_digits_read_without_scikit_learn_are_exactly_load_digits():
    """The built-in digits come from the CSV scikit-learn ships, read without importing sklearn.datasets."""
    import numpy as np
    from sklearn.datasets import load_digits

    from elastic_train.data.registry import digits_arrays

    images, target = digits_arrays()
    d = load_digits()
    assert images.dtype == d.images.dtype and target.dtype == d.target.dtype
    assert np.array_equal(images, d.images) and np.array_equal(target, d.target)


@pytest.mark.subprocess
def test_building_digits_imports_no_scikit_learn():
    import subprocess
    import sys

    code = ("import sys; from elastic_train.config import load; from elastic_train.data import build_data; "
            "b = build_data(load(None, [])); print(len(b.train) + len(b.val), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1797", "False"], out.stdout
