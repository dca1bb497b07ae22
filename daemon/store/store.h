/* SPDX-License-Identifier: MIT */
/* store - objects in S3-compatible storage and over https (libcurl)
 *
 * The store layer: a client for s3://bucket/key and https:// URLs. HEAD
 * (size, ETag), GET of a whole object or of a byte range (If-Match on the
 * ETag a HEAD saw), ListObjectsV2 under a prefix, paginated. Requests are
 * signed with SigV4 (libcurl's CURLOPT_AWS_SIGV4, its 7.88 traps worked
 * around in store.c) with the credentials of the config the caller passes:
 * the daemon reads no credentials, endpoint or region of its own
 * environment (docs/storage.md). Connections are reused through one libcurl
 * share per store; every function may be called from any thread at once.
 *
 * Every error names the URL and what the store said:
 *	"s3://b/k: AccessDenied: Access Denied. (HTTP 403)"
 * 5xx, 429, a connection lost, a body cut short, a stalled body and a whole
 * body that does not match its sums (the ETag's MD5, x-amz-checksum-*) are
 * retried with exponential backoff and jitter for up to retry_seconds;
 * credentials are never written into a message.
 *
 * Who includes it: the sources layer (a source that names an object).
 *
 *   url.h     URLs: an endpoint, s3://bucket/key, RFC 3986 encoding
 *   s3xml.h   the XML of S3's answers: errors, ListObjectsV2 pages
 *   sums.h    MD5, CRC32, CRC32C, SHA-256 of a body as it streams in: checked
 *             against its ETag and x-amz-checksum-*
 *
 * layer: daemon/store -> daemon/base common include
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a store talks to and as whom. Strings are copied by store_new(). */
struct store_config {
	char endpoint[512];       /* scheme://host[:port]; "" = https://s3.REGION.amazonaws.com */
	char region[64];          /* "" = us-east-1 */
	bool path_style;          /* ENDPOINT/bucket/key, not bucket.HOST/key (MinIO, Ceph, SeaweedFS) */
	char access_key[128];     /* "" = unsigned requests (public objects) */
	char secret_key[128];
	char session_token[4096]; /* "" = none; else sent as x-amz-security-token */
	double retry_seconds;     /* how long retries of a request may go on (default 20) */
	double stall_seconds;     /* a body with no byte for this long is cut (default 30) */
	double connect_seconds;   /* a connect that takes longer fails (default 10) */
};

/* Defaults: AWS, us-east-1, virtual-hosted, no credentials. */
void store_config_init(struct store_config *cfg);

/**
 * store_config_from_env() - endpoint and region from an environment
 * @env: "NAME=VALUE" strings, NULL-terminated: the client's, not the daemon's
 *
 * AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL; AWS_REGION, else
 * AWS_DEFAULT_REGION; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN. An endpoint whose host is an IP address or localhost
 * gets path-style addressing (no bucket.HOST there). Fills what it finds
 * over @cfg's values.
 *
 * Return: 0, or -EINVAL (a value too long or an endpoint that is not
 * http(s)://HOST[:PORT]) with a message naming the variable.
 */
int store_config_from_env(struct store_config *cfg, const char *const *env, char *err, size_t errlen);

struct store;

int store_new(struct store **out, const struct store_config *cfg, char *err, size_t errlen);
struct store *store_free(struct store *st);

/* What a HEAD says of an object. */
struct store_object {
	uint64_t size;
	char etag[128]; /* as the store sent it, quotes included; "" when it sent none */
};

/**
 * store_head() - the size and ETag of @url
 *
 * Return: 0; -ENOENT (NoSuchKey, NoSuchBucket), -EACCES (AccessDenied,
 * InvalidAccessKeyId, SignatureDoesNotMatch, ExpiredToken, InvalidToken), -EINVAL (a bad URL), -EIO
 * (the store failed, retries spent), -ETIMEDOUT (stalled), each with a
 * message that names @url.
 */
int store_head(struct store *st, const char *url, struct store_object *obj, char *err, size_t errlen);

