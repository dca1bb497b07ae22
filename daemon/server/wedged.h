/* SPDX-License-Identifier: MIT */
/* wedged - the listening fds of replaced (wedged) nng listeners, whose
 * backlogs the daemon empties (nngfix.c, heal_listener()) */
#pragma once

#define WEDGED_MAX 16

/*
 * A bounded FIFO of listening sockets that nng still owns: we only accept and
 * close what waits in their backlogs, never close them. When full, adding one
 * drains the oldest a last time and forgets it (by then its backlog had a
 * second to empty and no new peer can reach it: the path names a newer one).
 */
struct wedged {
	int fd[WEDGED_MAX];
	unsigned head;            /* index of the oldest */
	unsigned n;
};

void wedged_init(struct wedged *w);
/* Keep @fd (ignored when negative). */
void wedged_add(struct wedged *w, int fd);
/* Accept and close every connection waiting on each fd kept; never blocks. */
void wedged_drain(const struct wedged *w);
/* Accept and close every connection waiting on @fd; never blocks. */
void wedged_drain_fd(int fd);
