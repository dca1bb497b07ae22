/* SPDX-License-Identifier: MIT */
/* term - the terminal of `loaderctl top`: raw keys, alternate screen, size
 *
 * Plain termios and ANSI (ECMA-48 / xterm) escapes: every terminal emulator
 * people run top in speaks them, and loaderctl keeps no dependency beyond
 * libloader, jansson and zlib. Ctrl-C arrives as a key (ISIG off) so that
 * quitting always goes through term_leave(); SIGINT, SIGTERM and SIGHUP from
 * elsewhere only set a flag, for the same reason.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "term.h"

#define ALT_SCREEN_ON "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"
#define ALT_SCREEN_OFF "\x1b[?25h\x1b[?1049l"

static volatile sig_atomic_t pending;

static void on_signal(int sig)
{
	pending |= sig == SIGWINCH ? TERM_RESIZED : TERM_QUIT;
}

int term_signalled(void)
{
	int p = pending;

	pending = 0;
	return p;
}

int term_write(struct term *t, const char *buf, size_t n)
{
	while (n) {
		ssize_t w = write(t->out, buf, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += w;
		n -= (size_t)w;
	}
	return 0;
}

void term_size(struct term *t)
{
	struct winsize ws;

	if (ioctl(t->out, TIOCGWINSZ, &ws) < 0 || !ws.ws_row || !ws.ws_col) {
		ws.ws_row = 24;
		ws.ws_col = 80;
	}
	t->rows = ws.ws_row;
	t->cols = ws.ws_col;
}

int term_enter(struct term *t)
{
	/* no SA_RESTART: a signal must wake term_keys()'s poll */
	struct sigaction sa = { .sa_handler = on_signal };
	struct termios raw;

	t->in = STDIN_FILENO;
	t->out = STDOUT_FILENO;
	t->entered = false;
	if (!isatty(t->in) || !isatty(t->out))
		return -ENOTTY;
	if (tcgetattr(t->in, &t->saved) < 0)
		return -errno;
	raw = t->saved;
	raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ISIG | IEXTEN);
	raw.c_iflag &= ~(tcflag_t)(IXON | ICRNL);
	raw.c_cc[VMIN] = 1;
	raw.c_cc[VTIME] = 0;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGWINCH, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	if (tcsetattr(t->in, TCSAFLUSH, &raw) < 0)
		return -errno;
	t->entered = true;
	term_size(t);
	return term_write(t, ALT_SCREEN_ON, strlen(ALT_SCREEN_ON));
}

void term_leave(struct term *t)
{
	if (!t->entered)
		return;
	t->entered = false;
	term_write(t, ALT_SCREEN_OFF, strlen(ALT_SCREEN_OFF));
	tcsetattr(t->in, TCSAFLUSH, &t->saved);
}

int term_keys(struct term *t, int timeout_ms, int fd, bool *fd_ready, char *buf, size_t n)
{
	struct pollfd pfd[2] = { { .fd = t->in, .events = POLLIN }, { .fd = fd, .events = POLLIN } };
	int r = poll(pfd, fd >= 0 ? 2 : 1, timeout_ms);
	ssize_t got;

	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	if (fd >= 0 && pfd[1].revents)
		*fd_ready = true;
	if (!pfd[0].revents)
		return 0;
	if (pfd[0].revents & (POLLHUP | POLLERR | POLLNVAL) && !(pfd[0].revents & POLLIN))
		return -EPIPE;
	got = read(t->in, buf, n);
	if (got < 0)
		return errno == EINTR || errno == EAGAIN ? 0 : -errno;
	if (got == 0)
		return -EPIPE;
	return (int)got;
}
