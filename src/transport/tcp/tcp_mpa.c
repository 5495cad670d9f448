// SPDX-License-Identifier: MIT
/*
 * The TCP transport's connection setup: MPA Request and Reply (RFC 5044
 * section 7) with urdma's private data naming both QPs, on the progress
 * thread.  At RTR the side with the lower (QPN, GID) connects and sends
 * the MPA Request; the other side's listener hands the connection to its
 * QP once that QP is at RTR with the matching destination, and only if it
 * comes from that peer (tcp_ident.c).
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
#include "transport/tcp/tcp_ident.h"

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
	size_t off = 0;

	memcpy(msg.f.key, key, MPA_KEY_LEN);
	msg.f.flags = flags;
	msg.f.rev = MPA_REVISION;
	msg.f.pd_len = htons(sizeof(msg.pd));
	msg.pd = *pd;
	while (off < sizeof(msg)) {
		ssize_t k = send(fd, (uint8_t *)&msg + off, sizeof(msg) - off,
				 MSG_NOSIGNAL);

		if (k < 0 && errno == EAGAIN &&
		    urdma_poll_fd(fd, POLLOUT, 1000) > 0)
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
void conn_sync_timeout(struct tcp_conn *c, struct urdma_qp *qp)
{
	/* UC has no timeout attribute; a send must not wait for ever on a
	 * peer that stopped reading (its messages are then dropped). */
	uint64_t ns = qp->ibqp.qp_type == IBV_QPT_UC ? 2000000000ull :
						      urdma_qp_retry_ns(qp);
	unsigned ms = ns && ns < 1000000 ? 1 : (unsigned)(ns / 1000000);

	if (c->timeout_ms == ms + 1)
		return;
	c->timeout_ms = ms + 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

/*
 * A NIC's QP at RTS is connected; ours gets its stream after RTR, and the
 * WRs posted at once wait for it.  Thousands of QPs set up together take
 * seconds (3,000 to 5,000 streams a second here), more than a retry budget
 * (0.54 s at timeout 14): counted from the post, most of their first WRs
 * failed with RETRY_EXC_ERR (11,014 of 16,384).  So while this process's
 * streams keep coming up, a WR waiting for its stream does not fail (for
 * up to 30 s: sq.c); once set-ups stop moving (the peer's host is gone, or
 * its QP refuses us), its budget counts from then (sq.c: from its first
 * look that found them stopped), as on a NIC.
 * "Keep coming up": one came up within the last SETUP_MOVING_NS, or the
 * budget if longer (at timeout 10, 33 ms, set-ups paused that long now and
 * then).  Only a stream that came up counts: a connect that reaches a
 * listener may end in a Reject, and be tried again every RETRY_CONNECT_NS
 * for ever.
 */
#define SETUP_MOVING_NS 1000000000ull
bool tcp_setup_moving(const struct urdma_qp *qp)
{
	uint64_t budget = urdma_qp_retry_ns(qp);
	uint64_t window = budget > SETUP_MOVING_NS ? budget : SETUP_MOVING_NS;

	return budget && urdma_now_ns() - atomic_load(&T.moved_ns) < window;
}

/* The stream is up.  Under T.lock. */
static void conn_up(struct tcp_conn *c)
{
	struct urdma_qp *qp = c->qp;

	list_del(&c->node);
	list_init(&c->node);
	conn_sync_timeout(c, qp);
	atomic_store(&T.moved_ns, urdma_now_ns());
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


static void reject(struct tcp_conn *c, int why);

/* Passive side: the QP is ready for this connection, if it comes from the
 * peer the QP was given (tcp_ident.c).  Under T.lock. */
void conn_attach(struct tcp_conn *c, struct urdma_qp *qp)
{
	struct urdma_mpa_pd pd;
	struct sockaddr_in6 expect;
	int ret = tcp_peer_addr(qp, &qp->attr, &expect);

	if (!ret)
		ret = urdma_tcp_peer_check(
			c->fd, &expect,
			urdma_gid_is_local(qp->uctx, &expect.sin6_addr),
			c->peer_qpn);
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
	c->crc = c->crc || tcp_want_crc(); /* the Request's wish, or ours */
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
void tcp_handshake(struct tcp_conn *c, uint32_t events)
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
				    tcp_want_crc() ? MPA_FLAG_C : 0, &pd)) {
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
		c->crc = (f.flags & MPA_FLAG_C) || tcp_want_crc();
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
		l = tcp_listener_of(c->local_qpn);
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

int conn_start(struct tcp_conn *c)
{
	c->fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	tcp_set_sock_opts(c->fd);
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
