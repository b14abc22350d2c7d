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
        if len(seen) != len(set(seen)) or len(seen) != (n_train // g) * g:
            problems.append(f"epoch {epoch}: {len(seen) - len(set(seen))} repeated, "
                            f"{(n_train // g) * g - len(set(seen))} missing")
    return problems
