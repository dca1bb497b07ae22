/* SPDX-License-Identifier: MIT */
/* sockpath - claim a socket path: replace a stale socket, refuse another user's */
#pragma once

#include <stddef.h>

/* Replace @path if it is a stale socket; -EADDRINUSE if someone listens,
 * -EEXIST if it is not a socket, -EPERM if another user owns it. @probe, if
 * set, tells whether someone listens (0) or not (-ECONNREFUSED); the default
 * is a plain connect().
 *
 * Used by every socket: fdchan_new() for the fd channel (a plain connect),
 * server_new() for the nng endpoint (with socket_probe(), nngfix.c), the
 * Python workers' and /metrics'. It lives here, not in nngfix.c: claiming
 * a path left by a killed daemon is no nng workaround (the endpoint's listener is renamed over the path, so nng
 * would never refuse a live daemon's path nor replace a stale one itself),
 * and the fd channel, which does not use nng, needs it even once a newer nng
 * deletes nngfix.c. Only the probe, the SP handshake instead of a bare
 * connect() that nng 1.5.2's listener does not survive, is nng's. */
int sock_claim_path(const char *path, int (*probe)(const char *path), char *err, size_t errlen);
/* -EPERM, and in @why who else may write the directory of @path ("the
 * socket directory /tmp is writable by others (mode 1777)"); 0 if nobody.
 * sock_claim_path() refuses a path another user owns (-EPERM) with it. */
int sock_dir_check(const char *path, char *why, size_t len);
