/* SPDX-License-Identifier: MIT */
/* store - objects in S3-compatible storage and over https (see store.h)
 *
 * One request is one curl easy handle on the store's share (connections,
 * DNS and TLS sessions kept across requests and threads, locked by the
 * share's mutexes), made, run and cleaned up in the calling thread: no
 * handle crosses threads, so any number of source workers may call at once.
 *
 * libcurl 7.88's SigV4 (CURLOPT_AWS_SIGV4) has two traps that a server that
 * does not verify signatures hides (SeaweedFS verifies them):
 *  - it neither sends nor signs x-amz-content-sha256, which S3 requires:
 *    we send it ourselves (UNSIGNED-PAYLOAD: every request here is a GET
 *    or HEAD without a body), and libcurl signs every x-amz-* header given;
 *  - it signs the query string as it is in the URL, not in the canonical
 *    form: list_page() writes ListObjectsV2's query already canonical
 *    (keys sorted, values RFC 3986-encoded, '/' as %2F).
 * The path is signed as written too: key_path() encodes each byte of a key
 * but the unreserved ones and '/' once, which is S3's canonical URI.
 *
 * Faults: a 5xx or 429 answer, a connection lost or refused, a body shorter
 * than its Content-Length and a stalled body (CURLOPT_LOW_SPEED_*) are
 * tried again after an exponential backoff with full jitter, until
 * retry_seconds have passed; every other answer is final. An error answer's
 * XML gives the message: "URL: Code: Message (HTTP status)". A HEAD's error
 * has no body; its code comes from a one-byte GET of the same URL.
 *
 * A whole object's body is checked as it streams in, against one sum of all
 * its bytes that the answer gives: when an S3 store's ETag is a plain MD5
 * (32 hex digits: one PUT, not a multipart upload, not SSE-KMS or SSE-C),
 * the MD5 of the bytes; when the answer carries an x-amz-checksum-crc32,
 * -crc32c, -crc64nvme or -sha256 of the whole object (asked for with
 * x-amz-checksum-mode: ENABLED; a multipart upload's composite sum,
 * "SUM-PARTS", is no sum of the bytes), that one. Where it gives several,
 * only the cheapest is computed (a CRC, then the MD5, then SHA-256): one
 * verified sum of the whole body is the guarantee (a body corrupted on
 * its way), and a second one would add CPU time, not safety. A body that
 * does not match is a fault of the transport like a cut one (tried again;
 * counted, store_checksum_mismatches()); a range is not checked against
 * the sums of the whole.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "s3xml.h"
#include "sums.h"
#include "store.h"
#include "url.h"

/* idle connections kept per store: more than the source workers of a pipeline */
#define STORE_MAX_CONNECTIONS 64

struct store {
	struct store_config cfg;
	char scheme[8];      /* of the endpoint: "http" or "https" */
	char host[256];      /* host[:port] of the endpoint */
	char sigv4[128];     /* "aws:amz:REGION:s3" */
	bool listed;         /* store_endpoints names the endpoint itself */
	CURLSH *share;
	pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
};

/* One request: its target, what it asks, what came back. */
struct req {
	struct store *st;
	const char *url;     /* the caller's URL: every message names it */
	char *http;          /* the URL asked of the server */
	bool sign;
	bool head;
	bool ranged;
	bool verify;         /* a whole object: its body checked against its sums */
	uint64_t off;
	size_t len;
	const char *if_match;
	bool listed;         /* store_endpoints names the target itself */
	char refused[256];   /* why a connection was not made (open_socket()) */
	/* the body: into fd (>= 0, at offset got) or into buf (cap bytes;
	 * grow: realloc up to max) */
	int fd;
	bool werr;           /* a write to fd failed (errno in wno) */
	int wno;
	char *buf;
	size_t cap, got, max;
	bool grow, overflow;
	uint64_t seen;       /* bytes of a 200 answer to a Range seen */
	bool whole_done;     /* the range cut out of such an answer is complete */
	/* an error answer's body, kept for its XML */
	char ebody[8192];
	size_t elen;
	long status;
	char etag[128];
	bool sse_etag;       /* encrypted with KMS or the client's key: its ETag is no MD5 */
	bool s3_answer;      /* it says x-amz-request-id: an S3 store's, whose ETag may be an MD5 */
	enum sum_kind sum_kind; /* the x-amz-checksum-* the answer carries, SUM_NONE: none */
	char sum_want[64];   /* its value (base64) */
	bool sum_composite;  /* x-amz-checksum-type: COMPOSITE (a multipart upload's) */
	bool decided;        /* the body's first byte came: what to check is known */
	bool use_md5;        /* the ETag is the MD5 to check */
	struct sum md5;      /* of the body so far (use_md5) */
	struct sum sum;      /* of the body so far (sum_kind) */
	struct sum *own;     /* the caller's CRC32C of the body (store_get_fd()), or NULL */
	int64_t clen;        /* Content-Length, -1 when none */
	char cerr[CURL_ERROR_SIZE];
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- the endpoints stores may reach (config store_endpoints) ---- */

struct endpoint_rule {
	char scheme[8];
	char host[256];      /* lower case, an IPv6 address in brackets */
	bool under;          /* "*.HOST": every name under HOST, not HOST */
	long port;           /* the scheme's default when the entry has none */
};

static char **allowed;               /* as given; NULL: any endpoint */
static struct endpoint_rule *rules;
static size_t nrules;
static char allowed_text[1024];      /* the list, for messages */

/* The scheme, lower-case host and port of an http(s) URL, as libcurl reads
 * it for the request. */
static int url_target(const char *url, char *scheme, size_t scap, char *host, size_t hcap, long *port)
{
	CURLU *u = curl_url();
	char *s = NULL, *h = NULL, *p = NULL;
	int r = -EINVAL;

	if (!u)
		return -ENOMEM;
	if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_SCHEME, &s, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_PORT, &p, CURLU_DEFAULT_PORT) == CURLUE_OK &&
	    strlen(s) < scap && strlen(h) < hcap) {
		snprintf(scheme, scap, "%s", s);
		for (size_t i = 0; ; i++) {
			host[i] = (char)tolower((unsigned char)h[i]);
			if (!h[i])
				break;
		}
		*port = strtol(p, NULL, 10);
		r = 0;
	}
	curl_free(s);
	curl_free(h);
	curl_free(p);
	curl_url_cleanup(u);
	return r;
}

