// SPDX-License-Identifier: MIT
/*
 * The TCP transport's parking: when the progress thread watches a stream
 * and when it leaves it to the application's polls (docs/ARCHITECTURE.md,
 * receive path); the poll and arm entry points that decide it.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/tcp/crc32c.h"
#include "transport/tcp/iwarp_parse.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/fdpoll.h"
#include "util/log.h"
#include "transport/tcp/tcp.h"

#define POLLING_NS 200000ull
/* Two polls this close belong to one poll loop (a poll that receives
 * nothing costs one recv, well under 1 us here). */
#define TIGHT_POLL_NS 5000ull

/* An application thread polled this connection within the last 200 us. */
bool tcp_app_polling(struct tcp_conn *c)
{
	return urdma_now_ns() - atomic_load(&c->last_poll_ns) < POLLING_NS;
}

/* The application armed a CQ of the stream's QP: it is about to sleep on
 * it.  Under rx_lock (c->qp). */
bool tcp_cq_armed(struct tcp_conn *c)
{
	struct urdma_qp *qp = c->qp;

	return qp && (urdma_cq_armed(qp->rcq) ||
		      (qp->scq != qp->rcq && urdma_cq_armed(qp->scq)));
}

/* The hold of a receive pass the progress thread runs (HOLD_NEAR_NS). */
uint64_t tcp_progress_hold_ns(struct tcp_conn *c)
{
	return tcp_app_polling(c) && c->qp && !tcp_cq_armed(c) ? HOLD_NEAR_NS : 0;
}

/*
 * Parking: an application that polls its CQ and finds nothing, twice, waits
 * inside the library; what arrives now it receives itself, sooner than a
 * woken progress thread would, and on a busy core that wake-up would delay
 * it.  So the progress thread stops watching the stream (parked).  As soon
 * as a poll receives something the application is about to leave the
 * library, perhaps to spin on memory for a one-sided operation: unparked,
 * at once, or after its next send if what came was a message (tcp_poll).
 * tcp_maintain unparks a stream whose application stopped polling, and
 * tcp_armed one whose application is about to sleep on its CQ.  Under
 * rx_lock.
 */
void conn_park(struct tcp_conn *c, bool park)
{
	uint8_t recv = TXP_RECV;

	if (park && c->shut)
		return; /* the progress thread drops what comes */
	if (!park) /* a receiving poll's park ends with any unpark */
		atomic_compare_exchange_strong(&c->tx_parked, &recv, TXP_NONE);
	if (atomic_load(&c->parked) == park)
		return;
	atomic_store(&c->parked, park);
	conn_watch(c);
	/* tcp_maintain looks at it within PARK_LOOK_NS, and again each
	 * PARK_LOOK_NS while it stays parked. */
	if (park)
		urdma_progress_by(urdma_now_ns() + PARK_LOOK_NS);
}

/*
 * A long send holds the socket in the kernel; answers arriving meanwhile
 * (to the flush Reads of earlier messages) would wake the progress thread,
 * on a busy core taking its time from the sender, only to wait for the
 * socket.  So the sending thread parks the stream for the send (when it
 * was not parked already) and takes the answers itself afterwards.  While
 * the send waits for room, the stream is unparked and read (tx_wait): the
 * peer may be waiting for us to read.  sq_lock, not tx_lock, held.
 */

bool tx_park(struct tcp_conn *c)
{
	bool parked = false;

	if (pthread_mutex_trylock(&c->rx_lock))
		return false;
	if (!atomic_load(&c->parked) && atomic_load(&c->state) == C_UP &&
	    !c->closing) {
		conn_park(c, true);
		atomic_store(&c->tx_parked, TXP_SEND);
		parked = true;
	}
	pthread_mutex_unlock(&c->rx_lock);
	return parked;
}

/* After a send: end the park that waited for it.  A long send's own
 * (wait) takes what came meanwhile; a receiving poll's (its TXP_RECV
 * already ended: tcp_execute) gives the stream back, unless someone
 * receives now (then tcp_maintain does). */
void tx_unpark(struct tcp_conn *c, bool wait)
{
	uint8_t how;

	if (wait)
		pthread_mutex_lock(&c->rx_lock);
	else if (pthread_mutex_trylock(&c->rx_lock))
		return;
	how = wait ? atomic_exchange(&c->tx_parked, TXP_NONE) : TXP_RECV;
	if (how != TXP_NONE && !c->closing) {
		if (how == TXP_SEND)
			rx_locked(c, HOLD_APP_NS);
		conn_park(c, false);
	}
	pthread_mutex_unlock(&c->rx_lock);
	rsp_send(c);
}

