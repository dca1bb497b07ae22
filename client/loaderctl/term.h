/* SPDX-License-Identifier: MIT */
/* term - the terminal of `loaderctl top`: raw keys, alternate screen, size */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <termios.h>

struct term {
	int in, out;            /* the tty's fds (stdin, stdout) */
	struct termios saved;   /* restored by term_leave() */
	bool entered;
	unsigned rows, cols;
};

/* Raw keys (no echo, no line buffering, Ctrl-C a key), the alternate screen,
 * the cursor hidden. 0 or a negative errno (-ENOTTY when stdin or stdout is
 * not a terminal). */
int term_enter(struct term *t);

/* Undo term_enter(): the saved modes, the main screen, the cursor. Safe to
 * call twice. */
void term_leave(struct term *t);

/* The window size into @t->rows, @t->cols (24x80 when the tty says 0). */
void term_size(struct term *t);

/* Wait up to @timeout_ms for keys, or for @fd (-1: none) to be readable
 * (then *@fd_ready is set). Returns the count of key bytes read into @buf, 0
 * on timeout, @fd or a signal (SIGWINCH, SIGTERM: see term_signalled), or a
 * negative errno; -EPIPE when the terminal hung up. */
int term_keys(struct term *t, int timeout_ms, int fd, bool *fd_ready, char *buf, size_t n);

/* Signals seen since the last call: TERM_RESIZED, TERM_QUIT (SIGINT,
 * SIGTERM, SIGHUP). */
enum { TERM_RESIZED = 1, TERM_QUIT = 2 };
int term_signalled(void);

/* Write all of @buf to the terminal. 0 or a negative errno. */
int term_write(struct term *t, const char *buf, size_t n);
