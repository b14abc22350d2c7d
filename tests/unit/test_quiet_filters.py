"""The driver drops Ray's known-benign forwarded blocks from the console, and nothing else."""

from __future__ import annotations

from elastic_train.launch.quiet import _WithoutBenignLines, without_benign_blocks

# As Ray 2.60's Train controller logs it when its call to the autoscaling coordinator times out (CPU saturated).
OVERLOAD = [
    "Failed to send resource request for train-2af299f3996347eab57ecef7d5dbc286. If this only happens transiently "
    "during network partition or CPU being overloaded, it's safe to ignore this error. If this error persists, "
    "file a GitHub issue.",
    "Traceback (most recent call last):",
    '  File ".../ray/train/v2/_internal/execution/scaling_policy/autoscaling_coordinator_client.py", line 58, in '
    "send_resource_request",
    "    ray.get(",
    '  File "python/ray/includes/common.pxi", line 107, in ray._raylet.check_status',
    "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
]


def test_the_overload_warning_block_is_dropped_and_the_lines_around_it_kept():
    lines = ["before", *OVERLOAD, "[elastic-train] epoch 1/1 step 10", *OVERLOAD]
    assert without_benign_blocks(lines) == ["before", "[elastic-train] epoch 1/1 step 10"]


def test_the_same_warning_with_another_error_still_prints():
    other = [*OVERLOAD[:-1], "ray.exceptions.RayActorError: The actor died unexpectedly"]
    assert without_benign_blocks(other) == other
    assert without_benign_blocks(OVERLOAD[:-1]) == OVERLOAD[:-1]  # cut short: not known to be benign
    assert without_benign_blocks(OVERLOAD[:1]) == OVERLOAD[:1]


def test_the_printer_gets_the_batch_less_the_block_or_nothing():
    printed = []
    printer = _WithoutBenignLines(printed.append)
    printer({"pid": 1, "lines": list(OVERLOAD)})
    printer({"pid": 1, "lines": ["kept", *OVERLOAD]})
    assert printed == [{"pid": 1, "lines": ["kept"]}]


# Ray 2.60's PlacementGroupCleaner monitor thread with a second Ray on the machine (seen in a sweep, issue 13).
CLEANER_NO_ADDRESS = [
    "Exception in thread PlacementGroupCleanerMonitor:",
    "Traceback (most recent call last):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "    self.run()",
    '  File ".../ray/train/v2/_internal/execution/controller/placement_group_cleaner.py", line 80, in _monitor_loop',
    "    alive = is_actor_alive(",
    '  File ".../ray/_private/services.py", line 759, in canonicalize_bootstrap_address_or_die',
    "    raise ConnectionError(",
    "ConnectionError: Found multiple active Ray instances: {'192.0.2.2:33443', '192.0.2.2:34237'}. Please specify "
    "the one to connect to by setting the `--address` flag or `RAY_ADDRESS` environment variable.",
]
CLEANER_AT_WORK = ("Detected that the Ray Train controller actor (a1b2c3d4e5f60718293a4b5c01000000) is dead. "
                   "Cleaning up placement group = [2cd1e2f3a4b5c6d7e8f901000000] created by this run.")


def test_the_cleaners_monitor_traceback_and_cleanup_notice_are_dropped():
    printed = []
    printer = _WithoutBenignLines(printed.append)
    slow_state_api = ("Failed to query Ray Train Controller actor state. State API may be temporarily unavailable. "
                      "Continuing to monitor.")
    printer({"pid": 7, "lines": [*CLEANER_NO_ADDRESS, CLEANER_AT_WORK, slow_state_api, slow_state_api, "kept"]})
    assert printed == [{"pid": 7, "lines": ["kept"]}]


def test_the_cleaners_monitor_dying_of_anything_else_still_prints():
    other = [*CLEANER_NO_ADDRESS[:-1], "RuntimeError: something else"]
    assert without_benign_blocks(other) == other
    mixed = [CLEANER_NO_ADDRESS[0], *OVERLOAD[1:]]  # a block's start with another block's end: not benign
    assert without_benign_blocks(mixed) == mixed


