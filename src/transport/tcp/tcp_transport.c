// SPDX-License-Identifier: MIT
/*
 * The TCP transport: RC queue pairs between hosts, framed as iWARP
 * (MPA / DDP / RDMAP, RFC 5044 / 5041 / 5040, RFC 7306 for atomics and
 * immediate data).  docs/wire-protocol.md describes the bytes.
 *
 * Addressing.  Every process that has QPs listens on a kernel-chosen TCP
 * port (one listener per 256 QPs); a QP number is (port << 8 | index), so
 * the QPN and GID that programs exchange out of band are all a peer needs
 * to reach the QP: no daemon, no well-known port.  At RTR the side with
 * the lower (QPN, GID) connects and sends the MPA Request naming both QPs;
 * the other side's listener hands the connection to its QP once that QP
 * is at RTR with the matching destination.
 *
 * Threads.  Send WRs run in the posting thread (sq_lock), as for the other
 * transports: a Send or Write completes when TCP has taken all its bytes;
 * a Read or an atomic completes when its response arrives.  Received FPDUs
 * are processed by whoever gets conn->rx_lock first: ibv_poll_cq (so a
 * polling application needs no thread switch) or the progress thread
 * (epoll on the socket, so one-sided operations need nothing from the
 * target application).  The receive path never waits for sq_lock.
 *
 * Locks: sq_lock > T.lock > conn.rx_lock > conn.tx_lock > conn.ord_lock;
 * the rx path takes cq locks (completions) and only try-locks sq_lock.
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
#include "transport/tcp/tcp_ident.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"

#define RBUF_SIZE (256 * 1024)
#define TX_IOV 64
#define TX_GATHER 4608 /* a write that goes out from one buffer (tx_flat) */
#define RSP_SEGS 8	     /* FPDUs per non-blocking response write */
#define RSP_TAKE 8	     /* data-less responses sent with a message */
#define RSP_MAX (1u << 16) /* queued responses before the peer is cut off */
/* An FPDU at most: MPA length, the largest header, payload, pad, CRC */
#define RES_SIZE (sizeof(((struct tx_seg *)0)->hdr) + IWARP_SEG_PAYLOAD + 8)
/* Accepted connections still in their handshake hold an fd and a buffer
 * each: at most this many, for at most this long. */
#define PENDING_MAX 64
#define PENDING_TIMEOUT_NS (60ull * 1000000000ull)
#define RETRY_CONNECT_NS (20ull * 1000000ull)

enum conn_state {
	C_CONNECTING,	/* active: TCP connect in progress */
	C_RETRY,	/* active: wait, then connect again */
	C_REQ_SENT,	/* active: MPA Request sent, Reply awaited */
	C_WAIT_REQ,	/* passive: accepted, MPA Request awaited */
	C_PENDING_QP,	/* passive: Request read, its QP not at RTR yet */
	C_UP,		/* FPDUs flow */
	C_CLOSED,	/* retired: the progress thread frees it */
};

/* Where an outstanding RDMA Read or atomic we issued lands. */
struct tcp_ord {
	bool used, atomic;
	uint32_t tag; /* sink STag (Read) or request identifier (atomic) */
	uint64_t len, got;
	int n;
	struct urdma_span sp[URDMA_MAX_SGE];
};

/*
 * A message we sent that the peer has not yet confirmed.  iWARP has no
 * acknowledgements, but the responder processes a stream in order, so a
 * response (Read or atomic) confirms every message sent before its
 * request.  A signaled Send or Write is followed by a zero-length Read
 * (a "flush"), and completes when that Read's response arrives: then the
 * data is placed, as on InfiniBand, and a remote error (a Terminate)
 * lands on the WR that caused it.
 */
enum { K_SEND, K_WRITE, K_READ, K_ATOMIC, K_FLUSH };
struct tcp_unc {
	uint32_t wr_idx;
	uint8_t kind;
	uint32_t tag; /* K_READ, K_ATOMIC, K_FLUSH: the response's tag */
	uint32_t msn; /* of the request on its DDP queue */
	uint32_t stag, len;
	uint64_t to;
};

/* One FPDU being sent: its header bytes and its pad + CRC. */
struct tx_seg {
	uint8_t hdr[2 + sizeof(struct ddp_untagged_hdr) +
		    sizeof(struct rdmap_atomic_req)];
	uint8_t trailer[8];
	uint32_t hlen, tlen; /* bytes used in hdr and trailer */
};

/* A response queued by the receive path: a Read Response (from va, off
 * bytes of len sent so far) or a control message (hdr is all of it). */
struct tcp_rsp {
	uint8_t hdr[sizeof(struct ddp_untagged_hdr) +
		    sizeof(struct rdmap_atomic_resp)];
	uint32_t hlen, len;
	uint64_t va, off;
	bool read;
};

/* Why a stream stays parked until our next send ends (tx_unpark): */
enum txp {
	TXP_NONE,
	TXP_SEND, /* a long send parked it; the sender then reads (tx_park) */
	/* A poll that received a message or a Write (tcp_poll); it waits for
	 * the application's answer, and ends as that send starts
	 * (tcp_execute), the unpark following the send. */
	TXP_RECV,
};

struct tcp_conn {
	struct urdma_watcher w;
	struct list_head node; /* in T.pending while being set up */
	int fd;
	_Atomic int state;
	bool crc;
	/* The QP lets go: a sender waiting for room gives up (tx_wait). */
	_Atomic bool closing;
	struct urdma_qp *qp;
	uint32_t local_qpn, peer_qpn;
	uint8_t src_gid[16]; /* active side: the address it connects from */
	uint64_t since_ns; /* when the current state began */
	struct sockaddr_in6 sa;
	pthread_mutex_t rx_lock, tx_lock, ord_lock;
	/* receive side, under rx_lock */
	uint8_t *rbuf;
	size_t rlen;
	uint32_t rx_msn[DDP_NUM_QN];
	bool rcv_active; /* a Send is being placed into receive rcv_idx */
	uint32_t rcv_idx;
	int rcv_n;
	struct urdma_span rcv_sp[URDMA_MAX_SGE];
	uint64_t rcv_room, rcv_got;
	bool imm_pending;
	uint32_t imm;
	uint64_t write_len, last_write_len;
	_Atomic bool stalled; /* a Send waits for a receive WR */
	_Atomic uint64_t last_poll_ns; /* an application thread polled */
	uint64_t rx_bytes;     /* received so far (rx_lock) */
	uint32_t rx_writes;    /* Writes placed whole (rx_lock) */
	unsigned quiet_polls;  /* application polls that received nothing */
	/* Until then (urdma_now_ns), a receiving poll unparks at once: its
	 * application left a TXP_RECV park to tcp_maintain while bytes came
	 * that it did not read, so it does not answer what it receives (it
	 * spins on memory for more).  For SPINS_NS only (rx_lock). */
	uint64_t spins_until;
	/* The progress thread does not watch for data: the application
	 * polls (conn_park, under rx_lock). */
	_Atomic bool parked;
	/* Parked until our next send ends (enum txp, under rx_lock). */
	_Atomic uint8_t tx_parked;
	/* send side, under tx_lock */
	uint32_t tx_msn[DDP_NUM_QN];
	struct tx_seg tx_tail; /* an FPDU to send with the next message's end */
	uint8_t tx_buf[TX_GATHER]; /* a small write, as one buffer (tx_flat) */
	/* The unsent end of an FPDU that a non-blocking write cut: it goes
	 * before anything else. */
	uint8_t *res;
	uint32_t res_off, res_len;
	/* Responses, in order (rsp_lock; sent under tx_lock, rsp_pump).
	 * rsp_n counts them and a cut FPDU, rsp_data those with data (Read
	 * Responses: tx_msg).  rsp_due: when the oldest must go at the latest
	 * (rsp_push). */
	pthread_mutex_t rsp_lock;
	struct tcp_rsp *rsp;
	uint32_t rsp_head, rsp_tail, rsp_size;
	_Atomic uint32_t rsp_n, rsp_data;
	_Atomic uint64_t rsp_due;
	uint64_t rx_hold_ns; /* what this receive pass holds answers for */
	/* The progress thread watches for room to send them (EPOLLOUT);
	 * the watch's events change under watch_lock (conn_watch). */
	_Atomic bool want_out;
	pthread_mutex_t watch_lock;
	/* A write gave up inside an FPDU: the stream takes nothing more. */
	_Atomic bool tx_broken;
	/* The stream's end once given up (conn_shut): the Terminate the
	 * receive path framed (term_off of its term_len bytes sent), then
	 * the FIN; whoever has tx_lock sends them (tx_fin). */
	uint8_t term[sizeof(((struct tx_seg *)0)->hdr) + 8];
	uint32_t term_len, term_off, term_ctrl;
	_Atomic bool fin_want;
	unsigned timeout_ms; /* TCP_USER_TIMEOUT set, + 1 (0: never set) */
	/* outstanding Reads and atomics, unconfirmed messages: ord_lock */
	struct tcp_ord ord[URDMA_MAX_RD_ATOM];
	uint32_t next_tag;
	struct tcp_unc *unc;
	uint32_t unc_head, unc_tail, unc_size;
	/* failure */
	_Atomic bool dead;
	uint64_t dead_ns; /* when it was found dead */
	bool dead_handled;
	bool shut; /* given up (conn_shut): what arrives is dropped */
	/* tcp_maintain's watch on the oldest unconfirmed message */
	uint32_t watch_head;
	uint64_t watch_ns;
};

struct tcp_qp_reg {
	struct urdma_qp *qp;
	bool taken;
	bool ready; /* passive side at RTR, waiting for peer_qpn */
	uint32_t peer_qpn;
};

struct tcp_listener {
	struct urdma_watcher w;
	bool closed; /* retired; an event already fetched finds this */
	int fd;
	uint16_t port;
	int nqps;
	struct tcp_qp_reg reg[256];
};

static struct {
	pthread_mutex_t lock;
	struct tcp_listener *ls[256];
	struct list_head pending; /* conns being set up */
} T = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.pending = LIST_HEAD_INIT(T.pending),
};

static bool want_crc(void)
{
	const char *e = getenv("URDMA_MPA_CRC");

	return !e || strcmp(e, "0");
}

static void conn_cb(struct urdma_watcher *w, uint32_t events);
static void conn_release(struct urdma_watcher *w);
static void rx_locked(struct tcp_conn *c, uint64_t hold_ns);
static void conn_park(struct tcp_conn *c, bool park);
static void tx_fin(struct tcp_conn *c);

/*
 * How long answers to flushes wait for a message of ours to ride with.
 * Taken by the application's poll: the application is about to see what
 * came and will likely answer; up to HOLD_APP_NS, as a shorter time would
 * wake the progress thread (asleep for 2 ms between passes over a parked
 * stream) for nearly every message.  Taken by the progress thread while
 * the application polls (it may be spinning on memory for a Write):
 * HOLD_NEAR_NS, the progress thread's own timer.  Sent on its own, the
 * answer would complete the peer's message before ours comes, so the peer
 * leaves its poll to spin on memory and our message finds nobody polling:
 * the progress thread takes it, answers it on its own, and so on.
 * Otherwise (nobody polls, or sleeps on the CQ) nobody will answer: now.
 */
#define HOLD_APP_NS 2000000ull
#define HOLD_NEAR_NS 50000ull

/* ---- listeners and QP numbers ---- */

static struct tcp_listener *listener_of(uint32_t qpn)
{
	for (int i = 0; i < 256; i++)
		if (T.ls[i] && T.ls[i]->port == qpn >> 8)
			return T.ls[i];
	return NULL;
}