void conn_cb(struct urdma_watcher *w, uint32_t events)
{
	struct tcp_conn *c = (struct tcp_conn *)w;

	if (atomic_load(&c->state) != C_UP) {
		pthread_mutex_lock(&T.lock);
		if (atomic_load(&c->state) != C_UP && c->fd >= 0)
			tcp_handshake(c, events);
		pthread_mutex_unlock(&T.lock);
		return;
	}
	pthread_mutex_lock(&c->rx_lock);
	rx_locked(c, tcp_progress_hold_ns(c));
	pthread_mutex_unlock(&c->rx_lock);
	tx_rest_resume(c); /* a cut message's rest, and the WRs behind it */
	rsp_send_due(c);
	tx_fin(c); /* an end that waited for room */
	if (!atomic_load(&c->rsp_n) && !atomic_load(&c->fin_want) &&
	    !atomic_load(&c->resting) &&
	    atomic_exchange(&c->want_out, false)) {
		conn_watch(c);
		rsp_send_due(c); /* queued meanwhile */
		/* A send cut meanwhile found want_out still set and left the
		 * watch to us. */
		if (atomic_load(&c->resting) &&
		    !atomic_exchange(&c->want_out, true))
			conn_watch(c);
	}
}

/*
 * tcp_maintain gave back a stream that a receiving poll had parked
 * (TXP_RECV), and bytes had come meanwhile: the application did not
 * answer what it received but went to spin on memory for them (a flag
 * Write behind the data).  Each such wait lasts until tcp_maintain's next
 * look (PARK_LOOK_NS), so for SPINS_NS this stream's receiving polls
 * unpark at once (tcp_poll).  Not for good: this is a guess (an
 * application held off its CPU between a receive and its answer while
 * more came would look the same), and while it lasts the unpark sits
 * between each message and its answer (about 0.5 us one-way in
 * ib_send_lat).  A real spinner pays one look's wait per SPINS_NS.
 * Under rx_lock.
 */
#define SPINS_NS 1000000000ull

void conn_spins(struct tcp_conn *c)
{
	uint64_t now = urdma_now_ns();

	if (now >= c->spins_until)
		urdma_dbg("tcp: qp %#x: the application spins on memory: "
			  "receiving polls unpark for %llu ms",
			  c->local_qpn, SPINS_NS / 1000000);
	c->spins_until = now + SPINS_NS;
}

/* Whether the socket has something to read (or an error), by a look that
 * does not take the socket's lock.  A poll loop that tried to read instead
 * would hold that lock now and then as a segment arrives: TCP then leaves
 * the segment to the lock's release, in this thread, and the read finds
 * nothing; the next read has it, a system call and the peer's receive
 * processing later. */
static bool rx_ready(struct tcp_conn *c)
{
	return urdma_poll_fd(c->fd, POLLIN, 0) != 0;
}

/* rbuf holds the start of an untagged FPDU (a Send's), not all of it, and
 * it is not a Send waiting for a receive WR.  Under rx_lock. */
static bool rx_mid_untagged(struct tcp_conn *c)
{
	return c->rlen > 2 && !(c->rbuf[2] & DDP_FLAG_T) &&
	       !atomic_load(&c->stalled);
}

