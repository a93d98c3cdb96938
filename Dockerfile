# syntax=docker/dockerfile:1
# Build stage: a static magpie (musl), dependencies in their own cached layer.
FROM rust:1.95-slim-bookworm AS build
ARG TARGET=x86_64-unknown-linux-musl
# musl-gcc: ring and jemalloc compile C for the musl target.
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "$TARGET"
WORKDIR /src

# Dependencies: the real manifests and lock file with dummy crates. This
# layer is rebuilt only when a Cargo.toml or Cargo.lock changes. The
# manifests name [[bench]] targets, so their files must exist (empty: `cargo
# build` does not compile benches).
COPY Cargo.toml Cargo.lock ./
COPY crates/core/Cargo.toml crates/core/
COPY crates/proxy/Cargo.toml crates/proxy/
COPY crates/lab/Cargo.toml crates/lab/
RUN mkdir -p src crates/core/src crates/core/benches crates/proxy/src crates/proxy/benches crates/lab/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch crates/core/src/lib.rs crates/proxy/src/lib.rs crates/lab/src/lib.rs \
       crates/core/benches/placement.rs crates/core/benches/usage_scan.rs \
       crates/proxy/benches/session_store.rs \
    && cargo build --release --locked --target "$TARGET" -p magpie \
    && rm -rf src crates

# magpie itself. COPY keeps the files' own times, which may be older than the
# dummy build: touch them so that cargo rebuilds the crates.
COPY src ./src
COPY crates ./crates
RUN touch src/main.rs crates/*/src/lib.rs \
    && cargo build --release --locked --target "$TARGET" --bin magpie \
    && strip "target/$TARGET/release/magpie" \
    && cp "target/$TARGET/release/magpie" /magpie

# Runtime stage: nothing but the binary and its config. No shell, no libc:
# the health check is magpie's own `probe` command, in exec form.
FROM scratch
COPY --from=build /magpie /usr/local/bin/magpie
COPY config/container.yaml /etc/magpie/magpie.yaml
USER 10001:10001
# Proxy and admin ports of config/container.yaml; change them with your config.
EXPOSE 7000 9090
# SIGTERM drains open connections for shutdown_grace, then exits 0.
STOPSIGNAL SIGTERM
# Healthy while the admin endpoint answers /readyz with 200: a table is
# published and at least one backend is up.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/magpie", "probe", "http://127.0.0.1:9090/readyz"]
ENTRYPOINT ["/usr/local/bin/magpie"]
CMD ["run", "--config", "/etc/magpie/magpie.yaml"]
