// SPDX-License-Identifier: MIT
/*
 * The TCP transport's send path: writing a message (one buffer or a
 * gather, waiting for room while reading, or cut and its rest kept for
 * later), the responses the receive path queues (Read Responses, answers
 * to flushes, atomic responses) and the stream's end (Terminate, FIN).
 * The FPDUs are framed in tcp_frame.c.
 */
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

#include "transport/tcp/iwarp_parse.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"
#include "transport/tcp/tcp.h"

static bool conn_giving_up(struct tcp_conn *c)
{
	return atomic_load(&c->dead) || atomic_load(&c->closing) ||
	       (c->qp && atomic_load(&c->qp->shm->state) >= URDMA_SQPS_ERR);
}

/*
 * Wait until the socket takes more, or the stream is given up.  The peer
 * may be waiting for us to read (both sides sending at once): a thread that
 * waits for room receives meanwhile (and ends a send-time park), unless
 * another thread is at it.  The receive path it runs never waits for
 * tx_lock (responses are queued, a Terminate goes when tx_lock is let go:
 * tx_fin, a WR it makes runnable is not sent from there: rx_owner), so
 * holding it here is safe.  Under tx_lock.
 */
int tx_wait(struct tcp_conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLOUT };

	if (conn_giving_up(c))
		return -EPIPE;
	if (c->tx_cut == TXC_ALWAYS)
		return TX_CUT;
	/* If rx_lock is busy, its holder is receiving; tcp_maintain unparks
	 * a stream that nobody polls. */
	if (!pthread_mutex_trylock(&c->rx_lock)) {
		if (atomic_exchange(&c->tx_parked, TXP_NONE) && !c->closing)
			conn_park(c, false);
		rx_locked(c, HOLD_APP_NS);
		/* Wake for data too, unless a Send waits for a receive. */
		if (!atomic_load(&c->stalled) && !atomic_load(&c->dead))
			p.events |= POLLIN;
		pthread_mutex_unlock(&c->rx_lock);
	}
	/* Our receiving waits for a receive WR: the application that would
	 * post it may be this very sender (tx_cut). */
	if (c->tx_cut == TXC_STALLED && atomic_load(&c->stalled))
		return TX_CUT;
	poll(&p, 1, 100);
	return 0;
}

/* iov as one buffer (*len bytes), copied into buf when it has more than
 * one iovec and at most TX_GATHER bytes; NULL when it has more.  A
 * message of up to 4 KiB (its FPDU, the answers and the flush tail that
 * go with it: 7 iovecs) then goes out by send(), which costs less than
 * sendmsg(), and sendmsg() costs more with each iovec. */
static const void *tx_flat(const struct iovec *iov, int n, uint8_t *buf,
			   size_t *len)
{
	size_t k = 0;

	if (n == 1) {
		*len = iov->iov_len;
		return iov->iov_base;
	}
	for (int i = 0; i < n && k <= TX_GATHER; i++)
		k += iov[i].iov_len;
	if (k > TX_GATHER)
		return NULL;
	*len = k;
	for (k = 0; n--; iov++) {
		memcpy(buf + k, iov->iov_base, iov->iov_len);
		k += iov->iov_len;
	}
	return buf;
}

/*
 * Write some of iov without waiting.  Returns the bytes written, or
 * -EAGAIN, or an error (the stream is dead).  With more, the same thread
 * writes the rest of the message next: MSG_MORE keeps TCP from pushing
 * the partly filled segment this write ends with (TCP_NODELAY would), so
 * a long message goes out in full-sized segments.  The last write of a
 * message is pushed.  Under tx_lock (tx_buf).
 */
static ssize_t tx_some(struct tcp_conn *c, struct iovec *iov, int n,
		       bool more)
{
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n };
	int flags = MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0);
	size_t len;
	const void *flat = tx_flat(iov, n, c->tx_buf, &len);

	if (atomic_load(&c->tx_broken))
		return -EPIPE;
	for (;;) {
		/* No SIGPIPE for the application when the peer is gone. */
		ssize_t k = flat ? send(c->fd, flat, len, flags) :
				   sendmsg(c->fd, &mh, flags);

		if (k >= 0)
			return k;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN)
			return -EAGAIN;
		k = errno;
		conn_set_dead_err(c, (int)k);
		return -k;
	}
}

/* ---- responses ---- */

