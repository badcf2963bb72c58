# hypura, CPU build. Serves on port 11434 (all interfaces inside the container).
#
#   docker build -t hypura .
#   docker run --rm -p 11434:11434 -e HYPURA_API_KEY=change-me hypura   # SmolLM2, fetched on first start
#   docker run --rm -p 11434:11434 -e HYPURA_API_KEY=change-me -v /srv/models:/models:ro hypura serve --host 0.0.0.0 /models
#
# Listening on all interfaces needs an API key (HYPURA_API_KEY), or
# --insecure-no-auth for a trusted network. Models are only read (mount them read-only); downloads (`/api/pull`) and the
# default model go to the volume /var/lib/hypura. `docker stop` sends SIGTERM:
# in-flight requests get --shutdown-grace (default 30 s) — give `docker stop -t 40`.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The same prerequisites as the README's commands (cmake, make, g++, libclang-dev, …).
RUN ./scripts/install-deps.sh
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p hypura && cp target/release/hypura /usr/local/bin/hypura

FROM debian:bookworm-slim
# libgomp1: ggml's OpenMP threads; ca-certificates: pulls over https.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /var/lib/hypura --create-home --shell /usr/sbin/nologin hypura
COPY --from=build /usr/local/bin/hypura /usr/local/bin/hypura
ENV HOME=/var/lib/hypura \
    HYPURA_CACHE_DIR=/var/lib/hypura/cache \
    HYPURA_MODELS_DIR=/var/lib/hypura/models
VOLUME /var/lib/hypura
USER hypura
EXPOSE 11434
STOPSIGNAL SIGTERM
ENTRYPOINT ["hypura"]
CMD ["serve", "--host", "0.0.0.0"]
