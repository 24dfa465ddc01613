/*
 * watchdog.c - systemd notification (sd_notify without libsystemd: one
 * datagram to $NOTIFY_SOCKET) and the watchdog that covers both halves of
 * the daemon.
 *
 * WATCHDOG=1 is sent from a timer on the daemon's loop every
 * WatchdogSec/2, so a frozen loop stops the pings; and only while the HTTP
 * side answers: each tick the loop sends GET /healthz to its own listening
 * socket (libuv, non-blocking), and the HTTP server stamps d->http_beat_ms
 * on every request it takes (http.c). A stamp older than WatchdogSec
 * withholds the ping, so systemd restarts a daemon whose HTTP server no
 * longer answers (its listening socket or libmicrohttpd wedged) even though
 * the loop still runs. The probe is bound before it connects and announced
 * to the connection guard, which keeps it outside every per-client and
 * total cap (conn.h): 64 slow-header sockets or 64 event streams from the
 * probe's own address cannot hold the pings back.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"
#include "daemon.h"

static const char probe_req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

typedef struct {
    ac_daemon *d;
    uv_timer_t timer;
    uv_tcp_t tcp;
    uv_connect_t conn;
    uv_write_t wr;
    char buf[512];
    int probing;    /* a probe's socket is open */
    long long usec; /* WATCHDOG_USEC */
    double probe_started;
    long probes; /* guard_probes at the last tick */
    int withheld; /* pings withheld since the last one sent (logged once) */
} watchdog;

static watchdog W;

void wd_notify(const char *msg) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0] || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) return;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    if (sa.sun_path[0] == '@') sa.sun_path[0] = 0; /* abstract namespace */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
        fprintf(stderr, "autocompressd: sd_notify: %s\n", strerror(errno));
    close(fd);
}

long long wd_now_ms(void) { return (long long)(ac_now() * 1000.0); }

static void probe_closed(uv_handle_t *h) {
    (void)h;
    W.probing = 0;
}

static void probe_end(void) {
    if (!uv_is_closing((uv_handle_t *)&W.tcp)) uv_close((uv_handle_t *)&W.tcp, probe_closed);
}

static void probe_alloc(uv_handle_t *h, size_t n, uv_buf_t *b) {
    (void)h;
    (void)n;
    *b = uv_buf_init(W.buf, sizeof W.buf);
}

static void probe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
    (void)s;
    (void)b;
    if (n < 0) probe_end(); /* the reply was read to its end (or the socket failed) */
}

static void probe_written(uv_write_t *w, int status) {
    (void)w;
    if (status) probe_end();
}

static void probe_connected(uv_connect_t *c, int status) {
    (void)c;
    uv_buf_t b = uv_buf_init((char *)probe_req, sizeof probe_req - 1);
    if (status || uv_write(&W.wr, (uv_stream_t *)&W.tcp, &b, 1, probe_written) ||
        uv_read_start((uv_stream_t *)&W.tcp, probe_alloc, probe_read))
        probe_end();
}

/* One request to our own HTTP server; its arrival stamps http_beat_ms. */
static void probe_start(void) {
    ac_daemon *d = W.d;
    struct sockaddr_in sa;
    const char *h = d->cfg.listen_host;
    if (!strcmp(h, "localhost") || !strcmp(h, "0.0.0.0")) h = "127.0.0.1";
    if (uv_ip4_addr(h, d->cfg.listen_port, &sa)) return;
    if (uv_tcp_init(d->loop, &W.tcp)) return;
    W.probing = 1;
    W.probe_started = ac_now();
    /* Bound first, so the connection guard knows the probe's address and
     * port and keeps it out of the per-client and total caps (conn.h). */
    struct sockaddr_in local;
    int len = sizeof local;
    if (uv_ip4_addr(h, 0, &local) || uv_tcp_bind(&W.tcp, (const struct sockaddr *)&local, 0) ||
        uv_tcp_getsockname(&W.tcp, (struct sockaddr *)&local, &len)) {
        probe_end();
        return;
    }
    if (d->guard) guard_expect(d->guard, &local);
    if (uv_tcp_connect(&W.conn, &W.tcp, (const struct sockaddr *)&sa, probe_connected)) probe_end();
}

static void on_tick(uv_timer_t *t) {
    (void)t;
    ac_daemon *d = W.d;
    long p = d->guard ? guard_probes(d->guard) : 0;
    if (p != W.probes) { /* the server accepted the probe: with TLS no request of ours gets through */
        W.probes = p;
        if (d->cfg.tls_cert[0]) atomic_store(&d->http_beat_ms, wd_now_ms());
    }
    long long age_ms = wd_now_ms() - atomic_load(&d->http_beat_ms);
    if (age_ms * 1000 < W.usec) {
        wd_notify("WATCHDOG=1");
        W.withheld = 0;
    } else if (!W.withheld++) {
        fprintf(stderr, "autocompressd: watchdog: the HTTP side has not answered for %lld ms; WATCHDOG=1 withheld\n",
                age_ms);
    }
    /* A probe stuck longer than the watchdog period is dropped and a new one sent. */
    if (W.probing && (ac_now() - W.probe_started) * 1e6 > (double)W.usec) probe_end();
    if (!W.probing) probe_start();
}

int wd_start(ac_daemon *d, long long usec) {
    memset(&W, 0, sizeof W);
    W.d = d;
    W.usec = usec;
    atomic_store(&d->http_beat_ms, wd_now_ms());
    if (uv_timer_init(d->loop, &W.timer)) return -1;
    uint64_t every = (uint64_t)(usec / 2000 > 0 ? usec / 2000 : 1);
    return uv_timer_start(&W.timer, on_tick, 0, every);
}

void wd_stop(void) {
    if (!W.d) return;
    uv_timer_stop(&W.timer);
    uv_close((uv_handle_t *)&W.timer, NULL);
    if (W.probing) probe_end();
    W.d = NULL;
}
