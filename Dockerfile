# Weir in a container: a release build, then a slim runtime image running as the non-root `weir`
# user with the Debian package's paths (/usr/bin/weir, /etc/weir, /var/lib/weir, /var/log/weir).
#   docker build -t weir .
#   docker run --rm --stop-timeout 35 -p 9080:9080 \
#     -v "$PWD/my-resources.yaml:/etc/weir/conf/resources.yaml:ro" weir
# A graceful stop lets in-flight requests finish for up to 30 s: give Docker more than that
# (its default is 10 s). The access log goes to standard output, as nginx's image does.
# See docs/operations.md.

FROM rust:1.88-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin weir \
 && strip target/release/weir

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 weir \
 && useradd --system --uid 10001 --gid weir --home-dir /var/lib/weir --no-create-home --shell /usr/sbin/nologin weir \
 && install -d -o weir -g weir -m 0750 /var/lib/weir /var/log/weir \
 && ln -s /dev/stdout /var/log/weir/access.log \
 && install -d -m 0755 /etc/weir/conf \
 && ln -s /var/lib/weir /etc/weir/data \
 && ln -s /var/log/weir /etc/weir/logs
COPY --from=build /src/target/release/weir /usr/bin/weir
COPY debian/config.yaml debian/resources.yaml /etc/weir/conf/
# Persist plugin data (short-url's SQLite database) outside the container. The weir user has
# the fixed uid/gid 10001, for bind mounts.
VOLUME ["/var/lib/weir"]
USER weir
# Data plane. The exporter (9091) and the control server (9090) listen on loopback inside the
# container; publish the exporter by setting plugin_attr.prometheus.export_addr.ip to 0.0.0.0.
EXPOSE 9080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/weir", "-p", "/etc/weir"]
