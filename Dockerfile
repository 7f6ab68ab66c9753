# The Vigil image: `vigil operator` (the chart's default command) and `vigil-agent`.
#   docker build -t vigil:dev . && kind load docker-image vigil:dev --name vigil
#   helm install vigil charts/vigil -n vigil-system --create-namespace \
#     --set image.repository=vigil --set image.tag=dev
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# A fixed non-root user, matching the chart's runAsUser.
USER 65532:65532
ENTRYPOINT ["vigil"]
CMD ["operator"]