/* Queue a response, to go within hold_ns (0: now, due 0).  Receive path
 * (rx_lock).  -ENOSPC: the peer asks more than it reads. */
int rsp_push(struct tcp_conn *c, const struct tcp_rsp *r,
		    uint64_t hold_ns)
{
	uint64_t due = hold_ns ? urdma_now_ns() + hold_ns : 0;

	pthread_mutex_lock(&c->rsp_lock);
	if (c->rsp_tail - c->rsp_head == c->rsp_size) {
		uint32_t n = c->rsp_size ? 2 * c->rsp_size : 16;
		struct tcp_rsp *q =
			n <= RSP_MAX ? urdma_ring_move(c->rsp, c->rsp_size,
						       c->rsp_head, c->rsp_size,
						       n, sizeof(*q)) :
				       NULL;

		if (!q) {
			pthread_mutex_unlock(&c->rsp_lock);
			return -ENOSPC;
		}
		c->rsp = q;
		c->rsp_head = 0;
		c->rsp_tail = c->rsp_size;
		c->rsp_size = n;
	}
	if (c->rsp_head == c->rsp_tail || due < atomic_load(&c->rsp_due))
		atomic_store(&c->rsp_due, due);
	c->rsp[c->rsp_tail++ & (c->rsp_size - 1)] = *r;
	atomic_fetch_add(&c->rsp_n, 1);
	if (r->read && r->len)
		atomic_fetch_add(&c->rsp_data, 1);
	pthread_mutex_unlock(&c->rsp_lock);
	if (hold_ns)
		urdma_progress_by(due);
	return 0;
}

/* Send what the socket takes now of buf's len bytes from *off on,
 * advancing *off.  Returns 0 (progress), -EAGAIN or an error.  Under
 * tx_lock. */
static int tx_rest(struct tcp_conn *c, uint8_t *buf, uint32_t len,
		   uint32_t *off)
{
	struct iovec v = { buf + *off, len - *off };
	ssize_t k = tx_some(c, &v, 1, false);

	if (k < 0)
		return (int)k;
	*off += (uint32_t)k;
	return 0;
}

/* All of buf's len bytes from *off on, as far as the socket takes them
 * now: 0 when they have gone, -EAGAIN or an error.  Under tx_lock. */
static int tx_rest_all(struct tcp_conn *c, uint8_t *buf, uint32_t len,
		       uint32_t *off)
{
	while (*off < len) {
		int r = tx_rest(c, buf, len, off);

		if (r)
			return r;
	}
	return 0;
}

/* The bytes a cut write left (rest), as far as the socket takes them
 * now: 0 when none is left (and nothing else rests: resting is clear),
 * -EAGAIN or an error.  Under tx_lock. */
static int rest_bytes(struct tcp_conn *c)
{
	int r = tx_rest_all(c, c->rest, c->rest_len, &c->rest_off);

	if (r)
		return r;
	c->rest_len = c->rest_off = 0;
	if (!c->rest_job_on)
		atomic_store(&c->resting, false);
	return 0;
}

/* Send what the socket takes now of the cut FPDU's end (res).  Returns 0
 * (progress), -EAGAIN or an error.  Under tx_lock. */
static int res_send(struct tcp_conn *c)
{
	int r = tx_rest(c, c->res, c->res_len, &c->res_off);

	if (r)
		return r;
	if (c->res_off == c->res_len) {
		c->res_len = c->res_off = 0;
		atomic_fetch_sub(&c->rsp_n, 1);
	}
	return 0;
}

/* Send what the socket takes now of the held messages.  Returns 0 when
 * none is left, -EAGAIN or an error.  Under tx_lock. */
static int hold_send(struct tcp_conn *c)
{
	int r = tx_rest_all(c, c->hold, c->hold_len, &c->hold_off);

	if (r)
		return r;
	c->hold_len = c->hold_off = 0;
	atomic_store_explicit(&c->held, false, memory_order_relaxed);
	return 0;
}

/* The held messages go now, if tx_lock is free (its holder's write takes
 * them otherwise) and the socket has room: from a poll of the
 * application's (it may be about to wait for their answers) and from the
 * progress thread (TX_HOLD_NS); while some are left, the progress thread
 * comes back. */
