/* SPDX-License-Identifier: MIT */
/* fdchan - hands slab fds to clients over AF_UNIX with SCM_RIGHTS */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "fdchan-wire.h"

/* Resolves a token for a peer of @uid and @pid: 0 with the fd (closed by the
 * channel once sent if *@fd_close is set, else kept by the callee) and, for a
 * CUDA attachment with a VMM device slab, its fd (else -1; the callee's), and
 * for an attachment with a batch ring its memfd and eventfd (else -1; the
 * callee's). */
typedef int (*fdchan_lookup_fn)(void *userdata, const uint8_t *token, uid_t uid, pid_t pid,
                                int *fd, bool *fd_close, uint64_t *size, int *dev_fd,
                                uint64_t *dev_size, int *ring_fd, int *ring_efd);

struct fdchan;

/* Listen on @path with @mode, and group @gid unless it is -1. */
int fdchan_new(struct fdchan **out, uv_loop_t *loop, const char *path, unsigned mode, int gid,
               fdchan_lookup_fn lookup, void *userdata, char *err, size_t errlen);
/* Close the listener and every connection, unlink the path; frees itself
 * once libuv closed the handles. */
void fdchan_close(struct fdchan *ch);

/* Replace @path if it is a stale socket; -EADDRINUSE if someone listens,
 * -EEXIST if it is not a socket, -EPERM if another user owns it. @probe, if
 * set, tells whether someone listens (0) or not (-ECONNREFUSED); the default
 * is a plain connect().
 *
 * Used by both sockets: fdchan_new() for the fd channel (a plain connect)
 * and server_new() for the nng endpoint (with socket_probe(), nngfix.c). It
 * lives here, not in nngfix.c: claiming a path left by a killed daemon is no
 * nng workaround (the endpoint's listener is renamed over the path, so nng
 * would never refuse a live daemon's path nor replace a stale one itself),
 * and the fd channel, which does not use nng, needs it even once a newer nng
 * deletes nngfix.c. Only the probe, the SP handshake instead of a bare
 * connect() that nng 1.5.2's listener does not survive, is nng's. */
int sock_claim_path(const char *path, int (*probe)(const char *path), char *err, size_t errlen);
/* -EPERM, and in @why who else may write the directory of @path ("the
 * socket directory /tmp is writable by others (mode 1777)"); 0 if nobody.
 * sock_claim_path() refuses a path another user owns (-EPERM) with it. */
int sock_dir_check(const char *path, char *why, size_t len);
