# elastic-train's image: Ray, torch and the project, installed exactly as `make install` does
# (scripts/install.sh under constraints.txt), run by a non-root user. The cluster launcher YAMLs and the
# KubeRay manifests run it; its name is defined once, in cluster/image.env.
#
#   docker build -t elastic-train:cpu .                                                    # CPU torch
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t "$IMAGE" .   # CUDA
#   docker build --build-arg RAY_VERSION=2.57.1 --build-arg MLFLOW_VERSION=3.10.1 -t "$IMAGE" .     # a cluster's
#   docker run --rm --shm-size=2g elastic-train:cpu       # trains configs/digits.yaml on an embedded Ray
#
# No secrets are built in: the Ray token, MLflow credentials and cloud keys come from the environment
# (or mounted files) at run time.

# Debian 12 with Python 3.11, like the dev venv. Add the digest (@sha256:...) when you publish images.
FROM python:3.11.14-slim-bookworm

# Which torch build scripts/install.sh installs: CPU wheels by default, a CUDA index for GPU images (the
# wheels carry their CUDA runtime; the host needs only the NVIDIA driver and container toolkit).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
# A Ray job's Ray must equal its cluster's: empty takes the newest tested set (constraints.txt), a version
# installs that Ray / MLflow (inside pyproject.toml's range), as `make install RAY_VERSION=...` does.
ARG RAY_VERSION=""
ARG MLFLOW_VERSION=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    RAY_USAGE_STATS_ENABLED=0 \
    RAY_AUTH_MODE=token

# rsync: the Ray cluster launcher syncs files into the container with it; ssh: the head's autoscaler
# reaches the worker machines. Versions follow the pinned Debian release (its security updates included).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends rsync openssh-client \
 && rm -rf /var/lib/apt/lists/*

# uid 1000, like Ray's own images. The venv is the user's, so a launcher's head_setup_commands can add a
# cloud SDK (boto3, google-api-python-client) without root.
RUN useradd --create-home --uid 1000 --shell /bin/bash ray \
 && python -m venv "$VIRTUAL_ENV" \
 && mkdir /app \
 && chown ray:ray "$VIRTUAL_ENV" /app
USER 1000:1000
WORKDIR /app

# Dependencies first, from the files that decide them, so a code change does not reinstall torch. Empty
# stand-ins for README and the packages let the editable install map them; the real code lands next.
COPY --chown=ray:ray pyproject.toml constraints.txt constraints-oldest.txt ./
COPY --chown=ray:ray scripts/ scripts/
RUN touch README.md \
 && mkdir elastic_train jobs tracking \
 && touch elastic_train/__init__.py jobs/__init__.py tracking/__init__.py \
 && TORCH_INDEX_URL="$TORCH_INDEX_URL" TORCH_VERSION="$TORCH_VERSION" RAY_VERSION="$RAY_VERSION" \
    MLFLOW_VERSION="$MLFLOW_VERSION" scripts/install.sh "$VIRTUAL_ENV/bin/python"

# The code (read-only for the user: it owns only the venv and its home).
COPY . .

CMD ["python", "-m", "jobs.train", "--config", "configs/digits.yaml"]
