/* SPDX-License-Identifier: MIT */
/* url - the store's URLs: an endpoint's parts, an s3:// URL's bucket and
 * key, RFC 3986 encoding (see url.h)
 *
 * The encoding is the one S3 signs: every byte but the unreserved ones
 * (A-Z a-z 0-9 - _ . ~) as %XX, '/' kept in a path and encoded in a query
 * value. A key is encoded once; libcurl 7.88 signs the path as written.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "url.h"

int url_split_endpoint(const char *endpoint, char *scheme, size_t scap, char *host, size_t hcap)
{
	const char *p = strstr(endpoint, "://");
	size_t n;

	if (!p || (size_t)(p - endpoint) >= scap)
		return -EINVAL;
	memcpy(scheme, endpoint, (size_t)(p - endpoint));
	scheme[p - endpoint] = '\0';
	if (strcmp(scheme, "http") && strcmp(scheme, "https"))
		return -EINVAL;
	p += 3;
	n = strcspn(p, "/?#");
	if (n == 0 || n >= hcap || (p[n] && strcmp(p + n, "/")) || strchr(p, '@'))
		return -EINVAL;
	memcpy(host, p, n);
	host[n] = '\0';
	return 0;
}

/* RFC 3986 encoding of @s (@len bytes) appended at @out; '/' kept when
 * @keep_slash. Returns the new end, NULL past @cap. */
char *url_encode(char *out, char *cap, const char *s, size_t len, bool keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			     c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');

		if (out + (plain ? 1 : 3) >= cap)
			return NULL;
		if (plain) {
			*out++ = (char)c;
		} else {
			*out++ = '%';
			*out++ = hex[c >> 4];
			*out++ = hex[c & 15];
		}
	}
	*out = '\0';
	return out;
}

/* s3://BUCKET/KEY split: the bucket into @bucket, *@key after its '/'. */
int url_split_s3(const char *url, char *bucket, size_t bcap, const char **key)
{
	const char *b = url + 5, *slash = strchr(b, '/');
	size_t n = slash ? (size_t)(slash - b) : strlen(b);

	if (n == 0 || n >= bcap || strspn(b, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") < n)
		return -EINVAL;
	memcpy(bucket, b, n);
	bucket[n] = '\0';
	*key = slash ? slash + 1 : "";
	return 0;
}

/* Can @host (host[:port]) not carry a bucket in front: an IP or localhost? */
bool url_host_is_literal(const char *host)
{
	if (host[0] == '[')
		return true;
	if (!strncmp(host, "localhost", 9) && (!host[9] || host[9] == ':'))
		return true;
	return strspn(host, "0123456789.:") == strlen(host);
}