void tx_hold_push(struct tcp_conn *c)
{
	int r;

	if (!atomic_load_explicit(&c->held, memory_order_relaxed))
		return;
	if (pthread_mutex_trylock(&c->tx_lock)) {
		urdma_progress_by(urdma_now_ns() + TX_HOLD_NS);
		return;
	}
	r = atomic_load(&c->dead) ? 0 : hold_send(c);
	pthread_mutex_unlock(&c->tx_lock);
	if (r == -EAGAIN)
		urdma_progress_by(urdma_now_ns() + TX_HOLD_NS);
}

/* Send the cut FPDU's end, then the next FPDUs of the oldest responses,
 * as many as one write holds (RSP_SEGS FPDUs, TX_IOV iovecs) and as much
 * of it as the socket takes now; an FPDU it cuts is kept whole in res.
 * Requests that came together are answered in one system call.  Returns
 * 0 (progress), -EAGAIN or an error.  Under tx_lock. */
static int rsp_step(struct tcp_conn *c)
{
	struct tx_seg seg[RSP_SEGS];
	struct iovec iov[TX_IOV];
	struct tcp_rsp r[RSP_SEGS];
	/* Response i's FPDUs are seg[first[i] .. first[i + 1]); end[i]: its
	 * last is among them. */
	int fiov[RSP_SEGS + 1], first[RSP_SEGS + 1], niov = 0, nseg = 0, nr = 0;
	bool end[RSP_SEGS];
	int done = 0;
	ssize_t k;

	/* The rest of a cut message goes first, and all of one that has
	 * begun (one that has not sends the answers first itself). */
	if (atomic_load(&c->resting)) {
		int rr = c->rest_job_on && !c->rest_job.begun ? rest_bytes(c) :
							       tx_rest_push(c);

		if (rr)
			return rr;
	}
	/* (held messages go before the answers that came after them) */
	if (c->hold_len) {
		int hr = hold_send(c);

		if (hr)
			return hr;
	}
	if (c->res_len)
		return res_send(c);
	pthread_mutex_lock(&c->rsp_lock);
	for (uint32_t i = c->rsp_head; i != c->rsp_tail && nr < RSP_SEGS; i++)
		r[nr++] = c->rsp[i & (c->rsp_size - 1)];
	pthread_mutex_unlock(&c->rsp_lock);
	if (!nr)
		return 0;
	for (int i = 0; i < nr; i++) {
		struct urdma_span sp = { .va = r[i].va, .len = r[i].len,
					 .direct = r[i].direct };
		uint64_t off = r[i].off;
		int n = nseg < RSP_SEGS && niov < TX_IOV - 8 ?
				tcp_frame(c, r[i].hdr, r[i].hlen, &sp, r[i].read,
					  r[i].len, &off, &end[i], seg + nseg,
					  RSP_SEGS - nseg, iov, &niov,
					  fiov + nseg) :
				0;

		if (n < 0 && !i) {
			/* The region was deregistered after the Read was
			 * checked. */
			conn_set_dead(c, "a Read's source region went away");
			return -EFAULT;
		}
		if (n <= 0) { /* no room left: the next write takes it */
			nr = i;
			break;
		}
		first[i] = nseg;
		nseg += n;
		if (!end[i]) { /* the rest of this one next time */
			nr = i + 1;
			break;
		}
	}
	first[nr] = nseg;
	k = tx_some(c, iov, niov, false);
	if (k < 0)
		return (int)k;
	/* Whole FPDUs written, then the one cut, if any, kept in res. */
	for (; done < nseg; done++) {
		size_t flen = 0;

		for (int i = fiov[done]; i < fiov[done + 1]; i++)
			flen += iov[i].iov_len;
		if ((size_t)k < flen && k > 0) {
			for (int i = fiov[done]; i < fiov[done + 1]; i++) {
				size_t skip = (size_t)k < iov[i].iov_len ? (size_t)k :
									   iov[i].iov_len;

				memcpy(c->res + c->res_len,
				       (uint8_t *)iov[i].iov_base + skip,
				       iov[i].iov_len - skip);
				c->res_len += iov[i].iov_len - skip;
				k -= skip;
			}
			atomic_fetch_add(&c->rsp_n, 1);
		} else if ((size_t)k < flen) {
			break;
		} else {
			k -= flen;
		}
	}
	/* Retire the responses whose FPDUs all went; the first one left
	 * goes on from the end of those of its FPDUs that did. */
	pthread_mutex_lock(&c->rsp_lock);
	for (int i = 0; i < nr; i++) {
		uint64_t off = r[i].off;

		for (int j = first[i]; j < first[i + 1] && j < done; j++)
			off += r[i].len - off > IWARP_SEG_PAYLOAD ?
				       IWARP_SEG_PAYLOAD :
				       r[i].len - off;
		if (done < first[i + 1] || !end[i]) {
			c->rsp[c->rsp_head & (c->rsp_size - 1)].off = off;
			break;
		}
		c->rsp_head++;
		atomic_fetch_sub(&c->rsp_n, 1);
		if (r[i].read && r[i].len)
			atomic_fetch_sub(&c->rsp_data, 1);
	}
	pthread_mutex_unlock(&c->rsp_lock);
	return done ? 0 : -EAGAIN;
}

