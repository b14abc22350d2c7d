"""compat/torch_backend.py: the Train controller unpickles the run's backend config without importing torch, and
the config says what Ray's own TorchConfig says. The worker-side half is every distributed test's process group
(tests/distributed: 2 gloo workers, bitwise against 1)."""

from __future__ import annotations

import pickle
import subprocess
import sys

from elastic_train.compat.torch_backend import LightTorchConfig, light
from tests.conftest import ROOT


def test_a_controller_unpickles_the_config_and_builds_its_backend_without_torch():
    blob = pickle.dumps(LightTorchConfig(backend="gloo"))
    code = ("import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); b = c.backend_cls();"
            " c.train_func_context; c.framework;"
            " print(c.backend, b.share_cuda_visible_devices, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["gloo", "True", "False"]


def test_the_config_matches_rays_and_hands_it_what_the_copy_does_not_cover():
    from ray.train.torch.config import TorchConfig

    ours, ray_s = LightTorchConfig(backend="nccl", timeout_s=60), TorchConfig(backend="nccl", timeout_s=60)
    assert ours.to_dict() == ray_s.to_dict() and ours.framework == ray_s.framework
    assert ours.ray_config() == ray_s
    assert LightTorchConfig().to_dict() == TorchConfig().to_dict()  # same defaults

    class V2Group:  # what `light` asks of a worker group: Ray Train V2's has a worker-group context
        def get_worker_group_context(self):
            return None

    assert light(LightTorchConfig(backend="gloo"), V2Group()) and light(LightTorchConfig(backend="nccl"), V2Group())
    assert not light(LightTorchConfig(backend="tpu_dist"), V2Group())
    assert not light(LightTorchConfig(backend="gloo", init_method="tcp"), V2Group())
    assert not light(LightTorchConfig(backend="gloo"), object())  # a V1 group
