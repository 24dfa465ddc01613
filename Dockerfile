# AutoCompress daemon image (CPU; mount GPUs with --gpus all on a CUDA host
# and the daemon finds them through the driver at run time).
#
# Inside the container the daemon listens on 0.0.0.0 (so -p can reach it),
# and therefore requires a token: it refuses to start without one. Give it
# with AUTOCOMPRESS_TOKEN (at least 16 characters) and publish on loopback:
#   docker run -e AUTOCOMPRESS_TOKEN=$(openssl rand -hex 24) -p 127.0.0.1:8321:8321 \
#     -v /srv/models:/srv/models autocompress
FROM debian:12 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential pkg-config libjansson-dev libsqlite3-dev libuv1-dev libmicrohttpd-dev libpcre2-dev libutf8proc-dev libopenblas-dev libglpk-dev libcurl4-openssl-dev libgnutls28-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make -j"$(nproc)" build/autocompressd build/autocompress

FROM debian:12
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libjansson4 libsqlite3-0 libuv1 libmicrohttpd12 libpcre2-8-0 libutf8proc2 libopenblas0-pthread libglpk40 libcurl4 libgnutls30 ca-certificates \
    && rm -rf /var/lib/apt/lists/* && useradd --system --home /var/lib/autocompress autocompress \
    && mkdir -p /var/lib/autocompress /srv/models && chown autocompress /var/lib/autocompress
COPY --from=build /src/build/autocompressd /src/build/autocompress /usr/local/bin/
COPY web /usr/share/autocompress/web
COPY systemd/autocompressd.json /etc/autocompress/autocompressd.json
USER autocompress
EXPOSE 8321
VOLUME ["/var/lib/autocompress", "/srv/models"]
ENV AUTOCOMPRESS_TOKEN=""
HEALTHCHECK CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8321"]
CMD ["autocompressd", "--config", "/etc/autocompress/autocompressd.json", "--listen", "0.0.0.0:8321"]
