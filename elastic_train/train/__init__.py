"""What runs inside a worker.

    loop.py        the optimizer, LR schedule, precision and one training step, in plain PyTorch
    state.py       TrainState: everything a bit-exact resume needs, through state_dict()
    strategy.py    DDP and FSDP as strategy objects: wrap the model, its checkpoint files, eval sharding
    fsdp.py        FSDP2 sharding and DCP checkpoints (torch only), used by the FSDP strategy
    policy.py      when to checkpoint: step/time/epoch cadence and preemption
    metrics.py     aggregation windows, throughput, FLOPs, MFU
    goodput.py     the goodput book, charged across restarts, and its reporter to the run's ledger
    evaluator.py   validation summed over workers; scoring a trained model's weights
    console.py     rank 0's progress lines and bar
    faults.py      test-only fault injection ($ELASTIC_TRAIN_FAULT)
    session.py     one worker's life: build, restore, the step loop, checkpoints
    worker.py      the Ray Train entry points: the only module here that imports Ray

Imports point down: worker -> session -> (policy, goodput, evaluator, console, faults) -> state -> strategy
-> loop, with fsdp.py below strategy and metrics beside it. Everything but worker.py (and console.py's
tqdm_ray bar) is free of Ray; only worker.py and session.py touch tracking (a no-op tracker on ranks != 0), and
nothing here imports MLflow.
"""