/* Send every queued response; with wait, waiting for room, else up to
 * -EAGAIN.  Under tx_lock. */
static int rsp_pump(struct tcp_conn *c, bool wait)
{
	while (atomic_load(&c->rsp_n)) {
		int r = rsp_step(c);

		if (r == -EAGAIN && wait)
			r = tx_wait(c);
		if (r)
			return r;
	}
	return 0;
}

/* Watch for data unless parked, and for room while responses wait. */
void conn_watch(struct tcp_conn *c)
{
	pthread_mutex_lock(&c->watch_lock);
	urdma_progress_watch_events(
		c->fd,
		EPOLLET | (atomic_load(&c->parked) ? 0 : EPOLLIN) |
			(atomic_load(&c->want_out) ? EPOLLOUT : 0),
		URDMA_WATCH_FN, &c->w, true);
	pthread_mutex_unlock(&c->watch_lock);
}

/* Send the queued responses if tx_lock is free (its holder sends them
 * otherwise, tx_unlock); what the socket does not take now, the progress
 * thread sends when there is room.  Never waits. */
void rsp_send(struct tcp_conn *c)
{
	/* A dead stream's answers are dropped. */
	while (!atomic_load(&c->dead) && atomic_load(&c->rsp_n) &&
	       !pthread_mutex_trylock(&c->tx_lock)) {
		int r = rsp_pump(c, false);

		pthread_mutex_unlock(&c->tx_lock);
		if (r == -EAGAIN && !atomic_exchange(&c->want_out, true))
			conn_watch(c);
		if (r)
			break;
	}
	tx_fin(c); /* a stream given up while we held tx_lock */
}

/* The queued responses, if the oldest is due (rsp_push); if not, a pass
 * by then (one asked for earlier may have brought this one). */
void rsp_send_due(struct tcp_conn *c)
{
	uint64_t due = atomic_load(&c->rsp_due);

	if (!atomic_load(&c->rsp_n))
		return;
	if (urdma_now_ns() >= due)
		rsp_send(c);
	else
		urdma_progress_by(due);
}

void tx_unlock(struct tcp_conn *c)
{
	pthread_mutex_unlock(&c->tx_lock);
	rsp_send(c);
}

/* Past k bytes written of the n iovecs at *iov. */
static void iov_skip(struct iovec **iov, int *n, size_t k)
{
	while (*n && k >= (*iov)->iov_len) {
		k -= (*iov)->iov_len;
		(*iov)++;
		(*n)--;
	}
	if (*n) {
		(*iov)->iov_base = (uint8_t *)(*iov)->iov_base + k;
		(*iov)->iov_len -= k;
	}
}

/* The rest of a write that a sender gives up on, for the stream to end
 * on an FPDU's end (a Terminate follows): waiting for room, but not for
 * longer than TX_DRAIN_MS.  0 when all of it went.  Under tx_lock. */
#define TX_DRAIN_MS 1000

static int tx_drain(struct tcp_conn *c, struct iovec *iov, int n)
{
	uint64_t end = urdma_now_ns() + TX_DRAIN_MS * 1000000ull;

	while (n) {
		ssize_t k = tx_some(c, iov, n, false);
		uint64_t now = urdma_now_ns();

		if (k == -EAGAIN) {
			struct pollfd p = { .fd = c->fd, .events = POLLOUT };

			if (now >= end)
				return -ETIMEDOUT;
			poll(&p, 1, (int)((end - now) / 1000000 + 1));
			continue;
		}
		if (k < 0)
			return (int)k;
		iov_skip(&iov, &n, (size_t)k);
	}
	return 0;
}

