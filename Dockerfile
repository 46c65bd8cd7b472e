# pathmend node plugin image.
#
# Build stage: a static binary (no cgo), version stamped with ldflags. The
# same command is what `make build` runs, so CI exercises it without a
# Docker engine.
FROM golang:1.26-bookworm AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pathmend ./cmd/pathmend

# Runtime: what NodeStage runs on the host's behalf — mkfs/fsck/resize for
# ext4 and xfs (e2fsprogs, xfsprogs), mount/umount/blkid (util-linux, mount).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends e2fsprogs xfsprogs util-linux mount ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/pathmend /usr/local/bin/pathmend
ENTRYPOINT ["/usr/local/bin/pathmend"]
CMD ["serve"]
