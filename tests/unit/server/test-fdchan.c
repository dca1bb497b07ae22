/* SPDX-License-Identifier: MIT */
/* test-fdchan - the fd channel (daemon/server/fdchan.c) and the socket path claim
 *
 * A real libuv loop, real AF_UNIX sockets in a private directory under /tmp,
 * and clients that speak the bytes of common/fdchan-wire.h by hand, as
 * libloader does. The loop runs on this thread between the clients' steps
 * (pump()); a client of another uid is a forked child that drops to it.
 * What the daemon logs is captured from stderr and compared exactly.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "fdchan.h"
#include "sockpath.h"
#include "../test-proc.h"

/* fdchan.c's CONN_TIMEOUT_MS and MAX_CONNS */
#define CONN_TIMEOUT_MS 5000
#define MAX_CONNS 256
#define MAX_CONNS_PER_UID 32    /* root's and the daemon's own aside */

static uv_loop_t loop;
static char dir[64];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void pump(unsigned ms)
{
	uint64_t end = now_ms() + ms;

	do {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(500);
	} while (now_ms() < end);
	uv_run(&loop, UV_RUN_NOWAIT);
}

/* Run the loop until @fd is readable (data or EOF); the ms it took, or -1. */
static long wait_readable(int fd, unsigned max_ms)
{
	uint64_t t0 = now_ms();
	struct pollfd p = { .fd = fd, .events = POLLIN };

	for (;;) {
		uv_run(&loop, UV_RUN_NOWAIT);
		if (poll(&p, 1, 1) > 0)
			return (long)(now_ms() - t0);
		if (now_ms() - t0 > max_ms)
			return -1;
	}
}

static bool is_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 0) > 0;
}

/* Open fds of this process: a client's end of each connection and the
 * channel's end of each one it accepted. */
static unsigned count_fds(void)
{
	return proc_entries("/proc/self/fd") - 1; /* the listing's own */
}

/* Run the loop until this process has @want fds: the channel accepted (or
 * closed) what the test waits for. 30 s at most. */
static void pump_until_fds(unsigned want)
{
	uint64_t end = now_ms() + 30000;

	while (count_fds() != want && now_ms() < end)
		pump(1);
	if (count_fds() != want)
		fprintf(stderr, "%u fds, not %u\n", count_fds(), want);
	assert(count_fds() == want);
}

/* Run the loop until the channel has read all that @fd sent (nothing of it
 * left in the socket), and once more: an answer to it would be there now. */
static void pump_until_read(int fd)
{
	uint64_t end = now_ms() + 30000;
	int left;

	while (ioctl(fd, SIOCOUTQ, &left) == 0 && left > 0 && now_ms() < end)
		pump(1);
	assert(ioctl(fd, SIOCOUTQ, &left) == 0 && left == 0);
	uv_run(&loop, UV_RUN_NOWAIT);
}

/* ---- what the daemon logs ---- */

static int saved_stderr = -1;
static FILE *capture_file;
static char captured[65536];

static void capture_begin(void)
{
	fflush(stderr);
	capture_file = tmpfile();
	assert(capture_file);
	saved_stderr = dup(STDERR_FILENO);
	assert(saved_stderr >= 0);
	assert(dup2(fileno(capture_file), STDERR_FILENO) == STDERR_FILENO);
}

/* Stop capturing (asserts print to the real stderr again); the text. */
static const char *capture_end(void)
{
	size_t n;

	fflush(stderr);
	assert(dup2(saved_stderr, STDERR_FILENO) == STDERR_FILENO);
	close(saved_stderr);
	rewind(capture_file);
	n = fread(captured, 1, sizeof(captured) - 1, capture_file);
	captured[n] = 0;
	fclose(capture_file);
	return captured;
}

/* ---- the callee's tokens ---- */

struct tok {
	uint8_t token[FDCHAN_TOKEN_BYTES];
	uid_t uid;
	int fd, dev_fd;
	uint64_t size, dev_size;
	bool used;
};

static struct {
	struct tok toks[64];
	unsigned ntoks;
	unsigned calls;
	uid_t last_uid;
	uint8_t last_token[FDCHAN_TOKEN_BYTES];
	void *last_userdata;
} L;

static int userdata_mark;

/* As engine_take_token(): one use, the owner's uid or root, else refused. */
static int lookup(void *userdata, const uint8_t *token, uid_t uid, pid_t pid, int *fd, bool *fd_close,
                  uint64_t *size, int *dev_fd, uint64_t *dev_size, int *ring_fd, int *ring_efd)
{
	*ring_fd = *ring_efd = -1;
	(void)pid;
	*fd_close = false;
	L.calls++;
	L.last_uid = uid;
	L.last_userdata = userdata;
	memcpy(L.last_token, token, FDCHAN_TOKEN_BYTES);
	for (unsigned i = 0; i < L.ntoks; i++) {
		struct tok *t = &L.toks[i];
		if (memcmp(t->token, token, FDCHAN_TOKEN_BYTES) != 0 || t->used)
			continue;
		t->used = true;
		if (uid != t->uid && uid != 0)
			return -EPERM;
		*fd = t->fd;
		*size = t->size;
		*dev_fd = t->dev_fd;
		*dev_size = t->dev_size;
		return 0;
	}
	return -ENOENT;
}

