/* SPDX-License-Identifier: MIT */
/* test-wire - hostile bytes on the daemon's sockets get errors, never a crash
 *
 * Starts the real loaderd (argv[1]) on a private socket and talks to it with a
 * raw nng REQ socket, a raw unix socket and the fd channel: malformed protobuf,
 * a truncated message, an oversized message, requests before Hello, a wrong
 * protocol version, unknown attachments, garbage framing and bogus tokens.
 * After each, the daemon must still answer a well-behaved libloader client.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <grp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdchan-wire.h"
#include "loader.pb-c.h"
#include "loader/loader.h"
#include "test-daemon.h"

/* The daemon still serves a well-behaved client. */
static void check_alive(void)
{
	fprintf(stderr, "test-wire: check_alive\n");
	struct ldr_client *c;
	char *json = NULL;

	assert(kill(daemon_pid, 0) == 0);
	assert(ldr_connect(&c, sock_path, "test-wire") == 0);
	assert(ldr_status_json(c, &json) == 0);
	assert(strstr(json, "\"pipelines\""));
	ldr_free(json);
	ldr_close(c);
}

static nng_socket raw_open(void)
{
	nng_socket s;
	char url[160];

	assert(nng_req0_open(&s) == 0);
	/* a reply that does not come is an error (NULL) only here: generous,
	 * for a loaded machine and a sanitizer build of the daemon */
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 30000);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 30000);
	snprintf(url, sizeof(url), "ipc://%s", sock_path);
	assert(nng_dial(s, url, NULL, 0) == 0);
	return s;
}

/* Send raw bytes; return the unpacked reply or NULL (closed / timed out). */
static Loaderd__Reply *raw_call(nng_socket s, const void *buf, size_t len)
{
	void *rbuf;
	size_t rlen;
	Loaderd__Reply *rep;

	if (nng_send(s, (void *)buf, len, 0) != 0)
		return NULL;
	if (nng_recv(s, &rbuf, &rlen, NNG_FLAG_ALLOC) != 0)
		return NULL;
	rep = loaderd__reply__unpack(NULL, rlen, rbuf);
	nng_free(rbuf, rlen);
	assert(rep);
	return rep;
}

static Loaderd__Reply *call_req(nng_socket s, const Loaderd__Request *req)
{
	size_t len = loaderd__request__get_packed_size(req);
	uint8_t *buf = malloc(len ? len : 1);
	Loaderd__Reply *rep;

	loaderd__request__pack(req, buf);
	rep = raw_call(s, buf, len);
	free(buf);
	return rep;
}

static void expect_error(Loaderd__Reply *rep, int code, const char *text)
{
	assert(rep);
	if (rep->body_case != LOADERD__REPLY__BODY_ERROR || rep->error->code != code ||
	    !strstr(rep->error->message, text)) {
		fprintf(stderr, "expected error %d '%s', got case %d code %d '%s'\n", code, text,
		        rep->body_case, rep->body_case == LOADERD__REPLY__BODY_ERROR ? rep->error->code : 0,
		        rep->body_case == LOADERD__REPLY__BODY_ERROR ? rep->error->message : "");
		abort();
	}
	loaderd__reply__free_unpacked(rep, NULL);
}

static void hello(nng_socket s, uint32_t protocol, int expect_code)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Hello h = LOADERD__HELLO__INIT;
	Loaderd__Reply *rep;

	h.protocol = protocol;
	h.client_name = "raw";
	req.body_case = LOADERD__REQUEST__BODY_HELLO;
	req.hello = &h;
	rep = call_req(s, &req);
	if (expect_code) {
		expect_error(rep, expect_code, "protocol version");
		return;
	}
	assert(rep && rep->body_case == LOADERD__REPLY__BODY_HELLO);
	assert(rep->hello->protocol == LDR_PROTOCOL_VERSION);
	loaderd__reply__free_unpacked(rep, NULL);
}