/**
 * store_get_range() - @len bytes of @url from @offset into @buf
 * @etag: the ETag a HEAD saw ("" or NULL: any); the object must still have
 *        it (If-Match), else -ESTALE "object changed"
 *
 * Exactly @len bytes or an error: a range past the end is -ERANGE.
 */
int store_get_range(struct store *st, const char *url, const char *etag, uint64_t offset, size_t len,
		    void *buf, char *err, size_t errlen);

/**
 * store_get() - the whole object @url into a buffer of malloc()
 *
 * *data (freed by the caller) and *size on success; @etag as for
 * store_get_range(). At most @max_bytes: a larger object is -EFBIG.
 * Where the answer's ETag is a plain MD5 (32 hex digits; not SSE-KMS or
 * SSE-C; of an s3:// URL, or of an answer that says x-amz-request-id: an
 * S3 store's), the body's MD5 must be it, and where it carries the object's
 * x-amz-checksum-crc32, -crc32c or -sha256 (asked for), that sum too: a
 * body that does not match is tried again like a cut one, then -EIO "URL:
 * the body's MD5 HEX does not match its ETag "HEX" (N bytes); retried for
 * S s" (or "the body's CRC32 B64 does not match its x-amz-checksum-crc32
 * B64 ...").
 */
int store_get(struct store *st, const char *url, const char *etag, size_t max_bytes, void **data,
	      size_t *size, char *err, size_t errlen);

/**
 * store_get_fd() - the whole object @url written into @fd from offset 0
 *
 * *size: the bytes written (a retry writes again from 0; the caller
 * truncates to *size). A write that fails is -EIO naming the errno. The
 * body is checked against its ETag as for store_get(). *crc32c: the
 * CRC32C of the bytes written (the object cache keeps it, to check the
 * file again after a power loss).
 */
int store_get_fd(struct store *st, const char *url, const char *etag, int fd, uint64_t *size,
		 uint32_t *crc32c, char *err, size_t errlen);

/* Whole bodies that did not match their sums (each try), since the start. */
uint64_t store_checksum_mismatches(void);

/*
 * Whether the calling thread's last request failed for the transport: the
 * faults tried again until retry_seconds passed (5xx, 429, a stall, a cut
 * body, a body that does not match its sums, no connection), not an answer that is final (a refusal, a missing
 * key, a changed ETag). store_transport_clear() before a call that may make
 * no request at all.
 */
bool store_transport_failed(void);
void store_transport_clear(void);

/* The endpoint a store talks to (scheme://host[:port]), defaults filled in. */
const char *store_endpoint(const struct store *st);

/**
 * store_set_endpoints() - the endpoints a store may reach (config
 * store_endpoints)
 * @list: NULL-terminated "http(s)://HOST[:PORT]" entries, HOST maybe
 *        "*.DOMAIN" (every name under DOMAIN); NULL: any endpoint; an empty
 *        list: none (object storage off)
 *
 * Called once, before any store is made. A store whose endpoint, or an
 * https:// URL whose host, is not listed fails with -EPERM naming the list.
 * Whether listed or not, a connection to a link-local address (169.254/16,
 * fe80::/10, fd00:ec2::254: where clouds serve instance metadata and keys)
 * is refused, unless its endpoint is listed by that very address.
 *
 * Return: 0, or -EINVAL naming the entry that is not an endpoint.
 */
int store_set_endpoints(char *const *list, char *err, size_t errlen);
/* The list in force, as given (NULL: any endpoint). */
char *const *store_endpoints(void);

/* One key of a listing: its full key (not the URL), size and ETag. A
 * non-zero return stops the listing and is returned by store_list(). */
typedef int (*store_list_fn)(void *arg, const char *key, uint64_t size, const char *etag);

/**
 * store_list() - every object under the prefix of @url (s3://bucket/prefix)
 *
 * ListObjectsV2, page after page, in the store's order (UTF-8 binary order
 * of the keys on S3). Only s3:// URLs can be listed (-EINVAL otherwise).
 */
int store_list(struct store *st, const char *url, store_list_fn fn, void *arg, char *err, size_t errlen);
