/* SPDX-License-Identifier: MIT */
/* notify - the systemd notification protocol (sd_notify), without libsystemd */
#pragma once

#include <stdint.h>

/* Read $NOTIFY_SOCKET and $WATCHDOG_USEC/$WATCHDOG_PID. Returns 1 when a
 * notification socket is set, 0 when not (then notify_send does nothing). */
int notify_init(void);
/* Send one state message, e.g. "READY=1\nSTATUS=serving". Never blocks long. */
void notify_send(const char *state);
/* "RELOADING=1" with the MONOTONIC_USEC that systemd 253+ wants. */
void notify_reloading(void);
/* Watchdog interval in microseconds, 0 when systemd set none for us. */
uint64_t notify_watchdog_usec(void);
