"""A worker whose gloo peer was lost (its process or host gone) prints one line, not Ray Train's traceback of the
training function (issue 51, item 9): a filter on the handlers Ray Train's records reach, public logging only."""

from __future__ import annotations

import io
import logging

from elastic_train.train.worker import _PeerLostOneLine

# as Ray Train's worker logs it (ray/train/v2/_internal/util.py, Ray 2.55-2.60): one record, the traceback inside
TRACEBACK = """Error in training function:
Traceback (most recent call last):
  File "/x/elastic_train/train/metrics.py", line 76, in reduce
    dist.all_reduce(buf)
  File "/x/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
    work.wait()
RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [198.18.9.12]:26800: \
Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the training code.
"""


def emit(message: str) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(_PeerLostOneLine())
    log = logging.getLogger("test.peer_lost")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.error(message)
    finally:
        log.removeHandler(handler)
    return out.getvalue()


def test_a_lost_peers_traceback_is_one_line_naming_gloos_reason():
    printed = emit(TRACEBACK)
    assert printed.count("\n") == 1 and "Traceback" not in printed, printed
    assert "lost a peer (gloo: Connection reset by peer)" in printed and printed.startswith("[elastic-train] ")


def test_any_other_training_function_error_keeps_its_traceback():
    other = TRACEBACK.replace("RuntimeError: [/__w", "ValueError: [/__w")
    assert emit(other) == other + "\n"
    assert emit("something else failed") == "something else failed\n"
