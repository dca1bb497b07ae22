/* SPDX-License-Identifier: MIT */
/* test-fake - libloader against a fake daemon that says what the real one never does
 *
 * The fake (threads of this process) answers libloader's requests on a
 * private nng socket and fd channel with crafted replies: an attach reply
 * whose field lies outside its slot only once offset + batch_size *
 * sample_bytes is computed without wrapping, and a batch descriptor whose
 * slot is out of range. libloader must refuse each with an error that names
 * it, give the bad delivery's lease back, and go on.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fdchan-wire.h"
#include "loader.pb-c.h"
#include "loader/loader.h"

#define NSLOTS 4
#define SLOT_BYTES 4096
#define BAD_SEQ 1                /* the delivery whose slot is out of range */
#define LEASE(seq) (100 + (seq))

static char dir[64], sock_path[128], fd_path[140];
static nng_socket rep_sock;
static int fd_listener;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_seq;
static bool released[64];       /* by lease - 100 */

static void note_releases(const uint64_t *l, size_t n)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n; i++)
		if (l[i] >= LEASE(0) && l[i] < LEASE(64))
			released[l[i] - LEASE(0)] = true;
	pthread_mutex_unlock(&lock);
}

static bool was_released(uint64_t lease)
{
	bool r;

	pthread_mutex_lock(&lock);
	r = released[lease - LEASE(0)];
	pthread_mutex_unlock(&lock);
	return r;
}

static void attach_reply(Loaderd__Reply *rp, Loaderd__AttachReply *ar, Loaderd__Field *f,
                         Loaderd__Field **fp, int64_t *shape, uint8_t *token, const char *pipeline)
{
	bool wrap = strcmp(pipeline, "wrap") == 0;

	memset(token, 0x5a, FDCHAN_TOKEN_BYTES);
	f->name = "x";
	f->dtype = LDR_DTYPE_UINT8;
	shape[0] = 16;
	f->n_sample_shape = 1;
	f->sample_shape = shape;
	/* "wrap": 4 * 8 bytes from 2^64 - 16 end at 16, inside the slot only
	 * for a sum that wraps */
	f->offset = wrap ? UINT64_MAX - 15 : 0;
	f->sample_bytes = wrap ? 8 : 16;
	*fp = f;
	ar->attach_id = 7;
	ar->fd_token.data = token;
	ar->fd_token.len = FDCHAN_TOKEN_BYTES;
	ar->slab_bytes = NSLOTS * SLOT_BYTES;
	ar->slot_bytes = SLOT_BYTES;
	ar->nslots = NSLOTS;
	ar->n_fields = 1;
	ar->fields = fp;
	ar->batch_size = wrap ? 4 : 2;
	ar->batches_per_epoch = 1000;
	ar->samples = 2000;
	ar->fd_path = fd_path;
	ar->credits = 2;
	rp->body_case = LOADERD__REPLY__BODY_ATTACH;
	rp->attach = ar;
}

/* One delivery per Next: slot seq % NSLOTS, but out of range at BAD_SEQ. */
static void batches_reply(Loaderd__Reply *rp, Loaderd__Batches *bs, Loaderd__Batch *b,
                          Loaderd__Batch **bp)
{
	pthread_mutex_lock(&lock);
	b->seq = next_seq++;
	pthread_mutex_unlock(&lock);
	b->lease = LEASE(b->seq);
	b->index = b->seq;
	b->slot = b->seq == BAD_SEQ ? 99 : (uint32_t)(b->seq % NSLOTS);
	b->rows = 2;
	*bp = b;
	bs->n_batches = 1;
	bs->batches = bp;
	rp->body_case = LOADERD__REPLY__BODY_BATCHES;
	rp->batches = bs;
}

static void *serve(void *arg)
{
	(void)arg;
	for (;;) {
		Loaderd__Reply rp = LOADERD__REPLY__INIT;
		Loaderd__HelloReply hr = LOADERD__HELLO_REPLY__INIT;
		Loaderd__AttachReply ar = LOADERD__ATTACH_REPLY__INIT;
		Loaderd__Field f = LOADERD__FIELD__INIT, *fp;
		Loaderd__Batches bs = LOADERD__BATCHES__INIT;
		Loaderd__Batch b = LOADERD__BATCH__INIT, *bp;
		Loaderd__Ok ok = LOADERD__OK__INIT;
		Loaderd__Error er = LOADERD__ERROR__INIT;
		Loaderd__Request *rq;
		uint8_t token[FDCHAN_TOKEN_BYTES], *out;
		int64_t shape[1];
		void *buf;
		size_t len;

		if (nng_recv(rep_sock, &buf, &len, NNG_FLAG_ALLOC) != 0)
			return NULL;
		rq = loaderd__request__unpack(NULL, len, buf);
		nng_free(buf, len);
		assert(rq);
		switch (rq->body_case) {
		case LOADERD__REQUEST__BODY_HELLO:
			hr.protocol = LDR_PROTOCOL_VERSION;
			hr.daemon_version = "fake";
			hr.client_id = 1;
			rp.body_case = LOADERD__REPLY__BODY_HELLO;
			rp.hello = &hr;
			break;
		case LOADERD__REQUEST__BODY_ATTACH:
			attach_reply(&rp, &ar, &f, &fp, shape, token, rq->attach->pipeline);
			break;
		case LOADERD__REQUEST__BODY_NEXT:
			note_releases(rq->next->releases, rq->next->n_releases);
			batches_reply(&rp, &bs, &b, &bp);
			break;
		case LOADERD__REQUEST__BODY_RELEASE:
			note_releases(rq->release->leases, rq->release->n_leases);
			/* fall through */
		case LOADERD__REQUEST__BODY_DETACH:
			rp.body_case = LOADERD__REPLY__BODY_OK;
			rp.ok = &ok;
			break;
		default:
			er.code = ENOTSUP;
			er.message = "not in the fake";
			rp.body_case = LOADERD__REPLY__BODY_ERROR;
			rp.error = &er;
			break;
		}
		len = loaderd__reply__get_packed_size(&rp);
		out = malloc(len ? len : 1);
		loaderd__reply__pack(&rp, out);
		loaderd__request__free_unpacked(rq, NULL);
		nng_send(rep_sock, out, len, 0);
		free(out);
	}
}