int store_set_endpoints(char *const *list, char *err, size_t errlen)
{
	size_t n = 0, used = 0;

	pthread_once(&global_once, global_init);
	while (list && list[n])
		n++;
	rules = calloc(n + 1, sizeof(*rules));
	allowed = calloc(n + 1, sizeof(*allowed));
	if (!rules || !allowed)
		return errfmt(-ENOMEM, err, errlen, "store_endpoints: out of memory");
	allowed_text[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		struct endpoint_rule *e = &rules[i];
		char url[512], sch[8], host[256];
		const char *p = strstr(list[i], "://");

		if (!p || strlen(list[i]) >= sizeof url)
			return errfmt(-EINVAL, err, errlen, "store_endpoints[%zu]: '%s' is not http(s)://HOST[:PORT]",
				      i, list[i]);
		e->under = !strncmp(p + 3, "*.", 2);
		snprintf(url, sizeof url, "%.*s%s", (int)(p + 3 - list[i]), list[i], p + (e->under ? 5 : 3));
		if (url_split_endpoint(url, sch, sizeof sch, host, sizeof host) < 0 || strchr(host, '*') ||
		    url_target(url, e->scheme, sizeof e->scheme, e->host, sizeof e->host, &e->port) < 0)
			return errfmt(-EINVAL, err, errlen, "store_endpoints[%zu]: '%s' is not http(s)://HOST[:PORT]"
				      " (HOST may start with *.)", i, list[i]);
		if (!(allowed[i] = strdup(list[i])))
			return errfmt(-ENOMEM, err, errlen, "store_endpoints: out of memory");
		used += (size_t)snprintf(allowed_text + used, used < sizeof allowed_text ? sizeof allowed_text - used : 0,
					 "%s%s", i ? ", " : "", list[i]);
		if (used >= sizeof allowed_text)
			used = sizeof allowed_text;
	}
	nrules = n;
	if (!list) {
		free(allowed);
		allowed = NULL;
	}
	return 0;
}

char *const *store_endpoints(void)
{
	return allowed;
}

/* May a store reach @url (an endpoint or an https:// URL)? *@listed: a
 * rule names its host itself (not "*."). */
static int endpoint_check(const char *url, const char *what, bool *listed, char *err, size_t errlen)
{
	char scheme[8], host[256];
	long port;

	*listed = false;
	if (!allowed)
		return 0;
	if (url_target(url, scheme, sizeof scheme, host, sizeof host, &port) < 0)
		return errfmt(-EINVAL, err, errlen, "%s '%s' is not an http(s) URL", what, url);
	for (size_t i = 0; i < nrules; i++) {
		const struct endpoint_rule *e = &rules[i];
		size_t hl = strlen(host), el = strlen(e->host);

		if (strcmp(e->scheme, scheme) || e->port != port)
			continue;
		if (!e->under && !strcmp(host, e->host)) {
			*listed = true;
			return 0;
		}
		if (e->under && hl > el + 1 && host[hl - el - 1] == '.' && !strcmp(host + hl - el, e->host))
			return 0;
	}
	if (!nrules)
		return errfmt(-EPERM, err, errlen, "%s '%s' is not one this daemon may reach (its config's "
			      "store_endpoints is empty: object storage is off)", what, url);
	return errfmt(-EPERM, err, errlen, "%s '%s' is not one this daemon may reach (its config's "
		      "store_endpoints: %s)", what, url, allowed_text);
}

void store_config_init(struct store_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->retry_seconds = 20;
	cfg->stall_seconds = 30;
	cfg->connect_seconds = 10;
}

static int env_copy(char *dst, size_t cap, const char *const *env, const char *name, char *err,
		    size_t errlen)
{
	const char *v = env_value(env, name);

	if (!v)
		return 0;
	if (strlen(v) >= cap)
		return errfmt(-EINVAL, err, errlen, "%s: longer than %zu bytes", name, cap - 1);
	strcpy(dst, v);
	return 1;
}

