/* SPDX-License-Identifier: MIT */
/* brace - shard name patterns: "train-{0000..0099}.tar", "{a,b}"
 *
 * A webdataset source names its shards by patterns, a tokens source its
 * files, as WebDataset's own braceexpand does: ranges keep the width of a
 * zero-padded bound, lists give each alternative. A pattern is parsed once and its names made one by one
 * (brace_nth()), so that counting a million of them costs nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "brace.h"

#define BRACE_MAX 1000000             /* names one pattern may expand to (counted only) */

static bool parse_ull(const char *s, size_t n, unsigned long long *out)
{
	unsigned long long v = 0;

	if (n == 0 || n > 18)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (unsigned long long)(s[i] - '0');
	}
	*out = v;
	return true;
}

/* The @k-th alternative of a list group. */
static void alt_get(const struct brace_group *g, unsigned long long k, const char **s, size_t *n)
{
	const char *p = g->alts, *end = g->alts + g->altlen;

	for (;;) {
		const char *c = memchr(p, ',', (size_t)(end - p));

		if (k == 0) {
			*s = p;
			*n = (size_t)((c ? c : end) - p);
			return;
		}
		k--;
		p = c + 1;
	}
}

int brace_parse(const char *pattern, struct brace *br, char *err, size_t errlen)
{
	struct brace_group *g = br->g;
	const char *p = pattern;
	size_t ng = 0;
	unsigned long long total = 1;

	for (;;) {
		const char *open = strpbrk(p, "{}"), *close, *dots;

		if (!open)
			break;
		if (*open == '}')
			return errfmt(-EINVAL, err, errlen, "unbalanced '}' in \"%s\"", pattern);
		close = strpbrk(open + 1, "{}");
		if (!close || *close == '{')
			return errfmt(-EINVAL, err, errlen,
				    close ? "nested braces are not supported in \"%s\""
					  : "unbalanced '{' in \"%s\"", pattern);
		if (ng == BRACE_GROUPS_MAX)
			return errfmt(-EINVAL, err, errlen, "more than %d brace groups in \"%s\"",
				    BRACE_GROUPS_MAX, pattern);
		struct brace_group *b = &g[ng++];
		memset(b, 0, sizeof(*b));
		b->lit = p;
		b->litlen = (size_t)(open - p);
		dots = strstr(open + 1, "..");
		if (dots && dots < close) {
			const char *a = open + 1, *z = dots + 2;
			size_t an = (size_t)(dots - a), zn = (size_t)(close - z);

			if (!parse_ull(a, an, &b->lo) || !parse_ull(z, zn, &b->hi) || b->lo > b->hi)
				return errfmt(-EINVAL, err, errlen,
					    "bad range {%.*s} in \"%s\": want {FIRST..LAST} with 0 <= FIRST <= LAST",
					    (int)(close - open - 1), open + 1, pattern);
			b->range = true;
			if ((an > 1 && a[0] == '0') || (zn > 1 && z[0] == '0'))
				b->width = (int)(an > zn ? an : zn);
			b->count = b->hi - b->lo + 1;
		} else if (memchr(open + 1, ',', (size_t)(close - open - 1))) {
			b->alts = open + 1;
			b->altlen = (size_t)(close - open - 1);
			b->count = 1;
			for (const char *c = b->alts; c < close; c++)
				b->count += *c == ',';
		} else {
			return errfmt(-EINVAL, err, errlen,
				    "bad brace group {%.*s} in \"%s\": want {FIRST..LAST} or {a,b,...}",
				    (int)(close - open - 1), open + 1, pattern);
		}
		if (b->count > BRACE_MAX || total * b->count > BRACE_MAX)
			return errfmt(-EINVAL, err, errlen, "\"%s\" expands to more than %d names",
				    pattern, BRACE_MAX);
		total *= b->count;
		p = close + 1;
	}
	br->ng = ng;
	br->tail = p;
	br->total = total;
	br->maxlen = strlen(pattern) + 20 * ng + 1;
	return 0;
}

void brace_nth(const struct brace *br, unsigned long long i, char *s)
{
	unsigned long long rest = i, div = br->total;
	char *w = s;

	for (size_t k = 0; k < br->ng; k++) {
		const struct brace_group *g = &br->g[k];
		unsigned long long pick;

		div /= g->count;
		pick = rest / div;
		rest %= div;
		memcpy(w, g->lit, g->litlen);
		w += g->litlen;
		if (g->range) {
			w += sprintf(w, "%0*llu", g->width, g->lo + pick);
		} else {
			const char *a;
			size_t n;

			alt_get(g, pick, &a, &n);
			memcpy(w, a, n);
			w += n;
		}
	}
	strcpy(w, br->tail);
}

long brace_expand(const char *pattern, char ***out, char *err, size_t errlen)
{
	struct brace br;
	char **v;
	int r = brace_parse(pattern, &br, err, errlen);

	if (r < 0)
		return r;
	if (!out)
		return (long)br.total;
	v = calloc(br.total + 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (unsigned long long i = 0; i < br.total; i++) {
		v[i] = malloc(br.maxlen);
		if (!v[i]) {
			brace_free(v);
			return -ENOMEM;
		}
		brace_nth(&br, i, v[i]);
	}
	*out = v;
	return (long)br.total;
}

void brace_free(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