def test_a_pbt_trials_restore_notice_is_dropped():
    printed = []
    line = ("Restored on 192.0.2.2 from checkpoint: Checkpoint(filesystem=local, "
            "path=/tmp/i13q/store/p3/tune-8b00c_00000/checkpoint_000001)")
    _WithoutBenignLines(printed.append)({"pid": 9, "lines": [line, "Restore failed: kept"]})
    assert printed == [{"pid": 9, "lines": ["Restore failed: kept"]}]


def test_c10ds_no_reverse_dns_warning_on_separate_hosts_is_dropped():
    printed = []
    line = ("[W1205 01:49:29.098402022 socket.cpp:207] [c10d] The hostname of the client socket cannot be "
            "retrieved. err=-3")
    _WithoutBenignLines(printed.append)({"pid": 9, "lines": [line, "[c10d] connect failed: kept"]})
    assert printed == [{"pid": 9, "lines": ["[c10d] connect failed: kept"]}]


RAYLET_WARNING = (  # Ray 2.60's raylet, pushed to every driver (issue 34 item 13: four of these in one run)
    "WARNING: 12 PYTHON worker processes have been started on node: 5f3c0e8d2a with address: 198.18.0.11, which "
    "is 6x the maximum expected startup concurrency (2). This could be a result of using a large number of actors, "
    "tasks blocked in ray.get() calls, or tasks with fractional CPU requests (e.g., num_cpus=0.1) allowing high "
    "concurrency. See https://github.com/ray-project/ray/issues/3644 for some discussion of workarounds."
)


def test_the_raylets_startup_concurrency_warning_is_dropped_and_its_other_messages_kept(capsys):
    """Through Ray's own printer, wrapped where Ray's driver thread calls it by name (compat.ray_core)."""
    import ray._private.worker as ray_worker

    from elastic_train.compat.ray_core import wrap_raylet_message_printer
    from elastic_train.launch.quiet import _WithoutBenignRayletLines

    before = ray_worker.print_to_stdstream
    # Ray's own printer (an earlier run in this test process, on the already-connected Ray, may have wrapped it)
    original = before.inner if getattr(before, "elastic_train_wrapped", False) else before
    ray_worker.print_to_stdstream = original
    try:
        assert wrap_raylet_message_printer(_WithoutBenignRayletLines)
        assert wrap_raylet_message_printer(_WithoutBenignRayletLines)  # idempotent: wrapped once
        assert ray_worker.print_to_stdstream.inner is original
        ray_worker.print_to_stdstream({"lines": [RAYLET_WARNING], "pid": "raylet", "is_err": False}, False)
        assert capsys.readouterr().out == ""
        other = "The node with node id: 5f3c0e8d2a and address: 198.18.0.11 has been marked dead"
        ray_worker.print_to_stdstream({"lines": [RAYLET_WARNING, other], "pid": "raylet", "is_err": False}, False)
        out = capsys.readouterr().out
        assert other in out and "PYTHON worker processes" not in out
        # a worker's own output passes the raylet filter untouched (Ray's public skip regex, exported by this
        # session as a job exports it, drops the benign warning wherever it comes from)
        ray_worker.print_to_stdstream({"lines": ["[elastic-train] epoch 1/1 step 3"], "pid": 4242,
                                       "ip": "198.18.0.11", "is_err": False, "task_name": "t", "actor_name": ""},
                                      False)
        assert "[elastic-train] epoch 1/1 step 3" in capsys.readouterr().out
    finally:
        ray_worker.print_to_stdstream = before


