"""A sweep's MLflow relay (tracking/relay.py): rank 0 of a trial logs through one warm sender actor. Real Ray, a
real sqlite MLflow store; the logging side runs in a Ray task, as a worker would."""

from __future__ import annotations

import time
from pathlib import Path

import ray

from tracking import tracker_for
from tracking.relay import RelayTracker, start_relay, stop_relay
from tracking.runs import start_run


@ray.remote(num_cpus=0)
def log_steps(spec, relay, steps: range, close: bool):
    tracker = tracker_for(spec, rank=0, relay=relay)
    assert isinstance(tracker, RelayTracker)
    tracker.set_tags({"from": "worker"})
    for step in steps:
        tracker.log_metrics({"train_loss": 1.0 / step}, step=step)
    return tracker.close(timeout_s=30) if close else (tracker._stream, tracker._calls)


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what


def open_run(home: Path, name: str):
    uri = f"sqlite:///{home / 'mlflow.db'}"
    spec, _ = start_run(uri, "relay", name, artifact_root=home / "mlartifacts", spool_path=home / f"{name}.jsonl")
    return spec


def history(spec) -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(spec.uri).get_metric_history(spec.run_id, "train_loss"))


def test_two_runs_log_through_one_relay_and_close_flushes_each(ray_session, home):
    relay = start_relay({})
    try:
        a, b = open_run(home, "a"), open_run(home, "b")
        results = ray.get([log_steps.remote(a, relay, range(1, 6), True),
                           log_steps.remote(b, relay, range(1, 4), True)])
        assert [r["unsent"] for r in results] == [0, 0]
        assert history(a) == [1, 2, 3, 4, 5] and history(b) == [1, 2, 3]  # landed by the time close returned

        from mlflow.tracking import MlflowClient

        assert MlflowClient(a.uri).get_run(a.run_id).data.tags["from"] == "worker"
    finally:
        stop_relay(relay)


def test_what_a_stopped_trial_logged_is_sent_when_the_relay_stops(ray_session, home):
    """A trial ASHA stops never closes its tracker (its workers are killed): the sweep's end flushes it."""
    relay = start_relay({})
    spec = open_run(home, "stopped")
    stream, calls = ray.get(log_steps.remote(spec, relay, range(1, 4), False))
    # The task's calls are fire-and-forget: they may still be on their way when it returns (its process looks the
    # relay up first), and Ray does not order them against the driver's call that ends the sweep. In a sweep
    # they reached the relay seconds before its end; here the test waits for them (seen once: none had arrived).
    wait_until(lambda: ray.get(relay.calls_received.remote(stream)) >= calls, "the trial's calls never arrived")
    stop_relay(relay)
    assert history(spec) == [1, 2, 3]


@ray.remote(num_cpus=0)
def log_and_close(spec, relay, steps: range, timeout_s: float, restarted: bool = False):
    tracker = tracker_for(spec, rank=0, relay=relay)
    if restarted:  # a restarted worker group: logs only steps the run does not hold yet
        tracker.skip_logged_steps(-1)
    for step in steps:
        tracker.log_metrics({"train_loss": 1.0 / step}, step=step, unless_logged=restarted)
    return tracker.close(timeout_s=timeout_s)


def test_a_close_past_its_deadline_keeps_sending_and_a_restart_waits_for_it(ray_session, home):
    """A worker's close has a short bound (10 s as a worker exits); MLflow may be slower than that as a run ends.
    What is unsent then is not spooled and lost to the run: the relay goes on sending it, as an orphaned sender
    child would, and the run's next tracker (a restarted worker group) reads the run's floor only after that."""
    relay = start_relay({})
    try:
        spec = open_run(home, "late")
        first = ray.get(log_and_close.remote(spec, relay, range(1, 4), 0.0))
        assert first["still_sending"] and first["unsent"] > 0  # zero seconds: nothing can have been sent yet
        again = ray.get(log_and_close.remote(spec, relay, range(1, 6), 30.0, restarted=True))
        assert again["unsent"] == 0
        assert history(spec) == [1, 2, 3, 4, 5]  # steps 1-3 once: the restart waited, then skipped them
    finally:
        stop_relay(relay)
    assert not Path(spec.spool_path).exists()


def test_calls_that_overtake_each_other_are_applied_in_the_order_they_were_made(ray_session, home):
    """Ray runs an async actor's calls in no guaranteed order, even one caller's: the relay applies each
    tracker's calls by their numbers. Sent here in reverse order, as the relay may receive them."""
    relay = start_relay({})
    try:
        spec = open_run(home, "reordered")
        tracker = RelayTracker(spec, relay)
        stream, payload = "stream-1", {**tracker._spec}
        calls = [("set_tags", [{"phase": "first"}]), ("set_tags", [{"phase": "second"}]),
                 ("log_metrics", [{"train_loss": 0.5}, 1, 1000, False])]
        refs = [relay.call.remote(payload, cmd, args, stream, seq) for seq, (cmd, args) in reversed(list(
            enumerate(calls)))]
        result = ray.get(relay.close.remote(payload, 30.0, stream, len(calls)))
        ray.get(refs)
        assert result["unsent"] == 0
        from mlflow.tracking import MlflowClient

        assert MlflowClient(spec.uri).get_run(spec.run_id).data.tags["phase"] == "second"  # applied last
        assert history(spec) == [1]
    finally:
        stop_relay(relay)


def test_the_sweeps_end_waits_for_a_close_still_flushing(ray_session, home):
    """A trial Tune stops while its last close runs is often the sweep's last: the relay's end waits for that
    close instead of being killed under it (the run then lacked every metric its rank 0 logged)."""
    relay = start_relay({})
    spec = open_run(home, "closing")
    tracker = RelayTracker(spec, relay)
    for step in range(1, 4):
        tracker.log_metrics({"train_loss": 1.0 / step}, step=step)
    closing = relay.close.remote(tracker._spec, 30.0, tracker._stream, tracker._calls)  # the caller is gone
    # The close has reached the relay (in a sweep, the trial sent it before Tune stopped it). Ray runs an async
    # actor's calls in no guaranteed order: sent back to back, the sweep's end could run before the close was
    # received, which no relay can wait for (seen once in ~20 suites: the run had none of its metrics).
    wait_until(lambda: ray.get(relay.closes_in_progress.remote()) or ray.wait([closing], timeout=0)[0],
               "the relay never received the close")
    stop_relay(relay)  # at once, as the sweep's end does
    assert history(spec) == [1, 2, 3]