/* The fd channel: every token gets a fresh memfd of the slab's size. */
static void *serve_fds(void *arg)
{
	(void)arg;
	for (;;) {
		struct fdchan_request rq;
		struct fdchan_reply rp = { .magic = FDCHAN_MAGIC, .size = NSLOTS * SLOT_BYTES, .nfds = 1 };
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = { .iov_base = &rp, .iov_len = sizeof(rp) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
		                     .msg_controllen = sizeof(u.buf) };
		struct cmsghdr *cm;
		int c = accept(fd_listener, NULL, NULL), mfd;

		if (c < 0)
			return NULL;
		assert(recv(c, &rq, sizeof(rq), MSG_WAITALL) == (ssize_t)sizeof(rq));
		assert((mfd = memfd_create("fake-slab", MFD_CLOEXEC)) >= 0);
		assert(ftruncate(mfd, NSLOTS * SLOT_BYTES) == 0);
		memset(&u, 0, sizeof(u));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
		assert(sendmsg(c, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(rp));
		close(mfd);
		close(c);
	}
}

static void fake_start(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char url[160];
	pthread_t t;

	snprintf(dir, sizeof(dir), "/tmp/ldr-fake-XXXXXX");
	assert(mkdtemp(dir));
	snprintf(sock_path, sizeof(sock_path), "%s/loaderd.sock", dir);
	snprintf(fd_path, sizeof(fd_path), "%s.fds", sock_path);
	assert(nng_rep0_open(&rep_sock) == 0);
	snprintf(url, sizeof(url), "ipc://%s", sock_path);
	assert(nng_listen(rep_sock, url, NULL, 0) == 0);
	assert((fd_listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	strcpy(sa.sun_path, fd_path);
	assert(bind(fd_listener, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	assert(listen(fd_listener, 16) == 0);
	assert(pthread_create(&t, NULL, serve, NULL) == 0);
	pthread_detach(t);
	assert(pthread_create(&t, NULL, serve_fds, NULL) == 0);
	pthread_detach(t);
}

/* A field that lies outside its slot, but not once the sum wraps: refused. */
static void test_wrapping_field(struct ldr_client *c)
{
	struct ldr_attachment *a = NULL;
	int r = ldr_attach(c, "wrap", NULL, &a);

	if (r != -EPROTO || !strstr(ldr_client_error(c), "attach reply: field 0 is malformed")) {
		fprintf(stderr, "test-fake: attach with a wrapping field: %d (%s)\n", r,
		        r ? ldr_client_error(c) : "attached");
		abort();
	}
}

/* A delivery whose slot is out of range fails that one ldr_next(), not the
 * attachment, and its lease goes back to the daemon. */
static void test_bad_descriptor(struct ldr_client *c)
{
	struct ldr_attachment *a;
	struct ldr_batch *b;
	int r;

	assert(ldr_attach(c, "bad", NULL, &a) == 0);
	assert(ldr_next(a, 10000, &b) == 0);
	assert(ldr_batch_index(b) == 0);
	ldr_release(b);
	r = ldr_next(a, 10000, &b);
	if (r != -EPROTO || !strstr(ldr_client_error(c), "batch descriptor out of range: slot 99 of 4")) {
		fprintf(stderr, "test-fake: the bad delivery: %d (%s)\n", r,
		        r ? ldr_client_error(c) : "a batch");
		abort();
	}
	assert(strstr(ldr_client_error(c), "(lease 101 given back)"));
	/* the next ones come as before */
	for (uint64_t seq = BAD_SEQ + 1; seq < BAD_SEQ + 6; seq++) {
		r = ldr_next(a, 10000, &b);
		if (r != 0) {
			fprintf(stderr, "test-fake: after the bad delivery: %d (%s)\n", r, ldr_client_error(c));
			abort();
		}
		assert(ldr_batch_index(b) == seq);
		ldr_release(b);
	}
	/* the daemon got the bad delivery's lease back (a Release or a Next's) */
	for (int i = 0; i < 1000 && !was_released(LEASE(BAD_SEQ)); i++) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	assert(was_released(LEASE(BAD_SEQ)));
	assert(was_released(LEASE(0)));
}

int main(void)
{
	struct ldr_client *c;

	signal(SIGPIPE, SIG_IGN);
	setenv("LOADERD_RING", "0", 1);
	fake_start();
	assert(ldr_connect(&c, sock_path, "test-fake") == 0);
	test_wrapping_field(c);
	test_bad_descriptor(c);
	unlink(fd_path);
	unlink(sock_path);
	rmdir(dir);
	printf("test-fake: ok\n");
	/* no ldr_close(): the fake cannot answer a clean shutdown in order; exit */
	fflush(stdout);
	_exit(0);
}