/* The scheme and host[:port] of @endpoint (trailing '/' allowed, no path). */
int store_config_from_env(struct store_config *cfg, const char *const *env, char *err, size_t errlen)
{
	char scheme[8], host[256];
	int r, got;

	got = env_copy(cfg->endpoint, sizeof cfg->endpoint, env, "AWS_ENDPOINT_URL_S3", err, errlen);
	if (got == 0)
		got = env_copy(cfg->endpoint, sizeof cfg->endpoint, env, "AWS_ENDPOINT_URL", err, errlen);
	if (got < 0)
		return got;
	if (got) {
		if (url_split_endpoint(cfg->endpoint, scheme, sizeof scheme, host, sizeof host) < 0)
			return errfmt(-EINVAL, err, errlen, "%s: '%s' is not http(s)://HOST[:PORT]",
				      env_value(env, "AWS_ENDPOINT_URL_S3") ? "AWS_ENDPOINT_URL_S3" : "AWS_ENDPOINT_URL",
				      cfg->endpoint);
		if (url_host_is_literal(host))
			cfg->path_style = true;
	}
	r = env_copy(cfg->region, sizeof cfg->region, env, "AWS_REGION", err, errlen);
	if (r == 0)
		r = env_copy(cfg->region, sizeof cfg->region, env, "AWS_DEFAULT_REGION", err, errlen);
	if (r < 0)
		return r;
	if ((r = env_copy(cfg->access_key, sizeof cfg->access_key, env, "AWS_ACCESS_KEY_ID", err, errlen)) < 0 ||
	    (r = env_copy(cfg->secret_key, sizeof cfg->secret_key, env, "AWS_SECRET_ACCESS_KEY", err, errlen)) < 0 ||
	    (r = env_copy(cfg->session_token, sizeof cfg->session_token, env, "AWS_SESSION_TOKEN", err, errlen)) < 0)
		return r;
	return 0;
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg)
{
	struct store *st = arg;

	(void)h;
	(void)access;
	pthread_mutex_lock(&st->locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
	struct store *st = arg;

	(void)h;
	pthread_mutex_unlock(&st->locks[data]);
}

int store_new(struct store **out, const struct store_config *cfg, char *err, size_t errlen)
{
	struct store *st;
	int r;

	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK)
		return errfmt(-EIO, err, errlen, "store: curl_global_init: %s", curl_easy_strerror(global_rc));
	st = calloc(1, sizeof *st);
	if (!st)
		return errfmt(-ENOMEM, err, errlen, "store: out of memory");
	st->cfg = *cfg;
	if (!st->cfg.region[0])
		strcpy(st->cfg.region, "us-east-1");
	if (!st->cfg.endpoint[0])
		snprintf(st->cfg.endpoint, sizeof st->cfg.endpoint, "https://s3.%s.amazonaws.com", st->cfg.region);
	if (url_split_endpoint(st->cfg.endpoint, st->scheme, sizeof st->scheme, st->host, sizeof st->host) < 0) {
		r = errfmt(-EINVAL, err, errlen, "store: endpoint '%s' is not http(s)://HOST[:PORT]",
			       st->cfg.endpoint);
		free(st);
		return r;
	}
	if ((r = endpoint_check(st->cfg.endpoint, "store: endpoint", &st->listed, err, errlen)) < 0) {
		free(st);
		return r;
	}
	snprintf(st->sigv4, sizeof st->sigv4, "aws:amz:%s:s3", st->cfg.region);
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_init(&st->locks[i], NULL);
	st->share = curl_share_init();
	if (!st->share || curl_share_setopt(st->share, CURLSHOPT_LOCKFUNC, share_lock) ||
	    curl_share_setopt(st->share, CURLSHOPT_UNLOCKFUNC, share_unlock) ||
	    curl_share_setopt(st->share, CURLSHOPT_USERDATA, st) ||
	    curl_share_setopt(st->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) ||
	    curl_share_setopt(st->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) ||
	    curl_share_setopt(st->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION)) {
		store_free(st);
		return errfmt(-ENOMEM, err, errlen, "store: cannot set up a curl share");
	}
	*out = st;
	return 0;
}

struct store *store_free(struct store *st)
{
	if (!st)
		return NULL;
	if (st->share)
		curl_share_cleanup(st->share);
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&st->locks[i]);
	/* the secret goes from memory with the store */
	explicit_bzero(&st->cfg, sizeof st->cfg);
	free(st);
	return NULL;
}

/**
 * http_url() - the URL to ask of the server for @url, in malloc'd *@out
 * @query: a canonical query string to append, or NULL
 * @need_key: an object's URL (a key is required), else a bucket's
 */
static int http_url(struct store *st, const char *url, const char *query, bool need_key, char **out,
		    bool *sign, bool *listed, char *err, size_t errlen)
{
	char bucket[256];
	const char *key;
	size_t cap;
	char *s, *p;
	int r;

	*listed = st->listed;
	if (!strncmp(url, "https://", 8) || !strncmp(url, "http://", 7)) {
		if (query)
			return errfmt(-EINVAL, err, errlen, "%s: only s3:// URLs can be listed", url);
		if ((r = endpoint_check(url, "URL", listed, err, errlen)) < 0)
			return r;
		*out = strdup(url);
		*sign = false;
		return *out ? 0 : errfmt(-ENOMEM, err, errlen, "%s: out of memory", url);
	}
	if (strncmp(url, "s3://", 5))
		return errfmt(-EINVAL, err, errlen, "%s: not an s3:// or https:// URL", url);
	if (url_split_s3(url, bucket, sizeof bucket, &key) < 0)
		return errfmt(-EINVAL, err, errlen, "%s: no valid bucket name after s3://", url);
	if (need_key && !key[0])
		return errfmt(-EINVAL, err, errlen, "%s: no object key after the bucket", url);
	cap = strlen(st->cfg.endpoint) + strlen(bucket) + 3 * strlen(key) + (query ? strlen(query) : 0) + 16;
	s = malloc(cap);
	if (!s)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", url);
	if (st->cfg.path_style)
		p = s + sprintf(s, "%s://%s/%s/", st->scheme, st->host, bucket);
	else
		p = s + sprintf(s, "%s://%s.%s/", st->scheme, bucket, st->host);
	if (need_key)
		p = url_encode(p, s + cap, key, strlen(key), true);
	if (query)
		sprintf(p, "?%s", query);
	*out = s;
	*sign = st->cfg.access_key[0] != '\0';
	return 0;
}

