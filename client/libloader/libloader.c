/* SPDX-License-Identifier: MIT */
/* libloader - the client library of loaderd
 *
 * One nng REQ socket per client. Control requests (create, attach...) are
 * synchronous, each on a context of its own. Batches flow through Next
 * requests kept in flight per attachment (see top_up(): a window of deliveries,
 * each request asking for several batches), each on its own context; the
 * deliveries are stored by delivery number, so ldr_next() hands them out in
 * order and normally finds the next one already there. Finished batches are
 * released by piggy-backing their leases on the next Next request, or, when
 * the trainer does not ask for more, by a Release two milliseconds later. The
 * client's flusher thread sends both, so next() does not write to the socket
 * while batches are waiting here. A host attachment of a daemon that offers a
 * batch ring (ring.c) has no Next requests for batches: the daemon writes
 * the deliveries into shared memory, the releases go back there.
 *
 * Slabs are mapped once per attach, read-only, from an fd fetched over the fd
 * channel with the attach reply's one-time token. An attachment stays mapped
 * while any of its batches is unreleased, even after ldr_detach(). A CUDA
 * attachment also maps the daemon's device slab once (devmap.c); its batches'
 * fields are device pointers into it, and a batch released with
 * ldr_release_after() goes back once the event recorded on the trainer's
 * stream completed (the attachment's waiter thread sees to that).
 *
 * nng is not fork-safe: every entry point compares the process's pid
 * (self_pid(): getpid() cached, forgotten at a fork) with the pid that made
 * the handle, and a child gets LDR_EFORKED without nng being touched.
 *
 * The library's files, one concept each (libloader-private.h holds the
 * structures they share):
 *   libloader.c   this map, errors (set_err()), the small exported helpers
 *   rpc.c         synchronous calls (call_gen())
 *   client.c      the client handle: allocation, references, the Hello
 *   connect.c     ldr_connect(), losing the connection, ldr_close()
 *   whose.c       whose daemon: each connection's peer uid, checked
 *   control.c     create, drop, status, list, set, reload
 *   fdchan.c      fetching the slab's fd over the fd channel
 *   amap.c        an attachment's mapping of a slab
 *   attach.c      ldr_attach(), ldr_detach()
 *   window.c      the window of Next requests (top_up()) and their replies
 *   request.c     sending a Next, a Release or the watch (req_send())
 *   arrived.c     the deliveries that arrived, by delivery number (store_reply())
 *   revoke.c      sharing slots: the watch and the daemon's Revoke
 *   flusher.c     the client's thread: top-ups and releases off the trainer's path
 *   release.c     an attachment's queue of releases, which the flusher sends
 *   stats.c       stall accounting (TrainerStats)
 *   keep.c        batches held and kept (copy-on-write), make_room()
 *   next.c        ldr_next(), ldr_release()
 *   cudawait.c    ldr_release_after(): the CUDA waiter thread
 *   accessors.c   what an attachment and a batch tell
 *   reconnect.c   following a restarted daemon
 *   ring.c        the batch ring: deliveries and releases in shared memory
 */
#include <protobuf-c/protobuf-c.h>
#include <stdarg.h>

#include "libloader-private.h"
#include "config.h"

__thread char tls_err[16384];

/*
 * set_err() - the thread's last error, which ldr_client_error() returns.
 *
 * The public API's end of the error idiom of common/common.h. Helpers
 * below the API (devmap.c, cudadrv.c) take `char *err, size_t errlen` and
 * fill it with errfmt(), as the daemon's code does; the ldr_* function that
 * called one hands that sentence on with set_err(r, "%s", err). Like
 * errfmt(), it returns @err, so a failure is reported and returned in one
 * statement: a failure an ldr_* function returns goes through it.
 */
int set_err(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tls_err, sizeof(tls_err), fmt, ap);
	va_end(ap);
	return err;
}

const char *ldr_strerror(int err)
{
	return error_name(err);
}

const char *ldr_dtype_name(enum ldr_dtype dtype)
{
	return dtype_name((int)dtype);
}

size_t ldr_dtype_size(enum ldr_dtype dtype)
{
	return dtype_size((int)dtype);
}

const char *ldr_mode_name(enum ldr_mode mode)
{
	return mode_name((int)mode);
}

int ldr_mode_from_name(const char *name)
{
	return mode_from_name(name);
}

int ldr_socket_path(char *buf, size_t size, const char *explicit_path)
{
	return sockpath_resolve(buf, size, explicit_path);
}

const char *ldr_version(void)
{
	return LOADERD_VERSION;
}

const char *ldr_nng_version(void)
{
	return nng_version();
}

const char *ldr_protobuf_c_version(void)
{
	return protobuf_c_version();
}

void ldr_free(void *ptr)
{
	free(ptr);
}

const char *ldr_client_error(const struct ldr_client *client)
{
	(void)client;
	return tls_err;
}

int nng_to_errno(int rv)
{
	switch (rv) {
	case 0: return 0;
	case NNG_ETIMEDOUT: return -ETIMEDOUT;
	case NNG_ENOMEM: return -ENOMEM;
	case NNG_ECONNREFUSED: return -ECONNREFUSED;
	case NNG_ENOENT: return -ENOENT;
	case NNG_EADDRINVAL: return -EINVAL;
	case NNG_EPERM: return -EACCES;
	case NNG_ECLOSED: case NNG_ECANCELED: case NNG_ECONNRESET: case NNG_ECONNSHUT:
		return LDR_EDISCONNECTED;
	case NNG_EMSGSIZE: return -EMSGSIZE;
	default: return -EIO;
	}
}

void deadline_after(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}