static void set_sock_opts(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static struct tcp_conn *conn_new(int fd)
{
	struct tcp_conn *c = urdma_zalloc(sizeof(*c));

	if (!c)
		return NULL;
	c->rbuf = urdma_zalloc(RBUF_SIZE);
	c->res = urdma_zalloc(RES_SIZE);
	if (!c->rbuf || !c->res) {
		urdma_free(c->rbuf);
		urdma_free(c->res);
		urdma_free(c);
		return NULL;
	}
	c->fd = fd;
	c->w.fn = conn_cb;
	c->w.release = conn_release;
	c->since_ns = urdma_now_ns();
	pthread_mutex_init(&c->rx_lock, NULL);
	pthread_mutex_init(&c->tx_lock, NULL);
	pthread_mutex_init(&c->ord_lock, NULL);
	pthread_mutex_init(&c->rsp_lock, NULL);
	pthread_mutex_init(&c->watch_lock, NULL);
	list_init(&c->node);
	return c;
}

static void conn_release(struct urdma_watcher *w)
{
	struct tcp_conn *c = (struct tcp_conn *)w;

	if (c->fd >= 0)
		close(c->fd);
	urdma_free(c->rbuf);
	urdma_free(c->unc);
	urdma_free(c->rsp);
	urdma_free(c->res);
	urdma_free(c);
}

/* Close a conn; the progress thread frees it.  Under T.lock. */
static void conn_bury(struct tcp_conn *c)
{
	if (c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR);
	list_del(&c->node);
	atomic_store(&c->state, C_CLOSED);
	urdma_progress_retire(c->fd, &c->w);
}

static void listener_release(struct urdma_watcher *w)
{
	struct tcp_listener *l = (struct tcp_listener *)w;

	close(l->fd);
	urdma_free(l);
}

static bool passive_pending(const struct tcp_conn *c)
{
	int st = atomic_load(&c->state);

	return st == C_WAIT_REQ || st == C_PENDING_QP;
}

/* Close accepted connections over the bounds, oldest first (T.pending is
 * in arrival order).  The initiator of a legitimate one reconnects.  Under
 * T.lock, as connections arrive. */
static void pending_trim(void)
{
	uint64_t now = urdma_now_ns();
	struct tcp_conn *c, *n;
	int count = 0;

	list_for_each_entry(c, &T.pending, node)
		count += passive_pending(c);
	list_for_each_entry_safe(c, n, &T.pending, node) {
		if (!passive_pending(c))
			continue;
		if (count <= PENDING_MAX &&
		    now - c->since_ns < PENDING_TIMEOUT_NS)
			break;
		urdma_dbg("tcp: closing a connection that never finished MPA");
		conn_bury(c);
		count--;
	}
}

static void listener_cb(struct urdma_watcher *w, uint32_t events)
{
	struct tcp_listener *l = (struct tcp_listener *)w;
	(void)events;

	for (;;) {
		struct tcp_conn *c;
		int fd;

		pthread_mutex_lock(&T.lock);
		fd = l->closed ? -1 :
				 accept4(l->fd, NULL, NULL,
					 SOCK_NONBLOCK | SOCK_CLOEXEC);
		pthread_mutex_unlock(&T.lock);
		if (fd < 0)
			return;
		set_sock_opts(fd);
		c = conn_new(fd);
		if (!c) {
			close(fd);
			continue;
		}
		atomic_store(&c->state, C_WAIT_REQ);
		pthread_mutex_lock(&T.lock);
		list_add_tail(&c->node, &T.pending);
		if (urdma_progress_watch_events(fd, EPOLLIN, URDMA_WATCH_FN, &c->w,
						false))
			conn_bury(c);
		pending_trim();
		pthread_mutex_unlock(&T.lock);
	}
}

static struct tcp_listener *listener_new(void)
{
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6,
				   .sin6_addr = IN6ADDR_ANY_INIT };
	socklen_t len = sizeof(sa);
	struct tcp_listener *l = urdma_zalloc(sizeof(*l));
	int zero = 0;

	if (!l)
		return NULL;
	l->w.fn = listener_cb;
	l->w.release = listener_release;
	l->fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0)
		goto err;
	setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(l->fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(l->fd, 128) ||
	    getsockname(l->fd, (struct sockaddr *)&sa, &len))
		goto err_close;
	l->port = ntohs(sa.sin6_port);
	if (urdma_progress_watch(l->fd, URDMA_WATCH_FN, &l->w))
		goto err_close;
	urdma_dbg("tcp: listening on port %u", l->port);
	return l;
err_close:
	urdma_warn("tcp: cannot listen: %m; QPs of this process are not reachable over TCP");
	close(l->fd);
err:
	urdma_free(l);
	return NULL;
}

int urdma_tcp_reserve_qpn(uint32_t *qpn)
{
	int ret = -ENOSPC;

	pthread_mutex_lock(&T.lock);
	for (int i = 0; i < 256 && ret; i++) {
		struct tcp_listener *l = T.ls[i];

		if (!l) {
			l = T.ls[i] = listener_new();
			if (!l) {
				ret = -EADDRNOTAVAIL;
				break;
			}
		}
		for (int k = 0; k < 256; k++) {
			if (l->reg[k].taken)
				continue;
			l->reg[k].taken = true;
			l->nqps++;
			*qpn = (uint32_t)l->port << 8 | k;
			ret = 0;
			break;
		}
	}
	pthread_mutex_unlock(&T.lock);
	return ret;
}

void urdma_tcp_register_qp(struct urdma_qp *qp)
{
	struct tcp_listener *l;

	pthread_mutex_lock(&T.lock);
	l = listener_of(qp->ibqp.qp_num);
	if (l)
		l->reg[qp->ibqp.qp_num & 0xff].qp = qp;
	pthread_mutex_unlock(&T.lock);
}

/* The QP is gone: its number is free; the last one closes the listener. */
void urdma_tcp_release_qpn(uint32_t qpn)
{
	struct tcp_listener *l;

	pthread_mutex_lock(&T.lock);
	l = listener_of(qpn);
	if (l) {
		l->reg[qpn & 0xff] = (struct tcp_qp_reg){ 0 };
		if (--l->nqps == 0) {
			for (int i = 0; i < 256; i++)
				if (T.ls[i] == l)
					T.ls[i] = NULL;
			l->closed = true;
			urdma_progress_retire(l->fd, &l->w);
		}
	}
	pthread_mutex_unlock(&T.lock);
}

/* ---- sending ---- */

static void conn_set_dead(struct tcp_conn *c, const char *why)
{
	if (atomic_exchange(&c->dead, true))
		return;
	c->dead_ns = urdma_now_ns();
	urdma_info("tcp: qp %#x: connection to qp %#x lost: %s", c->local_qpn,
		   c->peer_qpn, why);
	urdma_progress_kick();
}

/* Frame one segment around hdr (the DDP/RDMAP header and any opcode
 * header) and plen payload bytes at offset off of the message: ULPDU
 * length, L flag, TO (tagged) or MO (untagged).  Returns the CRC so far;
 * the caller adds the payload's, then seg_close(). */
static uint32_t seg_open(struct tcp_conn *c, struct tx_seg *s,
			 const uint8_t *hdr, uint32_t hlen, uint32_t plen,
			 uint64_t off, bool last)
{
	uint32_t ulpdu = hlen + plen;

	s->hdr[0] = ulpdu >> 8;
	s->hdr[1] = ulpdu & 0xff;
	memcpy(s->hdr + 2, hdr, hlen);
	if (last)
		s->hdr[2] |= DDP_FLAG_L;
	else
		s->hdr[2] &= ~DDP_FLAG_L;
	if (hdr[0] & DDP_FLAG_T) {
		uint64_t to;

		memcpy(&to, hdr + 6, 8);
		to = htobe64(be64toh(to) + off);
		memcpy(s->hdr + 2 + 6, &to, 8);
	} else {
		uint32_t mo = htonl((uint32_t)off);

		memcpy(s->hdr + 2 + 14, &mo, 4);
	}
	s->hlen = 2 + hlen;
	s->tlen = ((4 - ((2 + ulpdu) & 3)) & 3) + 4; /* pad, CRC */
	return c->crc ? urdma_crc32c_update(~0u, s->hdr, s->hlen) : 0;
}

static void seg_close(struct tcp_conn *c, struct tx_seg *s, uint32_t crc)
{
	uint32_t pad = s->tlen - 4, v;

	memset(s->trailer, 0, pad);
	if (c->crc)
		crc = urdma_crc32c_update(crc, s->trailer, pad);
	v = c->crc ? MPA_CRC_WIRE(~crc) : 0;
	memcpy(s->trailer + pad, &v, 4);
}

/*
 * Frame the next FPDUs of a message into seg and iov: hdr (DDP+RDMAP
 * header and any opcode header, hlen bytes, ULPDU length not included)
 * then len bytes from spans, cut into segments, starting at offset *off.
 * At most maxseg segments, within TX_IOV iovecs (*niov used so far);
 * fiov[k] is the first iovec of segment k, and fiov[nseg] the end.
 * Returns the segments framed (*off advanced past them; *end when the
 * message's last is among them) or -EFAULT (spans shorter than len).
 */
static int frame(struct tcp_conn *c, const uint8_t *hdr, uint32_t hlen,
		 const struct urdma_span *sp, int nsp, uint64_t len,
		 uint64_t *off, bool *end, struct tx_seg *seg, int maxseg,
		 struct iovec *iov, int *niov, int *fiov)
{
	int nseg = 0;

	*end = false;
	while (nseg < maxseg && !*end) {
		uint32_t plen = len - *off > IWARP_SEG_PAYLOAD ?
					IWARP_SEG_PAYLOAD :
					(uint32_t)(len - *off);
		struct tx_seg *s = &seg[nseg];
		uint32_t crc = seg_open(c, s, hdr, hlen, plen, *off,
					*off + plen == len);
		uint64_t pos = *off, soff = pos;
		int si = 0, n = *niov;

		/* The span and offset where this segment starts. */
		while (si < nsp && soff >= sp[si].len)
			soff -= sp[si++].len;
		iov[n++] = (struct iovec){ s->hdr, s->hlen };
		for (uint32_t left = plen; left;) {
			uint64_t avail, k;
			uint8_t *p;

			while (si < nsp && soff == sp[si].len)
				si++, soff = 0;
			if (si == nsp)
				return -EFAULT;
			if (sp[si].ptr) {
				p = sp[si].ptr + soff;
				avail = sp[si].len - soff;
			} else {
				p = urdma_self_ptr(sp[si].va + soff, &avail);
				if (!p)
					return -EFAULT;
			}
			k = left;
			if (k > sp[si].len - soff)
				k = sp[si].len - soff;
			if (k > avail)
				k = avail;
			/* Room for this piece, the trailer and a flush tail. */
			if (n >= TX_IOV - 3) {
				if (nseg)
					return nseg; /* the rest next time */
				return -EFAULT;	     /* too fragmented */
			}
			iov[n++] = (struct iovec){ p, k };
			if (c->crc)
				crc = urdma_crc32c_update(crc, p, k);
			soff += k;
			left -= k;
		}
		seg_close(c, s, crc);
		iov[n++] = (struct iovec){ s->trailer, s->tlen };
		fiov[nseg++] = *niov;
		fiov[nseg] = n;
		*niov = n;
		*off = pos + plen;
		*end = *off == len;
		if (n >= TX_IOV - 5)
			break;
	}
	return nseg;
}

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
static int tx_wait(struct tcp_conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLOUT };

	if (conn_giving_up(c))
		return -EPIPE;
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
		conn_set_dead(c, strerror(errno));
		return -errno;
	}
}

/* ---- responses ---- */

/* Queue a response, to go within hold_ns (0: now, due 0).  Receive path
 * (rx_lock).  -ENOSPC: the peer asks more than it reads. */