# Ray 2.60's Train controller after a worker was killed in a streamed run (2026-12-05; paths shortened).
WORKER_DEATH = [
    'Graceful shutdown of backend failed. This is expected if one of the workers has crashed.',
    'Traceback (most recent call last):',
    '  File ".../ray/train/v2/_internal/callbacks/backend_setup.py", line 27, in before_execution_group_shutdown',
    '    self._backend.on_shutdown(execution_group, self._backend_config)',
    '  File ".../ray/train/torch/config.py", line 333, in on_shutdown',
    '    ray.get(futures, timeout=timeout_s)',
    '  File ".../ray/_private/auto_init_hook.py", line 22, in auto_init_wrapper',
    '    return fn(*args, **kwargs)',
    '           ^^^^^^^^^^^^^^^^^^^',
    '  File ".../ray/_private/client_mode_hook.py", line 134, in wrapper',
    '    return func(*args, **kwargs)',
    '           ^^^^^^^^^^^^^^^^^^^^^',
    '  File ".../ray/_private/worker.py", line 3009, in get',
    '    values, debugger_breakpoint = worker.get_objects(',
    '                                  ^^^^^^^^^^^^^^^^^^^',
    '  File ".../ray/_private/worker.py", line 1055, in get_objects',
    '    raise value',
    'ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.',
    '\tclass_name: RayTrainWorker',
    '\tactor_id: de805e19148afd8be89ef66a01000000',
    '\tpid: 27982',
    '\tnamespace: 864d8795-9f6b-448c-a952-01ed56d623b4',
    '\tip: 192.0.2.2',
    ('The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit '
     'detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes '
     'include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray stop --force '
     'was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another unexpected error. If '
     'the process was killed by the kernel OOM killer (verifiable by checking for OOM in dmesg of the '
     'OOMing node), consider enabling resource isolation via --enable-resource-isolation to prevent node '
     'deaths by resource contention and significant loss of progress by uninformed kernel OOM killing.'),
]


def test_a_worker_deaths_traceback_from_the_controller_becomes_one_line_with_the_reason():
    printed = []
    _WithoutBenignLines(printed.append)({"pid": 3, "lines": ["before", *WORKER_DEATH, "after"]})
    assert printed == [{"pid": 3, "lines": [
        "before",
        "RayTrainWorker pid 27982 on 192.0.2.2 died: Worker unexpectedly exits with a connection error code 2 "
        "(SYSTEM_ERROR); the worker group restarts from its last checkpoint",
        "after"]}]


def test_a_worker_on_a_lost_host_in_the_controllers_traceback_becomes_one_line():
    """The worker's host was killed or cut off (tests/hosts, 2026-12-07): Ray's RPC fails before the node is
    declared dead, and the block ends in ActorUnavailableError, which names the actor only by id."""
    unreachable = [*WORKER_DEATH[:-7], (
        "ray.exceptions.ActorUnavailableError: The actor 6195466f12653b751ec18d0f02000000 is unavailable: The actor "
        "is temporarily unavailable: RpcError: RPC error: failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:198.18.9.12:10005: Failed to connect to remote host: Connection refused. The actor may be restarting.")]
    printed = []
    _WithoutBenignLines(printed.append)({"pid": 3, "lines": ["before", *unreachable, "after"]})
    assert printed == [{"pid": 3, "lines": [
        "before",
        "a worker is unreachable (its host is gone or cut off: RpcError: RPC error: failed to connect to all "
        "addresses); the worker group restarts from its last checkpoint",
        "after"]}]


def test_the_same_shutdown_failing_for_another_reason_prints_whole():
    other = [*WORKER_DEATH[:-7], "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready."]
    assert without_benign_blocks(other) == other
    assert without_benign_blocks(WORKER_DEATH[:-7]) == WORKER_DEATH[:-7]  # cut short by a batch: as it came


# Ray 2.60 on separate hosts (tests/hosts, 2026-12-06): a host cut off for 30 s, declared dead, its link back.
FRAME = ("/work/main/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet(+0x6af46e) [0x55e5eee0346e] "
         "ray::gcs::NodeInfoAccessor::AsyncCheckAlive()::{lambda()#1}::operator()()")
RAYLET_FATAL = [
    "[2026-12-06 03:04:36,158 C 3843 3843] (raylet) node_manager.cc:519: GCS consider this node to be dead. This may "
    "happen when GCS is not backed by a DB and restarted or there is data loss in the DB.",
    "*** StackTrace Information ***", FRAME, FRAME,
    "/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85) [0x7f6369445305] __libc_start_main", "",
]
PEER_LOST = [
    "Error in training function:",
    "Traceback (most recent call last):",
    '  File ".../elastic_train/train/metrics.py", line 76, in reduce',
    "    dist.all_reduce(buf)",
    '  File ".../torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
    "    work.wait()",
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[198.18.9.12]:43169: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in "
    "the application. Check the logs of the remote worker before reporting an error. GLHF!",
    "",
]


