"""The sample-id trace (``data.trace_path``): read every rank's file, and check exactly-once per epoch."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def read_trace(prefix: Path) -> list[dict]:
    """Every record of ``<prefix>.rank*`` (files are appended to across restarts)."""
    records = []
    for f in prefix.parent.glob(prefix.name + ".rank*"):
        records.extend(json.loads(line) for line in f.read_text().splitlines() if line.strip())
    return records


def exactly_once_problems(records: list[dict], n_train: int, g: int, epochs: int) -> list[str]:
    """What breaks "every epoch consumed every training sample exactly once" ([] when nothing does): each
    (epoch, step) served whole by some worker group, recomputed steps serving the same ids, no id twice or
    missing within an epoch, whatever the world sizes were."""
    by_step: dict[tuple[int, int], dict[int, dict[int, list[int]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by_step[(r["epoch"], r["step"])][r["world_size"]][r["rank"]] = r["ids"]
    problems = []
    for epoch in range(epochs):
        seen: list[int] = []
        for step in range(n_train // g):
            complete = [ranks for w, ranks in by_step[(epoch, step)].items() if sorted(ranks) == list(range(w))]
            if not complete:
                problems.append(f"epoch {epoch} step {step}: never served by a whole worker group")
                continue
            ids = sorted(i for part in complete[0].values() for i in part)
            if len(ids) != len(set(ids)) or len(ids) != g:
                problems.append(f"epoch {epoch} step {step}: {len(ids)} ids, {len(set(ids))} distinct, want {g}")
            if any(sorted(i for part in ranks.values() for i in part) != ids for ranks in complete[1:]):
                problems.append(f"epoch {epoch} step {step}: a recomputation served other samples")
            seen.extend(ids)
        problems += epoch_problems(epoch, seen, (n_train // g) * g)
    return problems


def epoch_problems(epoch: int, seen: list[int], want: int) -> list[str]:
    """An epoch's samples, all servings together, must be ``want`` distinct ids: none twice, none missing."""
    if len(seen) == len(set(seen)) == want:
        return []
    return [f"epoch {epoch}: {len(seen) - len(set(seen))} repeated, {want - len(set(seen))} missing of {want}"]


def final_servings(records: list[dict]) -> dict[tuple[int, int], list[int]]:
    """For a streamed source (exactly-once, not bitwise): the ids of each (epoch, step) as the worker group that
    served it last saw them. A step served again after a restart (recomputed from a checkpoint) may hold other
    samples than its lost first serving; the last serving is the one the final model trained on."""
    by_step: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r in records:
        if "step" in r:
            by_step[(r["epoch"], r["step"])].append(r)
    out: dict[tuple[int, int], list[int]] = {}
    for key, rs in by_step.items():
        last = max(rs, key=lambda r: r["t"])
        w = last["world_size"]
        parts = {}
        for r in sorted(rs, key=lambda r: r["t"]):
            if r["world_size"] == w:
                parts[r["rank"]] = r["ids"]  # the latest serving per rank
        out[key] = [i for rank in sorted(parts) for i in parts[rank]] if sorted(parts) == list(range(w)) else []
    return out


def stream_exactly_once_problems(records: list[dict], n_train: int, g: int, epochs: int) -> list[str]:
    """What breaks "every epoch consumed floor(N/G)*G distinct samples, none twice" for a streamed source."""
    served = final_servings(records)
    problems = []
    for epoch in range(epochs):
        seen: list[int] = []
        for step in range(n_train // g):
            ids = served.get((epoch, step), [])
            if len(ids) != g:
                problems.append(f"epoch {epoch} step {step}: {len(ids)} ids from its last worker group, want {g}")
            seen.extend(ids)
        problems += epoch_problems(epoch, seen, (n_train // g) * g)
    return problems
