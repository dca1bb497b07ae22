/* SPDX-License-Identifier: MIT */
/* base - what several layers of the daemon use
 *
 * The bottom layer: nothing here knows of a pipeline, a client or a socket
 * request. Every other layer may include it; it includes only common/ and
 * the public headers. A helper belongs here when two layers need it and
 * neither may call the other (the sockets' path claim: server and engine;
 * a size: the process, the server and the image cache).
 *
 *   log.h            leveled messages to stderr, rate limits
 *   creds.h          whose permissions a dataset is read with (ds_open())
 *   sockpath.h       claim a socket path: replace a stale one
 *   size.h           parse a size: "512M", "4G"
 *   config-change.h  a live setting's change: its log line, its reply entry
 *   bootid.h         the kernel's boot id: which cache files a power loss may have torn
 *
 * layer: daemon/base -> common include
 */
#pragma once

#include "bootid.h"
#include "config-change.h"
#include "creds.h"
#include "log.h"
#include "size.h"
#include "sockpath.h"