/* Whether @etag ("\"HEX\"", quotes optional) is a plain MD5: 32 hex digits.
 * A multipart upload's ends in "-PARTS" and is none. */
static bool etag_is_md5(const char *etag)
{
	size_t n;

	if (etag[0] == '"')
		etag++;
	n = strspn(etag, "0123456789abcdefABCDEF");
	return n == 32 && (etag[32] == '\0' || (etag[32] == '"' && etag[33] == '\0'));
}

/* An x-amz-checksum-KIND header (@line after its "x-amz-checksum-"). */
static void sum_header(struct req *r, const char *line, size_t len)
{
	static const enum sum_kind kinds[] = { SUM_CRC32C, SUM_CRC64NVME, SUM_CRC32, SUM_SHA256 };
	const char *colon = memchr(line, ':', len), *v;
	size_t vl;

	if (!colon)
		return;
	v = colon + 1;
	while (*v == ' ' || *v == '\t')
		v++;
	vl = strcspn(v, "\r\n");
	while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
		vl--;
	if ((size_t)(colon - line) == 4 && !strncasecmp(line, "type", 4)) {
		/* a multipart upload's sum of its parts' sums: none of the bytes */
		r->sum_composite = vl == 9 && !strncasecmp(v, "COMPOSITE", 9);
		return;
	}
	for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
		const char *name = sum_name(kinds[i]);

		if ((size_t)(colon - line) != strlen(name) || strncasecmp(line, name, strlen(name)))
			continue;
		/* "SUM-PARTS" is a composite sum; one sum is checked, the cheapest */
		if (!sum_cheaper(kinds[i], r->sum_kind))
			break;
		if (vl > 0 && vl < sizeof r->sum_want && !memchr(v, '-', vl)) {
			r->sum_kind = kinds[i];
			memcpy(r->sum_want, v, vl);
			r->sum_want[vl] = '\0';
		}
	}
}

/* What a whole body is checked against, once its answer's head is in. An
 * ETag is taken for an MD5 only from an S3 store (an s3:// URL, or an
 * answer with x-amz-request-id): another web server's may be 32 hex digits
 * of something else. */
static void decide(struct req *r)
{
	r->decided = true;
	r->use_md5 = r->verify && !r->sse_etag && etag_is_md5(r->etag) &&
		     (!strncmp(r->url, "s3://", 5) || r->s3_answer);
	if (!r->verify || r->status < 200 || r->status > 299 || r->sum_composite)
		r->sum_kind = SUM_NONE;
	/* one sum of the whole body, the cheapest: the MD5 or the x-amz-checksum-* */
	if (r->use_md5 && r->sum_kind != SUM_NONE) {
		if (sum_cheaper(r->sum_kind, SUM_MD5))
			r->use_md5 = false;
		else
			r->sum_kind = SUM_NONE;
	}
	sum_init(&r->md5, SUM_MD5);
	sum_init(&r->sum, r->sum_kind);
	if (r->own)
		sum_init(r->own, SUM_CRC32C);
}

