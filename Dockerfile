# feedproc watcher image: runs `feedproc watch` against FEEDPROC_DATABASE_URL and FEEDPROC_HANDLER_URL.
#   docker build -t feedproc .
#   docker run --rm -e FEEDPROC_DATABASE_URL=postgresql://user@db:5432/feedproc \
#              -e FEEDPROC_HANDLER_URL=http://handler:8080/ feedproc
# Run `feedproc migrate` once (`docker run --rm -e FEEDPROC_DATABASE_URL=... feedproc migrate`) first.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY feedproc ./feedproc
COPY migrations ./migrations
COPY cmds ./cmds
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[postgres]"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 feedproc
COPY --from=build /wheels /wheels
# The wheels are the ones just built (--no-index), so the versions are fixed by this build.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-index --find-links /wheels "feedproc[postgres]" && rm -rf /wheels
USER 10001
WORKDIR /home/feedproc
ENV PYTHONUNBUFFERED=1 \
    FEEDPROC_DATABASE_URL=sqlite:////home/feedproc/feedproc.db \
    FEEDPROC_HANDLER_URL=http://127.0.0.1:8080/
STOPSIGNAL SIGTERM
ENTRYPOINT ["feedproc"]
CMD ["watch"]
