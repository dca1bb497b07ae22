/* SPDX-License-Identifier: MIT */
/* brace - shard name patterns: "train-{0000..0099}.tar", "{a,b}" */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct brace_group {
	const char *lit;              /* literal text before the group */
	size_t litlen;
	bool range;
	unsigned long long lo, hi;    /* range */
	int width;                    /* range: zero-padded width, 0 = none */
	const char *alts;             /* list: "a,b,c" (not NUL-terminated) */
	size_t altlen;
	unsigned long long count;
};

#define BRACE_GROUPS_MAX 16

/* A pattern's groups, literal tail and count of names (checked). */
struct brace {
	struct brace_group g[BRACE_GROUPS_MAX];
	size_t ng;
	const char *tail;
	unsigned long long total;
	size_t maxlen;                /* of a name, with its NUL */
};

/* Parse @pattern into @br, its names counted and bounded: 0, or -EINVAL with
 * @err naming what is wrong. */
int brace_parse(const char *pattern, struct brace *br, char *err, size_t errlen);
/* Name @i (< br->total) into @s, br->maxlen bytes. */
void brace_nth(const struct brace *br, unsigned long long i, char *s);

/**
 * brace_expand() - expand "a-{000..012}.tar" and "{x,y}" patterns.
 * @out: receives a NULL-terminated array of strings (free with
 *       brace_free()), or NULL to count and check only
 *
 * Numeric ranges count up and keep the width of a zero-padded bound;
 * several braces give every combination, leftmost slowest. No nesting.
 * Return: the number of strings (at most 1000000), or -EINVAL with @err set,
 * or -ENOMEM.
 */
long brace_expand(const char *pattern, char ***out, char *err, size_t errlen);
void brace_free(char **v);