static size_t on_header(char *line, size_t size, size_t n, void *arg)
{
	struct req *r = arg;
	size_t len = size * n;

	if (len >= 5 && !strncmp(line, "HTTP/", 5)) {
		/* a new response (after a 100 Continue, say): forget the last */
		const char *sp = memchr(line, ' ', len);

		r->etag[0] = '\0';
		r->sse_etag = false;
		r->s3_answer = false;
		r->sum_kind = SUM_NONE;
		r->sum_composite = false;
		r->clen = -1;
		r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
	} else if (len > 15 && !strncasecmp(line, "x-amz-checksum-", 15)) {
		sum_header(r, line + 15, len - 15);
	} else if (len > 31 && !strncasecmp(line, "x-amz-server-side-encryption:", 29)) {
		const char *v = line + 29;

		while (*v == ' ' || *v == '\t')
			v++;
		/* "aws:kms" and "aws:kms:dsse"; "AES256" (SSE-S3) keeps the MD5 */
		r->sse_etag = !strncasecmp(v, "aws:kms", 7);
	} else if (len > 48 && !strncasecmp(line, "x-amz-server-side-encryption-customer-algorithm:", 48)) {
		r->sse_etag = true;
	} else if (len > 17 && !strncasecmp(line, "x-amz-request-id:", 17)) {
		r->s3_answer = true;
	} else if (len > 5 && !strncasecmp(line, "ETag:", 5)) {
		const char *v = line + 5;
		size_t vl;

		while (*v == ' ' || *v == '\t')
			v++;
		vl = strcspn(v, "\r\n");
		if (vl < sizeof r->etag) {
			memcpy(r->etag, v, vl);
			r->etag[vl] = '\0';
		}
	} else if (len > 15 && !strncasecmp(line, "Content-Length:", 15)) {
		r->clen = strtoll(line + 15, NULL, 10);
	}
	return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
	struct req *r = arg;
	size_t len = size * n;

	if (r->status < 200 || r->status > 299) {
		size_t room = sizeof r->ebody - 1 - r->elen;

		memcpy(r->ebody + r->elen, data, len < room ? len : room);
		r->elen += len < room ? len : room;
		r->ebody[r->elen] = '\0';
		return len;
	}
	if (r->ranged && r->status == 200) {
		/* a server that ignores Range sends the whole object: keep the
		 * range's part of it, and stop the transfer there */
		uint64_t at = r->seen;

		r->seen += len;
		if (at + len <= r->off)
			return len;
		if (at < r->off) {
			data += r->off - at;
			len -= (size_t)(r->off - at);
		}
		if (len > r->len - r->got)
			len = r->len - r->got;
		memcpy(r->buf + r->got, data, len);
		r->got += len;
		if (r->got == r->len) {
			r->whole_done = true;
			return 0;
		}
		return size * n;
	}
	if (!r->decided)
		decide(r);
	if (r->use_md5)
		sum_update(&r->md5, data, len);
	if (r->sum_kind != SUM_NONE)
		sum_update(&r->sum, data, len);
	if (r->own)
		sum_update(r->own, data, len);
	if (r->fd >= 0) {
		for (size_t done = 0; done < len;) {
			ssize_t w = pwrite(r->fd, data + done, len - done, (off_t)(r->got + done));

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				r->werr = true;
				r->wno = w < 0 ? errno : ENOSPC;
				return 0;
			}
			done += (size_t)w;
		}
		r->got += len;
		return len;
	}
	if (r->got + len > r->cap) {
		size_t want = r->cap ? r->cap : 65536;
		char *nb;

		if (!r->grow || r->got + len > r->max) {
			r->overflow = true;
			return 0;
		}
		while (want < r->got + len)
			want *= 2;
		if (want > r->max)
			want = r->max;
		nb = realloc(r->buf, want);
		if (!nb) {
			r->overflow = true;
			return 0;
		}
		r->buf = nb;
		r->cap = want;
	}
	memcpy(r->buf + r->got, data, len);
	r->got += len;
	return len;
}

/* The result of one try. */
enum outcome { DONE, RETRY, FINAL };

/* A link-local address (169.254/16, fe80::/10, IPv4-mapped too) or AWS's
 * IPv6 metadata address: in @ip as text. */
static bool metadata_address(const struct sockaddr *sa, char *ip, size_t cap)
{
	static const uint8_t aws6[16] = { 0xfd, 0x00, 0x0e, 0xc2, [15] = 0x54, [14] = 0x02 };

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &in->sin_addr, ip, (socklen_t)cap);
		return (ntohl(in->sin_addr.s_addr) & 0xffff0000u) == 0xa9fe0000u;
	}
	if (sa->sa_family == AF_INET6) {
		const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };

		inet_ntop(AF_INET6, b, ip, (socklen_t)cap);
		return (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) || !memcmp(b, aws6, 16) ||
		       (!memcmp(b, mapped, 12) && b[12] == 169 && b[13] == 254);
	}
	return false;
}

/* Each connection's socket: none to where a cloud serves its instance
 * metadata (and its keys), whatever name resolved to it, unless the
 * config lists that endpoint itself (store_set_endpoints()). */
static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
	struct req *r = arg;
	char ip[INET6_ADDRSTRLEN] = "";

	if (purpose == CURLSOCKTYPE_IPCXN && !r->listed && metadata_address(&a->addr, ip, sizeof ip)) {
		snprintf(r->refused, sizeof r->refused, "%s is a link-local address, where clouds serve instance "
			 "metadata: not reached unless the config's store_endpoints lists this endpoint", ip);
		return CURL_SOCKET_BAD;
	}
	return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* One try of @r: a fresh easy handle on the share. */