static int tx_all_now(struct tcp_conn *c, struct iovec *iov, int n,
		      bool more);

/* The progress thread watches for room while something rests. */
static void rest_watch(struct tcp_conn *c)
{
	if (!atomic_exchange(&c->want_out, true))
		conn_watch(c);
}

/* The cut message's unframed part goes nowhere now (its memory may go:
 * the stream is given up, or its WR completes in error), nor do the
 * FPDUs framed to ride with it.  Under tx_lock. */
static void tx_rest_drop_job(struct tcp_conn *c)
{
	c->rest_job_on = false;
	c->ntail = 0;
	c->tx_head.hlen = 0;
	if (!c->rest_len)
		atomic_store(&c->resting, false);
}

/* What a cut write had left (tx_cut): kept in rest, to go first when
 * there is room.  -EINPROGRESS.  Under tx_lock. */
static int rest_keep(struct tcp_conn *c, const struct iovec *iov, int n)
{
	size_t len = 0;

	for (int i = 0; i < n; i++)
		len += iov[i].iov_len;
	if (len > c->rest_cap) {
		/* (the library's memory, as the progress thread reads it:
		 * util/alloc.h) */
		size_t cap = (len + 65535) & ~(size_t)65535;
		uint8_t *b = urdma_zalloc(cap);

		if (!b) {
			conn_set_dead(c, "no memory for the rest of a message");
			return -ENOMEM;
		}
		urdma_free(c->rest);
		c->rest = b;
		c->rest_cap = (uint32_t)cap;
	}
	c->rest_len = 0;
	for (int i = 0; i < n; i++) {
		memcpy(c->rest + c->rest_len, iov[i].iov_base, iov[i].iov_len);
		c->rest_len += (uint32_t)iov[i].iov_len;
	}
	c->rest_off = 0;
	atomic_store(&c->resting, true);
	return -EINPROGRESS;
}

/*
 * Hold a small message back (whole: its FPDUs, and the answers and tail
 * riding with it) when it comes within TX_HOLD_GAP_NS of the end of the
 * last write: a sender posting a stream of them (ib_send_bw 8 B) then
 * makes one write for many, not a system call (and on loopback the
 * peer's TCP receive, run in it) each.  A ping-pong's message comes a
 * round trip after the last, and goes at once.  What is held goes with
 * the next write, or when the application polls a CQ of the QP
 * (tcp_poll), arms one, or after TX_HOLD_NS (tcp_maintain): an
 * application that spins on memory after posting waits that long.
 * Under tx_lock.
 */
static bool tx_hold(struct tcp_conn *c, const struct iovec *iov, int n)
{
	size_t len = 0;

	for (int i = 0; i < n; i++)
		len += iov[i].iov_len;
	if (len > TX_HOLD_MSG || c->hold_len + len > TX_HOLD_MAX ||
	    c->res_len || atomic_load(&c->fin_want) ||
	    urdma_now_ns() - c->last_tx_ns >= TX_HOLD_GAP_NS)
		return false;
	if (!c->hold && !(c->hold = urdma_zalloc(TX_HOLD_MAX)))
		return false;
	for (int i = 0; i < n; i++) {
		memcpy(c->hold + c->hold_len, iov[i].iov_base, iov[i].iov_len);
		c->hold_len += iov[i].iov_len;
	}
	if (!atomic_exchange_explicit(&c->held, true, memory_order_relaxed))
		urdma_progress_by(urdma_now_ns() + TX_HOLD_NS);
	return true;
}

/* Write all of iov, waiting for room (more: see tx_some), after what is
 * held; or, when it is a whole message (may_hold), hold it (tx_hold).
 * Under tx_lock. */
static int tx_all(struct tcp_conn *c, struct iovec *iov, int n, bool more,
		  bool may_hold)
{
	int r;

	if (may_hold && !more && tx_hold(c, iov, n))
		return 0;
	if (c->hold_len) {
		struct iovec v[TX_IOV + 1]; /* (tx_msg's writes: TX_IOV at most) */

		v[0] = (struct iovec){ c->hold + c->hold_off,
				       c->hold_len - c->hold_off };
		memcpy(v + 1, iov, (size_t)n * sizeof(*iov));
		c->hold_len = c->hold_off = 0;
		atomic_store_explicit(&c->held, false, memory_order_relaxed);
		r = tx_all_now(c, v, n + 1, more);
	} else {
		r = tx_all_now(c, iov, n, more);
	}
	c->last_tx_ns = urdma_now_ns();
	return r;
}

