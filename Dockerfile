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
    go build -trimpath -ldflags="-s -w" -o /out/ackmonitor ./cmd/ackmonitor

# --- run -----------------------------------------------------------------
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/agentmesh /out/ackmonitor /usr/local/bin/
USER nonroot:nonroot
# The monitor's SQLite ledger (when no PostgreSQL DSN is given) and the dev stack's store.
VOLUME ["/data"]
ENV AGENTMESH_DEV_DATA_DIR=/data AGENTMESH_MONITOR_DATA_DIR=/data/ackmonitor
EXPOSE 8222
ENTRYPOINT ["/usr/local/bin/agentmesh"]
CMD ["--help"]