def test_a_raylet_declared_dead_prints_one_line_not_its_stack_trace():
    from elastic_train.launch.quiet import DECLARED_DEAD_LINE

    printed = []
    _WithoutBenignLines(printed.append)({"pid": "raylet", "ip": "198.18.9.11", "lines": ["before", *RAYLET_FATAL]})
    assert printed == [{"pid": "raylet", "ip": "198.18.9.11", "lines": ["before", DECLARED_DEAD_LINE]}]
    # the other way a raylet learns it (the GCS's node-removed notice reaches it first), seen the same day
    removed = ["[2026-12-06 04:01:02,003 C 51 51] (raylet) node_manager.cc:1033: [Timeout] Exiting because this "
               "node manager has mistakenly been marked as dead by the GCS: GCS failed to check the health of this "
               "node for 5 times. This is likely because the machine or raylet has become overloaded.",
               *RAYLET_FATAL[1:]]
    printed.clear()
    _WithoutBenignLines(printed.append)({"pid": "raylet", "lines": removed})
    assert printed[0]["lines"] == [DECLARED_DEAD_LINE]
    # a raylet crashing for another reason keeps its FATAL line (the why) and its frames become one line; a
    # worker's own output is never touched
    from elastic_train.launch.quiet import TRACE_LINE

    other = ["[... C ...] (raylet) node_manager.cc:1: Check failed: something", *RAYLET_FATAL[1:], "after"]
    printed.clear()
    _WithoutBenignLines(printed.append)({"pid": "raylet", "lines": other})
    _WithoutBenignLines(printed.append)({"pid": 4242, "lines": RAYLET_FATAL})
    assert [d["lines"] for d in printed] == [[other[0], TRACE_LINE, "after"], RAYLET_FATAL]


def test_the_heads_raylet_terminated_push_for_a_dead_node_becomes_one_line():
    from elastic_train.launch.quiet import TERMINATED_DECLARED_DEAD_LINE, _WithoutBenignRayletLines

    printed = []
    push = ("Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL by the user or "
            "system OOM killer, ... Last 20 lines of the Raylet logs:\n    *** StackTrace Information ***\n    "
            + FRAME)
    _WithoutBenignRayletLines(lambda data, _: printed.append(data))({"pid": "raylet", "lines": [push]}, False)
    assert printed == [{"pid": "raylet", "lines": [TERMINATED_DECLARED_DEAD_LINE]}]
    removed = push.replace("NodeInfoAccessor::AsyncCheckAlive", "ray::raylet::NodeManager::NodeRemoved")
    _WithoutBenignRayletLines(lambda data, _: printed.append(data))({"pid": "raylet", "lines": [removed]}, False)
    assert printed[-1]["lines"] == [TERMINATED_DECLARED_DEAD_LINE]
    # another cause: Ray's message stays, the log tail (a trace) goes to where it is kept; no trace: as it came
    oom = push.replace(FRAME, "[... E ...] oom killer")
    _WithoutBenignRayletLines(lambda data, _: printed.append(data))({"pid": "raylet", "lines": [oom]}, False)
    assert printed[-1]["lines"] == [oom.split("Last 20 lines")[0] + "Its last log lines are in that node's raylet.out."]
    plain = push.split("\n")[0]
    _WithoutBenignRayletLines(lambda data, _: printed.append(data))({"pid": "raylet", "lines": [plain]}, False)
    assert printed[-1]["lines"] == [plain]


def test_a_workers_lost_peer_traceback_becomes_one_line_and_other_errors_print_whole():
    assert without_benign_blocks(["a", *PEER_LOST, "b"]) == [
        "a", "this worker's process group lost a peer (gloo: Connection reset by peer); its group ends and "
        "restarts without it", "b"]
    user_bug = [*PEER_LOST[:-2], "ZeroDivisionError: division by zero"]
    assert without_benign_blocks(user_bug) == user_bug