/* Write all of iov, waiting for room (more: see tx_some).  Under
 * tx_lock. */
static int tx_all_now(struct tcp_conn *c, struct iovec *iov, int n,
		      bool more)
{
	bool partial = false;

	while (n) {
		ssize_t k = tx_some(c, iov, n, more);

		if (k == -EAGAIN) {
			int r = tx_wait(c);

			if (r == TX_CUT) {
				r = rest_keep(c, iov, n);
				if (r != -EINPROGRESS && partial)
					atomic_store(&c->tx_broken, true);
				return r;
			}
			if (r) {
				/* Part of an FPDU may be out: nothing may
				 * follow it on this stream, unless the rest
				 * goes now, for its end (tx_fin) to follow. */
				if (partial && (!atomic_load(&c->fin_want) ||
						tx_drain(c, iov, n)))
					atomic_store(&c->tx_broken, true);
				return r;
			}
			continue;
		}
		if (k < 0)
			return (int)k;
		partial = true;
		iov_skip(&iov, &n, (size_t)k);
	}
	return 0;
}

/* Frame the queued responses that carry no data (answers to flushes,
 * atomic responses), oldest first, into seg/iov, at most max iovecs: they
 * go in the same writev as the message they ride with, so the peer finds
 * them with it.  Returns the iovecs used.  Under tx_lock, with no FPDU
 * cut. */
static int rsp_take(struct tcp_conn *c, struct tx_seg *seg, struct iovec *iov,
		    int max)
{
	int n = 0;

	if (!atomic_load(&c->rsp_n))
		return 0; /* the common case: no lock per message */
	if (max > 2 * RSP_TAKE)
		max = 2 * RSP_TAKE;
	pthread_mutex_lock(&c->rsp_lock);
	while (n + 2 <= max && c->rsp_head != c->rsp_tail) {
		struct tcp_rsp *r = &c->rsp[c->rsp_head & (c->rsp_size - 1)];
		struct tx_seg *s = &seg[n / 2];

		if (r->read && r->len)
			break;
		seg_close(c, s, seg_open(c, s, r->hdr, r->hlen, 0, 0, true));
		iov[n++] = (struct iovec){ s->hdr, s->hlen };
		iov[n++] = (struct iovec){ s->trailer, s->tlen };
		c->rsp_head++;
		atomic_fetch_sub(&c->rsp_n, 1);
	}
	pthread_mutex_unlock(&c->rsp_lock);
	return n;
}

/*
 * Send one message (see tcp_frame), waiting for room.  Queued responses go
 * first (those without data in the same writev); the FPDUs framed to ride
 * with it (tx_frame_ctrl) go in the same writev: tx_head before the
 * message, the tx_tail ones after its end.  A Write takes the answers
 * without data at its end instead, before the tail, when nothing with
 * data waits: a peer that waits for its own message's completion (an
 * answer) then goes on receiving until our Write is all there, and does
 * not leave to spin on memory for the rest of it (ib_write_lat), which
 * its progress thread would have to receive.  Not a Send: a peer with no
 * receive posted stops reading at it, and its answers would wait too.
 * With tx_cut, a message the socket has no room for may stop, its rest
 * kept for later (tx_rest_push): -EINPROGRESS.  Under tx_lock.
 */
static int tx_job_run(struct tcp_conn *c, struct tx_job *j);

int tx_msg(struct tcp_conn *c, const uint8_t *hdr, uint32_t hlen,
	   const struct urdma_span *sp, int nsp, uint64_t len)
{
	struct tx_job j; /* (not zeroed whole: a KiB per message) */

	memcpy(j.h, hdr, hlen);
	if (nsp) /* (a control message has no spans: sp is NULL) */
		memcpy(j.sp, sp, (size_t)nsp * sizeof(*sp));
	j.hlen = hlen;
	j.nsp = nsp;
	j.len = len;
	j.off = 0;
	j.begun = j.late = false;
	return tx_job_run(c, &j);
}

