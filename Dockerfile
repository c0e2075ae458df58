# gpuoperator's image: the operator and its webhooks in one Python process per replica.
#
#   make image                  # docker build -t gpuoperator:<version> .
#
# The Deployment (config/manager) runs it with a read-only root filesystem, as the numeric
# non-root user below (runAsNonRoot needs a numeric USER to verify), all capabilities
# dropped; the only writable path is /tmp, an emptyDir. Nothing writes elsewhere: no bytecode
# caches at run time (compiled at install), HOME and TMPDIR point into /tmp.

# ---- build: the wheel of this checkout and the wheels of its dependencies -------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuoperator ./gpuoperator
COPY controllers ./controllers
COPY admission ./admission
RUN pip wheel --wheel-dir /wheels .

# ---- run ------------------------------------------------------------------------------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="gpuoperator" \
      org.opencontainers.image.description="GPU catalog for KubeVirt VMs: classes, claims, inventory" \
      org.opencontainers.image.licenses="Apache-2.0"
# A passwd entry for the uid, so tools that look the user up find one; no home, no shell.
RUN groupadd --gid 65532 gpuoperator \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin gpuoperator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels gpuoperator && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TMPDIR=/tmp HOME=/tmp
USER 65532:65532
ENTRYPOINT ["gpuoperator"]
CMD ["run"]
