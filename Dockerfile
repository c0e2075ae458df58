# gpuoperator's image: the operator and its webhooks in one Python process per replica.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuoperator ./gpuoperator
COPY controllers ./controllers
COPY admission ./admission
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin gpuoperator
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["gpuoperator"]
CMD ["run"]
