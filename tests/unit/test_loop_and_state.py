"""The plain-PyTorch step, checkpoints through state_dict, and goodput accounting (no Ray)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from elastic_train.config import load
from elastic_train.data import build_data
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.models import build_model
from elastic_train.train.goodput import GoodputBook
from elastic_train.train.loop import (
    Precision,
    evaluate,
    lr_factor,
    make_optimizer,
    make_scheduler,
    train_step,
)
from elastic_train.train.state import (
    Goodput,
    IncompleteCheckpoint,
    RunRecord,
    TrainState,
    load_model,
    params_sha256,
    read_meta,
    schedule_entry,
)

CPU = torch.device("cpu")


def _setup(*overrides: str, cap: int | None = None):
    cfg = load(None, ["model.hidden_sizes=[32]", "train.global_batch_size=64", *overrides])
    bundle = build_data(cfg)
    model = build_model(cfg, bundle.spec)
    opt = make_optimizer(model, cfg.train)
    sched = make_scheduler(opt, cfg.train, 100)
    data = WorkerData(bundle, BatchPlan(64, 1, cap), 0, cfg.seed, CPU, loader_workers=0)
    return cfg, bundle, model, opt, sched, data


def test_loss_falls_on_digits():
    cfg, bundle, model, opt, sched, data = _setup("train.lr=0.01")
    prec = Precision.create("fp32", CPU)
    losses = []
    for epoch in range(3):
        for _, micro in data.epoch(epoch):
            r = train_step(model, micro, opt, sched, prec, 1 / 64, cfg.train.grad_clip)
            losses.append(r.loss_sum.item() / r.samples)
    assert losses[-1] < 0.5 * losses[0]
    totals = evaluate(model, data.val_batches(128), prec, CPU)
    assert totals[2].item() == len(bundle.val) and totals[1].item() / totals[2].item() > 0.8


def test_gradient_accumulation_matches_one_big_batch():
    cfg, _, model, opt, sched, data = _setup()
    _, _, model2, _, _, data2 = _setup(cap=16)
    model2.load_state_dict(model.state_dict())
    opt2 = make_optimizer(model2, cfg.train)
    sched2 = make_scheduler(opt2, cfg.train, 100)
    prec = Precision.create("fp32", CPU)
    (_, big), (_, small) = next(data.epoch(0)), next(data2.epoch(0))
    assert len(big) == 1 and len(small) == 4
    r1 = train_step(model, big, opt, sched, prec, 1 / 64, None)
    r2 = train_step(model2, small, opt2, sched2, prec, 1 / 64, None)
    assert r1.loss_sum.item() == pytest.approx(r2.loss_sum.item(), rel=1e-6)
    assert r1.grad_norm.item() == pytest.approx(r2.grad_norm.item(), rel=1e-5)
    for p1, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=1e-5, atol=1e-6)
    # off log steps and without clipping, the norm is not computed at all
    assert train_step(model2, small, opt2, sched2, prec, 1 / 64, None, measure_grad_norm=False).grad_norm is None


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_run_on_cpu(precision):
    cfg, _, model, opt, sched, data = _setup(f"train.precision={precision}")
    prec = Precision.create(precision, CPU)
    assert (prec.scaler is not None) == (precision == "fp16")
    r = train_step(model, next(data.epoch(0))[1], opt, sched, prec, 1 / 64, 1.0)
    assert torch.isfinite(r.loss_sum)


def test_schedule_warmup_then_cosine_to_floor():
    cfg = load(None, ["train.warmup_steps=10", "train.min_lr_ratio=0.1"]).train
    assert lr_factor(0, 100, cfg) == pytest.approx(0.1)
    assert lr_factor(9, 100, cfg) == pytest.approx(1.0)
    assert lr_factor(10, 100, cfg) == pytest.approx(1.0)
    assert lr_factor(100, 100, cfg) == pytest.approx(0.1)
    assert 0.1 < lr_factor(55, 100, cfg) < 1.0


def test_checkpoint_round_trip_continues_bitwise(tmp_path):
    cfg, bundle, model, opt, sched, data = _setup("model.dropout=0.2")
    prec = Precision.create("fp32", CPU)
    state = TrainState(model, opt, sched, prec)
    steps = list(data.epoch(0))
    for _, micro in steps[:3]:
        train_step(model, micro, opt, sched, prec, 1 / 64, 1.0)
        state.progress.advance(64, data.steps_per_epoch)
    state.save(tmp_path / "ck", 0, meta={"config": cfg.model_dump(mode="json"),
                                         "data_spec": {"kind": "classification", "input_shape": [1, 8, 8],
                                                       "num_classes": 10, "tokens_per_sample": 1}})
    # continue the original
    for _, micro in steps[3:6]:
        train_step(model, micro, opt, sched, prec, 1 / 64, 1.0)
    expected = params_sha256(model.state_dict())
    # a fresh process-equivalent: new objects, restored from disk (dropout uses the restored RNG)
    _, _, model2, opt2, sched2, _ = _setup("model.dropout=0.2")
    torch.manual_seed(12345)  # garbage RNG that the restore must overwrite
    state2 = TrainState(model2, opt2, sched2, prec)
    assert state2.load(tmp_path / "ck", 0) is True
    assert state2.progress.global_step == 3 and state2.progress.step_in_epoch == 3
    for _, micro in steps[3:6]:
        train_step(model2, micro, opt2, sched2, prec, 1 / 64, 1.0)
    assert params_sha256(model2.state_dict()) == expected
    restored, cfg2, meta = load_model(tmp_path / "ck")
    assert cfg2.model.dropout == 0.2 and meta["progress"]["global_step"] == 3


def test_a_checkpoint_without_meta_is_refused(tmp_path):
    cfg, _, model, opt, sched, _ = _setup()
    state = TrainState(model, opt, sched, Precision.create("fp32", CPU))
    state.save(tmp_path / "ck", 0, meta={})
    (tmp_path / "ck" / "meta.json").unlink()  # as if the save died before its last write
    with pytest.raises(IncompleteCheckpoint):
        read_meta(tmp_path / "ck")
    with pytest.raises(IncompleteCheckpoint):
        copy.deepcopy(state).load(tmp_path / "ck", 0)


def test_goodput_book_charges_restarts():
    book = GoodputBook()
    book.begin_attempt(100.0, 2, None, None, [])
    book.loop_started(105.0)  # startup (and a restart) ends when the training loop starts
    book.first_step_done(106.0)
    book.heartbeat(110.0, 40, productive_s=5.0, checkpoint_s=0.0)  # steps 0..40
    saved = Goodput(**vars(book.totals))  # a checkpoint at step 40
    book.heartbeat(112.0, 50, productive_s=2.0, checkpoint_s=0.5)
    # crash after step 50; the new group restores step 40 on 1 worker
    event = book.begin_attempt(120.0, 1, 40, saved, [2])
    assert event["restart"] and event["recomputed_steps"] == 10 and event["previous_world_size"] == 2
    book.loop_started(125.0)
    book.first_step_done(126.0)
    t = book.totals
    assert t.restarts == 1 and t.recomputed_steps == 10
    assert t.productive_s == pytest.approx(5.0)  # the 2 s after the checkpoint were lost
    assert t.restart_lost_s == pytest.approx(2.0 + (125.0 - 112.0))
    assert t.startup_s == pytest.approx(5.0) and book.world_sizes == [2, 1]


def test_a_pbt_clone_adopts_the_donor_state_with_its_own_learning_rate(tmp_path):
    """TrainState.adopt: the donor's weights, optimizer moments and position; this run's lr, schedule base and
    identity (a PBT clone, elastic_train.sweep.tuner.run_trial)."""
    cfg, _, model, opt, sched, data = _setup("train.lr=0.01", "train.warmup_steps=2")
    prec = Precision.create("fp32", CPU)
    donor = TrainState(model, opt, sched, prec, record=RunRecord(
        run_name="trial-donor", mlflow_run_id="d", schedule=[schedule_entry(0, 0.01, 64, "trial-donor")]))
    for _, micro in list(data.epoch(0))[:4]:
        train_step(model, micro, opt, sched, prec, 1 / 64, 1.0)
        donor.progress.advance(64, data.steps_per_epoch)
    donor.save(tmp_path / "ck", 0, meta={})
    _, _, model2, opt2, sched2, _ = _setup("train.lr=0.002", "train.warmup_steps=2")
    clone = TrainState(model2, opt2, sched2, prec, record=RunRecord(run_name="trial-clone", mlflow_run_id="c"))
    clone.load(tmp_path / "ck", 0)
    origin = clone.adopt(0.002, RunRecord(run_name="trial-clone", mlflow_run_id="c"), global_batch_size=64)
    assert origin == {"run_name": "trial-donor", "global_step": 4, "epoch": 0, "step_in_epoch": 4}
    # The weights' hyperparameter schedule: the donor's stretch, then the clone's from the take-over on.
    assert clone.record.schedule == [
        {"step": 0, "lr": 0.01, "global_batch_size": 64, "run_name": "trial-donor"},
        {"step": 4, "lr": 0.002, "global_batch_size": 64, "run_name": "trial-clone", "cloned_from": "trial-donor"}]
    assert json.loads((tmp_path / "ck" / "meta.json").read_text())["schedule"] == donor.record.schedule
    assert clone.progress.global_step == 4 and clone.record.run_name == "trial-clone"
    assert params_sha256(model2.state_dict()) == params_sha256(model.state_dict())
    moments = [s["exp_avg"] for s in opt.state.values()], [s["exp_avg"] for s in opt2.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(*moments, strict=True))
    factor = sched.lr_lambdas[0](4)  # the schedule's position is the donor's; its base is the clone's
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([0.002 * factor] * len(opt2.param_groups))
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01 * factor] * len(opt.param_groups))
    _, micro = list(data.epoch(0))[4]
    train_step(model2, micro, opt2, sched2, prec, 1 / 64, 1.0)
    assert sched2.get_last_lr() == pytest.approx([0.002 * sched.lr_lambdas[0](5)] * len(opt2.param_groups))
