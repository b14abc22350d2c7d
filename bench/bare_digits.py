"""The least a user could write with bare Ray Train to do what ``jobs.train`` does on digits for one epoch.

    .venv/bin/python bench/bare_digits.py [--epochs 1] [--workers 1]

scikit-learn's digits, the preset's MLP (256, 256), AdamW at 3e-3, global batch 128, DDP through TorchTrainer,
a checkpoint at the end of each epoch (``ray.train.report``). No MLflow, no preflight, no ledger. It prints
``FIRST_STEP <unix time>`` from rank 0 after the first optimizer step (bench/startup.py reads it), and
``DONE <val accuracy>`` at the end. The baseline for bench/startup.py; it imports nothing from this project.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_val = int(0.2 * len(x))
    va, tr = perm[:n_val], perm[n_val:]
    ds = torch.utils.data.TensorDataset(x[tr], y[tr])
    world = ray.train.get_context().get_world_size()
    loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(ds, batch_size=128 // world, shuffle=True, drop_last=True)
    )
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                          nn.Linear(256, 10))
    model = ray.train.torch.prepare_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    rank = ray.train.get_context().get_world_rank()
    first = True
    for epoch in range(config["epochs"]):
        if world > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
            if first and rank == 0:
                print(f"FIRST_STEP {time.time():.3f}", flush=True)
            first = False
        with torch.no_grad():
            acc = (model(x[va]).argmax(1) == y[va]).float().mean().item()
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0:
                torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
            ray.train.report({"epoch": epoch, "val_accuracy": acc},
                             checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--storage", default=None, help="storage path (default: a fresh temporary folder)")
    args = parser.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init()
    storage = args.storage or tempfile.mkdtemp(prefix="bare-digits-")
    trainer = TorchTrainer(train_loop, train_loop_config={"epochs": args.epochs},
                           scaling_config=ScalingConfig(num_workers=args.workers),
                           run_config=RunConfig(name="bare-digits", storage_path=storage))
    result = trainer.fit()
    print(f"DONE {result.metrics.get('val_accuracy')}", flush=True)


if __name__ == "__main__":
    main()