static int rsp_push(struct tcp_conn *c, const struct tcp_rsp *r,
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

/* Send the cut FPDU's end, then the next FPDUs of the oldest response,
 * as much as the socket takes now; an FPDU it cuts is kept whole in res.
 * Returns 0 (progress), -EAGAIN or an error.  Under tx_lock. */
static int rsp_step(struct tcp_conn *c)
{
	struct tx_seg seg[RSP_SEGS];
	struct iovec iov[TX_IOV];
	int fiov[RSP_SEGS + 1], niov = 0, nseg, done = 0;
	struct tcp_rsp r;
	struct urdma_span sp;
	uint64_t off;
	ssize_t k;
	bool end;

	if (c->res_len)
		return res_send(c);
	pthread_mutex_lock(&c->rsp_lock);
	if (c->rsp_head == c->rsp_tail) {
		pthread_mutex_unlock(&c->rsp_lock);
		return 0;
	}
	r = c->rsp[c->rsp_head & (c->rsp_size - 1)];
	pthread_mutex_unlock(&c->rsp_lock);
	sp = (struct urdma_span){ .va = r.va, .len = r.len };
	off = r.off;
	nseg = frame(c, r.hdr, r.hlen, &sp, r.read, r.len, &off, &end, seg,
		     RSP_SEGS, iov, &niov, fiov);
	if (nseg < 0) {
		/* The region was deregistered after the Read was checked. */
		conn_set_dead(c, "a Read's source region went away");
		return -EFAULT;
	}
	k = tx_some(c, iov, niov, false);
	if (k < 0)
		return (int)k;
	/* Whole FPDUs written, then the one cut, if any, kept in res. */
	for (off = r.off; done < nseg; done++) {
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
		off += r.len - off > IWARP_SEG_PAYLOAD ? IWARP_SEG_PAYLOAD :
							r.len - off;
	}
	pthread_mutex_lock(&c->rsp_lock);
	if (done == nseg && end) {
		c->rsp_head++;
		atomic_fetch_sub(&c->rsp_n, 1);
		if (r.read && r.len)
			atomic_fetch_sub(&c->rsp_data, 1);
	} else {
		c->rsp[c->rsp_head & (c->rsp_size - 1)].off = off;
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
static void conn_watch(struct tcp_conn *c)
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
static void rsp_send(struct tcp_conn *c)
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

/* The queued responses, if the oldest is due (rsp_push). */
static void rsp_send_due(struct tcp_conn *c)
{
	if (atomic_load(&c->rsp_n) && urdma_now_ns() >= atomic_load(&c->rsp_due))
		rsp_send(c);
}

static void tx_unlock(struct tcp_conn *c)
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

/* Write all of iov, waiting for room (more: see tx_some).  Under
 * tx_lock. */
static int tx_all(struct tcp_conn *c, struct iovec *iov, int n, bool more)
{
	bool partial = false;

	while (n) {
		ssize_t k = tx_some(c, iov, n, more);

		if (k == -EAGAIN) {
			int r = tx_wait(c);

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
 * Send one message (see frame), waiting for room.  Queued responses go
 * first (those without data in the same writev), a pending tail
 * (tx_flush_tail) last, in the same writev.  A Write takes the answers
 * without data at its end instead, before the tail, when nothing with
 * data waits: a peer that waits for its own message's completion (an
 * answer) then goes on receiving until our Write is all there, and does
 * not leave to spin on memory for the rest of it (ib_write_lat), which
 * its progress thread would have to receive.  Not a Send: a peer with no
 * receive posted stops reading at it, and its answers would wait too.
 * Under tx_lock.
 */
static int tx_msg(struct tcp_conn *c, const uint8_t *hdr, uint32_t hlen,
		  const struct urdma_span *sp, int nsp, uint64_t len)
{
	struct tx_seg seg[TX_IOV / 4], pseg[RSP_TAKE];
	struct iovec iov[TX_IOV];
	int fiov[TX_IOV / 4 + 1], niov = 0;
	uint64_t off = 0;
	/* A Write, with no cut FPDU and no Read Response with data queued */
	bool end = false, late = (hdr[0] & DDP_FLAG_T) && !c->res_len &&
				 !atomic_load(&c->rsp_data);
	int ret = 0;

	if (!c->res_len && !late)
		niov = rsp_take(c, pseg, iov, 2 * RSP_TAKE);
	if (!late && atomic_load(&c->rsp_n) && niov < 2 * RSP_TAKE) {
		/* A Read Response or a cut FPDU is next: send it all first. */
		ret = tx_all(c, iov, niov, false);
		if (!ret)
			ret = rsp_pump(c, true);
		niov = 0;
	}
	while (!ret && !end) {
		int n;

		/* A stream given up meanwhile ends here, on an FPDU's end. */
		if (off && conn_giving_up(c))
			return -EPIPE;
		n = frame(c, hdr, hlen, sp, nsp, len, &off, &end, seg,
			  TX_IOV / 4, iov, &niov, fiov);

		if (n < 0)
			return n;
		if (end && late)
			niov += rsp_take(c, pseg, iov + niov, TX_IOV - 2 - niov);
		if (end && c->tx_tail.hlen) {
			iov[niov++] = (struct iovec){ c->tx_tail.hdr,
						      c->tx_tail.hlen };
			iov[niov++] = (struct iovec){ c->tx_tail.trailer,
						      c->tx_tail.tlen };
			c->tx_tail.hlen = 0;
		}
		ret = tx_all(c, iov, niov, !end);
		niov = 0;
	}
	return ret;
}

static uint32_t put_untagged(uint8_t *h, unsigned op, uint32_t qn,
			     uint32_t msn)
{
	struct ddp_untagged_hdr u = {
		.ddp_ctrl = DDP_VERSION,
		.rdmap_ctrl = RDMAP_VERSION << RDMAP_RV_SHIFT | op,
		.qn = htonl(qn),
		.msn = htonl(msn),
	};

	memcpy(h, &u, sizeof(u));
	return sizeof(u);
}

static uint32_t put_tagged(uint8_t *h, unsigned op, uint32_t stag,
			   uint64_t to)
{
	struct ddp_tagged_hdr t = {
		.ddp_ctrl = DDP_FLAG_T | DDP_VERSION,
		.rdmap_ctrl = RDMAP_VERSION << RDMAP_RV_SHIFT | op,
		.stag = htonl(stag),
		.to = htobe64(to),
	};

	memcpy(h, &t, sizeof(t));
	return sizeof(t);
}

/* An untagged control message with a fixed body.  Under tx_lock. */
static int tx_ctrl(struct tcp_conn *c, unsigned op, uint32_t qn,
		   const void *body, uint32_t blen)
{
	uint8_t h[sizeof(struct ddp_untagged_hdr) + 64];
	uint32_t n = put_untagged(h, op, qn, c->tx_msn[qn]++);

	memcpy(h + n, body, blen);
	return tx_msg(c, h, n + blen, NULL, 0, 0);
}

/* Frame the Terminate for the segment whose DDP header is at hdr, in the
 * receive buffer right after its ULPDU length: with D, that header
 * (hdr_len bytes, and the Read Request body after it when R is set too)
 * and, with M, the segment's length.  It goes before the FIN (tx_fin).
 * Under rx_lock, before conn_shut. */
static void term_frame(struct tcp_conn *c, uint32_t ctrl, const uint8_t *hdr,
		       uint32_t hdr_len)
{
	struct rdmap_terminate t = { .ctrl = htonl(ctrl) };
	uint8_t h[sizeof(struct ddp_untagged_hdr) + sizeof(t)];
	uint32_t blen = 4, n;
	struct tx_seg s;

	if (hdr_len && (ctrl >> 13 & TERM_HDRCT_D)) {
		if (ctrl >> 13 & TERM_HDRCT_R)
			hdr_len += sizeof(struct rdmap_read_req);
		t.ctrl = htonl(ctrl | TERM_HDRCT_M << 13);
		memcpy(&t.ddp_seg_len, hdr - 2, 2);
		memcpy(t.hdr, hdr, hdr_len);
		blen = 4 + 2 + hdr_len;
	}
	n = put_untagged(h, RDMAP_TERMINATE, DDP_QN_TERM,
			 c->tx_msn[DDP_QN_TERM]++);
	memcpy(h + n, &t, blen);
	seg_close(c, &s, seg_open(c, &s, h, n + blen, 0, 0, true));
	memcpy(c->term, s.hdr, s.hlen);
	memcpy(c->term + s.hlen, s.trailer, s.tlen);
	c->term_len = s.hlen + s.tlen;
	c->term_off = 0;
	c->term_ctrl = ctrl;
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
	int r = 0;

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
static void tx_fin(struct tcp_conn *c)
{
	bool full;

	if (!atomic_load(&c->fin_want) || pthread_mutex_trylock(&c->tx_lock))
		return;
	full = atomic_load(&c->fin_want) && tx_fin_locked(c);
	pthread_mutex_unlock(&c->tx_lock);
	if (full && !atomic_exchange(&c->want_out, true))
		conn_watch(c);
}

/* ---- the QP side of an error ---- */

/* Ask the progress thread to put the QP in error (never wait for sq_lock
 * on the receive path). */
static void qp_error_async(struct tcp_conn *c)
{
	if (c->qp)
		atomic_store(&c->qp->shm->error_req, 1);
	urdma_progress_kick();
}

/* Unconfirmed messages, under ord_lock. */
static bool unc_alloc(struct tcp_conn *c, struct urdma_qp *qp)
{
	/* a message and its flush per WR; overdue probes use what is left */
	c->unc_size = roundup_pow2(2 * qp->sq_size + 16);
	c->unc = urdma_zalloc_array(c->unc_size, sizeof(*c->unc));
	return c->unc != NULL;
}

static struct tcp_unc *unc_push(struct tcp_conn *c, uint32_t wr_idx,
				uint8_t kind, uint32_t msn)
{
	struct tcp_unc *u = &c->unc[c->unc_tail++ & (c->unc_size - 1)];

	*u = (struct tcp_unc){ .wr_idx = wr_idx, .kind = kind, .msn = msn };
	return u;
}

/* Report the unconfirmed messages up to position f: those before it done,
 * f itself with st.  If st is an error, those after f are flushed and the
 * outstanding Reads forgotten.  Takes ord_lock. */
static void unc_settle(struct tcp_conn *c, uint32_t f, enum ibv_wc_status st)
{
	struct urdma_qp *qp = c->qp;
	bool any = false;

	uint32_t fwr = 0;

	pthread_mutex_lock(&c->ord_lock);
	for (uint32_t i = c->unc_head; i != c->unc_tail && i != f + 1; i++) {
		struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

		urdma_qp_wr_mark(qp, u->wr_idx, i == f ? st : IBV_WC_SUCCESS);
		fwr = u->wr_idx;
		c->unc_head = i + 1;
		any = true;
	}
	if (st != IBV_WC_SUCCESS) {
		for (uint32_t i = c->unc_head; i != c->unc_tail; i++) {
			struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

			if (u->wr_idx != fwr) /* not f's own flush Read */
				urdma_qp_wr_mark(qp, u->wr_idx,
						 IBV_WC_WR_FLUSH_ERR);
			any = true;
		}
		c->unc_head = c->unc_tail;
		for (int i = 0; i < URDMA_MAX_RD_ATOM; i++)
			c->ord[i].used = false;
	}
	pthread_mutex_unlock(&c->ord_lock);
	if (any)
		urdma_qp_wr_kick(qp);
}

/* The position of the response-bearing message with this tag, or tail. */
static uint32_t unc_find_tag(struct tcp_conn *c, uint32_t tag)
{
	uint32_t i;

	pthread_mutex_lock(&c->ord_lock);
	for (i = c->unc_head; i != c->unc_tail; i++) {
		struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

		if (u->kind >= K_READ && u->tag == tag)
			break;
	}
	pthread_mutex_unlock(&c->ord_lock);
	return i;
}

/* Which message a Terminate names, from the DDP header it carries. */
static uint32_t unc_find_hdr(struct tcp_conn *c, const uint8_t *h, size_t len)
{
	uint32_t i, stag, qn, msn;
	uint64_t to;

	if (len < sizeof(struct ddp_tagged_hdr))
		return c->unc_head;
	stag = iwarp_get32(h + 2); /* tagged: STag, TO */
	to = iwarp_get64(h + 6);
	qn = iwarp_get32(h + 6); /* untagged: QN, MSN */
	msn = iwarp_get32(h + 10);
	pthread_mutex_lock(&c->ord_lock);
	for (i = c->unc_head; i != c->unc_tail; i++) {
		struct tcp_unc *u = &c->unc[i & (c->unc_size - 1)];

		if (h[0] & DDP_FLAG_T) {
			if (u->kind == K_WRITE && u->stag == stag &&
			    to - u->to <= u->len)
				break;
		} else if (len >= sizeof(struct ddp_untagged_hdr) &&
			   u->msn == msn &&
			   ((qn == DDP_QN_SEND &&
			     (u->kind == K_SEND || u->kind == K_WRITE)) ||
			    (qn == DDP_QN_READ &&
			     (u->kind == K_READ || u->kind == K_FLUSH)) ||
			    (qn == DDP_QN_ATOMIC_REQ && u->kind == K_ATOMIC))) {
			break;
		}
	}
	if (i == c->unc_tail)
		i = c->unc_head;
	pthread_mutex_unlock(&c->ord_lock);
	return i;
}

/* Drop what has arrived (a stream we gave up on). */
static void rx_discard(struct tcp_conn *c)
{
	while (recv(c->fd, NULL, 1u << 30, MSG_DONTWAIT | MSG_TRUNC) > 0)
		;
}

/*
 * End a stream we give up on: a FIN after what we queued (a Terminate, the
 * answers the peer earned), once no FPDU is half sent (tx_fin: a sender in
 * the middle of one finishes it first, tx_all), and from now on whatever
 * arrives is dropped (rx_pass), the stream unparked so that the progress
 * thread sees it.  A peer that keeps sending is not left waiting for room
 * until our QP is destroyed, and it still reads our Terminate before the
 * end of the stream (a reset could overtake it).  Under rx_lock.
 */
static void conn_shut(struct tcp_conn *c)
{
	c->shut = true;
	atomic_store(&c->fin_want, true);
	tx_fin(c);
	conn_park(c, false);
	rx_discard(c);
}

/* Terminate the stream for an error in what we received. */
static void rx_fail(struct tcp_conn *c, uint32_t ctrl, const uint8_t *hdr,
		    uint32_t hdr_len)
{
	/* The Terminate and the stream's end first: a sender that gives up
	 * from now on (dead, or the QP in error) ends its FPDU for them
	 * (tx_all).  Then the QP's error: the WRs flushed below do not put
	 * it in ERR without its event (sq_run).  Then dead. */
	term_frame(c, ctrl, hdr, hdr_len);
	atomic_store(&c->fin_want, true);
	qp_error_async(c);
	c->dead_handled = true;
	conn_set_dead(c, "protocol error in received data");
	conn_shut(c);
	unc_settle(c, c->unc_head, IBV_WC_WR_FLUSH_ERR);
}

/* ---- receiving ---- */

enum { RX_OK, RX_STALL, RX_ERR };

static void rq_notify(struct urdma_qp *qp, bool solicited)
{
	if (urdma_rq_notify_claim(qp->shm, solicited))
		urdma_cq_notify(to_ucq(qp->ibqp.recv_cq));
}

/* Enter our own receive ring as its deliverer, as the shm requester enters
 * a peer's.  false: the QP no longer receives. */
static bool rq_enter(struct urdma_qp *qp)
{
	urdma_rq_busy(qp->shm);
	if (atomic_load(&qp->shm->state) == URDMA_SQPS_RTR)
		return true;
	urdma_rq_idle(qp->shm);
	return false;
}

/* Copy len bytes into spans at byte offset off. */
static int spans_put(const struct urdma_span *sp, int n, uint64_t off,
		     const uint8_t *src, uint64_t len)
{
	struct urdma_span d[URDMA_MAX_SGE];
	struct urdma_span s = { .len = len, .ptr = (uint8_t *)src };
	int k = 0;

	for (int i = 0; i < n; i++) {
		if (off >= sp[i].len) {
			off -= sp[i].len;
			continue;
		}
		d[k] = sp[i];
		d[k].va += off;
		d[k].len -= off;
		if (d[k].ptr)
			d[k].ptr += off;
		off = 0;
		k++;
	}
	return urdma_copy_spans(NULL, d, k, NULL, &s, 1, len);
}

static uint32_t lookup_term(int err, bool tagged)
{
	switch (err) {
	case -EINVAL:
		return tagged ? term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
					  TERM_DDP_EC_T_INV_STAG, TERM_HDRCT_D) :
				term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
					  TERM_RDMAP_EC_INV_STAG, TERM_HDRCT_D);
	case -ERANGE:
		return tagged ? term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
					  TERM_DDP_EC_T_BOUNDS, TERM_HDRCT_D) :
				term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
					  TERM_RDMAP_EC_BOUNDS, TERM_HDRCT_D);
	case -EACCES:
		return term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
				 TERM_RDMAP_EC_ACCESS, TERM_HDRCT_D);
	default:
		return term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_CATASTROPHIC,
				 TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
	}
}

/* Resolve [to, to+len) of one of our MRs for a remote access. */
static int remote_access(struct urdma_qp *qp, uint32_t stag, uint64_t to,
			 uint64_t len, uint32_t access, uint64_t *va)
{
	return urdma_remote_lookup(qp->uctx->shm,
				   READ_ONCE(qp->attr.qp_access_flags),
				   to_upd(qp->ibqp.pd)->id, stag, to, len,
				   access, va);
}

/* Claim the next receive WR, with the ring entered.  false: none posted. */
static bool rcv_claim(struct tcp_conn *c)
{
	struct urdma_shm_qp *s = c->qp->shm;
	uint32_t done = atomic_load(&s->rq_done);

	if (done == atomic_load_explicit(&c->qp->rq_prod, memory_order_acquire))
		return false;
	c->rcv_idx = done;
	c->rcv_got = 0;
	return true;
}

/* Complete the claimed receive, with the ring entered (unless the owner
 * flushed it meanwhile). */
static void rcv_complete(struct tcp_conn *c, enum ibv_wc_status st,
			 enum ibv_wc_opcode op, uint64_t byte_len, bool imm,
			 uint32_t imm_data)
{
	struct urdma_shm_qp *s = c->qp->shm;
	struct urdma_shm_rqe *e = urdma_rq_entry(c->qp, c->rcv_idx);

	c->rcv_active = false;
	if (atomic_load(&s->rq_done) != c->rcv_idx)
		return;
	e->status = st;
	e->opcode = op;
	e->byte_len = byte_len;
	e->imm_data = imm_data;
	e->wc_flags = imm ? IBV_WC_WITH_IMM : 0;
	e->src_qp = c->peer_qpn;
	atomic_store_explicit(&s->rq_done, c->rcv_idx + 1,
			      memory_order_release);
}

/* A Send segment: the first claims a receive WR, each is placed at its
 * MO, the last completes the WR.  One pass through the ring's handshake
 * per segment. */
static int rx_send(struct tcp_conn *c, const struct iwarp_msg *m,
		   uint32_t *term)
{
	struct urdma_qp *qp = c->qp;
	bool done = false, solicited = m->opcode == RDMAP_SEND_SE;
	int r = RX_OK;

	if (!rq_enter(qp))
		return RX_OK; /* the QP left RTR: the stream is closing */
	if (!m->mo && !c->rcv_active) {
		if (!rcv_claim(c)) {
			r = RX_STALL; /* like RNR: hold the stream */
			goto out;
		}
		c->rcv_active = true;
		if (urdma_rqe_spans(qp->uctx->shm, to_upd(qp->ibqp.pd)->id,
				    qp->rq.max_sge,
				    urdma_rq_entry(qp, c->rcv_idx), c->rcv_sp,
				    &c->rcv_n, &c->rcv_room)) {
			rcv_complete(c, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0,
				     false, 0);
			*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
					  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
			r = RX_ERR;
			goto out_done;
		}
	}
	if (!c->rcv_active || m->mo != c->rcv_got) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_MO, TERM_HDRCT_D);
		r = RX_ERR;
		goto out;
	}
	if (c->rcv_got + m->len > c->rcv_room) {
		rcv_complete(c, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, false, 0);
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_TOO_LONG, TERM_HDRCT_D);
		r = RX_ERR;
		goto out_done;
	}
	if (m->len && spans_put(c->rcv_sp, c->rcv_n, c->rcv_got, m->payload,
				m->len)) {
		rcv_complete(c, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, false, 0);
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
		r = RX_ERR;
		goto out_done;
	}
	c->rcv_got += m->len;
	if (!m->last)
		goto out;
	rcv_complete(c, IBV_WC_SUCCESS, IBV_WC_RECV, c->rcv_got,
		     c->imm_pending, c->imm);
	c->imm_pending = false;
	c->rx_msn[DDP_QN_SEND]++;
