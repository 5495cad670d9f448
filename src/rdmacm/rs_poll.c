/* SPDX-License-Identifier: MIT */
/*
 * rsockets: rpoll and rselect, over rsockets and normal fds together.
 */

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "rdmacm/cma.h"
#include "rdmacm/cma_priv.h"
#include "rdmacm/rsocket_priv.h"

/* ------------------------------------------------------------------ */
/* Polling                                                            */
/* ------------------------------------------------------------------ */

/* The poll events of an rsocket now.  Lock held. */
static short rs_revents(struct rsocket *rs, short events)
{
	short r = 0;

	if (rs->dg)
		return rs_dg_revents(rs) & (events | POLLERR | POLLHUP | POLLNVAL);
	switch (rs->state) {
	case RS_IDLE:
		r = POLLOUT | POLLHUP;
		break;
	case RS_LISTENING:
		if (rs->req_head)
			r = POLLIN;
		break;
	case RS_ADDR_QUERY:
	case RS_ROUTE_QUERY:
	case RS_CONNECTING:
		break;
	case RS_FAILED:
		r = POLLOUT | POLLHUP | (rs->err ? POLLERR : 0);
		break;
	case RS_CONNECTED:
		if (rs->rx_tail != rs->rx_head || rs->peer_shut || rs->rd_shut ||
		    rs->conn_dead)
			r |= POLLIN;
		if (rs->peer_shut || rs->conn_dead)
			r |= POLLRDHUP;
		if (rs_can_send(rs))
			r |= POLLOUT;
		/* as TCP: the peer's clean end of stream is POLLIN|POLLRDHUP;
		 * POLLHUP once both directions are shut, or on a reset */
		if ((rs->conn_dead && !rs->peer_shut) ||
		    (rs->wr_shut && (rs->peer_shut || rs->rd_shut)))
			r |= POLLHUP;
		if (rs->err)
			r |= POLLERR;
		break;
	}
	return r & (events | POLLERR | POLLHUP | POLLNVAL);
}

/* Check every entry once; rsockets make progress.  Normal fds are asked
 * only with look (else their last answer stands: a system call per spin
 * would eat the spin).  Returns the number of entries with revents. */
static int rs_poll_check(struct pollfd *fds, nfds_t nfds, struct rsocket **map,
			 struct pollfd *norm, int nnorm, bool look)
{
	int cnt = 0, j = 0;

	if (look && nnorm > 0) {
		uint32_t stops;
		int r;

		do
			stops = cma_stop_seq();
		while ((r = poll(norm, (nfds_t)nnorm, 0)) < 0 && cma_cut_by_stop(stops));
		if (r < 0)
			return -1;
	}
	for (nfds_t i = 0; i < nfds; i++) {
		struct rsocket *rs = map[i];

		if (rs) {
			pthread_mutex_lock(&rs->lock);
			rs_progress(rs);
			fds[i].revents = rs_revents(rs, fds[i].events);
			pthread_mutex_unlock(&rs->lock);
		} else if (fds[i].fd >= 0) {
			fds[i].revents = norm[j++].revents;
		} else {
			fds[i].revents = 0;
		}
		if (fds[i].revents)
			cnt++;
	}
	return cnt;
}

