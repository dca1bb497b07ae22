/* SPDX-License-Identifier: MIT */
/* libloader: the client's end of the fd channel: the attach reply's one-time
 * token buys the slab's fd (and a CUDA attachment's device slab fd, a batch
 * ring's memfd and eventfd) over a Unix socket, SCM_RIGHTS.
 */
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "libloader-private.h"
#include "fdchan-wire.h"

/*
 * A trainer's process takes signals while it attaches: SIGCHLD when a worker
 * or the workers' host's intermediate child exits, handlers installed
 * without SA_RESTART (Python's, torch's DataLoader's). An interrupted call
 * here is retried, never reported as the channel's failure: connect() is
 * called again (EISCONN: it had completed; EALREADY: the kernel goes on
 * with it, and its outcome is waited for).
 */
static int connect_nointr(int fd, const struct sockaddr_un *sa)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	int err = 0, r;
	socklen_t len = sizeof(err);

	for (;;) {
		if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0 || errno == EISCONN)
			return 0;
		if (errno != EINTR)
			break;
	}
	if (errno != EALREADY && errno != EINPROGRESS)
		return -errno;
	/* a connection the kernel goes on with: wait for its outcome */
	while ((r = poll(&p, 1, 10000)) < 0 && errno == EINTR)
		;
	if (r <= 0)
		return r == 0 ? -ETIMEDOUT : -errno;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		return -errno;
	return -err;
}

int fetch_slab_fd(const char *path, uid_t daemon_uid, const uint8_t *token, size_t token_len,
                  uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd, int *ring_efd)
{
	struct ucred cr;
	socklen_t crlen = sizeof(cr);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fdchan_request rq = { .magic = FDCHAN_MAGIC, .version = FDCHAN_VERSION };
	struct fdchan_reply rp;
	struct iovec iov = { .iov_base = &rp, .iov_len = sizeof(rp) };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                      .msg_controllen = sizeof(u.buf) };
	struct timeval tv = { .tv_sec = 10 };
	struct cmsghdr *cm;
	int fd, r, slab = -1, fds[4] = { -1, -1, -1, -1 }, got = 0;
	ssize_t n;

	*dev_fd = *ring_fd = *ring_efd = -1;
	*dev_size = 0;
	if (token_len != sizeof(rq.token) || strlen(path) >= sizeof(sa.sun_path))
		return set_err(-EPROTO, "bad attach reply (token or fd channel path)");
	memcpy(rq.token, token, sizeof(rq.token));
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return set_err(-errno, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if ((r = connect_nointr(fd, &sa)) < 0) {
		close(fd);
		return set_err(r, "cannot connect to the fd channel %s: %s", path, strerror(-r));
	}
	/* the daemon's own, as its control socket was (whose.c): the token
	 * goes to nobody else, and no other process's slab comes back */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0 || cr.uid != daemon_uid) {
		char who[96], want[96];
		close(fd);
		return set_err(-EPERM, "the fd channel %s is served by %s, not by the daemon's %s: "
		               "refusing it", path, crlen == sizeof(cr) ? uid_name(cr.uid, who, sizeof(who))
		               : "an unknown uid", uid_name(daemon_uid, want, sizeof(want)));
	}
	while ((n = send(fd, &rq, sizeof(rq), MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	if (n != (ssize_t)sizeof(rq)) {
		int e = n < 0 ? errno : EPROTO;
		close(fd);
		return set_err(-e, "fd channel: send: %s", strerror(e));
	}
	memset(&u, 0, sizeof(u));
	while ((n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	r = n < 0 ? -errno : 0;
	close(fd);
	if (n < 0)
		return set_err(r, "fd channel %s: no reply%s: %s", path,
		               r == -EAGAIN || r == -EWOULDBLOCK ? " within 10 s" : "", strerror(-r));
	if (n == 0)
		return set_err(-EPROTO, "fd channel %s: the daemon closed it without a reply (it closes "
		               "a connection whose request did not arrive within 5 s)", path);
	if (n != (ssize_t)sizeof(rp) || rp.magic != FDCHAN_MAGIC)
		return set_err(-EPROTO, "fd channel %s: not a reply of the daemon's (%zd bytes)", path, n);
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
		    cm->cmsg_len >= CMSG_LEN(sizeof(int)) && cm->cmsg_len <= CMSG_LEN(4 * sizeof(int)) &&
		    !got) {
			got = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			memcpy(fds, CMSG_DATA(cm), (size_t)got * sizeof(int));
		}
	slab = fds[0];
	if (rp.status < 0 || got != (int)rp.nfds || (rp.ring_fds != 0 && rp.ring_fds != 2) ||
	    rp.nfds < 1 + rp.ring_fds || rp.nfds > 2 + rp.ring_fds) {
		for (int i = 0; i < got; i++)
			close(fds[i]);
		if (rp.status >= 0)
			return set_err(-EPROTO, "fd channel: %u fds announced (%u of a batch ring), %d "
			               "received", rp.nfds, rp.ring_fds, got);
		return set_err(rp.status, "fd channel: token refused: %s", strerror(-rp.status));
	}
	*size = rp.size;
	if (rp.nfds - rp.ring_fds == 2) {
		*dev_fd = fds[1];
		*dev_size = rp.device_size;
	}
	if (rp.ring_fds == 2) {
		*ring_fd = fds[rp.nfds - 2];
		*ring_efd = fds[rp.nfds - 1];
	}
	return slab;
}