out_done:
	done = true;
out:
	urdma_rq_idle(qp->shm);
	if (done) /* errors always notify */
		rq_notify(qp, solicited || r == RX_ERR);
	return r;
}

/* Immediate Data: for the next Send, or completing a Write's receive. */
static int rx_imm(struct tcp_conn *c, const struct iwarp_msg *m)
{
	struct urdma_qp *qp = c->qp;

	if (m->u.imm.flags & URDMA_IMM_FOR_SEND) {
		c->imm_pending = true;
		c->imm = m->u.imm.imm;
		c->rx_msn[DDP_QN_SEND]++;
		return RX_OK;
	}
	if (!rq_enter(qp))
		return RX_OK;
	if (!rcv_claim(c)) {
		urdma_rq_idle(qp->shm);
		return RX_STALL;
	}
	rcv_complete(c, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
		     c->last_write_len, true, m->u.imm.imm);
	urdma_rq_idle(qp->shm);
	rq_notify(qp, m->opcode == RDMAP_IMM_SE);
	c->rx_msn[DDP_QN_SEND]++;
	return RX_OK;
}

static int rx_write(struct tcp_conn *c, const struct iwarp_msg *m,
		    uint32_t *term)
{
	uint64_t va;
	int err = remote_access(c->qp, m->stag, m->to, m->len,
				IBV_ACCESS_REMOTE_WRITE, &va);

	if (err) {
		*term = lookup_term(err, true);
		return RX_ERR;
	}
	if (m->len) {
		struct urdma_span d = { .va = va, .len = m->len };
		struct urdma_span s = { .len = m->len, .ptr = (uint8_t *)m->payload };

		if (urdma_copy_spans(NULL, &d, 1, NULL, &s, 1, m->len)) {
			*term = lookup_term(-EFAULT, true);
			return RX_ERR;
		}
	}
	c->write_len += m->len;
	if (m->last) {
		c->last_write_len = c->write_len;
		c->write_len = 0;
		c->rx_writes++;
	}
	return RX_OK;
}

static struct tcp_ord *ord_find(struct tcp_conn *c, uint32_t tag, bool atomic)
{
	for (int i = 0; i < URDMA_MAX_RD_ATOM; i++)
		if (c->ord[i].used && c->ord[i].tag == tag &&
		    c->ord[i].atomic == atomic)
			return &c->ord[i];
	return NULL;
}

