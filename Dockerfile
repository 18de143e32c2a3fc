# syntax=docker/dockerfile:1
# The kvroute control plane image: a static Go binary on distroless, running as the
# distroless "nonroot" user (65532), which manifests/base/deployment.yaml also requires.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t ghcr.io/kvroute/kvroute-controlplane:0.1.0 --push .
#
# Then point the Deployment at it (manifests/README.md, "Images"). The filter is not built
# here: `make oci` packages it as its own OCI image.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Dependencies first, so that source edits reuse the module download layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS TARGETARCH
# CGO off: the ZMQ client is pure Go (go-zeromq), and a static binary needs no libc.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/kvroute-controlplane ./controlplane/cmd/kvroute-controlplane

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvroute-controlplane /kvroute-controlplane
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/kvroute-controlplane"]
# The binary's default listen address is loopback; in a pod it must be all interfaces.
CMD ["--listen=0.0.0.0:8080"]