/* A sealed-size memfd filled with @seed's pattern. */
static int make_slab(uint64_t size, uint8_t seed)
{
	int fd = memfd_create("test-fdchan-slab", MFD_CLOEXEC);
	uint8_t buf[4096];

	assert(fd >= 0);
	for (uint64_t off = 0; off < size; off += sizeof(buf)) {
		size_t n = size - off < sizeof(buf) ? (size_t)(size - off) : sizeof(buf);
		for (size_t i = 0; i < n; i++)
			buf[i] = (uint8_t)(seed + (off + i) * 7);
		assert(pwrite(fd, buf, n, (off_t)off) == (ssize_t)n);
	}
	return fd;
}

static void check_slab(int fd, uint64_t size, uint8_t seed)
{
	struct stat st;
	uint8_t *p;

	assert(fstat(fd, &st) == 0);
	assert((uint64_t)st.st_size == size);
	p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	assert(p != MAP_FAILED);
	for (uint64_t i = 0; i < size; i++)
		assert(p[i] == (uint8_t)(seed + i * 7));
	munmap(p, size);
}

static bool same_file(int a, int b)
{
	struct stat sa, sb;

	assert(fstat(a, &sa) == 0 && fstat(b, &sb) == 0);
	return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static struct tok *add_token(uint8_t id, uid_t uid, uint64_t size, uint64_t dev_size)
{
	struct tok *t = &L.toks[L.ntoks++];

	assert(L.ntoks <= 64);
	memset(t, 0, sizeof(*t));
	for (int i = 0; i < FDCHAN_TOKEN_BYTES; i++)
		t->token[i] = (uint8_t)(id * 31 + i);
	t->uid = uid;
	t->size = size;
	t->fd = make_slab(size, id);
	t->dev_fd = -1;
	if (dev_size) {
		t->dev_size = dev_size;
		t->dev_fd = make_slab(dev_size, (uint8_t)(id + 100));
	}
	return t;
}

/* ---- the client's side ---- */

static void sockpath(char *out, size_t len, const char *name)
{
	assert(snprintf(out, len, "%s/%s", dir, name) < (int)len);
}

static int try_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert(fd >= 0);
	assert(strlen(path) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

static int client_connect(const char *path)
{
	int fd = try_connect(path);

	assert(fd >= 0);
	return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
	assert(send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
}

static struct fdchan_request make_req(const uint8_t *token)
{
	struct fdchan_request rq = { .magic = FDCHAN_MAGIC, .version = FDCHAN_VERSION };

	memcpy(rq.token, token, FDCHAN_TOKEN_BYTES);
	return rq;
}

struct got {
	ssize_t n;                 /* bytes of the reply */
	struct fdchan_reply rep;
	int fds[4];
	int nfds;                  /* fds that came in SCM_RIGHTS */
	bool truncated;
	bool eof_after;            /* the daemon closed the connection after it */
};

/* Read one reply (0 bytes: closed without one) and check the close after it. */
static struct got recv_reply(int fd)
{
	struct got g;
	struct iovec iov = { .iov_base = &g.rep, .iov_len = sizeof(g.rep) };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
	                      .msg_controllen = sizeof(u.buf) };
	char extra;

	memset(&g, 0, sizeof(g));
	memset(&u, 0, sizeof(u));
	for (int i = 0; i < 4; i++)
		g.fds[i] = -1;
	assert(wait_readable(fd, 3000) >= 0);
	g.n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	assert(g.n >= 0);
	g.truncated = (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		assert(cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS);
		int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		assert(g.nfds + k <= 4);
		memcpy(g.fds + g.nfds, CMSG_DATA(cm), (size_t)k * sizeof(int));
		g.nfds += k;
	}
	if (g.n > 0) {
		assert(wait_readable(fd, 3000) >= 0);
		g.eof_after = recv(fd, &extra, 1, MSG_DONTWAIT) == 0;
	} else {
		g.eof_after = true;
	}
	return g;
}

static void close_fds(struct got *g)
{
	for (int i = 0; i < g->nfds; i++)
		close(g->fds[i]);
	g->nfds = 0;
}

/* One whole exchange: connect, the request, the reply. */
static struct got exchange(const char *path, const void *req, size_t len)
{
	int fd = client_connect(path);
	struct got g;

	send_all(fd, req, len);
	g = recv_reply(fd);
	close(fd);
	return g;
}

static void assert_refused(const struct got *g, int status)
{
	assert(g->n == (ssize_t)sizeof(struct fdchan_reply));
	assert(!g->truncated);
	assert(g->rep.magic == FDCHAN_MAGIC);
	assert(g->rep.status == status);
	assert(g->rep.nfds == 0);
	assert(g->rep.size == 0);
	assert(g->rep.device_size == 0);
	assert(g->nfds == 0);
	assert(g->eof_after);
}

static struct fdchan *open_chan(const char *path, unsigned mode, int gid)
{
	struct fdchan *ch = NULL;
	char err[256] = "";

	assert(fdchan_new(&ch, &loop, path, mode, gid, lookup, &userdata_mark, err, sizeof(err)) == 0);
	assert(ch);
	assert(err[0] == 0);
	return ch;
}

/* Close the channel and run the loop until its handles are gone. */
static void close_chan(struct fdchan *ch, const char *path)
{
	struct stat st;

	fdchan_close(ch);
	assert(lstat(path, &st) < 0 && errno == ENOENT); /* unlinked at once */
	assert(uv_run(&loop, UV_RUN_DEFAULT) == 0);      /* nothing of it is left on the loop */
}

/* ---- 1. the exchange ---- */

static void test_exchange(void)
{
	char path[128], line[256];
	struct fdchan *ch;
	struct tok *t1, *t2, *t3;
	struct fdchan_request rq;
	struct got g;
	struct stat st;
	const char *log;

	sockpath(path, sizeof(path), "a.fds");
	ch = open_chan(path, 0660, -1);
	assert(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0660);

	/* a good token: the slab's fd, its size, nfds 1, then the daemon closes */
	t1 = add_token(1, getuid(), 3 * 4096 + 5, 0);
	rq = make_req(t1->token);
	g = exchange(path, &rq, sizeof(rq));
	assert(g.n == (ssize_t)sizeof(struct fdchan_reply) && !g.truncated);
	assert(g.rep.magic == FDCHAN_MAGIC && g.rep.status == 0);
	assert(g.rep.nfds == 1 && g.nfds == 1);
	assert(g.rep.size == 3 * 4096 + 5 && g.rep.device_size == 0);
	assert(g.eof_after);
	assert(g.fds[0] != t1->fd && same_file(g.fds[0], t1->fd));
	check_slab(g.fds[0], t1->size, 1);
	assert(fcntl(t1->fd, F_GETFD) >= 0); /* the callee keeps its own fd */
	assert(L.calls == 1 && L.last_uid == getuid() && L.last_userdata == &userdata_mark);
	assert(memcmp(L.last_token, t1->token, FDCHAN_TOKEN_BYTES) == 0);
	close_fds(&g);

	/* with a device slab: both fds, in that order, and both sizes */
	t2 = add_token(2, getuid(), 8192, 65536 + 3);
	rq = make_req(t2->token);
	g = exchange(path, &rq, sizeof(rq));
	assert(g.n == (ssize_t)sizeof(struct fdchan_reply) && !g.truncated);
	assert(g.rep.status == 0 && g.rep.nfds == 2 && g.nfds == 2);
	assert(g.rep.size == 8192 && g.rep.device_size == 65536 + 3);
	assert(same_file(g.fds[0], t2->fd) && same_file(g.fds[1], t2->dev_fd));
	check_slab(g.fds[0], 8192, 2);
	check_slab(g.fds[1], 65536 + 3, 102);
	assert(g.eof_after);
	close_fds(&g);

	/* the request in pieces, the loop running in between: still one request */
	t3 = add_token(3, getuid(), 4096, 0);
	rq = make_req(t3->token);
	{
		int fd = client_connect(path);
		const char *p = (const char *)&rq;
		send_all(fd, p, 3);
		pump_until_read(fd);
		assert(!is_readable(fd));
		send_all(fd, p + 3, 9);
		pump_until_read(fd);
		assert(!is_readable(fd));
		send_all(fd, p + 12, sizeof(rq) - 12);
		g = recv_reply(fd);
		close(fd);
	}
	assert(g.rep.status == 0 && g.nfds == 1 && g.rep.size == 4096);
	check_slab(g.fds[0], 4096, 3);
	close_fds(&g);

	/* the same token again: the callee's refusal, exactly, no fd; and the log */
	capture_begin();
	g = exchange(path, &rq, sizeof(rq));
	log = capture_end();
	assert_refused(&g, -ENOENT);
	snprintf(line, sizeof(line), "loaderd: warning: fd channel: pid %d: token refused: %s\n", (int)getpid(),
	         strerror(ENOENT));
	assert(strcmp(log, line) == 0);

	/* an unknown token */
	{
		uint8_t bogus[FDCHAN_TOKEN_BYTES];
		memset(bogus, 0xab, sizeof(bogus));
		rq = make_req(bogus);
		unsigned calls = L.calls;
		capture_begin();
		g = exchange(path, &rq, sizeof(rq));
		log = capture_end();
		assert_refused(&g, -ENOENT);
		assert(strcmp(log, line) == 0);
		assert(L.calls == calls + 1 && memcmp(L.last_token, bogus, sizeof(bogus)) == 0);
	}

	/* several clients at once, replies to the right ones */
	{
		struct tok *ts[6];
		int fds[6];
		for (int i = 0; i < 6; i++) {
			ts[i] = add_token((uint8_t)(10 + i), getuid(), 4096 * (uint64_t)(i + 1), 0);
			fds[i] = client_connect(path);
		}
		for (int i = 5; i >= 0; i--) {
			rq = make_req(ts[i]->token);
			send_all(fds[i], &rq, sizeof(rq));
		}
		for (int i = 0; i < 6; i++) {
			g = recv_reply(fds[i]);
			assert(g.rep.status == 0 && g.nfds == 1 && g.rep.size == 4096 * (uint64_t)(i + 1));
			assert(same_file(g.fds[0], ts[i]->fd));
			check_slab(g.fds[0], g.rep.size, (uint8_t)(10 + i));
			close_fds(&g);
			close(fds[i]);
		}
	}
	close_chan(ch, path);
	printf("exchange: fds, sizes, pieces, refusals: ok\n");
}

/* ---- 2. malformed and short requests, peers that hang up ---- */

static void test_malformed(void)
{
	char path[128], line[256];
	struct fdchan *ch;
	struct fdchan_request rq;
	struct tok *t;
	struct got g;
	const char *log;
	unsigned calls;

	sockpath(path, sizeof(path), "b.fds");
	ch = open_chan(path, 0660, -1);
	t = add_token(40, getuid(), 4096, 0);

	/* wrong magic: -EPROTO, the callee never asked, the token still good */
	calls = L.calls;
	rq = make_req(t->token);
	rq.magic = 0xdeadbeef;
	capture_begin();
	g = exchange(path, &rq, sizeof(rq));
	log = capture_end();
	assert_refused(&g, -EPROTO);
	assert(strcmp(log, "loaderd: warning: fd channel: malformed request (magic deadbeef, version 2)\n") == 0);
	assert(L.calls == calls);

	/* another version */
	rq = make_req(t->token);
	rq.version = FDCHAN_VERSION + 1;
	capture_begin();
	g = exchange(path, &rq, sizeof(rq));
	log = capture_end();
	assert_refused(&g, -EPROTO);
	snprintf(line, sizeof(line), "loaderd: warning: fd channel: malformed request (magic %08x, version %u)\n",
	         FDCHAN_MAGIC, FDCHAN_VERSION + 1);
	assert(strcmp(log, line) == 0);
	assert(L.calls == calls);

	/* a short request, then the peer stops writing: closed without a reply */
	rq = make_req(t->token);
	{
		int fd = client_connect(path);
		send_all(fd, &rq, sizeof(rq) - 1);
		assert(shutdown(fd, SHUT_WR) == 0);
		g = recv_reply(fd);
		assert(g.n == 0 && g.nfds == 0);
		close(fd);
	}
	assert(L.calls == calls);

	/* a peer that connects and hangs up at once: the channel closes its
	 * end once it saw that (an EOF here), and asked nobody */
	{
		int fd = client_connect(path);
		assert(shutdown(fd, SHUT_WR) == 0);
		assert(wait_readable(fd, 30000) >= 0);
		close(fd);
	}
	assert(L.calls == calls);

	/* a full request, and the peer gone before the reply: no SIGPIPE, the
	 * token is spent (the callee gave it out), the channel goes on */
	{
		struct tok *t2 = add_token(41, getuid(), 4096, 0);
		int fd = client_connect(path);
		rq = make_req(t2->token);
		send_all(fd, &rq, sizeof(rq));
		close(fd);
		for (uint64_t end = now_ms() + 30000; L.calls == calls && now_ms() < end;)
			pump(1);
		assert(L.calls == calls + 1 && t2->used);
	}

	/* after all that, the untouched token still works */
	rq = make_req(t->token);
	g = exchange(path, &rq, sizeof(rq));
	assert(g.rep.status == 0 && g.nfds == 1 && same_file(g.fds[0], t->fd));
	close_fds(&g);
	close_chan(ch, path);
	printf("malformed, short, hung-up requests: ok\n");
}

/* ---- 3. the peer's uid, the socket's mode and group ---- */

/* In a child: drop to @uid/@gid, do one exchange with @token; the exit status
 * says what happened: 0 fd received with @seed's contents, 10+(-status) the
 * status refused, 2 connect refused with EACCES, 1 anything else. */
static pid_t last_child;

static int child_exchange(const char *path, uid_t uid, gid_t gid, const uint8_t *token, uint64_t size,
                          uint8_t seed)
{
	pid_t pid = fork();
	int ws;

	assert(pid >= 0);
	last_child = pid;
	if (pid == 0) {
		struct fdchan_request rq = make_req(token);
		struct fdchan_reply rep;
		struct iovec iov = { .iov_base = &rep, .iov_len = sizeof(rep) };
		union {
			char buf[CMSG_SPACE(2 * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
		                      .msg_controllen = sizeof(u.buf) };
		struct cmsghdr *cm;
		int fd, sfd;
		uint8_t *p;

		if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
			_exit(1);
		fd = try_connect(path);
		if (fd == -EACCES)
			_exit(2);
		if (fd < 0 || send(fd, &rq, sizeof(rq), MSG_NOSIGNAL) != (ssize_t)sizeof(rq))
			_exit(1);
		memset(&u, 0, sizeof(u));
		if (recvmsg(fd, &msg, 0) != (ssize_t)sizeof(rep) || rep.magic != FDCHAN_MAGIC)
			_exit(1);
		if (rep.status < 0)
			_exit(10 - rep.status);
		cm = CMSG_FIRSTHDR(&msg);
		if (!cm || cm->cmsg_type != SCM_RIGHTS || rep.size != size)
			_exit(1);
		memcpy(&sfd, CMSG_DATA(cm), sizeof(int));
		p = mmap(NULL, size, PROT_READ, MAP_SHARED, sfd, 0);
		if (p == MAP_FAILED)
			_exit(1);
		for (uint64_t i = 0; i < size; i++)
			if (p[i] != (uint8_t)(seed + i * 7))
				_exit(1);
		_exit(0);
	}
	/* the loop serves the child meanwhile */
	for (int i = 0; i < 10000; i++) {
		pid_t r = waitpid(pid, &ws, WNOHANG);
		assert(r >= 0);
		if (r == pid) {
			assert(WIFEXITED(ws));
			return WEXITSTATUS(ws);
		}
		pump(1);
	}
	assert(!"child did not exit");
	return -1;
}

static void test_peer_uid(void)
{
	char path[128];
	struct fdchan *ch;
	struct tok *mine, *other, *other2;
	struct stat st;
	const uid_t U = 4242;
	const gid_t G = 4243;

	if (geteuid() != 0) {
		printf("peer uid, mode, group: skipped (needs root to switch uid)\n");
		return;
	}
	assert(chmod(dir, 0711) == 0); /* the children may reach the socket */
	sockpath(path, sizeof(path), "c.fds");
	ch = open_chan(path, 0620, (int)G);
	assert(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
	assert((st.st_mode & 07777) == 0620 && st.st_gid == G && st.st_uid == getuid());

	mine = add_token(50, U, 4096 * 3, 0);
	other = add_token(51, U + 1, 4096, 0);
	other2 = add_token(52, U, 4096, 0);

	/* the owner's uid (SO_PEERCRED), a member of the socket's group: its fd */
	assert(child_exchange(path, U, G, mine->token, mine->size, 50) == 0);
	assert(L.last_uid == U);
	/* another uid's token: the callee refuses what SO_PEERCRED says; the
	 * warning names the peer's pid */
	capture_begin();
	int rc = child_exchange(path, U, G, other->token, other->size, 51);
	const char *log = capture_end();
	char line[256];
	assert(rc == 10 + EPERM);
	snprintf(line, sizeof(line), "loaderd: warning: fd channel: pid %d: token refused: %s\n", (int)last_child,
	         strerror(EPERM));
	assert(strcmp(log, line) == 0);
	assert(L.last_uid == U && other->used);
	/* outside the group, mode 0620 gives no write: cannot even connect */
	unsigned calls = L.calls;
	assert(child_exchange(path, U, G + 1, other2->token, other2->size, 52) == 2);
	assert(L.calls == calls && !other2->used);
	close_chan(ch, path);

	/* no group given: the daemon's own */
	ch = open_chan(path, 0600, -1);
	assert(lstat(path, &st) == 0 && (st.st_mode & 07777) == 0600 && st.st_gid == getegid());
	close_chan(ch, path);
	assert(chmod(dir, 0700) == 0);
	printf("peer uid, mode, group: ok\n");
}

/* ---- 4. silent peers and too many connections ---- */

static void test_idle(void)
{
	char path[128];
	struct fdchan *ch;
	struct tok *t;
	struct fdchan_request rq;
	struct got g;
	static int idle[MAX_CONNS];
	uint64_t t0;
	const char *log;

	sockpath(path, sizeof(path), "d.fds");
	ch = open_chan(path, 0660, -1);

	/* MAX_CONNS peers that say nothing; the loop accepts each */
	unsigned fds0 = count_fds();
	t0 = now_ms();
	for (int i = 0; i < MAX_CONNS; i++) {
		idle[i] = client_connect(path);
		uv_run(&loop, UV_RUN_NOWAIT);
	}
	pump_until_fds(fds0 + 2 * MAX_CONNS);
	for (int i = 0; i < MAX_CONNS; i++)
		assert(!is_readable(idle[i])); /* held open, not answered */

	/* one more is refused at once: closed without a reply */
	capture_begin();
	{
		int fd = client_connect(path);
		long ms;
		rq = make_req((const uint8_t *)"0123456789abcdef");
		send(fd, &rq, sizeof(rq), MSG_NOSIGNAL); /* may fail: already closed */
		ms = wait_readable(fd, 2000);
		assert(ms >= 0 && ms < 1000);
		assert(recv(fd, &g.rep, sizeof(g.rep), MSG_DONTWAIT) <= 0);
		close(fd);
	}
	log = capture_end();
	{
		char want[256];
		snprintf(want, sizeof(want), "loaderd: warning: fd channel: refusing a connection of uid %u "
		         "(pid %d): too many connections (1 refused so far)\n", (unsigned)getuid(), (int)getpid());
		assert(strcmp(log, want) == 0);
	}

	/* one idle peer leaves: its place serves a real request, while the rest wait */
	unsigned fds1 = count_fds();
	close(idle[0]);
	idle[0] = -1;
	pump_until_fds(fds1 - 2); /* the channel closed its end too */
	t = add_token(60, getuid(), 4096, 0);
	rq = make_req(t->token);
	g = exchange(path, &rq, sizeof(rq));
	assert(g.rep.status == 0 && g.nfds == 1 && same_file(g.fds[0], t->fd));
	close_fds(&g);
	assert(now_ms() - t0 < CONN_TIMEOUT_MS - 1000); /* all of it well within the timeout */

	/* the silent ones are closed after the timeout, not before, without a reply */
	capture_begin();
	for (int i = 1; i < MAX_CONNS; i++) {
		char b;
		assert(wait_readable(idle[i], CONN_TIMEOUT_MS + 3000) >= 0);
		assert(recv(idle[i], &b, 1, MSG_DONTWAIT) == 0);
		close(idle[i]);
	}
	uint64_t elapsed = now_ms() - t0;
	log = capture_end();
	assert(elapsed >= CONN_TIMEOUT_MS - 100 && elapsed < CONN_TIMEOUT_MS + 3000);
	{
		/* one warning for each */
		char line[128];
		int n = 0;
		snprintf(line, sizeof(line), "loaderd: warning: fd channel: peer sent no request within %d ms\n",
		         CONN_TIMEOUT_MS);
		for (const char *p = log; (p = strstr(p, line)); p += strlen(line))
			n++;
		if (n != MAX_CONNS - 1)
			fprintf(stderr, "%d warnings in:\n%s\n", n, log);
		assert(n == MAX_CONNS - 1);
		assert(strlen(log) == (size_t)n * strlen(line));
	}

	/* all places free again: as many real requests at once as MAX_CONNS */
	{
		static int fds[MAX_CONNS];
		struct tok *tk = add_token(61, getuid(), 4096, 0);
		unsigned fds2 = count_fds();
		for (int i = 0; i < MAX_CONNS; i++) {
			fds[i] = client_connect(path);
			uv_run(&loop, UV_RUN_NOWAIT);
		}
		pump_until_fds(fds2 + 2 * MAX_CONNS);
		rq = make_req(tk->token);
		send_all(fds[MAX_CONNS - 1], &rq, sizeof(rq));
		g = recv_reply(fds[MAX_CONNS - 1]);
		assert(g.rep.status == 0 && g.nfds == 1 && same_file(g.fds[0], tk->fd));
		close_fds(&g);
		/* closing with connections open: each peer sees the end */
		fdchan_close(ch);
		assert(uv_run(&loop, UV_RUN_DEFAULT) == 0);
		for (int i = 0; i < MAX_CONNS - 1; i++) {
			char b;
			assert(recv(fds[i], &b, 1, MSG_DONTWAIT) == 0);
			close(fds[i]);
		}
		close(fds[MAX_CONNS - 1]);
		assert(try_connect(path) == -ENOENT);
	}
	printf("silent peers closed after %llu ms, at most %d at once: ok\n", (unsigned long long)elapsed,
	       MAX_CONNS);
}

/* ---- 4b. one uid's share of the connections ---- */

/* A child as @uid opens @n silent connections and exits with how many of
 * them the daemon closed within 500 ms (while the parent's loop runs), or
 * later, once @want are: on a loaded machine the parent's loop may not have
 * accepted them within any fixed time (30 s at most). */
static int child_idle(const char *path, uid_t uid, int n, int want)
{
	pid_t pid = fork();
	int ws;

	assert(pid >= 0);
	if (pid == 0) {
		int fds[MAX_CONNS_PER_UID + 8], closed = 0;
		if (setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
			_exit(100);
		for (int i = 0; i < n; i++)
			if ((fds[i] = try_connect(path)) < 0)
				_exit(101);
		uint64_t t0 = now_ms();
		for (;;) {
			usleep(10 * 1000);
			closed = 0;
			for (int i = 0; i < n; i++) {
				char b;
				if (is_readable(fds[i]) && recv(fds[i], &b, 1, MSG_DONTWAIT) == 0)
					closed++;
			}
			if ((closed >= want && now_ms() - t0 >= 500) || now_ms() - t0 >= 30000)
				_exit(closed);
		}
	}
	for (uint64_t t0 = now_ms(); now_ms() - t0 < 60000;) {
		pid_t r = waitpid(pid, &ws, WNOHANG);
		assert(r >= 0);
		if (r == pid) {
			assert(WIFEXITED(ws));
			return WEXITSTATUS(ws);
		}
		pump(1);
	}
	assert(!"child did not exit");
	return -1;
}

static void test_uid_share(void)
{
	static int idle[MAX_CONNS];
	struct fdchan *ch;
	char path[128];
	const char *log;
	int closed;

	if (getuid() != 0) {
		printf("one uid's share of the connections: skipped (needs root)\n");
		return;
	}
	assert(chmod(dir, 0711) == 0); /* the children may reach the socket */
	sockpath(path, sizeof(path), "u.fds");
	ch = open_chan(path, 0666, -1);
	/* one uid: MAX_CONNS_PER_UID held, the next one refused */
	unsigned fds0 = count_fds();
	capture_begin();
	closed = child_idle(path, 4243, MAX_CONNS_PER_UID + 1, 1);
	log = capture_end();
	if (closed != 1)
		fprintf(stderr, "child: %d closed\n%s", closed, log);
	assert(closed == 1);
	assert(strstr(log, "fd channel: refusing a connection of uid 4243 (pid ") &&
	       strstr(log, "): too many connections of that uid (1 refused so far)\n"));
	pump_until_fds(fds0); /* the child's connections closed: the channel's ends too */
	/* full of root's idle connections: another uid's new one takes the
	 * place of root's oldest, not a refusal */
	for (int i = 0; i < MAX_CONNS; i++) {
		idle[i] = client_connect(path);
		uv_run(&loop, UV_RUN_NOWAIT);
	}
	pump_until_fds(fds0 + 2 * MAX_CONNS);
	assert(child_idle(path, 4244, 1, 0) == 0);
	assert(wait_readable(idle[0], 30000) >= 0);
	{
		char b;
		assert(is_readable(idle[0]) && recv(idle[0], &b, 1, MSG_DONTWAIT) == 0);
		for (int i = 1; i < MAX_CONNS; i++)
			assert(!is_readable(idle[i]));
	}
	for (int i = 0; i < MAX_CONNS; i++)
		close(idle[i]);
	close_chan(ch, path);
	assert(chmod(dir, 0700) == 0);
	printf("one uid's share of the connections: ok\n");
}

/* ---- 5. claiming the path: stale, live, not a socket ---- */

static int probe_calls;
static int probe_result;
static char probe_path[128];

static int probe(const char *path)
{
	probe_calls++;
	snprintf(probe_path, sizeof(probe_path), "%s", path);
	return probe_result;
}

/* A socket bound to @path and closed without unlink: what a killed daemon leaves. */
static void make_stale(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct stat st;

	strcpy(sa.sun_path, path);
	assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 4) == 0);
	close(fd);
	assert(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
}

static int make_live(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	strcpy(sa.sun_path, path);
	assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 4) == 0);
	return fd;
}

static void test_claim(void)
{
	char path[128], file[128], sub[128], longp[200], err[256], want[512];
	struct stat st;
	const char *log;
	int live, fd;

	sockpath(path, sizeof(path), "claim.sock");
	sockpath(file, sizeof(file), "plain-file");
	sockpath(sub, sizeof(sub), "plain-file/x.sock");

	/* nothing there: nothing to do, no probe */
	probe_calls = 0;
	err[0] = 0;
	assert(sock_claim_path(path, probe, err, sizeof(err)) == 0);
	assert(probe_calls == 0 && err[0] == 0);

	/* a stale socket: replaced, said so */
	make_stale(path);
	capture_begin();
	assert(sock_claim_path(path, NULL, err, sizeof(err)) == 0);
	log = capture_end();
	assert(lstat(path, &st) < 0 && errno == ENOENT);
	snprintf(want, sizeof(want), "loaderd: notice: replaced stale socket %s\n", path);
	assert(strcmp(log, want) == 0);

	/* a live one: refused, left alone, still serving */
	live = make_live(path);
	assert(sock_claim_path(path, NULL, err, sizeof(err)) == -EADDRINUSE);
	snprintf(want, sizeof(want), "another loaderd is already listening on %s", path);
	assert(strcmp(err, want) == 0);
	assert(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
	fd = client_connect(path);
	close(fd);
	/* the plain probe connected once and hung up: drain it */
	for (int i = 0; i < 2; i++) {
		int a = accept4(live, NULL, NULL, SOCK_NONBLOCK);
		if (a >= 0)
			close(a);
	}
	close(live);

	/* a bound socket that does not listen (yet) counts as stale */
	{
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int b = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		unlink(path);
		strcpy(sa.sun_path, path);
		assert(bind(b, (struct sockaddr *)&sa, sizeof(sa)) == 0);
		capture_begin();
		assert(sock_claim_path(path, NULL, err, sizeof(err)) == 0);
		capture_end();
		assert(lstat(path, &st) < 0 && errno == ENOENT);
		close(b);
	}

	/* the probe decides when given (the nng endpoint's SP handshake) */
	make_stale(path);
	probe_calls = 0;
	probe_result = 0; /* answered */
	assert(sock_claim_path(path, probe, err, sizeof(err)) == -EADDRINUSE);
	assert(probe_calls == 1 && strcmp(probe_path, path) == 0);
	snprintf(want, sizeof(want), "another loaderd is already listening on %s", path);
	assert(strcmp(err, want) == 0);
	assert(lstat(path, &st) == 0);
	probe_result = -EIO; /* connected, no handshake: neither ours to take nor known dead */
	assert(sock_claim_path(path, probe, err, sizeof(err)) == -EIO);
	snprintf(want, sizeof(want), "cannot check %s: %s", path, strerror(EIO));
	assert(strcmp(err, want) == 0);
	assert(lstat(path, &st) == 0);
	probe_result = -ECONNREFUSED; /* nobody */
	capture_begin();
	assert(sock_claim_path(path, probe, err, sizeof(err)) == 0);
	capture_end();
	assert(probe_calls == 3);
	assert(lstat(path, &st) < 0 && errno == ENOENT);

	/* not a socket: never probed, never removed */
	fd = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	assert(fd >= 0 && write(fd, "keep", 4) == 4);
	close(fd);
	probe_calls = 0;
	assert(sock_claim_path(file, probe, err, sizeof(err)) == -EEXIST);
	snprintf(want, sizeof(want), "%s exists and is not a socket", file);
	assert(strcmp(err, want) == 0);
	assert(probe_calls == 0);
	assert(lstat(file, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 4);

	/* a path that cannot be looked up */
	assert(sock_claim_path(sub, probe, err, sizeof(err)) == -ENOTDIR);
	snprintf(want, sizeof(want), "cannot use socket path %s: %s", sub, strerror(ENOTDIR));
	assert(strcmp(err, want) == 0);

	/* too long for sun_path */
	memset(longp, 'x', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = 0;
	assert(sock_claim_path(longp, probe, err, sizeof(err)) == -ENAMETOOLONG);
	snprintf(want, sizeof(want), "socket path too long (most 107 bytes): %s", longp);
	assert(strcmp(err, want) == 0);
	assert(probe_calls == 0);
	printf("claim: stale, live, probe, not a socket, errors: ok\n");
}

/* ---- 6. fdchan_new over those paths ---- */

static void test_new(void)
{
	char path[128], nodir[128], file[128], err[256], want[512];
	struct fdchan *ch, *ch2 = NULL;
	struct tok *t;
	struct fdchan_request rq;
	struct got g;
	const char *log;

	sockpath(path, sizeof(path), "e.fds");
	sockpath(nodir, sizeof(nodir), "no-such-dir/e.fds");
	sockpath(file, sizeof(file), "plain-file");

	/* over a stale socket: replaced, and it serves */
	make_stale(path);
	capture_begin();
	ch = open_chan(path, 0660, -1);
	log = capture_end();
	snprintf(want, sizeof(want), "loaderd: notice: replaced stale socket %s\n", path);
	assert(strcmp(log, want) == 0);
	t = add_token(70, getuid(), 4096, 0);
	rq = make_req(t->token);
	g = exchange(path, &rq, sizeof(rq));
	assert(g.rep.status == 0 && g.nfds == 1 && same_file(g.fds[0], t->fd));
	close_fds(&g);

	/* a second channel on a live one's path: refused; the first goes on */
	assert(fdchan_new(&ch2, &loop, path, 0660, -1, lookup, NULL, err, sizeof(err)) == -EADDRINUSE);
	assert(ch2 == NULL);
	snprintf(want, sizeof(want), "another loaderd is already listening on %s", path);
	assert(strcmp(err, want) == 0);
	/* the claim's probe connection: accepted before the next (one queue), no harm */
	t = add_token(71, getuid(), 8192, 0);
	rq = make_req(t->token);
	g = exchange(path, &rq, sizeof(rq));
	assert(g.rep.status == 0 && g.nfds == 1 && g.rep.size == 8192 && same_file(g.fds[0], t->fd));
	close_fds(&g);
	close_chan(ch, path);

	/* not a socket, no such directory, too long: errors that say so */
	assert(fdchan_new(&ch2, &loop, file, 0660, -1, lookup, NULL, err, sizeof(err)) == -EEXIST);
	snprintf(want, sizeof(want), "%s exists and is not a socket", file);
	assert(strcmp(err, want) == 0);
	assert(fdchan_new(&ch2, &loop, nodir, 0660, -1, lookup, NULL, err, sizeof(err)) == -ENOENT);
	snprintf(want, sizeof(want), "cannot listen on %s: %s", nodir, strerror(ENOENT));
	assert(strcmp(err, want) == 0);
	assert(ch2 == NULL);

	fdchan_close(NULL);
	assert(uv_run(&loop, UV_RUN_DEFAULT) == 0);
	printf("fdchan_new: stale replaced, live refused, errors: ok\n");
}

static int rm_entry(const char *name)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return unlink(p);
}

int main(void)
{
	alarm(100); /* a hang fails here, before meson's timeout */
	setvbuf(stdout, NULL, _IOLBF, 0);
	unsetenv("JOURNAL_STREAM"); /* the log lines compared start "loaderd: " */
	signal(SIGPIPE, SIG_DFL); /* a send without MSG_NOSIGNAL would kill us */
	snprintf(dir, sizeof(dir), "/tmp/test-fdchan-XXXXXX");
	assert(mkdtemp(dir));
	assert(uv_loop_init(&loop) == 0);

	test_exchange();
	test_malformed();
	test_peer_uid();
	test_idle();
	test_uid_share();
	test_claim();
	test_new();

	for (unsigned i = 0; i < L.ntoks; i++) {
		close(L.toks[i].fd);
		if (L.toks[i].dev_fd >= 0)
			close(L.toks[i].dev_fd);
	}
	assert(uv_loop_close(&loop) == 0);
	rm_entry("plain-file");
	assert(rmdir(dir) == 0); /* every socket path was removed */
	printf("ok\n");
	return 0;
}
