/*
 * remote.h - the CLI's commands that talk to a daemon over its REST API
 * (remote.c, over http_client.c): submit, status, list, logs, cancel, wait,
 * report, download. The server is --server URL, else $AUTOCOMPRESS_SERVER,
 * else the local daemon (http://127.0.0.1:8321); the bearer token --token,
 * else $AUTOCOMPRESS_TOKEN.
 *
 * Exit statuses (docs/cli.md): 0 success (a followed job succeeded), 1 the
 * job failed, 2 usage, 3 the job was cancelled, 4 the API refused the
 * request or the server could not be reached, 5 --timeout ran out.
 */
#ifndef AC_REMOTE_H
#define AC_REMOTE_H

enum { RC_OK = 0, RC_JOB_FAILED = 1, RC_USAGE = 2, RC_CANCELLED = 3, RC_API = 4, RC_TIMEOUT = 5 };

/* Options given before the command (autocompress --server URL --json CMD ...). */
typedef struct {
    const char *server, *token;
    int json;
} remote_globals;

/* Whether cmd is one of the commands above. */
int remote_is_command(const char *cmd);
/* Run the command argv[0] with its arguments (argv[1..argc-1]). */
int remote_main(const remote_globals *g, int argc, char **argv);
/* The one-line synopsis of every remote command (for the CLI's usage). */
extern const char remote_usage[];

#endif
