/* SPDX-License-Identifier: MIT */
/*
 * poll() on one fd for the library's own short waits and looks.  A signal
 * (the one that stops threads for a registration, core/stop.c, or the
 * application's) makes poll() return EINTR whatever SA_RESTART says, even
 * with a timeout of 0: taken as an answer, a look said "ready" when it was
 * not (peer.c: a live peer taken for dead), and a wait gave up early.
 * These go on with the time left.
 */
#ifndef URDMA_UTIL_FDPOLL_H
#define URDMA_UTIL_FDPOLL_H

#include <errno.h>
#include <poll.h>

#include "util/clock.h"

/* > 0: ready (or an error on fd: POLLERR, POLLHUP); 0: not within ms
 * (0: a look); < 0: an error of poll() other than EINTR. */
static inline int urdma_poll_fd(int fd, short events, int ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	/* (no clock for a look: rx_ready makes one at every poll) */
	uint64_t end = ms > 0 ? urdma_now_ns() + (uint64_t)ms * 1000000ull : 0;
	int r;

	while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR) {
		if (ms > 0) {
			uint64_t now = urdma_now_ns();

			if (now >= end)
				return 0;
			ms = (int)((end - now + 999999) / 1000000);
		}
	}
	return r;
}

#endif
