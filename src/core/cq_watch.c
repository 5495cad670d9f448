// SPDX-License-Identifier: MIT
/*
 * A CQ's readiness set: the sockets of the QPs whose transport receives in
 * ibv_poll_cq (TCP), in an epoll instance of the CQ's own, so that a poll
 * of a CQ behind hundreds of streams asks the kernel once which have
 * something to read instead of looking at each in turn (a poll() each).
 *
 * Only a CQ that polls more than URDMA_CQ_POLLERS QPs watches: with fewer,
 * every poll looks at all of them anyway, and a CQ per QP (rdma_cm makes
 * two) would cost an fd per CQ.  A poll takes at most half its QPs from
 * the set: a socket that stays readable (a stream whose peer is gone, a
 * Send waiting for a receive WR) is named at every poll, and the lists'
 * turn must go on for the QPs the set does not watch.
 *
 * Lifetimes.  A transport watches a stream's socket once it is up, from a
 * poll that looked at the socket itself, and stops watching it
 * (urdma_cq_unwatch_fd) before that socket closes, so a socket number the
 * kernel hands out again is never taken out of a set in its old owner's
 * name.  It stops in tr->disconnect, which qp_disconnect calls after
 * clearing qp->tr and waiting for the polls inside the QP's transport,
 * and before the QP is freed.  The set is read (epoll_wait) under the CQ
 * lock, what it names is used before that lock is let go, and the socket
 * leaves the set under that lock too: so a QP a poll has from the set is
 * not freed yet, and one without a transport is passed over
 * (cq_take_poller).
 */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/log.h"

static void cq_watch_one(struct urdma_cq *cq, struct urdma_qp *qp, int fd,
			 uint8_t bit)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = qp };

	if (atomic_load_explicit(&cq->polled_qps, memory_order_relaxed) <=
	    URDMA_CQ_POLLERS)
		return;
	pthread_mutex_lock(&cq->lock);
	if (cq->watch_epfd < 0)
		cq->watch_epfd = epoll_create1(EPOLL_CLOEXEC);
	if (atomic_load(&qp->fd_watch) & bit) {
		/* (watched meanwhile) */
	} else if (cq->watch_epfd >= 0 &&
		   !epoll_ctl(cq->watch_epfd, EPOLL_CTL_ADD, fd, &ev)) {
		atomic_fetch_or(&qp->fd_watch, bit);
	} else { /* polls look at it themselves, as before */
		urdma_dbg("qp %#x: not in its CQ's readiness set: %s",
			  qp->ibqp.qp_num, strerror(errno));
		atomic_fetch_or(&qp->fd_watch, URDMA_WATCH_FAILED);
	}
	pthread_mutex_unlock(&cq->lock);
}

/* qp's stream is up on socket fd: into its CQs' sets, those that watch
 * (more than URDMA_CQ_POLLERS polled QPs).  Cheap when there is nothing to
 * do: a transport calls it from a poll that looked at the socket itself.
 * The transport orders it before urdma_cq_unwatch_fd. */
void urdma_cq_watch_fd(struct urdma_qp *qp, int fd)
{
	uint8_t w = atomic_load_explicit(&qp->fd_watch, memory_order_relaxed);

	if (w & URDMA_WATCH_FAILED)
		return;
	if (!(w & URDMA_WATCH_RCQ))
		cq_watch_one(qp->rcq, qp, fd, URDMA_WATCH_RCQ);
	if (qp->scq != qp->rcq && !(w & URDMA_WATCH_SCQ))
		cq_watch_one(qp->scq, qp, fd, URDMA_WATCH_SCQ);
}

static void cq_unwatch_one(struct urdma_cq *cq, int fd)
{
	/* Under the lock a poll reads the set and uses what it names:
	 * after this, no poll holds qp from it. */
	pthread_mutex_lock(&cq->lock);
	epoll_ctl(cq->watch_epfd, EPOLL_CTL_DEL, fd, NULL);
	pthread_mutex_unlock(&cq->lock);
}

/* Before fd closes, or stops being qp's, and before qp is freed. */
void urdma_cq_unwatch_fd(struct urdma_qp *qp, int fd)
{
	uint8_t was = atomic_exchange(&qp->fd_watch, 0);

	/* (the sets live as long as their CQs, which outlive the QP) */
	if (was & URDMA_WATCH_RCQ)
		cq_unwatch_one(qp->rcq, fd);
	if (was & URDMA_WATCH_SCQ)
		cq_unwatch_one(qp->scq, fd);
}

/* Under cq->lock: the QPs whose sockets have something to read now, at
 * most max (epoll's ready list turns, so each gets its turn). */
int urdma_cq_ready(struct urdma_cq *cq, struct urdma_qp **qps, int max)
{
	struct epoll_event ev[URDMA_CQ_POLLERS];
	int n;

	if (cq->watch_epfd < 0)
		return 0;
	n = epoll_wait(cq->watch_epfd, ev,
		       max < URDMA_CQ_POLLERS ? max : URDMA_CQ_POLLERS, 0);
	/* (max: the caller leaves the rest of its batch to the lists) */
	for (int i = 0; i < n; i++)
		qps[i] = ev[i].data.ptr;
	return n > 0 ? n : 0;
}

/* Whether cq watches qp's socket (a poll that the set did not name it to
 * knows it has nothing to read). */
bool urdma_cq_watches(const struct urdma_cq *cq, struct urdma_qp *qp)
{
	return atomic_load_explicit(&qp->fd_watch, memory_order_relaxed) &
	       (cq == qp->rcq ? URDMA_WATCH_RCQ : URDMA_WATCH_SCQ);
}
