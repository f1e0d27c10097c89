# feedproc image: `feedproc watch` by default; `feedproc serve`, `migrate` and `work` from the same image.
#   docker build -t feedproc .
#   docker run --rm -e FEEDPROC_DATABASE_URL=postgresql://user@db:5432/feedproc feedproc migrate
#   docker run --rm -e FEEDPROC_DATABASE_URL=... -e FEEDPROC_HANDLER_URL=http://handler:8080/ feedproc
#   docker run --rm -p 8000:8000 -e FEEDPROC_DATABASE_URL=... -e FEEDPROC_API_TOKEN=... \
#              -e FEEDPROC_HEALTH_URL=http://127.0.0.1:8000/healthz feedproc serve --host 0.0.0.0
# The image holds no database: FEEDPROC_DATABASE_URL must be given (it refuses to start without).
# deploy/docker-compose.yml runs PostgreSQL, the migration, two watchers, serve and the example handler.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY feedproc ./feedproc
COPY migrations ./migrations
COPY cmds ./cmds
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[postgres,server]"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 feedproc
COPY --from=build /wheels /wheels
# The wheels are the ones just built (--no-index), so the versions are fixed by this build.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-index --find-links /wheels "feedproc[postgres,server]" && rm -rf /wheels
USER 10001
WORKDIR /home/feedproc
ENV PYTHONUNBUFFERED=1 \
    FEEDPROC_REQUIRE_DATABASE_URL=1 \
    FEEDPROC_HEALTH_URL=http://127.0.0.1:9090/livez
# 8000: feedproc serve (API, dashboard, /healthz); 9090: a watcher's probes and /metrics.
EXPOSE 8000 9090
# The watcher's liveness probe by default; serve sets FEEDPROC_HEALTH_URL to its /healthz.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['FEEDPROC_HEALTH_URL'], timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["feedproc"]
CMD ["watch", "--health-port", "9090", "--metrics-port", "9090", "--monitor-host", "0.0.0.0"]
