# gpuoperator's image: the operator and its webhooks in one Python process per replica.
#
#   make image                  # Docker where its daemon answers, podman (buildah) otherwise
#   docker build --build-arg BASE=<image> .   # another base with Python 3.11 and venv
#
# BASE is python:3.11-slim for users; on machines that reach no image registry, make image
# builds a base from Debian packages (hack/image/base.sh: Debian's python3 and python3-venv).
# Both bases get the same layout: a venv at /opt/gpuoperator (Debian's system Python is
# externally managed), filled only from requirements/runtime.txt with --require-hashes, so
# the wheel set is the lock's, and then gpuoperator's own wheel built from this checkout.
#
# The Deployment (config/manager) runs it with a read-only root filesystem, as the numeric
# non-root user below (runAsNonRoot needs a numeric USER to verify), all capabilities
# dropped; the only writable path is /tmp, an emptyDir. Nothing writes elsewhere: bytecode
# is compiled at build time and never written at run time, HOME and TMPDIR point into /tmp.
ARG BASE=python:3.11-slim

# ---- build: the venv, from the lock, plus this checkout's wheel ------------------------------
FROM ${BASE} AS build
# A CA bundle for pip, when the build machine reaches PyPI through a proxy of its own (make
# image mounts the host's PIP_CERT for the build only); unset by default.
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
RUN python3 -m venv /opt/build && python3 -m venv /opt/gpuoperator
COPY requirements/build.txt requirements/runtime.txt /src/requirements/
# Wheels only (no sdist is built), each checked against the lock's hashes.
RUN /opt/build/bin/pip install --require-hashes --no-deps --only-binary=:all: \
      -r /src/requirements/build.txt \
    && /opt/gpuoperator/bin/pip install --require-hashes --no-deps --only-binary=:all: \
      -r /src/requirements/runtime.txt
COPY pyproject.toml README.md /src/
COPY gpuoperator /src/gpuoperator
COPY controllers /src/controllers
COPY admission /src/admission
# --no-deps: the dependencies are the lock's, installed above; pip check proves they suffice.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src \
    && /opt/gpuoperator/bin/pip install --no-deps --no-index /wheels/gpuoperator-*.whl \
    && /opt/gpuoperator/bin/pip check \
    && /opt/gpuoperator/bin/pip uninstall --yes pip setuptools \
    && /opt/gpuoperator/bin/python -m compileall -q /opt/gpuoperator/lib

# ---- run ------------------------------------------------------------------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="gpuoperator" \
      org.opencontainers.image.description="GPU catalog for KubeVirt VMs: classes, claims, inventory" \
      org.opencontainers.image.licenses="Apache-2.0"
# A passwd entry for the uid, so tools that look the user up find one; no home, no shell.
RUN groupadd --gid 65532 gpuoperator \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin gpuoperator
COPY --from=build /opt/gpuoperator /opt/gpuoperator
ENV PATH=/opt/gpuoperator/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TMPDIR=/tmp HOME=/tmp
USER 65532:65532
ENTRYPOINT ["gpuoperator"]
CMD ["run"]
