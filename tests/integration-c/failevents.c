/* SPDX-License-Identifier: MIT */
/* failevents - a test double: loaderd whose disconnect events cannot be allocated
 *
 * Linked into loaderd-failevents only (tests/integration-c/meson.build), with daemon/main.c:
 * it replaces the daemon's weak pipe_event_new() (daemon/server/rpc.c) with one that
 * fails for every disconnect, as calloc would when out of memory, so that
 * test-alloc sees the daemon release those clients all the same.
 */
#include <stdlib.h>

#include "server-private.h"

struct event *pipe_event_new(nng_pipe_ev type)
{
	return type == NNG_PIPE_EV_REM_POST ? NULL : calloc(1, sizeof(struct event));
}
