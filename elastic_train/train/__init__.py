"""What runs inside a worker.

    loop.py        the optimizer, LR schedule, precision and one training step, in plain PyTorch
    state.py       TrainState: everything a bit-exact resume needs, through state_dict()
    strategy.py    DDP and FSDP as strategy objects: wrap the model, save/load its state, eval sharding
    fsdp.py        FSDP2 sharding and DCP checkpoints (torch only), used by the FSDP strategy
    policy.py      when to checkpoint: step/time/epoch cadence and preemption
    metrics.py     aggregation windows, throughput, FLOPs, MFU
    goodput.py     the goodput book, charged across restarts
    console.py     rank 0's progress lines and bar
    faults.py      test-only fault injection ($ELASTIC_TRAIN_FAULT)
    session.py     one worker's life: restore, the step loop, checkpoints
    worker.py      the Ray Train entry points: the only modules here that import Ray

Everything but worker.py (and console.py's tqdm_ray bar) is free of Ray and MLflow.
"""
