/* conn.c - see conn.h. */
#include "conn.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "autocompress.h"

typedef struct conn {
    struct conn *prev, *next;
    int fd, phase;
    int exempt; /* the watchdog's probe */
    struct sockaddr_in peer; /* family 0 when not IPv4 */
    double since;
} conn;

struct conn_guard {
    uv_timer_t sweep; /* first: the close callback frees the guard from it */
    conn head;        /* list sentinel */
    double header_s, body_s;
    int napi, max_api; /* connections not in SSE phase, and their cap */
    int max_per_client;
    struct sockaddr_in expect; /* the probe's address (family 0: none) */
    long probes;
    long cut;
};

/* The loop's deadline timer, every 250 ms (as Redis's serverCron). */
static void sweep(uv_timer_t *t) {
    conn_guard *g = (conn_guard *)t;
    double now = ac_now();
    for (conn *c = g->head.next; c != &g->head; c = c->next) {
        double limit = c->phase == CONN_HEAD ? g->header_s : c->phase == CONN_BODY ? g->body_s : 0;
        if (limit > 0 && now - c->since > limit && c->fd >= 0 && !c->exempt) {
            /* The socket stays open (libmicrohttpd owns it); shutdown
             * makes its next read fail, and it closes the connection. */
            shutdown(c->fd, SHUT_RDWR);
            c->fd = -1;
            g->cut++;
        }
    }
}

/* Over max_api API connections: cut the one that has waited longest for its
 * request head (a slow-header socket or an idle keep-alive one), never the
 * newcomer, so a client that sends its request at once is always served. */
static void evict_oldest_head(conn_guard *g, const conn *newcomer) {
    conn *old = NULL;
    for (conn *c = g->head.next; c != &g->head; c = c->next)
        if (c != newcomer && !c->exempt && c->phase == CONN_HEAD && c->fd >= 0 && (!old || c->since < old->since))
            old = c;
    if (!old) return;
    shutdown(old->fd, SHUT_RDWR);
    old->fd = -1;
    g->cut++;
}

conn_guard *guard_new(uv_loop_t *loop, int header_timeout_s, int body_timeout_s, int max_api, int max_per_client) {
    conn_guard *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->head.next = g->head.prev = &g->head;
    g->header_s = header_timeout_s;
    g->body_s = body_timeout_s;
    g->max_api = max_api;
    g->max_per_client = max_per_client;
    if (uv_timer_init(loop, &g->sweep)) {
        free(g);
        return NULL;
    }
    uv_timer_start(&g->sweep, sweep, 250, 250);
    return g;
}

static void guard_closed(uv_handle_t *h) { free(h); }

void guard_free(conn_guard *g) {
    if (!g) return;
    for (conn *c = g->head.next, *n; c != &g->head; c = n) {
        n = c->next;
        free(c);
    }
    g->head.next = g->head.prev = &g->head;
    uv_close((uv_handle_t *)&g->sweep, guard_closed);
}

void guard_expect(conn_guard *g, const struct sockaddr_in *sa) { g->expect = *sa; }

static int same_peer(const struct sockaddr_in *a, const struct sockaddr_in *b, int port_too) {
    return a->sin_family == AF_INET && b->sin_family == AF_INET && a->sin_addr.s_addr == b->sin_addr.s_addr &&
           (!port_too || a->sin_port == b->sin_port);
}

/* Past max_per_client connections from c's address: cut the newcomer. */
static void per_client_cap(conn_guard *g, conn *nc) {
    if (nc->peer.sin_family != AF_INET || g->max_per_client <= 0) return;
    int n = 0;
    for (conn *c = g->head.next; c != &g->head; c = c->next) n += !c->exempt && c->fd >= 0 && same_peer(&c->peer, &nc->peer, 0);
    if (n > g->max_per_client) {
        shutdown(nc->fd, SHUT_RDWR);
        nc->fd = -1;
        g->cut++;
    }
}

void guard_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                  enum MHD_ConnectionNotificationCode code) {
    conn_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn *c = calloc(1, sizeof *c);
        *socket_context = c;
        if (!c) return; /* untracked: only the inactivity timeout applies */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        c->phase = CONN_HEAD;
        c->since = ac_now();
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ai && ai->client_addr && ai->client_addr->sa_family == AF_INET)
            memcpy(&c->peer, ai->client_addr, sizeof c->peer);
        c->next = g->head.next;
        c->prev = &g->head;
        g->head.next->prev = c;
        g->head.next = c;
        if (same_peer(&c->peer, &g->expect, 1)) { /* the watchdog's probe: once */
            c->exempt = 1;
            g->probes++;
            memset(&g->expect, 0, sizeof g->expect);
            return;
        }
        per_client_cap(g, c);
        if (++g->napi > g->max_api) evict_oldest_head(g, c);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn *c = *socket_context;
        if (!c) return;
        c->prev->next = c->next;
        c->next->prev = c->prev;
        if (!c->exempt) g->napi -= c->phase != CONN_SSE;
        free(c);
        *socket_context = NULL;
    }
}

void guard_phase(conn_guard *g, struct MHD_Connection *mc, int phase) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn *c = ci ? ci->socket_context : NULL;
    if (!c) return;
    if (!c->exempt) g->napi += (c->phase == CONN_SSE) - (phase == CONN_SSE);
    c->phase = phase;
    c->since = ac_now();
}

long guard_cut(conn_guard *g) { return g->cut; }
long guard_probes(conn_guard *g) { return g->probes; }