static void test_malformed(void)
{
	nng_socket s = raw_open();
	static const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x34 };
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__Status st = LOADERD__STATUS__INIT;

	/* before Hello */
	req.body_case = LOADERD__REQUEST__BODY_STATUS;
	req.status = &st;
	expect_error(call_req(s, &req), EPROTO, "first request must be Hello");
	/* not protobuf at all */
	expect_error(raw_call(s, garbage, sizeof(garbage)), EPROTO, "malformed request");
	/* an empty message is a Request with no body */
	expect_error(raw_call(s, "", 0), EPROTO, "first request must be Hello");
	hello(s, LDR_PROTOCOL_VERSION + 7, EPROTONOSUPPORT);
	hello(s, LDR_PROTOCOL_VERSION, 0);
	expect_error(raw_call(s, "", 0), EPROTO, "empty or unknown request");
	expect_error(raw_call(s, garbage, sizeof(garbage)), EPROTO, "malformed request");

	/* a valid Create cut in the middle of its spec string */
	{
		Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
		size_t len;
		uint8_t *buf;
		cp.spec_json = "{\"name\": \"x\", \"source\": {\"kind\": \"npy\", \"paths\": [\"/nonexistent.npy\"]}}";
		req.body_case = LOADERD__REQUEST__BODY_CREATE;
		req.create = &cp;
		len = loaderd__request__get_packed_size(&req);
		buf = malloc(len);
		loaderd__request__pack(&req, buf);
		expect_error(raw_call(s, buf, len / 2), EPROTO, "malformed request");
		/* the whole one: the file is missing, and the error says which */
		expect_error(raw_call(s, buf, len), ENOENT, "/nonexistent.npy");
		free(buf);
	}
	/* requests about attachments that do not exist */
	{
		Loaderd__Next nx = LOADERD__NEXT__INIT;
		Loaderd__Detach dt = LOADERD__DETACH__INIT;
		Loaderd__Attach at = LOADERD__ATTACH__INIT;
		nx.attach_id = 424242;
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &nx;
		expect_error(call_req(s, &req), ENOENT, "no attachment 424242");
		dt.attach_id = 7;
		req.body_case = LOADERD__REQUEST__BODY_DETACH;
		req.detach = &dt;
		expect_error(call_req(s, &req), ENOENT, "no attachment 7");
		at.pipeline = "nope";
		req.body_case = LOADERD__REQUEST__BODY_ATTACH;
		req.attach = &at;
		expect_error(call_req(s, &req), ENOENT, "no pipeline named 'nope'");
		at.mode = (Loaderd__Mode)9;
		/* an unknown enum value decodes as is: still refused by name lookup first */
		expect_error(call_req(s, &req), ENOENT, "no pipeline named 'nope'");
	}
	/* a spec that is not JSON */
	{
		Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
		cp.spec_json = "{not json";
		req.body_case = LOADERD__REQUEST__BODY_CREATE;
		req.create = &cp;
		expect_error(call_req(s, &req), EINVAL, "invalid JSON");
	}
	/* left open: see test_oversized() */
	check_alive();
}

/* Runs in a process of its own (test-wire --oversized SOCKET): nng 1.5.2 can
 * wedge the sending process's own reaper when the peer drops a connection in
 * the middle of a large send, and that must not stall the rest of the test. */
static int oversized_child(void)
{
	nng_socket s = raw_open();
	size_t len = 2u << 20;
	uint8_t *buf = calloc(1, len);

	hello(s, LDR_PROTOCOL_VERSION, 0);
	/* larger than the daemon's 1 MiB limit: it drops the connection (nng's
	 * REQ resends it on the next connection, dropped again, until this
	 * timeout: no reply is what is checked, a short wait is enough) */
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 3000);
	if (raw_call(s, buf, len) != NULL)
		return 1;
	printf("oversized: no reply, connection dropped\n");
	fflush(stdout);
	_exit(0);
}

