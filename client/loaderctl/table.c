/* SPDX-License-Identifier: MIT */
/* table - aligned tables and lines of text, for stdout or a screen */

#include "loaderctl.h"

int table_add(struct table *t, const char *const *row)
{
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		void *p = realloc(t->cells, cap * sizeof(*t->cells));

		if (!p)
			return -ENOMEM;
		t->cells = p;
		t->cap = cap;
	}
	for (int c = 0; c < t->ncols; c++)
		snprintf(t->cells[t->nrows][c], CELL_MAX, "%s", row[c] ? row[c] : "-");
	t->nrows++;
	return 0;
}

void lines_put(struct lines *l, const char *s, size_t n)
{
	if (l->oom)
		return;
	if (l->cap - l->len < n + 1) {
		size_t cap = l->cap ? l->cap : 4096;
		char *p;

		while (cap - l->len < n + 1)
			cap *= 2;
		p = realloc(l->buf, cap);
		if (!p) {
			l->oom = true;
			return;
		}
		l->buf = p;
		l->cap = cap;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
	l->buf[l->len] = '\0';
}

/* Bytes of the well-formed UTF-8 character at @s (1 for ASCII), 0 if none. */
static size_t utf8_len(const unsigned char *s)
{
	size_t n = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] <= 0xdf ? 2 :
	           s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;

	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

/*
 * One line. Control characters (C0, DEL, C1) and bytes that are not UTF-8
 * become '?': client names are anyone's bytes, and an escape sequence in one
 * must not reach the terminal. Cut at @l->cols characters.
 */
void lines_add(struct lines *l, const char *fmt, ...)
{
	char line[8192], out[8192];
	unsigned cols = 0;
	size_t o = 0;
	va_list ap;

	l->n++;
	if (l->max && l->n > l->max)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	for (const unsigned char *p = (const unsigned char *)line; *p && !(l->cols && cols == l->cols);
	     cols++) {
		size_t n = utf8_len(p);

		if (n == 0 || *p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] < 0xa0)) {
			out[o++] = '?';
			p += n ? n : 1;
		} else {
			memcpy(out + o, p, n);
			o += n;
			p += n;
		}
	}
	lines_put(l, out, o);
	if (l->screen)
		lines_put(l, "\x1b[K", 3);
	if (!l->screen || l->n != l->max)
		lines_put(l, "\n", 1);
}

/* Write @l to stdout and free it. */
int lines_print(struct lines *l)
{
	int r = 0;

	if (l->oom) {
		warnx("out of memory");
		r = EXIT_FAILURE;
	} else if (l->len && (fwrite(l->buf, 1, l->len, stdout) != l->len || fflush(stdout) == EOF)) {
		r = EXIT_FAILURE;
	}
	free(l->buf);
	*l = (struct lines){ 0 };
	return r;
}

void table_lines(const struct table *t, struct lines *l)
{
	size_t w[TABLE_COLS] = { 0 };
	char line[TABLE_COLS * (CELL_MAX + 2)];

	for (size_t r = 0; r < t->nrows; r++)
		for (int c = 0; c < t->ncols; c++) {
			size_t len = strlen(t->cells[r][c]);
			if (len > w[c])
				w[c] = len;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		size_t len = 0;

		for (int c = 0; c < t->ncols; c++)
			len += (size_t)snprintf(line + len, sizeof(line) - len, "%-*s%s",
			                        c + 1 == t->ncols ? 0 : (int)w[c], t->cells[r][c],
			                        c + 1 == t->ncols ? "" : "  ");
		lines_add(l, "%s", line);
	}
}

void table_print(const struct table *t)
{
	struct lines l = { 0 };

	table_lines(t, &l);
	lines_print(&l);
}

void table_free(struct table *t)
{
	free(t->cells);
	t->cells = NULL;
	t->nrows = t->cap = 0;
}