/* Job j stops (a cut, tx_cut): what it has not framed yet waits in
 * rest_job, the progress thread watches for room.  -EINPROGRESS.  Under
 * tx_lock. */
static int tx_job_keep(struct tcp_conn *c, struct tx_job *j, bool more)
{
	if (more && j != &c->rest_job)
		c->rest_job = *j;
	c->rest_job_on = more;
	atomic_store(&c->resting, true);
	rest_watch(c);
	return -EINPROGRESS;
}

/* Send job j from where it is; -EINPROGRESS if it was cut (tx_job_keep).
 * Under tx_lock. */
static int tx_job_run(struct tcp_conn *c, struct tx_job *j)
{
	struct tx_seg seg[TX_IOV / 4], pseg[RSP_TAKE];
	struct iovec iov[TX_IOV];
	int fiov[TX_IOV / 4 + 1], niov = 0;
	bool end = false;
	int ret = 0;

	if (!j->begun) {
		/* A Write, with no cut FPDU and no Read Response with data
		 * queued */
		j->late = (j->h[0] & DDP_FLAG_T) && !c->res_len &&
			  !atomic_load(&c->rsp_data);
		if (!c->res_len && !j->late)
			niov = rsp_take(c, pseg, iov, 2 * RSP_TAKE);
		if (!j->late && atomic_load(&c->rsp_n) &&
		    niov < 2 * RSP_TAKE) {
			/* A Read Response or a cut FPDU is next: send it all
			 * first. */
			ret = tx_all(c, iov, niov, false, false);
			if (!ret)
				ret = rsp_pump(c, true);
			niov = 0;
			if (ret == TX_CUT || ret == -EINPROGRESS)
				return tx_job_keep(c, j, true);
			if (ret)
				return ret;
		}
		j->begun = true;
	}
	while (!ret && !end) {
		uint64_t off0 = j->off;
		int n;

		/* A stream given up meanwhile ends here, on an FPDU's end. */
		if (j->off && conn_giving_up(c))
			return -EPIPE;
		if (!j->off && c->tx_head.hlen) {
			/* (the Immediate Data that goes before its Send) */
			iov[niov++] = (struct iovec){ c->tx_head.hdr,
						      c->tx_head.hlen };
			iov[niov++] = (struct iovec){ c->tx_head.trailer,
						      c->tx_head.tlen };
			c->tx_head.hlen = 0;
		}
		n = tcp_frame(c, j->h, j->hlen, j->sp, j->nsp, j->len, &j->off,
			      &end, seg, TX_IOV / 4, iov, &niov, fiov);

		if (n < 0)
			return n;
		if (end && j->late)
			niov += rsp_take(c, pseg, iov + niov,
					 TX_IOV - 2 * TX_TAILS - niov);
		for (int t = 0; end && t < c->ntail; t++) {
			iov[niov++] = (struct iovec){ c->tx_tail[t].hdr,
						      c->tx_tail[t].hlen };
			iov[niov++] = (struct iovec){ c->tx_tail[t].trailer,
						      c->tx_tail[t].tlen };
		}
		if (end)
			c->ntail = 0;
		/* (held only whole: not the end of a long message) */
		ret = tx_all(c, iov, niov, !end || c->tx_more, !off0 && end);
		niov = 0;
	}
	if (ret == -EINPROGRESS)
		return tx_job_keep(c, j, !end);
	if (j == &c->rest_job)
		c->rest_job_on = false;
	/* A write without MSG_MORE pushed what TCP held.  Relaxed: written
	 * under tx_lock, only a hint outside it (tcp_flush). */
	if (!ret)
		atomic_store_explicit(&c->corked, c->tx_more,
				      memory_order_relaxed);
	return ret;
}

/* What a cut left (rest, rest_job), as far as the socket takes it now,
 * never waiting: 0 when nothing is left, -EAGAIN, or an error (the stream
 * is dead; the rest is dropped).  A stream being given up sends the cut
 * FPDUs' ends but frames no more of the message (its memory may be gone
 * once its QP is).  Under tx_lock. */