static void test_oversized(const char *self)
{
	pid_t pid = fork();
	int status;

	assert(pid >= 0);
	if (pid == 0) {
		execl(self, self, "--oversized", sock_path, (char *)NULL);
		_exit(127);
	}
	assert(waitpid(pid, &status, 0) == pid);
	assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	check_alive();
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert(fd >= 0);
	strcpy(sa.sun_path, path);
	assert(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	return fd;
}

static void test_garbage_framing(void)
{
	/* a correct SP handshake (we speak REQ, 0x30), then a frame of an
	 * unknown type and a length far beyond the limit: the pipe is dropped */
	static const uint8_t sp_head[8] = { 0, 'S', 'P', 0, 0x00, 0x30, 0, 0 };
	uint8_t peer_head[8], junk[4096];
	int fd = unix_connect(sock_path);

	assert(write(fd, sp_head, sizeof(sp_head)) == (ssize_t)sizeof(sp_head));
	assert(read(fd, peer_head, sizeof(peer_head)) == (ssize_t)sizeof(peer_head));
	assert(peer_head[1] == 'S' && peer_head[2] == 'P' && peer_head[5] == 0x31); /* REP */
	memset(junk, 0xa5, sizeof(junk));
	(void)!write(fd, junk, sizeof(junk));
	/* the daemon closes its end */
	while (read(fd, junk, sizeof(junk)) > 0)
		;
	close(fd);
	check_alive();
}

static void test_fdchan(void)
{
	struct {
		uint32_t magic, version;
		uint8_t token[16];
	} rq;
	struct {
		uint32_t magic;
		int32_t status;
		uint64_t size;
		uint32_t nfds, reserved;
		uint64_t device_size;
	} rp;
	int fd;

	/* wrong magic */
	fd = unix_connect(fd_path);
	memset(&rq, 0x11, sizeof(rq));
	assert(write(fd, &rq, sizeof(rq)) == (ssize_t)sizeof(rq));
	assert(read(fd, &rp, sizeof(rp)) == (ssize_t)sizeof(rp));
	assert(rp.status == -EPROTO);
	close(fd);
	/* version 1 (one fd, no device fields) is refused: both ends ship together */
	fd = unix_connect(fd_path);
	rq.magic = 0x4644444cu;
	rq.version = 1;
	assert(write(fd, &rq, sizeof(rq)) == (ssize_t)sizeof(rq));
	assert(read(fd, &rp, sizeof(rp)) == (ssize_t)sizeof(rp));
	assert(rp.status == -EPROTO);
	close(fd);
	/* a token nobody was given */
	fd = unix_connect(fd_path);
	rq.version = 2;
	assert(write(fd, &rq, sizeof(rq)) == (ssize_t)sizeof(rq));
	assert(read(fd, &rp, sizeof(rp)) == (ssize_t)sizeof(rp));
	assert(rp.status == -ENOENT);
	assert(rp.nfds == 0 && rp.device_size == 0);
	close(fd);
	/* half a request, then gone */
	fd = unix_connect(fd_path);
	assert(write(fd, &rq, 5) == 5);
	close(fd);
	check_alive();
}

/* Present @token on the fd channel; the reply's status (the fds it brings are closed). */
static int redeem(const uint8_t *token, uint32_t *nfds)
{
	struct fdchan_request rq = { .magic = FDCHAN_MAGIC, .version = FDCHAN_VERSION };
	struct fdchan_reply rp;
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = { .iov_base = &rp, .iov_len = sizeof(rp) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
	                     .msg_controllen = sizeof(cbuf) };
	int fd = unix_connect(fd_path);

	memcpy(rq.token, token, sizeof(rq.token));
	assert(write(fd, &rq, sizeof(rq)) == (ssize_t)sizeof(rq));
	assert(recvmsg(fd, &mh, MSG_CMSG_CLOEXEC) == (ssize_t)sizeof(rp));
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
			close(((int *)CMSG_DATA(cm))[i]);
	close(fd);
	*nfds = rp.nfds;
	return rp.status;
}

/* A token that another uid presented first (EPERM) is still its client's:
 * only a redemption that hands out the slab spends it. Then bad releases. */
static void test_token_refused_then_redeemed(void)
{
	Loaderd__Request req = LOADERD__REQUEST__INIT;
	Loaderd__CreatePipeline cp = LOADERD__CREATE_PIPELINE__INIT;
	Loaderd__Attach at = LOADERD__ATTACH__INIT;
	Loaderd__Reply *rep;
	nng_socket s = raw_open();
	uint8_t token[FDCHAN_TOKEN_BYTES];
	char spec[512];
	uint64_t attach_id;
	uint32_t nfds;
	int status;
	pid_t pid;

	write_tokens_n(1024);
	hello(s, LDR_PROTOCOL_VERSION, 0);
	snprintf(spec, sizeof(spec), "{\"name\": \"tok\", \"source\": {\"kind\": \"tokens\", \"path\": \"%s\","
	         " \"seq_len\": 8}, \"batch_size\": 4}", token_file);
	cp.spec_json = spec;
	req.body_case = LOADERD__REQUEST__BODY_CREATE;
	req.create = &cp;
	rep = call_req(s, &req);
	assert(rep && rep->body_case == LOADERD__REPLY__BODY_CREATE);
	loaderd__reply__free_unpacked(rep, NULL);
	at.pipeline = "tok";
	req.body_case = LOADERD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	rep = call_req(s, &req);
	assert(rep && rep->body_case == LOADERD__REPLY__BODY_ATTACH);
	assert(rep->attach->fd_token.len == sizeof(token));
	attach_id = rep->attach->attach_id;
	memcpy(token, rep->attach->fd_token.data, sizeof(token));
	loaderd__reply__free_unpacked(rep, NULL);

	/* ldr-alice (uid 1001) may reach the channel, not redeem root's token */
	assert(chmod(dir, 0711) == 0 && chmod(fd_path, 0666) == 0);
	pid = fork();
	assert(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) < 0 || setgid(1001) < 0 || setuid(1001) < 0)
			_exit(3);
		_exit(redeem(token, &nfds) == -EPERM && nfds == 0 ? 0 : 1);
	}
	assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* its client still gets the slab, once */
	assert(redeem(token, &nfds) == 0 && nfds >= 1);
	assert(redeem(token, &nfds) == -ENOENT && nfds == 0);

	/* releases of leases it was never given, inside a Next: the Next is
	 * answered, the daemon counts them and logs them (1st, 2nd, 4th...) */
	{
		Loaderd__Next nx = LOADERD__NEXT__INIT;
		uint64_t bogus[3] = { 424242, 424243, 424244 };
		struct ldr_client *c;
		char *json = NULL;
		nx.attach_id = attach_id;
		nx.releases = bogus;
		nx.n_releases = 3;
		nx.max_batches = 1;
		req.body_case = LOADERD__REQUEST__BODY_NEXT;
		req.next = &nx;
		rep = call_req(s, &req);
		assert(rep && rep->body_case == LOADERD__REPLY__BODY_BATCHES);
		loaderd__reply__free_unpacked(rep, NULL);
		assert(ldr_connect(&c, sock_path, "test-wire") == 0);
		assert(ldr_status_json(c, &json) == 0);
		if (!strstr(json, "\"bad_releases\":3")) {
			fprintf(stderr, "no bad_releases 3 in %s\n", json);
			abort();
		}
		ldr_free(json);
		ldr_close(c);
	}
	nng_close(s);
	unlink(token_file);
	check_alive();
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test-wire PATH-TO-LOADERD\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if (argc == 3 && strcmp(argv[1], "--oversized") == 0) {
		snprintf(sock_path, sizeof(sock_path), "%s", argv[2]);
		return oversized_child();
	}
	start_daemon(argv[1], "wire");
	check_alive();
	fprintf(stderr, "test-wire: test_malformed\n");
	test_malformed();
	fprintf(stderr, "test-wire: test_oversized\n");
	test_oversized(argv[0]);
	fprintf(stderr, "test-wire: test_garbage_framing\n");
	test_garbage_framing();
	fprintf(stderr, "test-wire: test_fdchan\n");
	test_fdchan();
	fprintf(stderr, "test-wire: test_token_refused_then_redeemed\n");
	test_token_refused_then_redeemed();
	stop_daemon();
	printf("test-wire: ok\n");
	return 0;
}