static int rx_read_resp(struct tcp_conn *c, const struct iwarp_msg *m,
			uint32_t *term)
{
	struct tcp_ord *o;
	bool done = false;
	int r = RX_OK;

	pthread_mutex_lock(&c->ord_lock);
	o = ord_find(c, m->stag, false);
	if (!o) {
		/* The response to a flush: zero-length, one segment. */
		pthread_mutex_unlock(&c->ord_lock);
		if (m->len || !m->last)
			goto bad_stag;
		goto confirm;
	}
	if (m->to != o->got || o->got + m->len > o->len) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
				  TERM_DDP_EC_T_BOUNDS, TERM_HDRCT_D);
		r = RX_ERR;
	} else {
		if (m->len && spans_put(o->sp, o->n, o->got, m->payload, m->len))
			r = RX_ERR, *term = lookup_term(-EFAULT, true);
		o->got += m->len;
		if (m->last && r == RX_OK) {
			if (o->got != o->len) {
				*term = term_ctrl(TERM_LAYER_DDP,
						  TERM_DDP_ET_TAGGED,
						  TERM_DDP_EC_T_BOUNDS,
						  TERM_HDRCT_D);
				r = RX_ERR;
			} else {
				o->used = false;
				done = true;
			}
		}
	}
	pthread_mutex_unlock(&c->ord_lock);
	if (!done)
		return r;
confirm: {
	uint32_t f = unc_find_tag(c, m->stag);

	if (f == c->unc_tail)
		goto bad_stag;
	unc_settle(c, f, IBV_WC_SUCCESS);
	return RX_OK;
}
bad_stag:
	*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_TAGGED,
			  TERM_DDP_EC_T_INV_STAG, TERM_HDRCT_D);
	return RX_ERR;
}

static int rx_read_req(struct tcp_conn *c, const struct iwarp_msg *m,
		       uint32_t *term)
{
	const struct rdmap_read_req *rr = &m->u.rr;
	struct tcp_rsp rsp = { 0 };
	uint64_t va;
	int err;

	err = remote_access(c->qp, rr->src_stag, rr->src_to, rr->size,
			    IBV_ACCESS_REMOTE_READ, &va);
	if (err) {
		*term = lookup_term(err, false);
		*term |= TERM_HDRCT_R << 13;
		return RX_ERR;
	}
	c->rx_msn[DDP_QN_READ]++;
	rsp.hlen = put_tagged(rsp.hdr, RDMAP_READ_RESP, rr->sink_stag,
			      rr->sink_to);
	rsp.read = true;
	rsp.va = va;
	rsp.len = rr->size;
	/* A flush's answer waits for our next message, two quiet polls, a
	 * call to the connection manager (tcp_release) or its time (the
	 * receive pass's hold, rx_locked), so that the application sees the
	 * message before we make a system call for it.  Data goes now. */
	if (rsp_push(c, &rsp, rr->size ? 0 : c->rx_hold_ns)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC,
				  TERM_HDRCT_D | TERM_HDRCT_R);
		return RX_ERR;
	}
	if (rr->size)
		rsp_send(c);
	return RX_OK;
}

static int rx_atomic_req(struct tcp_conn *c, const struct iwarp_msg *m,
			 uint32_t *term)
{
	const struct rdmap_atomic_req *a = &m->u.areq;
	struct rdmap_atomic_resp resp;
	struct tcp_rsp r = { 0 };
	uint64_t va, avail, orig;
	uint64_t *p;
	int err;

	/* We implement the verbs atomics: no masks. */
	if (a->opcode > ATOMIC_CMP_SWAP ||
	    (a->opcode == ATOMIC_FETCH_ADD && a->add_swap_mask) ||
	    (a->opcode == ATOMIC_CMP_SWAP &&
	     (~a->add_swap_mask || ~a->compare_mask))) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return RX_ERR;
	}
	err = remote_access(c->qp, a->stag, a->to, 8, IBV_ACCESS_REMOTE_ATOMIC,
			    &va);
	if (!err && (a->to & 7)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_ATOMIC_ALIGN, TERM_HDRCT_D);
		return RX_ERR;
	}
	if (err) {
		*term = lookup_term(err, false);
		return RX_ERR;
	}
	p = urdma_self_ptr(va, &avail);
	if (!p || avail < 8) {
		*term = lookup_term(-EFAULT, false);
		return RX_ERR;
	}
	orig = urdma_atomic_apply(p, a->opcode == ATOMIC_CMP_SWAP,
				  a->opcode == ATOMIC_CMP_SWAP ? a->compare :
								 a->add_swap,
				  a->add_swap);
	c->rx_msn[DDP_QN_ATOMIC_REQ]++;
	resp.req_id = htonl(a->req_id);
	resp.orig = htobe64(orig);
	/* The atomic-response queue is ours alone: its MSN needs no
	 * tx_lock. */
	r.hlen = put_untagged(r.hdr, RDMAP_ATOMIC_RESP, DDP_QN_ATOMIC_RESP,
			      c->tx_msn[DDP_QN_ATOMIC_RESP]++);
	memcpy(r.hdr + r.hlen, &resp, sizeof(resp));
	r.hlen += sizeof(resp);
	if (rsp_push(c, &r, 0)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
		return RX_ERR;
	}
	rsp_send(c);
	return RX_OK;
}

static int rx_atomic_resp(struct tcp_conn *c, const struct iwarp_msg *m,
			  uint32_t *term)
{
	struct tcp_ord *o;
	uint64_t v = m->u.aresp.orig;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	uint32_t f;

	c->rx_msn[DDP_QN_ATOMIC_RESP]++;
	pthread_mutex_lock(&c->ord_lock);
	o = ord_find(c, m->u.aresp.req_id, true);
	if (o) {
		if (spans_put(o->sp, o->n, 0, (uint8_t *)&v, 8))
			st = IBV_WC_LOC_PROT_ERR;
		o->used = false;
	}
	pthread_mutex_unlock(&c->ord_lock);
	f = o ? unc_find_tag(c, m->u.aresp.req_id) : c->unc_tail;
	if (f == c->unc_tail) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
		return RX_ERR;
	}
	unc_settle(c, f, st);
	return RX_OK;
}

/* What a Terminate from the peer means for our WR. */
static enum ibv_wc_status term_status(uint32_t ctrl)
{
	unsigned layer = TERM_LAYER(ctrl), et = TERM_ETYPE(ctrl),
		 ec = TERM_ECODE(ctrl);

	if (layer == TERM_LAYER_RDMAP && et == TERM_RDMAP_ET_PROT)
		return IBV_WC_REM_ACCESS_ERR;
	if (layer == TERM_LAYER_DDP && et == TERM_DDP_ET_TAGGED)
		return IBV_WC_REM_ACCESS_ERR;
	if (layer == TERM_LAYER_DDP && et == TERM_DDP_ET_UNTAGGED &&
	    ec == TERM_DDP_EC_U_TOO_LONG)
		return IBV_WC_REM_INV_REQ_ERR;
	if (layer == TERM_LAYER_RDMAP && et == TERM_RDMAP_ET_OP &&
	    (ec == TERM_RDMAP_EC_OPCODE || ec == TERM_RDMAP_EC_VERSION ||
	     ec == TERM_RDMAP_EC_ATOMIC_ALIGN))
		return IBV_WC_REM_INV_REQ_ERR;
	return IBV_WC_REM_OP_ERR;
}

static void rx_terminate(struct tcp_conn *c, const struct iwarp_msg *m)
{
	uint32_t ctrl = m->u.term_ctrl;

	urdma_info("tcp: qp %#x: TERMINATE from the peer (layer %u type %u code %#x)",
		   c->local_qpn, TERM_LAYER(ctrl), TERM_ETYPE(ctrl),
		   TERM_ECODE(ctrl));
	c->dead_handled = true; /* before tcp_maintain can see 'dead' */
	conn_set_dead(c, "terminated by the peer");
	/* ctrl, DDP segment length, then the DDP header if included */
	unc_settle(c,
		   (ctrl >> 13 & TERM_HDRCT_D) && m->len > 6 ?
			   unc_find_hdr(c, m->payload + 6, m->len - 6) :
			   c->unc_head,
		   term_status(ctrl));
	qp_error_async(c);
}

static int rx_msg(struct tcp_conn *c, const struct iwarp_msg *m,
		  uint32_t *term)
{
	/* Untagged messages come in order on their queue (a Terminate is
	 * taken whatever its MSN). */
	if (!m->tagged && m->opcode != RDMAP_TERMINATE &&
	    m->msn != c->rx_msn[m->qn]) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_MSN, TERM_HDRCT_D);
		return RX_ERR;
	}
	switch (m->opcode) {
	case RDMAP_SEND:
	case RDMAP_SEND_SE:
		return rx_send(c, m, term);
	case RDMAP_IMM:
	case RDMAP_IMM_SE:
		return rx_imm(c, m);
	case RDMAP_WRITE:
		return rx_write(c, m, term);
	case RDMAP_READ_REQ:
		return rx_read_req(c, m, term);
	case RDMAP_READ_RESP:
		return rx_read_resp(c, m, term);
	case RDMAP_ATOMIC_REQ:
		return rx_atomic_req(c, m, term);
	case RDMAP_ATOMIC_RESP:
		return rx_atomic_resp(c, m, term);
	case RDMAP_TERMINATE:
		rx_terminate(c, m);
		return RX_OK;
	default:
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return RX_ERR;
	}
}

/* The connection whose receive path this thread runs: a WR that a
 * completion lets the engine run from there must not send (tcp_execute),
 * as it could wait for room while nobody reads. */
static __thread struct tcp_conn *rx_owner;

static void rx_pass(struct tcp_conn *c);

/* Process what has arrived, holding answers for hold_ns.  Under rx_lock,
 * state C_UP. */
static void rx_locked(struct tcp_conn *c, uint64_t hold_ns)
{
	struct tcp_conn *outer = rx_owner;

	rx_owner = c;
	c->rx_hold_ns = hold_ns;
	rx_pass(c);
	rx_owner = outer;
}

static void rx_pass(struct tcp_conn *c)
{
	uint32_t st;

	if (c->closing || !c->qp)
		return;
	if (c->shut) {
		rx_discard(c);
		return;
	}
	st = atomic_load(&c->qp->shm->state);
	if (st == URDMA_SQPS_INIT) {
		/* Connected before our modify to RTR finished: wait for it. */
		atomic_store(&c->stalled, true);
		return;
	}
	if (st != URDMA_SQPS_RTR)
		return; /* in error: tcp_maintain closes the stream */
	atomic_store(&c->stalled, false);
	for (bool more = true;;) {
		size_t off = 0, room;
		ssize_t k;

		while (off < c->rlen && !atomic_load(&c->dead)) {
			struct iwarp_msg m;
			uint32_t term = 0;
			long n = iwarp_parse_fpdu(c->rbuf + off, c->rlen - off,
						  c->crc, &m, &term);
			int r;

			if (n == 0)
				break;
			if (n < 0) {
				/* The parser has seen at least 4 bytes. */
				size_t hl = c->rbuf[off + 2] & DDP_FLAG_T ?
						    sizeof(struct ddp_tagged_hdr) :
						    sizeof(struct ddp_untagged_hdr);

				rx_fail(c, term, c->rbuf + off + 2,
					c->rlen - off - 2 >= hl ? hl : 0);
				return;
			}
			r = rx_msg(c, &m, &term);
			if (r == RX_STALL) {
				atomic_store(&c->stalled, true);
				break;
			}
			if (r == RX_ERR) {
				rx_fail(c, term, m.hdr, m.hdr_len);
				return;
			}
			off += n;
		}
		if (off) {
			memmove(c->rbuf, c->rbuf + off, c->rlen - off);
			c->rlen -= off;
		}
		/* A read that left room emptied the socket: what comes later
		 * raises a new edge for the watch, or the next poll reads it
		 * (or the unpark that follows: conn_watch). */
		if (atomic_load(&c->stalled) || atomic_load(&c->dead) || !more)
			return;
		room = RBUF_SIZE - c->rlen;
		k = recv(c->fd, c->rbuf + c->rlen, room, MSG_DONTWAIT);
		if (k > 0) {
			c->rlen += k;
			c->rx_bytes += k;
			more = (size_t)k == room;
			continue;
		}
		if (k == 0)
			conn_set_dead(c, "closed by the peer");
		else if (errno != EAGAIN && errno != EINTR)
			conn_set_dead(c, strerror(errno));
		return;
	}
}

