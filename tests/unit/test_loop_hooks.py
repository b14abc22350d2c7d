"""The step loop's named moments (train/hooks.py) charge the goodput book and fire test faults, with no worker."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_train.train.faults import FaultHook
from elastic_train.train.goodput import GoodputReporter
from elastic_train.train.hooks import LoopHooks


class _Ledger:
    def __init__(self) -> None:
        self.books: list[dict] = []

    def put(self, book: dict) -> None:
        self.books.append(book)

    def flush(self, timeout_s: float = 10.0) -> bool:
        self.flushed = len(self.books)
        return True

    def get(self) -> dict | None:
        return self.books[-1] if self.books else None


def test_the_moments_of_one_attempt_add_up_in_the_book_and_reach_the_ledger(tmp_path):
    ledger = _Ledger()
    hooks = LoopHooks(GoodputReporter(ledger, print), FaultHook.parse(f"markers={tmp_path}", 0), torch.device("cpu"))
    hooks.built()
    event = hooks.attempt_begun(2, None, None, [])
    assert event["restart"] is False and hooks.book.world_sizes == [2]
    hooks.announced()
    hooks.loop_started()
    for step in (1, 2, 3):
        hooks.stepped(step, first=step == 1)
    hooks.window_logged(3, wall_s=1.5)
    hooks.metrics_logged(3)
    hooks.checkpoint_written(3)
    hooks.checkpointed(3, block_s=0.75, eval_s=0.25, finalize_s=0.0)
    hooks.flush()
    book = ledger.books[-1]
    assert book["last_step"] == 3 and book["tracking_floor"] == 3 and book["first_step_unix"] is not None
    assert book["totals"]["productive_s"] == pytest.approx(1.5)
    assert book["totals"]["checkpoint_s"] == pytest.approx(0.5) and book["totals"]["eval_s"] == pytest.approx(0.25)
    assert book["totals"]["checkpoints"] == 1
    phases = [json.loads(line)["event"] for line in (tmp_path / "phases.rank0.jsonl").read_text().splitlines()]
    assert phases == ["built", "first_step"]
    hooks.stepped(4, first=False)  # within 0.25 s of the last push: kept local
    assert ledger.books[-1]["last_step"] == 3
    hooks.close()  # the attempt ends: the book as it stands is pushed, then sent before the process may go
    assert ledger.books[-1]["last_step"] == 4 and ledger.flushed == len(ledger.books)


def test_a_fault_fires_at_its_step_and_a_save_fault_when_the_part_is_written(tmp_path):
    hooks = LoopHooks(GoodputReporter(None, print),
                      FaultHook.parse(f"step=2,mode=raise,marker={tmp_path / 'a'};step=4,mode=save", 0),
                      torch.device("cpu"))
    hooks.stepped(1, first=True)
    with pytest.raises(RuntimeError, match="injected fault at step 2"):
        hooks.stepped(2, first=False)
    hooks.stepped(2, first=False)  # its marker exists: it fired once
    hooks.checkpoint_written(3)  # before its step: nothing
    assert (tmp_path / "a").exists()