static CURLcode perform(struct req *r)
{
	struct store *st = r->st;
	struct curl_slist *hdrs = NULL, *t;
	char line[4300];
	CURLcode cc;
	CURL *h = curl_easy_init();

	if (!h)
		return CURLE_OUT_OF_MEMORY;
	r->got = 0;
	r->elen = 0;
	r->ebody[0] = '\0';
	r->status = 0;
	r->etag[0] = '\0';
	r->sse_etag = false;
	r->s3_answer = false;
	r->sum_kind = SUM_NONE;
	r->sum_want[0] = '\0';
	r->sum_composite = false;
	r->decided = false;
	r->clen = -1;
	r->overflow = false;
	r->werr = false;
	r->seen = 0;
	r->whole_done = false;
	r->cerr[0] = '\0';
	r->refused[0] = '\0';
	if (r->sign) {
		/* libcurl 7.88 neither sends nor signs it: given here, it is signed */
		hdrs = curl_slist_append(hdrs, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
		if (st->cfg.session_token[0]) {
			snprintf(line, sizeof line, "x-amz-security-token: %s", st->cfg.session_token);
			t = curl_slist_append(hdrs, line);
			hdrs = t ? t : hdrs;
			explicit_bzero(line, sizeof line);
		}
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, st->sigv4);
		curl_easy_setopt(h, CURLOPT_USERNAME, st->cfg.access_key);
		curl_easy_setopt(h, CURLOPT_PASSWORD, st->cfg.secret_key);
	}
	if (r->ranged) {
		snprintf(line, sizeof line, "Range: bytes=%" PRIu64 "-%" PRIu64, r->off,
			 r->off + (r->len ? r->len : 1) - 1);
		t = curl_slist_append(hdrs, line);
		hdrs = t ? t : hdrs;
	}
	if (r->verify) {
		/* the x-amz-checksum-* of the object, where it has one */
		t = curl_slist_append(hdrs, "x-amz-checksum-mode: ENABLED");
		hdrs = t ? t : hdrs;
	}
	if (r->if_match && r->if_match[0]) {
		snprintf(line, sizeof line, "If-Match: %s", r->if_match);
		t = curl_slist_append(hdrs, line);
		hdrs = t ? t : hdrs;
	}
	curl_easy_setopt(h, CURLOPT_URL, r->http);
	curl_easy_setopt(h, CURLOPT_SHARE, st->share);
	/* the share's pool keeps as many idle connections as a handle allows:
	 * libcurl's 5 would close most of many threads' connections */
	curl_easy_setopt(h, CURLOPT_MAXCONNECTS, (long)STORE_MAX_CONNECTIONS);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_NOBODY, r->head ? 1L : 0L);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->cerr);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(st->cfg.connect_seconds * 1000));
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(st->cfg.stall_seconds < 1 ? 1 : st->cfg.stall_seconds));
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_USERAGENT, "loaderd");
	curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_socket);
	curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, r);
	cc = curl_easy_perform(h);
	if (cc == CURLE_OK && !r->status)
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
	curl_easy_cleanup(h);
	curl_slist_free_all(hdrs);
	return cc;
}

/* The store's word on an error answer: "Code: Message (HTTP N)", and the
 * errno its code means. */
static int answer_error(struct req *r, char *msg, size_t cap)
{
	char code[128] = "", text[512] = "", raw[512];
	const char *end = r->ebody + r->elen;
	int e;

	/* the store's words go into logs and replies: printable only */
	if (s3xml_text(r->ebody, end, "Code", raw, sizeof code) == 1)
		text_clean(code, sizeof code, raw, '?');
	if (s3xml_text(r->ebody, end, "Message", raw, sizeof raw) == 1)
		text_clean(text, sizeof text, raw, '?');
	if (code[0] && text[0])
		snprintf(msg, cap, "%s: %s (HTTP %ld)", code, text, r->status);
	else if (code[0])
		snprintf(msg, cap, "%s (HTTP %ld)", code, r->status);
	else
		snprintf(msg, cap, "HTTP %ld", r->status);
	if (!strcmp(code, "NoSuchKey") || !strcmp(code, "NoSuchBucket") || r->status == 404)
		e = -ENOENT;
	else if (!strcmp(code, "AccessDenied") || !strcmp(code, "InvalidAccessKeyId") ||
		 !strcmp(code, "SignatureDoesNotMatch") || !strcmp(code, "ExpiredToken") ||
		 !strcmp(code, "InvalidToken") || r->status == 403 || r->status == 401)
		e = -EACCES;
	else if (r->status == 412)
		e = -ESTALE;
	else if (r->status == 416)
		e = -ERANGE;
	else
		e = -EIO;
	return e;
}

/* Whole bodies that did not match their sums, since the start (store.h). */
static atomic_uint_fast64_t checksum_mismatches;

uint64_t store_checksum_mismatches(void)
{
	return (uint64_t)atomic_load(&checksum_mismatches);
}

/* A whole body against its ETag and its x-amz-checksum-*: true when it
 * matches what of them is a sum of its bytes; else false with the message
 * in @msg. */
static bool body_matches(struct req *r, char *msg, size_t cap)
{
	const char *want = r->etag[0] == '"' ? r->etag + 1 : r->etag;
	char hex[65], b64[48];

	if (!r->verify)
		return true;
	if (!r->decided)
		decide(r); /* an empty body */
	if (r->use_md5) {
		sum_hex(&r->md5, hex);
		if (strncasecmp(hex, want, 32)) {
			atomic_fetch_add(&checksum_mismatches, 1);
			snprintf(msg, cap, "the body's MD5 %s does not match its ETag %s (%zu bytes)", hex, r->etag,
				 r->got);
			return false;
		}
	}
	if (r->sum_kind != SUM_NONE) {
		sum_base64(&r->sum, b64);
		if (strcmp(b64, r->sum_want)) {
			atomic_fetch_add(&checksum_mismatches, 1);
			snprintf(msg, cap, "the body's %s %s does not match its x-amz-checksum-%s %s (%zu bytes)",
				 sum_label(r->sum_kind), b64, sum_name(r->sum_kind), r->sum_want, r->got);
			return false;
		}
	}
	return true;
}

/* What one try's @cc and answer mean: DONE, RETRY (with *@e and @msg) or
 * FINAL (the same). */
