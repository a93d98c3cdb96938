# syntax=docker/dockerfile:1
# Build stage: compile magpie in release mode.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so that source edits do not refetch them.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin magpie \
    && strip target/release/magpie

# Runtime stage: a small Debian with only the binary and CA-free TCP needs.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin magpie \
    && mkdir -p /etc/magpie
COPY --from=build /src/target/release/magpie /usr/local/bin/magpie
COPY config/magpie.yaml /etc/magpie/magpie.yaml
USER magpie
# Proxy and admin ports of the example config; change them with your config.
EXPOSE 7000 9090
# SIGTERM drains open connections for shutdown_grace, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/magpie"]
CMD ["run", "--config", "/etc/magpie/magpie.yaml"]