/* ---- connection setup ---- */

static void fill_pd(struct urdma_mpa_pd *pd, uint32_t src, uint32_t dst,
		    uint32_t reject)
{
	*pd = (struct urdma_mpa_pd){
		.magic = htonl(URDMA_MPA_MAGIC),
		.version = htonl(URDMA_MPA_VERSION),
		.src_qpn = htonl(src),
		.dst_qpn = htonl(dst),
		.ird = htonl(URDMA_MAX_RD_ATOM),
		.ord = htonl(URDMA_MAX_RD_ATOM),
		.reject = htonl(reject),
	};
}

static int send_mpa(int fd, const char *key, uint8_t flags,
		    const struct urdma_mpa_pd *pd)
{
	struct {
		struct mpa_frame f;
		struct urdma_mpa_pd pd;
	} __attribute__((packed)) msg;
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	size_t off = 0;

	memcpy(msg.f.key, key, MPA_KEY_LEN);
	msg.f.flags = flags;
	msg.f.rev = MPA_REVISION;
	msg.f.pd_len = htons(sizeof(msg.pd));
	msg.pd = *pd;
	while (off < sizeof(msg)) {
		ssize_t k = send(fd, (uint8_t *)&msg + off, sizeof(msg) - off,
				 MSG_NOSIGNAL);

		if (k < 0 && errno == EAGAIN && poll(&p, 1, 1000) > 0)
			continue;
		if (k <= 0)
			return -1;
		off += k;
	}
	return 0;
}

/* Read an MPA frame into rbuf.  1: complete (*pd filled), 0: need more,
 * -1: broken. */
static int read_mpa(struct tcp_conn *c, const char *key, struct mpa_frame *f,
		    struct urdma_mpa_pd *pd)
{
	size_t need;
	ssize_t k;

	k = recv(c->fd, c->rbuf + c->rlen, RBUF_SIZE - c->rlen, MSG_DONTWAIT);
	if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
		return -1;
	if (k > 0)
		c->rlen += k;
	if (c->rlen < sizeof(*f))
		return 0;
	memcpy(f, c->rbuf, sizeof(*f));
	if (memcmp(f->key, key, MPA_KEY_LEN) || f->rev != MPA_REVISION ||
	    ntohs(f->pd_len) > MPA_MAX_PD ||
	    ntohs(f->pd_len) < sizeof(*pd))
		return -1;
	need = sizeof(*f) + ntohs(f->pd_len);
	if (c->rlen < need)
		return 0;
	memcpy(pd, c->rbuf + sizeof(*f), sizeof(*pd));
	if (ntohl(pd->magic) != URDMA_MPA_MAGIC ||
	    ntohl(pd->version) != URDMA_MPA_VERSION)
		return -1;
	memmove(c->rbuf, c->rbuf + need, c->rlen - need);
	c->rlen -= need;
	return 1;
}

/* Unacknowledged data for longer than the QP's retry budget breaks the
 * stream: IBV_WC_RETRY_EXC_ERR (timeout 0: TCP's own).  The budget is set
 * at RTS, which may come after the stream is up: called again per WR,
 * it only acts when the budget changed.  Under tx_lock or T.lock. */