void tcp_poll(struct urdma_qp *qp, enum urdma_poll_hint hint)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	/* A stream found dead has nothing more to give: the progress thread
	 * takes it from there (tcp_maintain). */
	if (!c || atomic_load(&c->state) != C_UP || atomic_load(&c->dead))
		return;
	tx_hold_push(c); /* the application may wait for their answers */
	uint64_t now = urdma_now_ns();
	uint64_t prev = atomic_load_explicit(&c->last_poll_ns,
					     memory_order_relaxed);
	uint32_t recvs, writes, msgs;
	bool quiet, release;

	atomic_store_explicit(&c->last_poll_ns, now, memory_order_relaxed);
	if (pthread_mutex_trylock(&c->rx_lock))
		return;
	/* A poll that looks itself: into the CQs' readiness sets, if they
	 * watch (once; c->qp set: tcp_disconnect takes it out after). */
	if (hint == URDMA_POLL_LOOK && c->qp)
		urdma_cq_watch_fd(qp, c->fd);
	msgs = c->rx_msgs;
	writes = c->rx_writes;
	recvs = c->rx_recvs;
	/* (the CQ's readiness set may have said already) */
	if (c->rlen || atomic_load(&c->stalled) ||
	    (hint == URDMA_POLL_LOOK ? rx_ready(c) : hint == URDMA_POLL_READY))
		rx_locked(c, HOLD_APP_NS);
	/* Polls that take no message, back to back (a poll loop, not one
	 * poll per call of an application that then spins on memory).  Part
	 * of a message is nothing yet: the application still waits for it. */
	if (c->rx_msgs != msgs) {
		c->quiet_polls = c->idle_polls = 0;
	} else {
		c->idle_polls++;
		c->quiet_polls = now - prev < TIGHT_POLL_NS ? c->quiet_polls + 1 : 1;
	}
	/* Two of them: the application waits here (park).  Answers held back
	 * go with its next message; one that polled twice since it took a
	 * message, however far apart (idle_polls, never below quiet_polls),
	 * is not answering: send them now.  With the polls close together
	 * only, one that polls now and then, and does not answer on this
	 * stream (it took a peer's Write it will never see), held the answer
	 * to that Write's flush, and so the peer's Write, for HOLD_APP_NS
	 * (2 ms: polls 8 us apart, a Write's median 2,088 us). */
	quiet = c->quiet_polls >= 2;
	release = c->idle_polls >= 2;
	/* A poll that received a message or a Write while parked: the
	 * application leaves to answer it (ib_send_lat, ib_write_lat), and
	 * its send gives the stream back once the answer is on its way
	 * (TXP_RECV, tx_unpark); an unpark here would put a system call
	 * between the message and the answer.  A close poll after it keeps
	 * that.  So does one that took an answer (a flush Read's Response)
	 * with part of the next untagged message behind it (a Send: the
	 * application polls for it): that message is still arriving;
	 * unparked, the progress thread took its rest while the polls waited
	 * for it (64 KiB ib_send_lat over TCP: 0.7 wake-ups and 2 futex calls
	 * a message on each side).  Not part of a Write: its application may
	 * leave to spin on memory for it.  Unless this application
	 * was lately found not answering (spins_until: it spun on memory for
	 * a Write still to come, and tcp_maintain had to unpark): then, as
	 * for anything else received (an answer), the stream goes back
	 * now. */
	if (!c->qp || tcp_cq_armed(c)) {
		conn_park(c, false); /* the application is about to sleep */
	} else if (quiet) {
		conn_park(c, true);
	} else if (atomic_load(&c->parked) && !c->quiet_polls &&
		   now >= c->spins_until &&
		   (c->rx_recvs != recvs || c->rx_writes != writes ||
		    rx_mid_untagged(c))) {
		uint8_t none = TXP_NONE;

		atomic_compare_exchange_strong(&c->tx_parked, &none, TXP_RECV);
	} else if (atomic_load(&c->tx_parked) != TXP_RECV ||
		   now - prev >= TIGHT_POLL_NS) {
		conn_park(c, false);
	}
	pthread_mutex_unlock(&c->rx_lock);
	if (release)
		rsp_send(c);
}

/* Before the QP goes: a peer that sent to it more than the application
 * took (ibv_srq_pingpong keeps a Send in flight per QP and stops at its
 * count) gets its messages placed and answered, instead of a
 * RETRY_EXC_ERR when the stream closes on them unread. */
void tcp_drain(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (!c || atomic_load(&c->state) != C_UP || atomic_load(&c->dead))
		return;
	tx_hold_push(c);
	pthread_mutex_lock(&c->rx_lock);
	if (c->rlen || atomic_load(&c->stalled) || rx_ready(c))
		rx_locked(c, 0);
	pthread_mutex_unlock(&c->rx_lock);
	rsp_send(c);
}

/* The application may sleep on its CQ now: the progress thread must watch
 * for data again.  Under the CQ lock, inner to rx_lock: if that is busy,
 * tcp_maintain unparks. */
void tcp_armed(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (!c)
		return;
	/* The application is about to sleep: what it holds back for its
	 * next message goes now, and so do the answers a poll of it held
	 * for that message (HOLD_APP_NS): it will not come. */
	tx_hold_push(c);
	if (atomic_load(&c->rsp_n))
		rsp_send(c);
	if (!atomic_load(&c->parked))
		return;
	if (pthread_mutex_trylock(&c->rx_lock)) {
		urdma_progress_kick();
		return;
	}
	if (atomic_load(&c->state) == C_UP)
		conn_park(c, false);
	pthread_mutex_unlock(&c->rx_lock);
}
