# agentmesh images: static binaries of the CLI (cmd/agentmesh) and the ack
# monitor (cmd/ackmonitor) on a distroless base.
#
#   docker build -t agentmesh .
#   docker run --rm agentmesh demo                 # the CLI is the entrypoint
#   docker run --rm --entrypoint /usr/local/bin/ackmonitor agentmesh -help

# --- build ---------------------------------------------------------------
FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so source edits do not re-download them.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/agentmesh ./cmd/agentmesh && \
    go build -trimpath -ldflags="-s -w" -o /out/ackmonitor ./cmd/ackmonitor && \
    mkdir -p /out/data

# --- run -----------------------------------------------------------------
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/agentmesh /out/ackmonitor /usr/local/bin/
# The monitor's SQLite ledger (when no PostgreSQL DSN is given) and the dev
# stack's store. Owned by nonroot (65532) in the image, so a new volume
# mounted there starts writable (Docker copies the image's directory and
# its ownership into it); without it the volume's root is root's.
COPY --from=build --chown=65532:65532 /out/data /data
USER nonroot:nonroot
VOLUME ["/data"]
# In a container the dashboard and the dev stack's NATS listen on every
# interface, so `docker run -p` reaches them.
ENV AGENTMESH_DEV_DATA_DIR=/data AGENTMESH_MONITOR_DATA_DIR=/data/ackmonitor \
    AGENTMESH_MONITOR_HTTP_ADDR=0.0.0.0:8281 AGENTMESH_DEV_LISTEN=0.0.0.0:4222
EXPOSE 4222 8281
ENTRYPOINT ["/usr/local/bin/agentmesh"]
CMD ["--help"]
