/* SPDX-License-Identifier: MIT */
/* url - the store's URLs (url.c): private to daemon/store */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* The scheme ("http", "https") and host[:port] of @endpoint, which has no
 * path (a trailing '/' allowed) and no user: 0 or -EINVAL. */
int url_split_endpoint(const char *endpoint, char *scheme, size_t scap, char *host, size_t hcap);

/* RFC 3986 encoding of @s (@len bytes) written at @out, NUL-terminated;
 * '/' kept when @keep_slash. Returns the new end, NULL when it would reach
 * @cap. */
char *url_encode(char *out, char *cap, const char *s, size_t len, bool keep_slash);

/* s3://BUCKET/KEY: the bucket (letters, digits, '.', '-', '_') into
 * @bucket, *@key after its '/' ("" when none). 0 or -EINVAL. */
int url_split_s3(const char *url, char *bucket, size_t bcap, const char **key);

/* Can @host (host[:port]) not carry a bucket in front: an IP address or
 * localhost? */
bool url_host_is_literal(const char *host);
