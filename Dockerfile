# syntax=docker/dockerfile:1
#
# One Dockerfile, two images:
#   docker build --target api    -t grpo-service:api    .   # REST API; also runs `grpo-service migrate`
#   docker build --target worker -t grpo-service:worker .   # Celery GPU training worker
#
# torch is a dependency of the package (pyproject.toml), so both images contain it. The API never
# imports it; its image gets the much smaller CPU-only wheel. The worker gets the default PyPI
# wheel, which bundles CUDA on linux/amd64 (override TORCH_INDEX_URL to choose another build).
#
# Why an editable install: service/core/migrate.py finds Alembic's scripts at
# Path(service/__file__).parent.parent / "migrations", and migrations/ is not a Python package, so
# a plain `pip install .` would put `service` in site-packages and lose migrations/. The source
# tree therefore lives at /app and is installed with `pip install -e .` (the package imports from
# /app/service, and /app/migrations sits next to it).

ARG PYTHON_IMAGE=python:3.11-slim
ARG TORCH_SPEC="torch>=2.6,<2.14"

# ------------------------------------------------------------------------------------------ base
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false \
    GRPO_DATA_DIR=/var/lib/grpo \
    HF_HOME=/var/lib/grpo/hf
# bubblewrap sandboxes python verifiers (without it they are refused). A fixed non-root uid:
# the verifier sandbox's RLIMIT_NPROC only binds a non-root user.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home --home-dir /home/grpo --shell /usr/sbin/nologin grpo \
 && mkdir -p /var/lib/grpo \
 && chown grpo:grpo /var/lib/grpo
WORKDIR /app

# ------------------------------------------------------------------------------- build: shared
FROM base AS build
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --upgrade pip
COPY pyproject.toml README.md ./
# The client (grpo-client, a dependency of the package that is not on PyPI) is installed from
# its folder, beside the other runtime dependencies.
COPY service/client/ service/client/
# The runtime dependencies, read from pyproject.toml, in their own layer (cached across code edits).
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
    > /tmp/requirements.txt

# --------------------------------------------------------------------------- build: API (CPU torch)
FROM build AS build-api
ARG TORCH_SPEC
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}" \
 && pip install ./service/client -r /tmp/requirements.txt
COPY . .
RUN pip install --no-deps -e .

# ------------------------------------------------------------------------ build: worker (CUDA torch)
FROM build AS build-worker
ARG TORCH_SPEC
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}" \
 && pip install ./service/client -r /tmp/requirements.txt
COPY . .
RUN pip install --no-deps -e .

# ------------------------------------------------------------------------------------------- api
FROM base AS api
COPY --from=build-api /opt/venv /opt/venv
COPY --from=build-api /app /app
ENV PATH=/opt/venv/bin:$PATH
USER grpo
EXPOSE 8000
# Migrations (run once per release, before the API): docker run --rm grpo-service:api grpo-service migrate
CMD ["grpo-service", "api", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------------------------------- worker
FROM base AS worker
COPY --from=build-worker /opt/venv /opt/venv
COPY --from=build-worker /app /app
ENV PATH=/opt/venv/bin:$PATH
USER grpo
# One job at a time (celery -c 1, a fresh child per job); on SIGTERM Celery shuts down warm,
# letting the running job go on until the stop grace period ends.
CMD ["grpo-service", "worker"]
