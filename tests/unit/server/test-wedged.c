/* SPDX-License-Identifier: MIT */
/* test-wedged - the bounded queue of replaced listeners' fds (daemon/server/wedged.c) */
#include <assert.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wedged.h"

#define NL (WEDGED_MAX + 3)

/* A listener (abstract name, blocking like nng's may be) with @n peers waiting. */
static int listener_with_backlog(int i, int n, int *peers)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert(l >= 0);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
	                  (size_t)snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "test-wedged-%d-%d",
	                                   (int)getpid(), i));
	assert(bind(l, (struct sockaddr *)&sa, len) == 0);
	assert(listen(l, 16) == 0);
	for (int k = 0; k < n; k++) {
		peers[k] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert(peers[k] >= 0);
		assert(connect(peers[k], (struct sockaddr *)&sa, len) == 0);
	}
	return l;
}

static bool backlog_empty(int l)
{
	struct pollfd p = { .fd = l, .events = POLLIN };
	return poll(&p, 1, 0) == 0;
}

int main(void)
{
	struct wedged w;
	int l[NL], peers[NL][2];

	/* a negative fd (find_listen_fd found none) is not kept */
	wedged_init(&w);
	wedged_add(&w, -1);
	assert(w.n == 0);
	wedged_drain(&w);

	for (int i = 0; i < NL; i++)
		l[i] = listener_with_backlog(i, 2, peers[i]);
	for (int i = 0; i < NL; i++) {
		wedged_add(&w, l[i]);
		assert(!backlog_empty(l[i]));
		/* a full queue drains the one it forgets, a last time */
		if (i >= WEDGED_MAX)
			assert(backlog_empty(l[i - WEDGED_MAX]));
		else
			assert(!backlog_empty(l[0]));
	}
	assert(w.n == WEDGED_MAX);
	wedged_drain(&w);
	for (int i = 0; i < NL; i++)
		assert(backlog_empty(l[i]));

	/* the forgotten ones are not drained any more; the kept ones are */
	{
		int p0[1], pk[1];
		close(l[0]);
		l[0] = listener_with_backlog(100, 1, p0);      /* not in the queue */
		int lk = listener_with_backlog(101, 1, pk);
		wedged_add(&w, lk);                            /* evicts and drains l[NL - WEDGED_MAX] */
		wedged_drain(&w);
		assert(!backlog_empty(l[0]));
		assert(backlog_empty(lk));
		close(p0[0]);
		close(pk[0]);
		close(lk);
	}
	for (int i = 0; i < NL; i++) {
		close(l[i]);
		close(peers[i][0]);
		close(peers[i][1]);
	}
	printf("ok\n");
	return 0;
}
