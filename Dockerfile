# Planaria image: the operator (`planaria operator`) and the agent (`planaria agent`) share it.
#
#   docker build -t planaria:cpu .                            # CPU build (gloo)
#   docker build -t planaria:cuda --build-arg TORCH=cuda .    # GPU build (NCCL, CUDA torch)
#
# The runtime stage runs as a non-root numeric user (10001, the Helm chart's runAsUser) and writes
# nothing outside /tmp, so it works with readOnlyRootFilesystem: true when /tmp (and /dev/shm
# for snapshots) are emptyDir volumes: HOME, every cache and temporary file point there, and
# bytecode is compiled at build time and never written at run time.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH=cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/planaria
ENV PATH=/opt/planaria/bin:$PATH
# torch first and pinned: an unpinned torch pulls the CUDA build even for the CPU image.
RUN if [ "$TORCH" = "cpu" ]; then \
        pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0; \
    elif [ "$TORCH" = "cuda" ]; then \
        pip install torch==2.13.0; \
    else \
        echo "TORCH must be cpu or cuda, got '$TORCH'" >&2; exit 2; \
    fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY agent ./agent
COPY protos ./protos
# torch's own test helpers include a Python 3.12-only file (torch/testing/_internal/
# py312_intrinsics.py) that compileall cannot compile on 3.11, and nothing imports them at run
# time: they are skipped instead of failing the build.
# The hf extra (tokenizers, Parquet, transformers, safetensors): bring-your-own models and data.
RUN pip install ".[hf]" && python -c "import planaria.cli.main" \
    && python -m compileall -q -x '/torch/testing/_internal/' /opt/planaria

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="planaria" \
      org.opencontainers.image.description="Planaria operator and training agent" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 planaria \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin planaria
COPY --from=build /opt/planaria /opt/planaria
ENV PATH=/opt/planaria/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["planaria"]
CMD ["--help"]
