/* SPDX-License-Identifier: MIT */
/* libloader: the client's end of the fd channel: the attach reply's one-time
 * token buys the slab's fd (and a CUDA attachment's device slab fd) over a
 * Unix socket, SCM_RIGHTS.
 */
#include <sys/socket.h>
#include <sys/un.h>

#include "libloader-private.h"
#include "fdchan-wire.h"

int fetch_slab_fd(const char *path, const uint8_t *token, size_t token_len, uint64_t *size,
                         int *dev_fd, uint64_t *dev_size)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fdchan_request rq = { .magic = FDCHAN_MAGIC, .version = FDCHAN_VERSION };
	struct fdchan_reply rp;
	struct iovec iov = { .iov_base = &rp, .iov_len = sizeof(rp) };
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                      .msg_controllen = sizeof(u.buf) };
	struct timeval tv = { .tv_sec = 10 };
	struct cmsghdr *cm;
	int fd, slab = -1, fds[2] = { -1, -1 };
	ssize_t n;

	*dev_fd = -1;
	*dev_size = 0;
	if (token_len != sizeof(rq.token) || strlen(path) >= sizeof(sa.sun_path))
		return set_err(-EPROTO, "bad attach reply (token or fd channel path)");
	memcpy(rq.token, token, sizeof(rq.token));
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return set_err(-errno, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return set_err(-e, "cannot connect to the fd channel %s: %s", path, strerror(e));
	}
	if (send(fd, &rq, sizeof(rq), MSG_NOSIGNAL) != (ssize_t)sizeof(rq)) {
		int e = errno;
		close(fd);
		return set_err(-e, "fd channel: send: %s", strerror(e));
	}
	memset(&u, 0, sizeof(u));
	n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
	close(fd);
	if (n != (ssize_t)sizeof(rp) || rp.magic != FDCHAN_MAGIC)
		return set_err(-EPROTO, "fd channel: no valid reply");
	for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
		    (cm->cmsg_len == CMSG_LEN(sizeof(int)) || cm->cmsg_len == CMSG_LEN(2 * sizeof(int))))
			memcpy(fds, CMSG_DATA(cm), cm->cmsg_len - CMSG_LEN(0));
	slab = fds[0];
	if (rp.status < 0 || (fds[1] >= 0) != (rp.nfds == 2)) {
		if (slab >= 0)
			close(slab);
		if (fds[1] >= 0)
			close(fds[1]);
		if (rp.status >= 0)
			return set_err(-EPROTO, "fd channel: %u fds announced, another number received", rp.nfds);
		return set_err(rp.status, "fd channel: token refused: %s", strerror(-rp.status));
	}
	if (slab < 0)
		return set_err(-EPROTO, "fd channel: reply carried no fd");
	*size = rp.size;
	*dev_fd = fds[1];
	*dev_size = rp.device_size;
	return slab;
}
