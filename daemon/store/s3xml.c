/* SPDX-License-Identifier: MIT */
/* s3xml - the XML of S3's answers (see s3xml.h)
 *
 * Not a general XML parser: S3's error and ListBucketResult documents are
 * flat, their element names fixed, and the text of an element has no
 * markup, only entities (&amp; &lt; &gt; &quot; &apos;) and character
 * references (SeaweedFS writes the ETag's quotes as &#34;). Each element is
 * found by its start tag and the first end tag after it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "s3xml.h"

static const char *find(const char *p, const char *end, const char *s)
{
	size_t n = strlen(s);

	for (; p && (size_t)(end - p) >= n; p++) {
		p = memchr(p, s[0], (size_t)(end - p) - n + 1);
		if (!p)
			return NULL;
		if (!memcmp(p, s, n))
			return p;
	}
	return NULL;
}

/* One UTF-8 sequence of code point @c at @out; its length, 0 if invalid. */
static size_t utf8_put(char *out, unsigned long c)
{
	if (c == 0 || (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
		return 0;
	if (c < 0x80) {
		out[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		out[0] = (char)(0xc0 | (c >> 6));
		out[1] = (char)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		out[0] = (char)(0xe0 | (c >> 12));
		out[1] = (char)(0x80 | ((c >> 6) & 0x3f));
		out[2] = (char)(0x80 | (c & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (c >> 18));
	out[1] = (char)(0x80 | ((c >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((c >> 6) & 0x3f));
	out[3] = (char)(0x80 | (c & 0x3f));
	return 4;
}

/* The entity at @p (after '&', up to ';' before @end) decoded into @u;
 * its length in @u, 0 if unknown. *@next is past the ';'. */
static size_t entity(const char *p, const char *end, char *u, const char **next)
{
	static const struct {
		const char *name;
		char c;
	} named[] = { { "amp", '&' }, { "lt", '<' }, { "gt", '>' }, { "quot", '"' }, { "apos", '\'' } };
	const char *semi = memchr(p, ';', (size_t)(end - p));
	size_t n;

	if (!semi || semi - p > 10)
		return 0;
	n = (size_t)(semi - p);
	*next = semi + 1;
	if (n >= 2 && p[0] == '#') {
		char num[12];
		char *e;
		unsigned long c;
		int hex = p[1] == 'x' || p[1] == 'X';

		memcpy(num, p + 1 + hex, n - 1 - hex);
		num[n - 1 - hex] = '\0';
		if (!num[0] || num[0] == '-' || num[0] == '+' || num[0] == ' ')
			return 0;
		c = strtoul(num, &e, hex ? 16 : 10);
		return *e ? 0 : utf8_put(u, c);
	}
	for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
		if (strlen(named[i].name) == n && !memcmp(p, named[i].name, n)) {
			u[0] = named[i].c;
			return 1;
		}
	}
	return 0;
}

int s3xml_text(const char *p, const char *end, const char *tag, char *out, size_t cap)
{
	char open[64], close[64];
	const char *s, *e;
	size_t o = 0;

	if (cap == 0 || snprintf(open, sizeof open, "<%s>", tag) >= (int)sizeof open)
		return -EINVAL;
	snprintf(close, sizeof close, "</%s>", tag);
	s = find(p, end, open);
	if (!s)
		return 0;
	s += strlen(open);
	e = find(s, end, close);
	if (!e)
		return -EINVAL;
	while (s < e) {
		char u[4];
		size_t n = 1;
		const char *next = s + 1;

		if (*s == '&') {
			n = entity(s + 1, e, u, &next);
			if (n == 0)
				return -EINVAL;
		} else {
			u[0] = *s;
		}
		if (o + n >= cap)
			return -EINVAL;
		memcpy(out + o, u, n);
		o += n;
		s = next;
	}
	out[o] = '\0';
	return 1;
}

/* One <Contents> block [p, end): its key, size and ETag to @fn. */
static int list_entry(const char *p, const char *end, s3xml_entry_fn fn, void *arg, char *err,
		      size_t errlen)
{
	char key[4096], size[32], etag[256];
	char *e;
	unsigned long long n;

	if (s3xml_text(p, end, "Key", key, sizeof key) != 1 || !key[0])
		return errfmt(-EINVAL, err, errlen, "a Contents element without a Key (or one over 4095 bytes)");
	if (s3xml_text(p, end, "Size", size, sizeof size) != 1 || !size[0] || size[0] == '-')
		return errfmt(-EINVAL, err, errlen, "%s: no Size in the listing", key);
	errno = 0;
	n = strtoull(size, &e, 10);
	if (*e || errno)
		return errfmt(-EINVAL, err, errlen, "%s: Size '%s' in the listing is not a number", key, size);
	if (s3xml_text(p, end, "ETag", etag, sizeof etag) != 1)
		etag[0] = '\0';
	return fn(arg, key, n, etag);
}

int s3xml_list(const char *xml, size_t len, s3xml_entry_fn fn, void *arg, bool *truncated, char *token,
	       size_t tokcap, char *err, size_t errlen)
{
	const char *end = xml + len, *p, *body;
	char flag[16];
	int r;

	p = find(xml, end, "<ListBucketResult");
	if (!p)
		return errfmt(-EINVAL, err, errlen, "the listing is not a ListBucketResult");
	body = p;
	while ((p = find(p, end, "<Contents>")) != NULL) {
		const char *e = find(p, end, "</Contents>");

		if (!e)
			return errfmt(-EINVAL, err, errlen, "the listing ends inside a Contents element");
		r = list_entry(p, e, fn, arg, err, errlen);
		if (r)
			return r;
		p = e;
	}
	*truncated = false;
	token[0] = '\0';
	if (s3xml_text(body, end, "IsTruncated", flag, sizeof flag) == 1 && !strcmp(flag, "true")) {
		*truncated = true;
		if (s3xml_text(body, end, "NextContinuationToken", token, tokcap) != 1 || !token[0])
			return errfmt(-EINVAL, err, errlen,
				      "the listing is truncated but has no NextContinuationToken");
	}
	return 0;
}
