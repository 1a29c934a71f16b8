# One image per component, for registries' own pipelines:
#   docker build --build-arg COMPONENT=machine-webhook -t kkp-quota-machine-webhook:0.1.0 .
# (or --target machine-webhook). COMPONENT: master-controller | seed-controller | machine-webhook.
# The same static build and the same image contents as `make images` (deploy/images/build.sh):
# only /usr/local/bin/<component>, run as 65532:65532, no shell, no base image.
# deploy/images/build.sh checks that VERSION below and the COPY lines match the workspace.
ARG RUST_VERSION=1.95.0
ARG COMPONENT=machine-webhook
ARG VERSION=0.1.0
ARG SOURCE=https://example.invalid/kkp-quota

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Only what the build reads (never the host's target/ or .fleet/).
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
COPY crds crds/
COPY runtime runtime/
COPY provider-sizes provider-sizes/
COPY master-controller master-controller/
COPY seed-controller seed-controller/
COPY machine-webhook machine-webhook/
COPY e2e e2e/
COPY kubectl-kkp-quota kubectl-kkp-quota/
COPY deploy/images/static-build.sh deploy/images/static-build.sh
RUN deploy/images/static-build.sh

FROM scratch AS master-controller
ARG VERSION
ARG SOURCE
COPY --from=build --chown=0:0 /src/target/x86_64-unknown-linux-gnu/release/master-controller /usr/local/bin/master-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/master-controller"]
LABEL org.opencontainers.image.title=kkp-quota-master-controller \
      org.opencontainers.image.source=${SOURCE} \
      org.opencontainers.image.version=${VERSION}

FROM scratch AS seed-controller
ARG VERSION
ARG SOURCE
COPY --from=build --chown=0:0 /src/target/x86_64-unknown-linux-gnu/release/seed-controller /usr/local/bin/seed-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/seed-controller"]
LABEL org.opencontainers.image.title=kkp-quota-seed-controller \
      org.opencontainers.image.source=${SOURCE} \
      org.opencontainers.image.version=${VERSION}

FROM scratch AS machine-webhook
ARG VERSION
ARG SOURCE
COPY --from=build --chown=0:0 /src/target/x86_64-unknown-linux-gnu/release/machine-webhook /usr/local/bin/machine-webhook
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/machine-webhook"]
LABEL org.opencontainers.image.title=kkp-quota-machine-webhook \
      org.opencontainers.image.source=${SOURCE} \
      org.opencontainers.image.version=${VERSION}

# The stage named by COMPONENT is the image (ENTRYPOINT cannot take a build ARG, so one stage each).
FROM ${COMPONENT}
