# The one `tensile` binary, for every component (virtual-node, webhook, descheduler, scheduler).
#   docker build -t registry.example/tensile:0.1.0 .
# The build stage uses the toolchain the workspace asks for (rust-version in Cargo.toml); the
# runtime image has no shell and no package manager, and runs as a non-root user.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml clippy.toml ./
COPY crates crates
COPY deploy deploy
# Without the sandbox (`tensile up`, `sim`, `bench`): no simulator in the image; with jemalloc
# (crates/cli/src/main.rs), whose C this build image compiles (gcc, make).
RUN cargo build --release --locked -p tensile-cli --no-default-features --features jemalloc \
 && install -D target/release/tensile /out/tensile

# glibc, CA certificates, nothing else; the binary links only libc (TLS is rustls).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/tensile /usr/local/bin/tensile
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tensile"]