static void conn_sync_timeout(struct tcp_conn *c, struct urdma_qp *qp)
{
	uint64_t ns = urdma_qp_retry_ns(qp);
	unsigned ms = ns && ns < 1000000 ? 1 : (unsigned)(ns / 1000000);

	if (c->timeout_ms == ms + 1)
		return;
	c->timeout_ms = ms + 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

/* The stream is up.  Under T.lock. */
static void conn_up(struct tcp_conn *c)
{
	struct urdma_qp *qp = c->qp;

	list_del(&c->node);
	list_init(&c->node);
	conn_sync_timeout(c, qp);
	atomic_store(&c->state, C_UP);
	__atomic_store_n(&qp->tr_priv, c, __ATOMIC_RELEASE);
	/* Edge-triggered: one wake-up per arrival (unless parked). */
	conn_watch(c);
	urdma_dbg("tcp: qp %#x <-> qp %#x connected%s", c->local_qpn,
		  c->peer_qpn, c->crc ? " (CRC)" : "");
	/* FPDUs that came with the Reply (rbuf), and WRs waiting for the
	 * stream: for tcp_maintain and the engine, not under T.lock. */
	urdma_progress_kick();
}

static int peer_addr(struct urdma_qp *qp, const struct ibv_qp_attr *attr,
		     struct sockaddr_in6 *sa);
static void reject(struct tcp_conn *c, int why);

/* Passive side: the QP is ready for this connection, if it comes from the
 * peer the QP was given (tcp_ident.c).  Under T.lock. */
static void conn_attach(struct tcp_conn *c, struct urdma_qp *qp)
{
	struct urdma_mpa_pd pd;
	struct sockaddr_in6 expect;
	int ret = peer_addr(qp, &qp->attr, &expect);

	if (!ret)
		ret = urdma_tcp_peer_check(c->fd, &expect, c->peer_qpn);
	if (ret) {
		char a[INET6_ADDRSTRLEN] = "?";
		struct sockaddr_in6 from;
		socklen_t len = sizeof(from);

		if (!getpeername(c->fd, (struct sockaddr *)&from, &len))
			inet_ntop(AF_INET6, &from.sin6_addr, a, sizeof(a));
		urdma_warn("tcp: qp %#x: refused a connection from %s claiming "
			   "qp %#x: %s", c->local_qpn, a, c->peer_qpn,
			   ret == -EADDRNOTAVAIL ? "not the address it was given" :
			   ret == -EACCES ? "a socket of another user than that QP's" :
					    strerror(-ret));
		reject(c, EACCES);
		return;
	}
	c->qp = qp;
	c->crc = c->crc || want_crc(); /* the Request's wish, or ours */
	if (!unc_alloc(c, qp)) {
		conn_bury(c);
		return;
	}
	fill_pd(&pd, c->local_qpn, c->peer_qpn, 0);
	if (send_mpa(c->fd, MPA_KEY_REP, c->crc ? MPA_FLAG_C : 0, &pd)) {
		conn_bury(c);
		return;
	}
	conn_up(c);
}

static void reject(struct tcp_conn *c, int why)
{
	struct urdma_mpa_pd pd;

	fill_pd(&pd, c->local_qpn, c->peer_qpn, why);
	send_mpa(c->fd, MPA_KEY_REP, MPA_FLAG_R, &pd);
	conn_bury(c);
}

/* Handshake steps, in the progress thread, under T.lock. */
static void handshake(struct tcp_conn *c, uint32_t events)
{
	struct mpa_frame f;
	struct urdma_mpa_pd pd;
	int r;

	switch (atomic_load(&c->state)) {
	case C_CONNECTING: {
		int err = 0;
		socklen_t len = sizeof(err);

		if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		fill_pd(&pd, c->local_qpn, c->peer_qpn, 0);
		if (err || send_mpa(c->fd, MPA_KEY_REQ,
				    want_crc() ? MPA_FLAG_C : 0, &pd)) {
			urdma_dbg("tcp: qp %#x: connect: %s", c->local_qpn,
				  strerror(err ? err : errno));
			goto retry;
		}
		atomic_store(&c->state, C_REQ_SENT);
		urdma_progress_watch_events(c->fd, EPOLLIN, URDMA_WATCH_FN,
					    &c->w, true);
		return;
	}
	case C_REQ_SENT:
		r = read_mpa(c, MPA_KEY_REP, &f, &pd);
		if (r == 0)
			return;
		if (r < 0 || (f.flags & MPA_FLAG_R) ||
		    ntohl(pd.src_qpn) != c->peer_qpn) {
			urdma_dbg("tcp: qp %#x: qp %#x refused the connection",
				  c->local_qpn, c->peer_qpn);
			goto retry;
		}
		c->crc = (f.flags & MPA_FLAG_C) || want_crc();
		conn_up(c);
		return;
	case C_WAIT_REQ: {
		struct tcp_listener *l;
		struct tcp_qp_reg *reg;

		r = read_mpa(c, MPA_KEY_REQ, &f, &pd);
		if (r == 0)
			return;
		if (r < 0 || (f.flags & MPA_FLAG_M)) {
			conn_bury(c);
			return;
		}
		c->peer_qpn = ntohl(pd.src_qpn);
		c->local_qpn = ntohl(pd.dst_qpn);
		c->crc = f.flags & MPA_FLAG_C;
		l = listener_of(c->local_qpn);
		reg = l ? &l->reg[c->local_qpn & 0xff] : NULL;
		if (!reg || !reg->qp) {
			reject(c, ENOENT);
			return;
		}
		if (reg->ready && reg->peer_qpn == c->peer_qpn &&
		    !reg->qp->tr_priv) {
			conn_attach(c, reg->qp);
			return;
		}
		atomic_store(&c->state, C_PENDING_QP);
		return;
	}
	case C_PENDING_QP:
		/* The peer sends nothing before our Reply: this is EOF or an
		 * error, or a peer that breaks the protocol. */
		conn_bury(c);
		return;
	default:
		return;
	}
retry:
	urdma_progress_unwatch(c->fd);
	close(c->fd);
	c->fd = -1;
	c->rlen = 0;
	c->since_ns = urdma_now_ns();
	atomic_store(&c->state, C_RETRY);
}

static int conn_start(struct tcp_conn *c)
{
	c->fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	set_sock_opts(c->fd);
	if (urdma_tcp_bind_source(c->fd, c->src_gid))
		urdma_dbg("tcp: qp %#x: can't bind to its GID's address: %m",
			  c->local_qpn);
	atomic_store(&c->state, C_CONNECTING);
	c->since_ns = urdma_now_ns();
	if (connect(c->fd, (struct sockaddr *)&c->sa, sizeof(c->sa)) &&
	    errno != EINPROGRESS) {
		int err = -errno;

		close(c->fd);
		c->fd = -1;
		atomic_store(&c->state, C_RETRY);
		return err;
	}
	return urdma_progress_watch_events(c->fd, EPOLLOUT, URDMA_WATCH_FN,
					   &c->w, false);
}

#define POLLING_NS 200000ull
/* How often tcp_maintain looks at a parked stream (the progress thread's
 * pass while something is pending). */
#define PARK_LOOK_NS 2000000ull
/* Two polls this close belong to one poll loop (a poll that receives
 * nothing costs one recv, well under 1 us here). */
#define TIGHT_POLL_NS 5000ull

/* An application thread polled this connection within the last 200 us. */
static bool app_polling(struct tcp_conn *c)
{
	return urdma_now_ns() - atomic_load(&c->last_poll_ns) < POLLING_NS;
}

/* The hold of a receive pass the progress thread runs (HOLD_NEAR_NS). */
static uint64_t progress_hold_ns(struct tcp_conn *c)
{
	return app_polling(c) && c->qp && !atomic_load(&c->qp->shm->notify) ?
		       HOLD_NEAR_NS :
		       0;
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
static void conn_park(struct tcp_conn *c, bool park)
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
#define TX_PARK_MIN (128 * 1024)

static bool tx_park(struct tcp_conn *c)
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
static void tx_unpark(struct tcp_conn *c, bool wait)
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

static void conn_cb(struct urdma_watcher *w, uint32_t events)
{
	struct tcp_conn *c = (struct tcp_conn *)w;

	if (atomic_load(&c->state) != C_UP) {
		pthread_mutex_lock(&T.lock);
		if (atomic_load(&c->state) != C_UP && c->fd >= 0)
			handshake(c, events);
		pthread_mutex_unlock(&T.lock);
		return;
	}
	pthread_mutex_lock(&c->rx_lock);
	rx_locked(c, progress_hold_ns(c));
	pthread_mutex_unlock(&c->rx_lock);
	rsp_send_due(c);
	tx_fin(c); /* an end that waited for room */
	if (!atomic_load(&c->rsp_n) && !atomic_load(&c->fin_want) &&
	    atomic_exchange(&c->want_out, false)) {
		conn_watch(c);
		rsp_send_due(c); /* queued meanwhile */
	}
}

/* ---- the transport operations ---- */

/* The peer's address from the QP's AV; only IPv4-mapped or global IPv6.
 * Without a GID the peer is on this host (a LID names this network
 * namespace): loopback. */
static int peer_addr(struct urdma_qp *qp, const struct ibv_qp_attr *attr,
		     struct sockaddr_in6 *sa)
{
	static const union ibv_gid loopback = {
		.raw = { [10] = 0xff, [11] = 0xff, 127, 0, 0, 1 }
	};
	const union ibv_gid *g = attr->ah_attr.is_global ?
					 &attr->ah_attr.grh.dgid :
					 &loopback;

	if (g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80) {
		urdma_warn("qp %#x: link-local GIDs can't be reached over TCP",
			   qp->ibqp.qp_num);
		return -EINVAL;
	}
	*sa = (struct sockaddr_in6){ .sin6_family = AF_INET6,
				     .sin6_port = htons(attr->dest_qp_num >> 8) };
	memcpy(&sa->sin6_addr, g->raw, 16);
	return 0;
}

static int tcp_connect(struct urdma_qp *qp, const struct ibv_qp_attr *attr)
{
	struct urdma_context *uctx = qp->uctx;
	uint8_t sidx = attr->ah_attr.grh.sgid_index;
	const uint8_t *sgid = sidx < uctx->num_gids ?
				      uctx->gids[sidx].gid.raw :
				      uctx->gids[0].gid.raw;
	struct sockaddr_in6 sa;
	struct tcp_listener *l;
	struct tcp_conn *c;
	bool active;
	int ret = peer_addr(qp, attr, &sa);

	if (ret)
		return ret;
	active = qp->ibqp.qp_num < attr->dest_qp_num ||
		 (qp->ibqp.qp_num == attr->dest_qp_num &&
		  memcmp(sgid, attr->ah_attr.grh.dgid.raw, 16) < 0);
	pthread_mutex_lock(&T.lock);
	l = listener_of(qp->ibqp.qp_num);
	if (!l) {
		pthread_mutex_unlock(&T.lock);
		urdma_warn("qp %#x: not reachable over TCP", qp->ibqp.qp_num);
		return -EADDRNOTAVAIL;
	}
	if (!active) {
		struct tcp_qp_reg *reg = &l->reg[qp->ibqp.qp_num & 0xff];

		reg->ready = true;
		reg->peer_qpn = attr->dest_qp_num;
		list_for_each_entry(c, &T.pending, node) {
			if (atomic_load(&c->state) == C_PENDING_QP &&
			    c->local_qpn == qp->ibqp.qp_num &&
			    c->peer_qpn == attr->dest_qp_num) {
				conn_attach(c, qp);
				break;
			}
		}
		pthread_mutex_unlock(&T.lock);
		return 0;
	}
	c = conn_new(-1);
	if (!c) {
		pthread_mutex_unlock(&T.lock);
		return -ENOMEM;
	}
	c->qp = qp;
	if (!unc_alloc(c, qp)) {
		conn_release(&c->w); /* fd -1: nothing watched yet */
		pthread_mutex_unlock(&T.lock);
		return -ENOMEM;
	}
	c->local_qpn = qp->ibqp.qp_num;
	c->peer_qpn = attr->dest_qp_num;
	c->sa = sa;
	if (attr->ah_attr.is_global)
		memcpy(c->src_gid, sgid, 16);
	list_add_tail(&c->node, &T.pending);
	qp->tr_priv = c;
	ret = conn_start(c);
	pthread_mutex_unlock(&T.lock);
	if (ret && ret != -ECONNREFUSED)
		urdma_dbg("qp %#x: connect: %s", qp->ibqp.qp_num, strerror(-ret));
	return 0; /* like a NIC: traffic retries, then times out */
}

static void tcp_disconnect(struct urdma_qp *qp)
{
	struct tcp_conn *c;
	struct tcp_listener *l;

	/* Under T.lock: the progress thread may be attaching a connection
	 * to this QP right now (conn_attach). */
	pthread_mutex_lock(&T.lock);
	c = qp->tr_priv;
	l = listener_of(qp->ibqp.qp_num);
	if (l)
		l->reg[qp->ibqp.qp_num & 0xff].ready = false;
	if (c) {
		/* closing first: a sender waiting for room gives up.  The
		 * answers a peer waits for go if the socket takes them. */
		atomic_store(&c->closing, true);
		rsp_send(c);
		pthread_mutex_lock(&c->rx_lock);
		c->qp = NULL;
		pthread_mutex_unlock(&c->rx_lock);
		conn_bury(c);
	}
	qp->tr_priv = NULL;
	pthread_mutex_unlock(&T.lock);
}

static struct tcp_ord *ord_get(struct tcp_conn *c, struct urdma_qp *qp)
{
	unsigned max = qp->attr.max_rd_atomic ? qp->attr.max_rd_atomic : 1;
	unsigned used = 0;
	struct tcp_ord *free_o = NULL;

	if (max > URDMA_MAX_RD_ATOM)
		max = URDMA_MAX_RD_ATOM;
	for (int i = 0; i < URDMA_MAX_RD_ATOM; i++) {
		if (c->ord[i].used)
			used++;
		else if (!free_o)
			free_o = &c->ord[i];
	}
	return used < max ? free_o : NULL;
}

/* The flush Read goes out in the same writev as the end of the message it
 * follows, so a peer that takes the message also finds the Read (and
 * answers it) before its application can see the completion and exit. */
static void tx_flush_tail(struct tcp_conn *c, uint32_t tag)
{
	struct rdmap_read_req rr = { .sink_stag = htonl(tag) };
	uint8_t h[sizeof(struct ddp_untagged_hdr) + sizeof(rr)];
	uint32_t n = put_untagged(h, RDMAP_READ_REQ, DDP_QN_READ,
				  c->tx_msn[DDP_QN_READ]++);

	memcpy(h + n, &rr, sizeof(rr));
	seg_close(c, &c->tx_tail,
		  seg_open(c, &c->tx_tail, h, n + sizeof(rr), 0, 0, true));
}

/* Send or Write (with or without immediate data).  Under tx_lock.  A
 * failed write leaves the connection dead: tcp_maintain then fails the
 * unconfirmed messages, this one first. */
static void tx_send_write(struct tcp_conn *c, struct urdma_qp *qp,
			  struct urdma_swqe *w, const struct urdma_span *sp,
			  int n)
{
	bool send = w->opcode == IBV_WR_SEND || w->opcode == IBV_WR_SEND_WITH_IMM;
	bool imm = w->opcode == IBV_WR_SEND_WITH_IMM ||
		   w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	bool se = w->send_flags & IBV_SEND_SOLICITED;
	bool sig = qp->sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED);
	uint8_t h[sizeof(struct ddp_untagged_hdr)];
	uint32_t tag = 0, hl;
	struct tcp_unc *u;
	int ret = 0;

	pthread_mutex_lock(&c->ord_lock);
	u = unc_push(c, qp->sq_head, send ? K_SEND : K_WRITE,
		     c->tx_msn[DDP_QN_SEND] + (imm && send));
	u->stag = w->rkey;
	u->to = w->remote_addr;
	u->len = w->byte_len;
	if (sig) {
		tag = ++c->next_tag;
		unc_push(c, qp->sq_head, K_FLUSH, c->tx_msn[DDP_QN_READ])->tag =
			tag;
	}
	pthread_mutex_unlock(&c->ord_lock);
	if (send) {
		if (imm) {
			struct rdmap_imm im = {
				.imm = w->imm_data,
				.flags = htonl(URDMA_IMM_FOR_SEND),
			};

			ret = tx_ctrl(c, RDMAP_IMM, DDP_QN_SEND, &im, sizeof(im));
		}
		hl = put_untagged(h, se ? RDMAP_SEND_SE : RDMAP_SEND, DDP_QN_SEND,
				  c->tx_msn[DDP_QN_SEND]++);
	} else {
		hl = put_tagged(h, RDMAP_WRITE, w->rkey, w->remote_addr);
	}
	if (!ret && sig && !(imm && !send))
		tx_flush_tail(c, tag); /* rides with the message's end */
	if (!ret)
		ret = tx_msg(c, h, hl, sp, n, w->byte_len);
	if (!ret && imm && !send) {
		struct rdmap_imm im = { .imm = w->imm_data };

		if (sig)
			tx_flush_tail(c, tag);
		tx_ctrl(c, se ? RDMAP_IMM_SE : RDMAP_IMM, DDP_QN_SEND, &im,
			sizeof(im));
	}
	c->tx_tail.hlen = 0; /* sent, or the stream is dead */
}

/* Read or atomic.  Under tx_lock. */
static enum urdma_tx tx_read_atomic(struct tcp_conn *c, struct urdma_qp *qp,
				    struct urdma_swqe *w,
				    const struct urdma_span *sp, int n)
{
	bool atomic = w->opcode != IBV_WR_RDMA_READ;
	struct tcp_ord *o;
	uint32_t tag;

	pthread_mutex_lock(&c->ord_lock);
	o = ord_get(c, qp);
	if (!o) {
		pthread_mutex_unlock(&c->ord_lock);
		return URDMA_TX_WAIT;
	}
	tag = ++c->next_tag;
	*o = (struct tcp_ord){ .used = true, .atomic = atomic, .tag = tag,
			       .len = atomic ? 8 : w->byte_len, .n = n };
	memcpy(o->sp, sp, n * sizeof(sp[0]));
	unc_push(c, qp->sq_head, atomic ? K_ATOMIC : K_READ,
		 c->tx_msn[atomic ? DDP_QN_ATOMIC_REQ : DDP_QN_READ])->tag = tag;
	pthread_mutex_unlock(&c->ord_lock);
	if (!atomic) {
		struct rdmap_read_req rr = {
			.sink_stag = htonl(tag),
			.size = htonl(w->byte_len),
			.src_stag = htonl(w->rkey),
			.src_to = htobe64(w->remote_addr),
		};

		tx_ctrl(c, RDMAP_READ_REQ, DDP_QN_READ, &rr, sizeof(rr));
	} else {
		bool cas = w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
		struct rdmap_atomic_req ar = {
			.opcode = htonl(cas ? ATOMIC_CMP_SWAP : ATOMIC_FETCH_ADD),
			.req_id = htonl(tag),
			.stag = htonl(w->rkey),
			.to = htobe64(w->remote_addr),
			.add_swap = htobe64(cas ? w->swap : w->compare_add),
			.add_swap_mask = cas ? ~0ull : 0,
			.compare = htobe64(cas ? w->compare_add : 0),
			.compare_mask = cas ? ~0ull : 0,
		};

		tx_ctrl(c, RDMAP_ATOMIC_REQ, DDP_QN_ATOMIC_REQ, &ar, sizeof(ar));
	}
	return URDMA_TX_POSTED;
}

static enum urdma_tx tcp_execute(struct urdma_qp *qp, struct urdma_swqe *w,
				 enum ibv_wc_status *status)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);
	struct urdma_span sp[URDMA_MAX_SGE];
	enum urdma_tx r = URDMA_TX_POSTED;
	bool rd = w->opcode == IBV_WR_RDMA_READ ||
		  w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
		  w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
	uint8_t recv = TXP_RECV;
	bool long_park, answer;
	int n = 0;

	if (c && atomic_load(&c->dead)) {
		bool unconfirmed;

		pthread_mutex_lock(&c->ord_lock);
		unconfirmed = c->unc_head != c->unc_tail;
		pthread_mutex_unlock(&c->ord_lock);
		/* Once an error has been reported on this stream the QP is on
		 * its way to ERR: later WRs are flushed.  With messages still
		 * unconfirmed, tcp_maintain fails the first of them: wait for
		 * it.  Otherwise this WR is the first to find the peer gone. */
		if (!c->dead_handled && unconfirmed)
			return URDMA_TX_WAIT;
		*status = c->dead_handled ? IBV_WC_WR_FLUSH_ERR :
					    IBV_WC_RETRY_EXC_ERR;
		return URDMA_TX_DONE;
	}
	if (!c || atomic_load(&c->state) != C_UP)
		return URDMA_TX_NOT_READY;
	if (rx_owner == c)
		return URDMA_TX_WAIT; /* run from poll_cq or the progress thread */
	*status = urdma_local_spans(qp, w, sp, &n,
				    rd ? IBV_ACCESS_LOCAL_WRITE : 0);
	if (*status != IBV_WC_SUCCESS)
		return URDMA_TX_DONE;
	long_park = !rd && w->byte_len >= TX_PARK_MIN && tx_park(c);
	/* The answer to what a receiving poll parked the stream for: from
	 * now on the application is not one that left it to spin on memory
	 * (tcp_maintain), even if its CPU is taken from it in the send.  The
	 * load first: no locked instruction per message otherwise. */
	answer = atomic_load(&c->tx_parked) == TXP_RECV &&
		 atomic_compare_exchange_strong(&c->tx_parked, &recv, TXP_NONE);
	pthread_mutex_lock(&c->tx_lock);
	conn_sync_timeout(c, qp);
	if (rd)
		r = tx_read_atomic(c, qp, w, sp, n);
	else
		tx_send_write(c, qp, w, sp, n);
	tx_unlock(c);
	if (long_park || answer)
		tx_unpark(c, long_park);
	return r;
}

