/* SPDX-License-Identifier: MIT */
/* nngclose - nng_close() with a time limit */
#pragma once

#include <nng/nng.h>
#include <stdbool.h>

/*
 * nng_close(@sock) on a thread of its own, waiting at most @ms for it. nng
 * 1.5.2 can wait forever on a peer that stopped reading (SIGSTOP, a full
 * socket buffer) or on a connection torn down mid-send; a process on its way
 * out must not hang on that. Returns false when the close did not finish in
 * time: it goes on in the background, and what nng holds is freed at exit.
 */
bool nng_close_within(nng_socket sock, int ms);
