# One image holding every Tessera binary.
#
# Build stage: the Go toolchain of go.mod's `go` line, on Debian 12 so that
# tessera-node links against the same glibc the runtime stage ships.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
# tessera-scheduler is its own module (scheduler/: kube-scheduler with
# Tessera's plugin, k8s.io/kubernetes kept out of the root go.mod); its
# go.mod replaces the root module with ../, whose go.mod is already here.
COPY scheduler/go.mod scheduler/go.sum scheduler/
RUN cd scheduler && go mod download
COPY . .
ARG VERSION=dev
# Every cmd/ binary (make build), and tessera-scheduler (make scheduler),
# static like every binary but tessera-node.
RUN make build scheduler VERSION=${VERSION}

# Runtime stage: Debian 12 slim for glibc, which tessera-node needs to dlopen
# the driver's libnvidia-ml.so.1 (the NVIDIA container toolkit mounts it in).
# Every other binary is static.
FROM debian:12.12-slim
RUN useradd --system --uid 65532 --no-create-home tessera
COPY --from=build /src/bin/ /usr/local/bin/
# The extender, tessera-scheduler and the simulator run as this user; the
# node agent's DaemonSet runs it as root because it serves sockets in host
# directories.
USER 65532
ENTRYPOINT ["/usr/local/bin/tessera-node"]
