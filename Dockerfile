# syntax=docker/dockerfile:1
# amdgpu-exporter container image, for sites that build with Docker.
#
#   docker build -t amdgpu-exporter:0.1.0 .
#   docker run -d -p 9442:9442 amdgpu-exporter:0.1.0
#
# The reference image is the one `make image` builds from Debian packages without a container
# engine (deploy/image/build.py; README.md, "Container image"): this file makes the same image with
# Docker: the same Debian suite and pinned packages (deploy/image/debian-packages.txt), the same
# locked wheels, the same user, entrypoint, labels and healthcheck. tests/integration/
# test_oci_image.py and test_dockerfile.py hold the two equal; test_dockerfile.py also lints this
# file with hadolint and replays its Python install steps on the host.
#
# The exporter only reads sysfs, which is world-readable, and a container's /sys shows the host's
# GPUs: no volume, device or capability is needed (--read-only --tmpfs /tmp --cap-drop=ALL is fine).
# deploy/kubernetes/daemonset.yaml runs the image with the same arguments as CMD below (a test keeps
# the two identical).

# Stage 1: pip fetches every locked wheel (checked against the hashes in requirements/runtime.lock)
# and builds the exporter's own with the locked setuptools, so stage 2 needs no index and no build
# tooling (add a compiler here, not there, if a dependency ever ships no wheel). The builder gets a
# venv of its own: nothing is installed into the base image's Python.
FROM debian:sid-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.14.8-1 python3-venv=3.14.8-1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY requirements/build.lock requirements/runtime.lock ./requirements/
COPY exporter ./exporter
RUN python3 -m venv /opt/builder \
 && /opt/builder/bin/pip install --require-hashes -r requirements/build.lock \
 && /opt/builder/bin/pip wheel --require-hashes --wheel-dir /wheels -r requirements/runtime.lock \
 && /opt/builder/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && cp requirements/runtime.lock /wheels/

# Stage 2: the runtime. No compiler, no pip cache, no wheels left behind.
FROM debian:sid-slim
LABEL org.opencontainers.image.title="amdgpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for AMD Instinct GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ROCM_PATH=/opt/rocm

# librocm_smi64 (6.4) for --source=rocm-smi and auto, amd-smi (libamd_smi and the amdsmi module)
# for --source=amd-smi. pyrsmi loads $ROCM_PATH/lib/librocm_smi64.so and the library loads
# libdrm_amdgpu.so; Debian ships both only under their versioned names.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.14.8-1 python3-venv=3.14.8-1 \
    librocm-smi64-1=6.4.1-1.1 amd-smi=10.1-1 libamd-smi27=10.1-1 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/rocm/lib \
 && ln -s /usr/lib/x86_64-linux-gnu/librocm_smi64.so.1 /opt/rocm/lib/librocm_smi64.so \
 && ln -s libdrm_amdgpu.so.1 /usr/lib/x86_64-linux-gnu/libdrm_amdgpu.so

# The wheels come in through a bind mount, so no layer keeps a copy of them. --no-index: the
# runtime stage installs exactly what stage 1 fetched: the locked versions (their hashes checked
# once more), then the exporter without resolving anything, then pip check that they fit. Debian's
# amd-smi installs the `amdsmi` module alone in /usr/share/amd_smi: a .pth file adds that folder to
# the venv's path, for --source=amd-smi.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv /opt/amdgpu-exporter \
 && /opt/amdgpu-exporter/bin/pip install --no-index --find-links=/wheels --require-hashes -r /wheels/runtime.lock \
 && /opt/amdgpu-exporter/bin/pip install --no-index --no-deps /wheels/amdgpu_exporter-*.whl \
 && /opt/amdgpu-exporter/bin/pip check \
 && /opt/amdgpu-exporter/bin/python -c "import site; open(site.getsitepackages()[0] + '/debian-amdsmi.pth', 'w').write('/usr/share/amd_smi\\n')"

# 65534 = nobody in Debian. Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 65534:65534
EXPOSE 9442
# slim has no curl: ask /healthz with the venv's own Python.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/opt/amdgpu-exporter/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9442/healthz', timeout=4)"]
ENTRYPOINT ["/opt/amdgpu-exporter/bin/amdgpu-exporter"]
CMD ["--web.listen-address=:9442", "--log.format=json"]
