# Planaria image: the operator (`planaria operator`) and the agent (`planaria agent`) share it.
#
#   docker build -t planaria:cpu .                            # CPU build (gloo)
#   docker build -t planaria:cuda --build-arg TORCH=cuda .    # GPU build (NCCL, CUDA torch)
#
# The runtime stage runs as a non-root numeric user (10001, the Helm chart's runAsUser) and writes
# nothing outside /tmp, so it works with readOnlyRootFilesystem: true when /tmp (and /dev/shm
# for snapshots) are emptyDir volumes: HOME, every cache and temporary file point there, and
# bytecode is compiled at build time and never written at run time.
#
# Mirrors and air-gapped builds (docs/kubernetes.md, "Building the image"), all optional:
#   PYTHON_IMAGE     the base of both stages: any Debian-like image with python3 (3.11+) and its
#                    venv module, groupadd and useradd (scripts/build-image.sh passes a
#                    debootstrapped bookworm)
#   INDEX_URL        the package index (a PyPI mirror); `none`: find-links only (--no-index)
#   TORCH_INDEX_URL  where torch comes from (the CPU index for TORCH=cpu, else INDEX_URL);
#                    `none`: find-links only
#   EXTRA_INDEX_URL  more indexes, space-separated
#   FIND_LINKS       wheel folders or pages, space-separated (a folder must exist in the build,
#                    e.g. `buildah bud -v /opt/wheels:/opt/wheels:ro`)
#   CA_BUNDLE        PEM text of CAs pip trusts besides the base image's (a mirror's or an
#                    intercepting proxy's): --build-arg CA_BUNDLE="$(cat ca.pem)"
# They configure pip in the deps and build stages only; none of them reaches the runtime stage.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The dependency list (project.dependencies and the hf extra), alone in a file: the dependencies
# layer below is rebuilt when that list changes, not on every edit of pyproject.toml.
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["hf"]))' >/requirements.txt

# The virtual environment with every dependency, byte-compiled and trimmed: rebuilt only when
# the dependency list, the build arguments or this file change, never for a change to the code.
FROM ${PYTHON_IMAGE} AS deps
ARG TORCH=cpu
ARG INDEX_URL=https://pypi.org/simple
ARG TORCH_INDEX_URL=
ARG EXTRA_INDEX_URL=
ARG FIND_LINKS=
ARG CA_BUNDLE=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONFIG_FILE=/etc/planaria-build-pip.conf
# pip's configuration from the build arguments, in one file the build stages' pip reads.
RUN set -eu; conf="$PIP_CONFIG_FILE"; echo "[global]" >"$conf"; \
    if [ "$INDEX_URL" = none ]; then echo "no-index = true" >>"$conf"; \
    else echo "index-url = $INDEX_URL" >>"$conf"; fi; \
    if [ -n "$EXTRA_INDEX_URL" ]; then echo "extra-index-url = $EXTRA_INDEX_URL" >>"$conf"; fi; \
    if [ -n "$FIND_LINKS" ]; then echo "find-links = $FIND_LINKS" >>"$conf"; fi; \
    if [ -n "$CA_BUNDLE" ]; then \
        cat /etc/ssl/certs/ca-certificates.crt >"${conf%.conf}-ca.pem" 2>/dev/null || true; \
        printf '%s\n' "$CA_BUNDLE" >>"${conf%.conf}-ca.pem"; \
        echo "cert = ${conf%.conf}-ca.pem" >>"$conf"; \
    fi
# Planaria itself goes to /opt/planaria/app (the build stage), on the venv's path through a .pth.
RUN python3 -m venv /opt/planaria \
    && echo /opt/planaria/app >"$(/opt/planaria/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/planaria-app.pth"
ENV PATH=/opt/planaria/bin:$PATH
# torch first and pinned: an unpinned torch pulls the CUDA build even for the CPU image, and the
# CPU pin names the +cpu build so that no mirror can substitute a CUDA wheel for it.
RUN set -eu; \
    if [ "$TORCH" = "cpu" ]; then \
        wheel="torch==2.13.0+cpu"; index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"; \
    elif [ "$TORCH" = "cuda" ]; then \
        wheel="torch==2.13.0"; index="$TORCH_INDEX_URL"; \
    else \
        echo "TORCH must be cpu or cuda, got '$TORCH'" >&2; exit 2; \
    fi; \
    if [ "$index" = none ]; then set -- --no-index; \
    elif [ -n "$index" ]; then set -- --index-url "$index"; \
    else set --; fi; \
    pip install "$@" "$wheel"
COPY --from=requirements /requirements.txt /src/requirements.txt
# torch's own test helpers include a Python 3.12-only file (torch/testing/_internal/
# py312_intrinsics.py) that compileall cannot compile on 3.11, and nothing imports them at run
# time: they are skipped instead of failing the build.
# The hf extra (tokenizers, Parquet, transformers, safetensors): bring-your-own models and data.
RUN pip install -r /src/requirements.txt \
    && python -m compileall -q -x '/torch/testing/_internal/' /opt/planaria
# What the torch wheel carries for C++ and for its own tests, unused at run time (about 190 MB):
# C++ headers (torch.utils.cpp_extension and inductor's C++ backend need them, and a compiler,
# which the image has never had), C++ test binaries, protoc. torch_shm_manager stays (tensor
# sharing between processes).
RUN torch="$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))')" \
    && rm -rf "$torch/include" "$torch/test" \
    && find "$torch/bin" -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} + \
    && python -c "import torch; torch.ones(2).sum()"

# Planaria alone (its dependencies are the venv's) in /opt/planaria/app: the only part a change
# to the code rebuilds. pip's own bytecode would name its temporary folder as the source files'
# place (tracebacks), so compileall writes it where the files end up.
FROM deps AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY agent ./agent
COPY protos ./protos
RUN pip install --no-deps --no-compile --target /opt/planaria/app . \
    && python -m compileall -q /opt/planaria/app \
    && python -c "import planaria.cli.main" && pip check

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="planaria" \
      org.opencontainers.image.description="Planaria operator and training agent" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 planaria \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin planaria
# The venv (the dependencies: cached while they are) and Planaria, in two layers.
COPY --from=deps /opt/planaria /opt/planaria
COPY --from=build /opt/planaria/app /opt/planaria/app
ENV PATH=/opt/planaria/app/bin:/opt/planaria/bin:$PATH \
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