# Ray 2.60's crash dump in a worker's stderr, forwarded to the driver (seen in a full `make test`, 2026-12-05: the
# PreemptionWatcher that Ray Train kills at a worker group's end aborting as it died).
CHECK = ("[mutex.cc : 1954] RAW: Check (v & (kMuWriter | kMuReader)) != (kMuWriter | kMuReader) failed: Lock: Mutex "
         "corrupt: both reader and writer lock held: 0xffffffffffffff0b")
ABORT = [
    "*** SIGABRT received at time=1796555089 on cpu 1 ***",
    "PC: @     0x7fcca349feec  (unknown)  (unknown)",
    "    @     0x7fcca3451050       9104  (unknown)",
    "[2026-12-06 11:04:49,440 E 29062 30142] logging.cc:474: *** SIGABRT received at time=1796555089 on cpu 1 ***",
    "[2026-12-06 11:04:49,567 E 29062 30142] logging.cc:474: PC: @     0x7fcca349feec  (unknown)  (unknown)",
    "[2026-12-06 11:04:49,568 E 29062 30142] logging.cc:474:     @     0x7fcca3451050       9104  (unknown)",
    "Fatal Python error: Aborted",
    "",
    "Thread 0x00007fcca2bff6c0 (most recent call first):",
    '  File "/usr/lib/python3.11/threading.py", line 331 in wait',
    "",
    "Extension modules: msgpack._cmsgpack, google._upb._message, psutil._psutil_linux (total: 3)",
]


def test_a_teardown_helpers_crash_dump_prints_nothing_even_across_batches():
    from elastic_train.launch.quiet import crash_line

    printed = []
    printer = _WithoutBenignLines(printed.append)
    watcher = {"pid": 29062, "ip": "10.0.0.1", "actor_name": "PreemptionWatcher"}
    printer({**watcher, "lines": [CHECK, *ABORT[:4]]})
    printer({**watcher, "lines": ABORT[4:]})
    assert printed == []
    # the same dump from a worker of the run: the check that failed and one line naming the signal; the next
    # batch's frames are still dropped, and a line that is no part of a dump still prints
    worker = {"pid": 31, "ip": "10.0.0.1", "actor_name": "RayTrainWorker"}
    printer({**worker, "lines": ["before", CHECK, *ABORT[:5]]})
    printer({**worker, "lines": [*ABORT[5:], "after"]})
    assert [d["lines"] for d in printed] == [["before", CHECK, crash_line("SIGABRT")], ["after"]]


def test_a_process_ray_ends_with_sigterm_drops_its_dump_and_other_processes_print_as_they_came():
    printed = []
    printer = _WithoutBenignLines(printed.append)
    term = [line.replace("SIGABRT", "SIGTERM") for line in ABORT[:6]]
    printer({"pid": 7, "lines": term})
    assert printed == []
    other = ["", "    @ not a frame", '  File "x.py", line 3 in f', "Fatal Python error: kept"]
    printer({"pid": 8, "lines": other})
    assert printed == [{"pid": 8, "lines": other}]


WORKER_DIED = (  # a raylet's push, as Ray 2.60 printed it when a worker was killed (a test fault, mode=exit)
    'A worker died or was killed while executing a task by an unexpected system error. To troubleshoot th'
    'e problem, check the logs for the dead worker. Lease ID: 04000000b5a33d4b583ba08d32abbad69d9afc77e0d'
    'a0c694dfca223e2a4ed13 Worker ID: bb788be3e72d9626bc1bd26dec688f5deabdce022607045e4cdb6c4a Node ID: 3'
    '46374748ca64ed6a83e0e19f6071b1d9a9bc97466365b5cf3ccdbf0 Worker IP address: 192.0.2.2 Worker port: 41'
    '531 Worker PID: 18393 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits w'
    'ith a connection error code 2. End of file. Some common causes include: (1) the process was killed b'
    'y the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashe'
    'd unexpectedly due to SIGSEGV or another unexpected error. If the process was killed by the kernel O'
    'OM killer (verifiable by checking for OOM in dmesg of the OOMing node), consider enabling resource i'
    'solation via --enable-resource-isolation to prevent node deaths by resource contention and significa'
    'nt loss of progress by uninformed kernel OOM killing.'
)


