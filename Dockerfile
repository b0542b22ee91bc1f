# syntax=docker/dockerfile:1
#
# The `kpm` binary (crate kpm-cli) in a small runtime image, as
# deploy/run and deploy/doctor run it. From the repository root:
#
#   docker build -t ghcr.io/kpm-rs/kpm:0.1.0 .
#
# Without Docker or a registry, `cargo xtask image` builds an image of the
# same binary as an archive to load into containerd, podman or Docker
# (docs/operations.md, "Build the image").
#
# The tag is the workspace version (Cargo.toml); update the image of
# deploy/run/daemonset.yaml and deploy/doctor/daemonset.yaml with it
# (`cargo xtask deploy` checks it). The build needs crates.io and nothing else:
# the gRPC code is checked in (crates/kpm-api/src/gen), so no protoc.

# rust-version in Cargo.toml (`cargo xtask tidy` checks it); the full image
# has the C toolchain and make that jemalloc's build needs.
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kpm-cli \
    && install -D target/release/kpm /out/kpm

# glibc and libgcc, which the binary links against, and nothing else.
FROM gcr.io/distroless/cc-debian12
COPY --from=build /out/kpm /usr/local/bin/kpm
ENTRYPOINT ["/usr/local/bin/kpm"]
CMD ["run"]