/*
 * TCP_USER_TIMEOUT only sees data TCP has not had acknowledged.  When the
 * oldest unconfirmed message has waited the retry budget with all our bytes
 * acknowledged (the link went down after they arrived, or the peer is alive
 * but answers nothing: a Send waiting for a receive, a stopped process),
 * a zero-length Read goes out as a probe, and again each budget while it
 * stays stuck: a live peer's TCP acknowledges it and we keep waiting; on a
 * dead path it stays unacknowledged and the user timeout breaks the stream.
 * A probe's answer confirms what came before, like any flush.  The pass
 * that sees the oldest waiting asks for the one a budget later.  Under
 * rx_lock.
 */
static void conn_probe_overdue(struct tcp_conn *c, struct urdma_qp *qp)
{
	uint64_t now = urdma_now_ns(), budget = urdma_qp_retry_ns(qp);
	struct rdmap_read_req rr = { 0 };
	uint32_t head, used;

	pthread_mutex_lock(&c->ord_lock);
	head = c->unc_head;
	used = c->unc_tail - c->unc_head;
	pthread_mutex_unlock(&c->ord_lock);
	if (!budget || !used) {
		c->watch_ns = 0;
		return;
	}
	if (!c->watch_ns || c->watch_head != head) {
		c->watch_head = head;
		c->watch_ns = now;
	}
	if (now - c->watch_ns < budget || used + 1 >= c->unc_size) {
		urdma_progress_by(c->watch_ns + budget);
		return;
	}
	if (pthread_mutex_trylock(&c->tx_lock))
		return; /* a sender holds the stream: its bytes are timed */
	c->watch_ns = now;
	pthread_mutex_lock(&c->ord_lock);
	rr.sink_stag = htonl(++c->next_tag);
	unc_push(c, c->unc[(c->unc_tail - 1) & (c->unc_size - 1)].wr_idx,
		 K_FLUSH, c->tx_msn[DDP_QN_READ])->tag = c->next_tag;
	pthread_mutex_unlock(&c->ord_lock);
	tx_ctrl(c, RDMAP_READ_REQ, DDP_QN_READ, &rr, sizeof(rr));
	tx_unlock(c);
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

static void conn_spins(struct tcp_conn *c)
{
	uint64_t now = urdma_now_ns();

	if (now >= c->spins_until)
		urdma_dbg("tcp: qp %#x: the application spins on memory: "
			  "receiving polls unpark for %llu ms",
			  c->local_qpn, SPINS_NS / 1000000);
	c->spins_until = now + SPINS_NS;
}

static bool tcp_maintain(struct urdma_qp *qp)
{
	struct tcp_conn *c = qp->tr_priv;
	bool again = false, fail = false;

	if (!c)
		return false;
	if (atomic_load(&c->state) == C_RETRY) {
		pthread_mutex_lock(&T.lock);
		if (atomic_load(&c->state) == C_RETRY &&
		    urdma_now_ns() - c->since_ns >= RETRY_CONNECT_NS)
			conn_start(c);
		pthread_mutex_unlock(&T.lock);
		return true;
	}
	if (atomic_load(&c->state) != C_UP)
		return false;
	if (pthread_mutex_trylock(&c->rx_lock))
		return true; /* someone is receiving: look again soon */
	if (c->closing) {
		pthread_mutex_unlock(&c->rx_lock);
		return false;
	}
	if (atomic_load(&qp->shm->state) == URDMA_SQPS_ERR) {
		if (!atomic_load(&c->dead)) {
			/* The peer learns it from the stream's end: its
			 * unconfirmed WRs fail as if our QP stopped answering.
			 * The answers it already earned go first. */
			rsp_send(c);
			conn_shut(c);
			c->dead_handled = true;
			conn_set_dead(c, "local QP in error");
			unc_settle(c, c->unc_head, IBV_WC_WR_FLUSH_ERR);
		}
	} else {
		/* Bytes in rbuf (FPDUs that came with the MPA Reply, or part
		 * of one), a parked stream whose application stopped polling
		 * (or will sleep on its CQ), or a Send waiting for a receive. */
		bool unread = c->rlen != 0, left = false;
		uint64_t seen = c->rx_bytes;

		if (atomic_load(&c->parked)) {
			bool away = !app_polling(c);

			left = away && atomic_load(&c->tx_parked) == TXP_RECV;
			if (away || atomic_load(&qp->shm->notify)) {
				conn_park(c, false);
				unread = true;
			}
		}
		if (unread || atomic_load(&c->stalled))
			rx_locked(c, progress_hold_ns(c));
		if (left && c->rx_bytes != seen)
			conn_spins(c);
		if (atomic_load(&c->parked))
			urdma_progress_by(urdma_now_ns() + PARK_LOOK_NS);
		again = atomic_load(&c->stalled);
		conn_probe_overdue(c, qp);
		/* Unconfirmed messages on a lost stream fail at once, the
		 * first with RETRY_EXC_ERR, as when a NIC's retries run out.
		 * An idle QP goes to ERR once its retry budget has passed (1
		 * s without one), as over shared memory when the peer process
		 * dies: the library knows the peer is gone, so it says so
		 * (receives flushed, QP_FATAL), while completions that came
		 * before stay to be polled. */
		if (atomic_load(&c->dead) && !c->dead_handled) {
			if (c->unc_head != c->unc_tail) {
				c->dead_handled = true;
				unc_settle(c, c->unc_head, IBV_WC_RETRY_EXC_ERR);
				fail = true;
			} else if (urdma_now_ns() - c->dead_ns >=
				   urdma_qp_loss_grace_ns(qp)) {
				c->dead_handled = true;
				fail = true;
			} else {
				again = true;
			}
		}
	}
	pthread_mutex_unlock(&c->rx_lock);
	rsp_send_due(c);
	if (fail) /* sq_lock is outer to rx_lock */
		urdma_qp_set_error(qp, true);
	return again;
}

/* Whether the socket has something to read (or an error), by a look that
 * does not take the socket's lock.  A poll loop that tried to read instead
 * would hold that lock now and then as a segment arrives: TCP then leaves
 * the segment to the lock's release, in this thread, and the read finds
 * nothing; the next read has it, a system call and the peer's receive
 * processing later. */
static bool rx_ready(struct tcp_conn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };

	return poll(&p, 1, 0) != 0;
}

static void tcp_poll(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	/* A stream found dead has nothing more to give: the progress thread
	 * takes it from there (tcp_maintain). */
	if (!c || atomic_load(&c->state) != C_UP || atomic_load(&c->dead))
		return;
	uint64_t seen, now = urdma_now_ns();
	uint64_t prev = atomic_load_explicit(&c->last_poll_ns,
					     memory_order_relaxed);
	uint32_t recvs, writes;
	bool quiet;

	atomic_store_explicit(&c->last_poll_ns, now, memory_order_relaxed);
	if (pthread_mutex_trylock(&c->rx_lock))
		return;
	seen = c->rx_bytes;
	writes = c->rx_writes;
	recvs = c->qp ? atomic_load(&c->qp->shm->rq_done) : 0;
	if (c->rlen || atomic_load(&c->stalled) || rx_ready(c))
		rx_locked(c, HOLD_APP_NS);
	/* Polls that find nothing, back to back (a poll loop, not one poll
	 * per call of an application that then spins on memory). */
	if (c->rx_bytes != seen)
		c->quiet_polls = 0;
	else if (now - prev < TIGHT_POLL_NS)
		c->quiet_polls++;
	else
		c->quiet_polls = 1;
	/* Two of them: the application waits here (park).  Answers held back
	 * go with its next message; one that waits is not answering: send
	 * them now. */
	quiet = c->quiet_polls >= 2;
	/* A poll that received a message or a Write while parked: the
	 * application leaves to answer it (ib_send_lat, ib_write_lat), and
	 * its send gives the stream back once the answer is on its way
	 * (TXP_RECV, tx_unpark); an unpark here would put a system call
	 * between the message and the answer.  A close poll after it keeps
	 * that.  Unless this application was lately found not answering
	 * (spins_until: it spun on memory for a Write still to come, and
	 * tcp_maintain had to unpark): then, as for anything else received
	 * (an answer), the stream goes back now. */
	if (!c->qp || atomic_load(&c->qp->shm->notify)) {
		conn_park(c, false); /* the application is about to sleep */
	} else if (quiet) {
		conn_park(c, true);
	} else if (atomic_load(&c->parked) && !c->quiet_polls &&
		   now >= c->spins_until &&
		   (atomic_load(&c->qp->shm->rq_done) != recvs ||
		    c->rx_writes != writes)) {
		uint8_t none = TXP_NONE;

		atomic_compare_exchange_strong(&c->tx_parked, &none, TXP_RECV);
	} else if (atomic_load(&c->tx_parked) != TXP_RECV ||
		   now - prev >= TIGHT_POLL_NS) {
		conn_park(c, false);
	}
	pthread_mutex_unlock(&c->rx_lock);
	if (quiet)
		rsp_send(c);
}

static void tcp_recv_posted(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (c && atomic_load(&c->stalled))
		urdma_progress_kick();
}

/* The application may sleep on its CQ now: the progress thread must watch
 * for data again.  Under the CQ lock, inner to rx_lock: if that is busy,
 * tcp_maintain unparks. */
static void tcp_armed(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (!c || !atomic_load(&c->parked))
		return;
	if (pthread_mutex_trylock(&c->rx_lock)) {
		urdma_progress_kick();
		return;
	}
	if (atomic_load(&c->state) == C_UP)
		conn_park(c, false);
	pthread_mutex_unlock(&c->rx_lock);
}

/* Answers held back for our next message (a flush's) go now.  sq_lock
 * keeps the connection: qp_disconnect runs under it. */
static void tcp_release(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (c && atomic_load(&c->state) == C_UP)
		rsp_send(c);
}

const struct urdma_transport_ops urdma_tcp_transport = {
	.name = "tcp",
	.connect = tcp_connect,
	.disconnect = tcp_disconnect,
	.execute = tcp_execute,
	.maintain = tcp_maintain,
	.poll = tcp_poll,
	.recv_posted = tcp_recv_posted,
	.armed = tcp_armed,
	.release = tcp_release,
};
