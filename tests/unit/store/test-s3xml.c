/* SPDX-License-Identifier: MIT */
/* test-s3xml - S3's error and listing XML (daemon/store/s3xml.c) */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "s3xml.h"

struct seen {
	char keys[8][64];
	unsigned long long sizes[8];
	char etags[8][64];
	int n;
	int stop_at;
};

static int on_entry(void *arg, const char *key, uint64_t size, const char *etag)
{
	struct seen *s = arg;

	assert(s->n < 8);
	snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
	s->sizes[s->n] = size;
	snprintf(s->etags[s->n], sizeof s->etags[0], "%s", etag);
	s->n++;
	return s->n == s->stop_at ? 7 : 0;
}

static int text(const char *xml, const char *tag, char *out, size_t cap)
{
	return s3xml_text(xml, xml + strlen(xml), tag, out, cap);
}

static int list(const char *xml, struct seen *s, bool *more, char *token, char *err)
{
	memset(s->keys, 0, sizeof s->keys);
	s->n = 0;
	return s3xml_list(xml, strlen(xml), on_entry, s, more, token, 64, err, 256);
}

static void test_text(void)
{
	char out[64];

	assert(text("<Error><Code>AccessDenied</Code></Error>", "Code", out, sizeof out) == 1);
	assert(!strcmp(out, "AccessDenied"));
	/* the five entities and character references, UTF-8 out */
	assert(text("<M>a&amp;b&lt;c&gt;d&quot;e&apos;f&#34;&#x22;&#252;&#x65E5;</M>", "M", out, sizeof out) == 1);
	assert(!strcmp(out, "a&b<c>d\"e'f\"\"\xc3\xbc\xe6\x97\xa5"));
	assert(text("<M></M>", "M", out, sizeof out) == 1 && out[0] == '\0');
	assert(text("<Error></Error>", "Code", out, sizeof out) == 0);
	/* no end tag, an unknown entity, a NUL or surrogate reference, too long */
	assert(text("<M>abc", "M", out, sizeof out) == -EINVAL);
	assert(text("<M>&nbsp;</M>", "M", out, sizeof out) == -EINVAL);
	assert(text("<M>&#0;</M>", "M", out, sizeof out) == -EINVAL);
	assert(text("<M>&#xD800;</M>", "M", out, sizeof out) == -EINVAL);
	assert(text("<M>&#-5;</M>", "M", out, sizeof out) == -EINVAL);
	assert(text("<M>&amp</M>", "M", out, sizeof out) == -EINVAL);
	assert(text("<M>12345678</M>", "M", out, 8) == -EINVAL);
	assert(text("<M>1234567</M>", "M", out, 8) == 1 && !strcmp(out, "1234567"));
}

static void test_list(void)
{
	struct seen s = { .stop_at = 0 };
	char token[64], err[256];
	bool more;

	assert(list("<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>"
		    "<Contents><Key>a b&amp;c</Key><ETag>&#34;e1&#34;</ETag><Size>11</Size></Contents>"
		    "<Contents><Key>\xc3\xbc/x</Key><Size>0</Size></Contents>"
		    "<NextContinuationToken>t/+=</NextContinuationToken></ListBucketResult>",
		    &s, &more, token, err) == 0);
	assert(s.n == 2 && more && !strcmp(token, "t/+="));
	assert(!strcmp(s.keys[0], "a b&c") && s.sizes[0] == 11 && !strcmp(s.etags[0], "\"e1\""));
	assert(!strcmp(s.keys[1], "\xc3\xbc/x") && s.sizes[1] == 0 && s.etags[1][0] == '\0');

	assert(list("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>", &s, &more, token,
		    err) == 0);
	assert(s.n == 0 && !more && token[0] == '\0');

	assert(list("<Error><Code>x</Code></Error>", &s, &more, token, err) == -EINVAL);
	assert(!strcmp(err, "the listing is not a ListBucketResult"));
	assert(list("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", &s, &more, token,
		    err) == -EINVAL);
	assert(!strcmp(err, "the listing is truncated but has no NextContinuationToken"));
	assert(list("<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>", &s, &more,
		    token, err) == -EINVAL);
	assert(!strcmp(err, "a Contents element without a Key (or one over 4095 bytes)"));
	assert(list("<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>", &s, &more,
		    token, err) == -EINVAL);
	assert(!strcmp(err, "k: no Size in the listing"));
	assert(list("<ListBucketResult><Contents><Key>k</Key><Size>12x</Size></Contents></ListBucketResult>",
		    &s, &more, token, err) == -EINVAL);
	assert(!strcmp(err, "k: Size '12x' in the listing is not a number"));
	assert(list("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
		    &s, &more, token, err) == -EINVAL);
	assert(!strcmp(err, "k: no Size in the listing"));
	assert(list("<ListBucketResult><Contents><Key>k</Key>", &s, &more, token, err) == -EINVAL);
	assert(!strcmp(err, "the listing ends inside a Contents element"));

	/* the callback's non-zero return stops the listing and is returned */
	s.stop_at = 1;
	assert(list("<ListBucketResult><Contents><Key>a</Key><Size>1</Size></Contents>"
		    "<Contents><Key>b</Key><Size>1</Size></Contents></ListBucketResult>",
		    &s, &more, token, err) == 7);
	assert(s.n == 1);
}

int main(void)
{
	test_text();
	test_list();
	printf("test-s3xml: ok\n");
	return 0;
}