RS_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	struct rsocket *map_s[16], **map = map_s;
	struct pollfd norm_s[16], *norm = norm_s, sleep_s[48], *sl = sleep_s;
	uint64_t start, deadline = 0, spin_end;
	int nrs = 0, nnorm = 0, ret, spin_miss = 0;
	uint32_t stops;
	bool slept = false;

	if (nfds && !fds)
		return cma_err(EFAULT);
	if (nfds > (nfds_t)INT_MAX / 3)
		return cma_err(EINVAL);
	for (nfds_t i = 0; i < nfds; i++)
		if (rs_lookup(fds[i].fd))
			nrs++;
	if (!nrs)
		return poll(fds, nfds, timeout);

	if (nfds > 16) {
		map = calloc(nfds, sizeof(*map));
		norm = calloc(nfds, sizeof(*norm));
		if (!map || !norm) {
			free(map);
			free(norm);
			return cma_err(ENOMEM);
		}
	}
	if (nfds * 3 > 48) {
		sl = calloc(nfds * 3, sizeof(*sl));
		if (!sl) {
			ret = cma_err(ENOMEM);
			goto out;
		}
	}
	for (nfds_t i = 0; i < nfds; i++) {
		map[i] = rs_lookup(fds[i].fd);
		if (map[i]) {
			if (map[i]->spin_miss > spin_miss)
				spin_miss = map[i]->spin_miss;
		} else if (fds[i].fd >= 0) {
			norm[nnorm].fd = fds[i].fd;
			norm[nnorm].events = fds[i].events;
			norm[nnorm].revents = 0;
			nnorm++;
		}
	}

	start = urdma_now_ns();
	if (timeout > 0)
		deadline = start + (uint64_t)timeout * 1000000ull;
	spin_end = start + (rs_spin_us <= 0 ? 0 :
			    spin_miss >= 8 ? 1000ull : (uint64_t)rs_spin_us * 1000ull);
	for (bool look = true;;) {
		int nsl = 0, ms;
		uint64_t t;

		ret = rs_poll_check(fds, nfds, map, norm, nnorm, look);
		look = false; /* until after a sleep */
		if (ret != 0 || timeout == 0)
			break;
		t = urdma_now_ns();
		if (deadline && t >= deadline)
			break;
		if (t < spin_end) {
			cpu_relax();
			continue;
		}
		/* arm every rsocket, look once more, then sleep on the fds */
		for (nfds_t i = 0; i < nfds; i++) {
			struct rsocket *rs = map[i];

			if (!rs) {
				if (fds[i].fd >= 0) {
					sl[nsl].fd = fds[i].fd;
					sl[nsl].events = fds[i].events;
					sl[nsl].revents = 0;
					nsl++;
				}
				continue;
			}
			pthread_mutex_lock(&rs->lock);
			rs_arm(rs);
			rs_progress(rs);
			fds[i].revents = rs_revents(rs, fds[i].events);
			if (fds[i].revents)
				ret++;
			nsl += rs_sleep_fds(rs, &sl[nsl]);
			pthread_mutex_unlock(&rs->lock);
		}
		if (ret) {
			/* normal fds were not looked at in this pass */
			ret = rs_poll_check(fds, nfds, map, norm, nnorm, true);
			break;
		}
		ms = RS_WAKE_MS;
		if (timeout > 0) {
			uint64_t left = (deadline - t + 999999) / 1000000;

			if (left < (uint64_t)ms)
				ms = (int)left;
		}
		stops = cma_stop_seq();
		ret = poll(sl, (nfds_t)nsl, ms);
		slept = true;
		look = true;
		if (ret < 0) {
			/* (poll() would not have seen a stop's signal) */
			if (cma_cut_by_stop(stops))
				continue;
			if (errno == EINTR)
				break;
			goto out;
		}
		/* CM fds that fired: the owners look at their events */
		for (int k = 0; k < nsl; k++) {
			if (!sl[k].revents)
				continue;
			for (nfds_t i = 0; i < nfds; i++) {
				struct rsocket *rs = map[i];

				if (rs && rs->fd == sl[k].fd) {
					pthread_mutex_lock(&rs->lock);
					rs->cm_due = true;
					pthread_mutex_unlock(&rs->lock);
				}
			}
		}
	}
	/* adapt: a wait that needed a long sleep means spinning was wasted */
	if (ret > 0) {
		bool long_wait = slept && urdma_now_ns() - start > 1000000ull;

		for (nfds_t i = 0; i < nfds; i++) {
			struct rsocket *rs = map[i];

			if (rs && fds[i].revents) {
				if (long_wait)
					rs->spin_miss++;
				else
					rs->spin_miss = 0;
			}
		}
	}
out:
	if (map != map_s)
		free(map);
	if (norm != norm_s)
		free(norm);
	if (sl != sleep_s)
		free(sl);
	return ret;
}

RS_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds,
		      fd_set *exceptfds, struct timeval *timeout)
{
	struct pollfd *fds;
	int n = 0, ret, timeout_ms, cnt = 0;

	if (nfds < 0 || nfds > FD_SETSIZE)
		return cma_err(EINVAL);
	if (timeout) {
		if (timeout->tv_sec < 0 || timeout->tv_usec < 0)
			return cma_err(EINVAL);
		if (timeout->tv_sec > INT_MAX / 1000 - 1)
			timeout_ms = INT_MAX;
		else
			timeout_ms = (int)(timeout->tv_sec * 1000 +
					   (timeout->tv_usec + 999) / 1000);
	} else {
		timeout_ms = -1;
	}
	fds = calloc(nfds ? (size_t)nfds : 1, sizeof(*fds));
	if (!fds)
		return cma_err(ENOMEM);
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;

		if (readfds && FD_ISSET(fd, readfds))
			ev |= POLLIN;
		if (writefds && FD_ISSET(fd, writefds))
			ev |= POLLOUT;
		if (exceptfds && FD_ISSET(fd, exceptfds))
			ev |= POLLPRI;
		if (ev) {
			fds[n].fd = fd;
			fds[n].events = ev;
			n++;
		}
	}
	ret = rpoll(fds, (nfds_t)n, timeout_ms);
	if (ret < 0) {
		free(fds);
		return ret;
	}
	for (int i = 0; i < n; i++) {
		short r = fds[i].revents;

		if (r & POLLNVAL) {
			free(fds);
			return cma_err(EBADF);
		}
	}
	if (readfds)
		FD_ZERO(readfds);
	if (writefds)
		FD_ZERO(writefds);
	if (exceptfds)
		FD_ZERO(exceptfds);
	for (int i = 0; i < n; i++) {
		short r = fds[i].revents, ev = fds[i].events;

		if ((ev & POLLIN) && (r & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(fds[i].fd, readfds);
			cnt++;
		}
		if ((ev & POLLOUT) && (r & (POLLOUT | POLLERR))) {
			FD_SET(fds[i].fd, writefds);
			cnt++;
		}
		if ((ev & POLLPRI) && (r & POLLPRI)) {
			FD_SET(fds[i].fd, exceptfds);
			cnt++;
		}
	}
	free(fds);
	return cnt;
}