int tx_rest_push(struct tcp_conn *c)
{
	uint8_t cut = c->tx_cut;
	int r;

	if (!atomic_load(&c->resting))
		return 0;
	r = rest_bytes(c);
	if (!r && c->rest_job_on && conn_giving_up(c))
		tx_rest_drop_job(c);
	if (!r && c->rest_job_on) {
		c->tx_cut = TXC_ALWAYS;
		r = tx_job_run(c, &c->rest_job);
		c->tx_cut = cut;
		if (r == -EINPROGRESS)
			r = -EAGAIN; /* (tx_job_keep watches) */
		else
			tx_rest_drop_job(c); /* sent, or the stream died */
	}
	if (r == -EAGAIN) {
		rest_watch(c);
		return r;
	}
	if (r) { /* the stream died: nothing more goes */
		tx_rest_drop_job(c);
		c->rest_len = c->rest_off = 0;
	}
	atomic_store(&c->resting, false);
	return r;
}

/* The cut message's unframed part is dropped (tx_rest_drop_job, taking
 * tx_lock): a WR the stream took completes in error or flushed
 * (tcp_quiesce), or the QP goes (tcp_disconnect). */
void tx_rest_forget(struct tcp_conn *c)
{
	if (!atomic_load(&c->resting))
		return;
	pthread_mutex_lock(&c->tx_lock);
	tx_rest_drop_job(c);
	pthread_mutex_unlock(&c->tx_lock);
}

/* The progress thread, when there is room (conn_cb): the rest goes, and
 * the WRs that waited for it (URDMA_TX_WAIT) run in the pass over the QPs
 * that follows. */
void tx_rest_resume(struct tcp_conn *c)
{
	int r;

	if (!atomic_load(&c->resting))
		return;
	if (pthread_mutex_trylock(&c->tx_lock)) {
		/* its holder may not send it: look again (tcp_maintain) */
		urdma_progress_by(urdma_now_ns() + HOLD_NEAR_NS);
		return;
	}
	r = tx_rest_push(c);
	tx_unlock(c);
	if (r != -EAGAIN)
		urdma_progress_by(urdma_now_ns());
}

/* Send one now.  Under tx_lock. */
int tx_ctrl(struct tcp_conn *c, unsigned op, uint32_t qn,
		   const void *body, uint32_t blen)
{
	uint8_t h[sizeof(struct ddp_untagged_hdr) + CTRL_BODY];

	return tx_msg(c, h, tcp_ctrl_put(c, h, op, qn, body, blen, 0), NULL, 0, 0);
}

/*
 * The end of a stream we gave up on (conn_shut): the rest of a Read
 * Response FPDU that a write cut, the Terminate (term_frame), then the
 * FIN.  Nothing but the FIN follows an FPDU that a sender cut
 * (tx_broken).  Never waits: returns true when the socket has no room
 * now (the progress thread goes on when it has: conn_cb).  Under tx_lock.
 */
static bool tx_fin_locked(struct tcp_conn *c)
{
	int r = tx_rest_push(c); /* a cut message's FPDUs, whole */

	if (!r)
		r = hold_send(c); /* whole messages, before the end */

	while (!r && c->res_len)
		r = res_send(c);
	while (!r && c->term_off < c->term_len) {
		r = tx_rest(c, c->term, c->term_len, &c->term_off);
		if (!r && c->term_off == c->term_len)
			urdma_info("tcp: qp %#x: sent TERMINATE (layer %u type %u "
				   "code %#x)", c->local_qpn,
				   TERM_LAYER(c->term_ctrl),
				   TERM_ETYPE(c->term_ctrl),
				   TERM_ECODE(c->term_ctrl));
	}
	if (r == -EAGAIN)
		return true;
	if (c->term_off < c->term_len)
		urdma_info("tcp: qp %#x: TERMINATE not sent: %s", c->local_qpn,
			   atomic_load(&c->tx_broken) ?
				   "the stream was cut inside an FPDU" :
				   strerror(-r));
	shutdown(c->fd, SHUT_WR);
	atomic_store(&c->fin_want, false);
	return false;
}

/* End a given-up stream (tx_fin_locked) if tx_lock is free; its holder
 * does it otherwise, when it lets go (tx_unlock, rsp_send).  Never
 * waits. */
void tx_fin(struct tcp_conn *c)
{
	bool full;

	if (!atomic_load(&c->fin_want) || pthread_mutex_trylock(&c->tx_lock))
		return;
	full = atomic_load(&c->fin_want) && tx_fin_locked(c);
	pthread_mutex_unlock(&c->tx_lock);
	if (full && !atomic_exchange(&c->want_out, true))
		conn_watch(c);
}