def test_a_raylets_worker_died_push_becomes_one_short_line_with_what_it_said():
    from elastic_train.launch.quiet import _WithoutBenignRayletLines

    printed: list = []
    _WithoutBenignRayletLines(lambda data, _: printed.append(data))({"pid": "raylet", "lines": [WORKER_DIED]}, False)
    (line,) = printed[0]["lines"]
    assert line == ("a worker process died unexpectedly: pid 18393 on 192.0.2.2 (SYSTEM_ERROR: Worker unexpectedly "
                    "exits with a connection error code 2. End of file); its logs: "
                    "logs/worker-bb788be3e72d9626bc1bd26dec688f5deabdce022607045e4cdb6c4a-* on that node")
    other = "A worker died or was killed while executing a task by an unexpected system error, in a new way."
    printed.clear()
    _WithoutBenignRayletLines(lambda data, _: printed.append(data))({"pid": "raylet", "lines": [other]}, False)
    assert printed[0]["lines"] == [other]  # a wording it does not know prints whole


# As Ray 2.60's GCS logs it when its Redis goes away (GCS fault tolerance; cluster.sim's Redis SIGKILLed mid-run),
# forwarded to the driver as (pid=gcs_server): ~200 such lines in 3 s, then its FATAL.
GCS_REDIS_GONE = [
    "[2026-12-07 15:38:28,175 E 24624 24624] (gcs_server) redis_context.cc:357: Redis command submission failed: "
    "Disconnected: Redis is disconnected",
    "[2026-12-07 15:38:28,175 E 24624 24624] (gcs_server) redis_context.cc:270: Redis request [PING] failed due to "
    "error Redis connection unavailable. 5 retries left.",
    "[2026-12-07 15:38:29,791 E 24624 24638] (gcs_server) redis_context.cc:270: Redis request [HGET RAYdefault@KV "
    "@namespace_job:_ray_internal_job_info_raysubmit_xUgK4PHyz8zaXuSr] failed due to error Redis connection "
    "unavailable. 2 retries left.",
    "[2026-12-07 15:42:59,101 E 24624 24638] (gcs_server) redis_context.cc:270: Redis request [HSET RAYdefault@KV "
    "@namespace_job:some_key \x80\x04\x95",  # a pickled value's line break splits the request's line
    "K hK hK u\x8f",
    "finalize_s\x94G        u.] failed due to error Redis connection unavailable. 3 retries left.",
]
GCS_REDIS_FATAL = [
    "[2026-12-07 15:38:31,713 C 24624 24624] (gcs_server) redis_context.cc:308: Failed to run redis cmds: [PING] for "
    "5 times.",
    "*** StackTrace Information ***",
    "/.../ray/core/src/ray/gcs/gcs_server(+0x7b49c7) [0x55f5f1cbf9c7] ray::gcs::RedisRequestContext::Run()",
]


def test_the_gcs_losing_its_redis_prints_none_of_its_errors():
    """The skip regex (public) drops every GCS Redis error line; with console_blocks the pieces of a request whose
    binary arguments broke lines go too. The one line is the driver's watch's (launch/gcs_store.py)."""
    import re

    from elastic_train.launch.quiet import SKIP_REGEX

    skip = re.compile(SKIP_REGEX)
    logged = [line for line in GCS_REDIS_GONE + GCS_REDIS_FATAL[:1] if line.startswith("[")]
    assert all(skip.search(line) for line in logged) and skip.search(GCS_REDIS_GONE[-1])  # a request's tail too
    printed = []
    printer = _WithoutBenignLines(printed.append)
    printer({"pid": "gcs_server", "lines": GCS_REDIS_GONE * 20})
    another = "[2026-12-07 15:42:59,300 I 24624 24624] (gcs_server) gcs_server.cc:1: another GCS line"
    printer({"pid": "gcs_server", "lines": [*GCS_REDIS_GONE, another]})
    printer({"pid": "gcs_server", "lines": GCS_REDIS_FATAL})
    assert [d["lines"] for d in printed] == [[another]]
    # a worker's own line that mentions Redis is its own business
    printer({"pid": 7, "lines": GCS_REDIS_GONE[:1]})
    assert printed[-1]["lines"] == GCS_REDIS_GONE[:1]