static enum outcome judge(struct req *r, CURLcode cc, int *e, char *msg, size_t cap)
{
	if (cc != CURLE_OK && r->refused[0]) {
		*e = -EPERM;
		snprintf(msg, cap, "%s", r->refused);
		return FINAL;
	}
	switch (cc) {
	case CURLE_OK:
		break;
	case CURLE_PARTIAL_FILE:
		*e = -EIO;
		snprintf(msg, cap, "the body ended after %zu of %" PRId64 " bytes", r->got, r->clen);
		return RETRY;
	case CURLE_OPERATION_TIMEDOUT:
		*e = -ETIMEDOUT;
		if (r->status == 0)
			/* no answer's head: the connect timed out, or the server said nothing */
			snprintf(msg, cap, "no answer from %s (%s)", r->sign || !strncmp(r->url, "s3://", 5) ?
				 r->st->cfg.endpoint : "the server", r->cerr[0] ? r->cerr : curl_easy_strerror(cc));
		else
			snprintf(msg, cap, "stalled: no byte for %g s (after %zu of %" PRId64 " bytes)",
				 r->st->cfg.stall_seconds < 1 ? 1 : r->st->cfg.stall_seconds, r->got, r->clen);
		return RETRY;
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
		*e = -EHOSTUNREACH;
		snprintf(msg, cap, "cannot connect to %s (%s)", r->sign || !strncmp(r->url, "s3://", 5) ?
			 r->st->cfg.endpoint : "the server", curl_easy_strerror(cc));
		return RETRY;
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING:
		*e = -EIO;
		snprintf(msg, cap, "connection lost: %s", r->cerr[0] ? r->cerr : curl_easy_strerror(cc));
		return RETRY;
	case CURLE_WRITE_ERROR:
		if (r->whole_done)
			return DONE;
		if (r->werr) {
			*e = -EIO;
			snprintf(msg, cap, "cannot write the object: %s", strerror(r->wno));
			return FINAL;
		}
		if (r->overflow) {
			*e = r->grow ? -EFBIG : -EIO;
			snprintf(msg, cap, r->grow ? "larger than %zu bytes" : "more bytes than the %zu asked for",
				 r->grow ? r->max : r->len);
			return FINAL;
		}
		/* fall through */
	default:
		*e = -EIO;
		snprintf(msg, cap, "%s", r->cerr[0] ? r->cerr : curl_easy_strerror(cc));
		return FINAL;
	}
	if (r->status >= 200 && r->status <= 299) {
		if (r->head)
			return DONE;
		if (r->clen >= 0 && (uint64_t)r->clen != (r->ranged && r->status == 200 ? r->seen : r->got)) {
			*e = -EIO;
			snprintf(msg, cap, "the body ended after %zu of %" PRId64 " bytes", r->got, r->clen);
			return RETRY;
		}
		if (!body_matches(r, msg, cap)) {
			*e = -EIO;
			return RETRY;
		}
		if (r->ranged && r->got != r->len) {
			*e = r->got < r->len ? -ERANGE : -EIO;
			snprintf(msg, cap, "asked for %zu bytes at %" PRIu64 ", got %zu (HTTP %ld)", r->len, r->off,
				 r->got, r->status);
			return FINAL;
		}
		return DONE;
	}
	*e = answer_error(r, msg, cap);
	if (r->status == 412 && r->if_match)
		snprintf(msg + strlen(msg), cap - strlen(msg), ": the object changed since its ETag %s was seen",
			 r->if_match);
	return r->status == 429 || r->status >= 500 ? RETRY : FINAL;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A draw in [0, 1) for the jitter: per thread, seeded from the clock. */
static double jitter(void)
{
	static _Thread_local uint64_t state;

	if (!state) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		state = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&state;
	}
	state = splitmix64(state);
	return (double)(mix64(state) >> 11) / 9007199254740992.0;
}

/* Did this thread's last request fail for the transport (store.h)? */
static _Thread_local bool transport_failed;

bool store_transport_failed(void)
{
	return transport_failed;
}

void store_transport_clear(void)
{
	transport_failed = false;
}

/* @r tried until it is done, final, or retry_seconds have passed. */
static int run(struct req *r, char *err, size_t errlen)
{
	double start = now_s(), limit = r->st->cfg.retry_seconds, backoff = 0.1;
	char msg[1024];
	int e = 0;

	transport_failed = false;
	for (;;) {
		CURLcode cc = perform(r);
		enum outcome o = judge(r, cc, &e, msg, sizeof msg);
		double delay;
		struct timespec ts;

		if (o == DONE)
			return 0;
		if (o == FINAL)
			return errfmt(e, err, errlen, "%s: %s", r->url, msg);
		/* full jitter: a uniform draw below the doubling ceiling */
		delay = backoff * jitter();
		if (now_s() + delay - start > limit) {
			transport_failed = true;
			return errfmt(e, err, errlen, "%s: %s; retried for %g s", r->url, msg, limit);
		}
		ts.tv_sec = (time_t)delay;
		ts.tv_nsec = (long)((delay - (double)ts.tv_sec) * 1e9);
		nanosleep(&ts, NULL);
		backoff = backoff * 2 > 5 ? 5 : backoff * 2;
	}
}

/* @r set up for @url (with @query, for a listing): 0, or the error of
 * http_url(). */
static int req_open(struct req *r, struct store *st, const char *url, const char *query, char *err,
		    size_t errlen)
{
	memset(r, 0, sizeof *r);
	r->fd = -1;
	r->st = st;
	r->url = url;
	return http_url(st, url, query, query == NULL, &r->http, &r->sign, &r->listed, err, errlen);
}

