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
