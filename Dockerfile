# syntax=docker/dockerfile:1
#
# fdb-etcd with FoundationDB support (build tag fdb), linked against the
# official FoundationDB 7.3 client library. Build it with `make docker`; the
# same steps run outside Docker as `make fdb-clients build-fdb`.

ARG GO_VERSION=1.26
ARG FDB_VERSION=7.3.63

# ---- build: Go toolchain + libfdb_c and its headers from the official
# foundationdb-clients package; cgo links the binary against libfdb_c.
FROM golang:${GO_VERSION}-bookworm AS build
ARG FDB_VERSION
ARG VERSION=dev
WORKDIR /src
COPY Makefile ./
RUN make fdb-clients FDB_VERSION=${FDB_VERSION}
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build-fdb BIN=/out VERSION=${VERSION} && /out/fdb-etcd --version

# ---- runtime: glibc (libfdb_c needs it), the client library, fdbcli for
# operators, the binary; nothing else, and no root.
FROM debian:bookworm-slim AS runtime
ARG FDB_VERSION
LABEL org.opencontainers.image.title="fdb-etcd" \
      org.opencontainers.image.description="etcd v3 API server over FoundationDB" \
      io.foundationdb.client-version="${FDB_VERSION}"
COPY --from=build /usr/lib/libfdb_c.so /usr/lib/libfdb_c.so
COPY --from=build /usr/bin/fdbcli /usr/bin/fdbcli
COPY --from=build /out/fdb-etcd /usr/local/bin/fdb-etcd
RUN ldconfig \
 && groupadd --system --gid 65532 fdb-etcd \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/fdb-etcd --shell /usr/sbin/nologin fdb-etcd \
 && mkdir -p /var/lib/fdb-etcd /var/fdb \
 && chown 65532:65532 /var/lib/fdb-etcd /var/fdb
USER 65532:65532
WORKDIR /var/lib/fdb-etcd
# 2379: etcd client API (gRPC + /health on one port); 2381: /metrics, /health, /livez, /readyz.
EXPOSE 2379 2381
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/fdb-etcd", "healthcheck", "--url", "http://127.0.0.1:2381/health"]
ENTRYPOINT ["/usr/local/bin/fdb-etcd"]
CMD ["--data-dir=/var/lib/fdb-etcd", "--listen-client-urls=http://0.0.0.0:2379", "--listen-metrics-urls=http://0.0.0.0:2381"]
