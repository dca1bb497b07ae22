/* SPDX-License-Identifier: MIT */
/* wedged - the listening fds of replaced (wedged) nng listeners */
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wedged.h"

void wedged_init(struct wedged *w)
{
	w->head = 0;
	w->n = 0;
	for (unsigned i = 0; i < WEDGED_MAX; i++)
		w->fd[i] = -1;
}

void wedged_drain_fd(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	if (fd < 0)
		return;
	/* nng's fd may be blocking: accept only what poll says is there */
	while (poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
		int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break;
		}
		close(c);
	}
}

void wedged_add(struct wedged *w, int fd)
{
	if (fd < 0)
		return;
	if (w->n == WEDGED_MAX) {
		wedged_drain_fd(w->fd[w->head]);
		w->fd[w->head] = fd;
		w->head = (w->head + 1) % WEDGED_MAX;
		return;
	}
	w->fd[(w->head + w->n) % WEDGED_MAX] = fd;
	w->n++;
}

void wedged_drain(const struct wedged *w)
{
	for (unsigned i = 0; i < w->n; i++)
		wedged_drain_fd(w->fd[(w->head + i) % WEDGED_MAX]);
}