int store_head(struct store *st, const char *url, struct store_object *obj, char *err, size_t errlen)
{
	struct req r;
	int e;

	e = req_open(&r, st, url, NULL, err, errlen);
	if (e < 0)
		return e;
	r.head = true;
	e = run(&r, err, errlen);
	if (e < 0 && r.status >= 400 && r.status < 500 && r.elen == 0) {
		/* a HEAD's error has no body to say which: a GET of one byte has */
		struct req g;
		char gerr[1024], byte;

		memset(&g, 0, sizeof g);
		g.fd = -1;
		g.st = st;
		g.url = url;
		g.http = r.http;
		g.sign = r.sign;
		g.listed = r.listed;
		g.ranged = true;
		g.len = 1;
		g.buf = &byte;
		g.cap = 1;
		if (run(&g, gerr, sizeof gerr) < 0 && g.status == r.status && g.elen > 0)
			e = errfmt(e, err, errlen, "%s", gerr);
	}
	if (e == 0) {
		if (r.clen < 0)
			e = errfmt(-EIO, err, errlen, "%s: the store's HEAD answer has no Content-Length", url);
		obj->size = (uint64_t)r.clen;
		snprintf(obj->etag, sizeof obj->etag, "%s", r.etag);
	}
	free(r.http);
	return e;
}

int store_get_range(struct store *st, const char *url, const char *etag, uint64_t offset, size_t len,
		    void *buf, char *err, size_t errlen)
{
	struct req r;
	int e;

	if (len == 0)
		return 0;
	e = req_open(&r, st, url, NULL, err, errlen);
	if (e < 0)
		return e;
	r.ranged = true;
	r.off = offset;
	r.len = len;
	r.buf = buf;
	r.cap = len;
	r.if_match = etag;
	e = run(&r, err, errlen);
	free(r.http);
	return e;
}

int store_get(struct store *st, const char *url, const char *etag, size_t max_bytes, void **data,
	      size_t *size, char *err, size_t errlen)
{
	struct req r;
	int e;

	e = req_open(&r, st, url, NULL, err, errlen);
	if (e < 0)
		return e;
	r.grow = true;
	r.max = max_bytes;
	r.if_match = etag;
	r.verify = true;
	e = run(&r, err, errlen);
	free(r.http);
	if (e < 0) {
		free(r.buf);
		return e;
	}
	*data = r.buf ? r.buf : malloc(1);
	*size = r.got;
	if (!*data)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", url);
	return 0;
}

int store_get_fd(struct store *st, const char *url, const char *etag, int fd, uint64_t *size,
		 uint32_t *crc32c, char *err, size_t errlen)
{
	struct sum own;
	struct req r;
	int e;

	e = req_open(&r, st, url, NULL, err, errlen);
	if (e < 0)
		return e;
	r.fd = fd;
	r.if_match = etag;
	r.verify = true;
	r.own = &own;
	sum_init(&own, SUM_CRC32C);
	e = run(&r, err, errlen);
	free(r.http);
	if (e < 0)
		return e;
	*size = r.got;
	*crc32c = sum_crc32_value(&own);
	return 0;
}

const char *store_endpoint(const struct store *st)
{
	return st->cfg.endpoint;
}

/* The canonical ListObjectsV2 query of one page into @q: keys sorted,
 * values RFC 3986-encoded with '/' as %2F (libcurl 7.88 signs the query
 * as written). */
static int list_query(char *q, size_t cap, const char *prefix, const char *token)
{
	char *p = q, *end = q + cap;

	if (token[0]) {
		p += snprintf(p, (size_t)(end - p), "continuation-token=");
		if (!(p = url_encode(p, end, token, strlen(token), false)))
			return -ENAMETOOLONG;
		p += snprintf(p, (size_t)(end - p), "&");
	}
	p += snprintf(p, (size_t)(end - p), "list-type=2&prefix=");
	if (p >= end || !url_encode(p, end, prefix, strlen(prefix), false))
		return -ENAMETOOLONG;
	return 0;
}

int store_list(struct store *st, const char *url, store_list_fn fn, void *arg, char *err, size_t errlen)
{
	char bucket[256], token[2048] = "", *q;
	const char *prefix;
	size_t qcap;
	bool more = true;
	int e = 0;

	if (strncmp(url, "s3://", 5))
		return errfmt(-EINVAL, err, errlen, "%s: only s3:// URLs can be listed", url);
	if (url_split_s3(url, bucket, sizeof bucket, &prefix) < 0)
		return errfmt(-EINVAL, err, errlen, "%s: no valid bucket name after s3://", url);
	qcap = 3 * strlen(prefix) + 3 * sizeof token + 64;
	q = malloc(qcap);
	if (!q)
		return errfmt(-ENOMEM, err, errlen, "%s: out of memory", url);
	while (more && e == 0) {
		struct req r;
		char perr[512] = "";

		if (list_query(q, qcap, prefix, token) < 0) {
			e = errfmt(-EINVAL, err, errlen, "%s: continuation token too long", url);
			break;
		}
		e = req_open(&r, st, url, q, err, errlen);
		if (e < 0)
			break;
		r.grow = true;
		r.max = 64 << 20;
		e = run(&r, err, errlen);
		if (e == 0) {
			e = s3xml_list(r.buf ? r.buf : "", r.got, fn, arg, &more, token, sizeof token, perr,
				       sizeof perr);
			if (e < 0 && perr[0])
				errfmt(e, err, errlen, "%s: %s", url, perr);
		}
		free(r.buf);
		free(r.http);
	}
	free(q);
	return e;
}
