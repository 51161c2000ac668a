# sandboxd as a container image.
#
#   docker build -t sandboxd .                    # compile here (needs a registry for the Rust image)
#   docker build --target prebuilt -t sandboxd .  # copy target/release/sandboxd built on the host
#
# The web console (ui/) is embedded in the binary: the builder gets it from
# the `ui` stage (npm from a registry too); for `prebuilt`, run
# scripts/build-ui.sh before `cargo build --release` on the host.
#
# Stage order matters for the classic builder, which builds every stage up
# to the target: `prebuilt` comes before the Rust builder, so machines
# without a registry never need the Rust image.
ARG BASE_IMAGE=debian:bookworm-slim
ARG RUST_IMAGE=rust:1-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

FROM ${BASE_IMAGE} AS base
# A system user without a home or shell. It reaches the engine socket
# through the socket's group, added at run time (compose: group_add with
# DOCKER_GID), never by running as root.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin sandboxd \
 && install -d -m 0700 -o 10001 -g 10001 /var/lib/sandboxd
# The runtime image sources, for operators; sandboxd itself builds the
# runtime image from a copy of the Dockerfile embedded in the binary.
COPY sandbox-images /usr/share/sandboxd/sandbox-images
# The state directory (session tokens) is the user's own; compose mounts a
# named volume there, which starts as a copy of it.
ENV SANDBOXD_BIND_HOST=0.0.0.0 \
    SANDBOXD_PORT=8080 \
    SANDBOXD_STATE_DIR=/var/lib/sandboxd
EXPOSE 8080
USER 10001:10001
HEALTHCHECK --interval=10s --timeout=6s --start-period=5s --retries=3 CMD ["sandboxd", "healthcheck"]
ENTRYPOINT ["sandboxd"]

FROM base AS prebuilt
COPY target/release/sandboxd /usr/local/bin/sandboxd

FROM ${NODE_IMAGE} AS ui
WORKDIR /ui
COPY ui/package.json ui/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY ui/tsconfig.json ui/build.mjs ./
COPY ui/src ./src
RUN npm run build

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
COPY --from=ui /ui/dist ./ui/dist
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY proto ./proto
COPY agent ./agent
COPY sandbox-images ./sandbox-images
# The manifest names the test and bench targets; cargo wants their files.
COPY tests ./tests
COPY bench ./bench
# build.rs builds the agent (statically) and embeds it in sandboxd.
RUN cargo build --release --locked --bin sandboxd && cp target/release/sandboxd /sandboxd

FROM base AS runtime
COPY --from=builder /sandboxd /usr/local/bin/sandboxd
