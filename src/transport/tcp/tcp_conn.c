// SPDX-License-Identifier: MIT
/*
 * The TCP transport's listeners, QP numbers and connection objects.
 *
 * Every process that has QPs listens on a kernel-chosen TCP port (one
 * listener per 256 QPs); a QP number is (port << 8 | index), so the QPN and
 * GID that programs exchange out of band are all a peer needs to reach the
 * QP: no daemon, no well-known port.  Accepted connections wait here until
 * their MPA Request names a QP (tcp_mpa.c), within bounds.
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
#include "util/log.h"
#include "transport/tcp/tcp.h"

struct tcp_globals T = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.pending = LIST_HEAD_INIT(T.pending),
};

bool tcp_want_crc(void)
{
	const char *e = getenv("URDMA_MPA_CRC");

	return !e || strcmp(e, "0");
}

/* ---- listeners and QP numbers ---- */

struct tcp_listener *tcp_listener_of(uint32_t qpn)
{
	for (int i = 0; i < 256; i++)
		if (T.ls[i] && T.ls[i]->port == qpn >> 8)
			return T.ls[i];
	return NULL;
}

void tcp_set_sock_opts(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct tcp_conn *conn_new(int fd)
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

void conn_release(struct urdma_watcher *w)
{
	struct tcp_conn *c = (struct tcp_conn *)w;

	if (c->fd >= 0)
		close(c->fd);
	urdma_xsrq_ref_drop(&c->rcv_xref);
	urdma_free(c->rbuf);
	urdma_free(c->unc);
	urdma_free(c->rsp);
	urdma_free(c->res);
	urdma_free(c->hold);
	urdma_free(c->rest);
	urdma_free(c);
}

/* Close a conn; the progress thread frees it.  Under T.lock. */
void conn_bury(struct tcp_conn *c)
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

/* Listeners accept, or leave new connections in the kernel's backlog. */
static void listeners_pause(bool pause)
{
	if (atomic_load(&T.paused) == pause)
		return;
	atomic_store(&T.paused, pause);
	for (int i = 0; i < 256; i++) {
		struct tcp_listener *l = T.ls[i];

		if (l && !l->closed)
			urdma_progress_watch_events(l->fd, pause ? 0 : EPOLLIN,
						    URDMA_WATCH_FN, &l->w, true);
	}
}

/* While listeners are paused, tcp_tick calls pending_admit by t. */
static void pending_look(uint64_t t)
{
	atomic_store(&T.look_ns, t);
	urdma_progress_by(t);
}

/* Keep accepted connections within the bounds (tcp.h): close those that
 * waited too long, oldest first (T.pending is in arrival order), and let
 * listeners accept only while there is room.  Under T.lock, as
 * connections arrive and, while listeners are paused, from tcp_tick. */
static void pending_admit(void)
{
	uint64_t now = urdma_now_ns(), next = 0;
	struct tcp_conn *c, *n;
	int count = 0;

	list_for_each_entry(c, &T.pending, node)
		count += passive_pending(c);
	list_for_each_entry_safe(c, n, &T.pending, node) {
		uint64_t age;

		if (!passive_pending(c))
			continue;
		age = now - c->since_ns;
		if (age < PENDING_TIMEOUT_NS &&
		    (count < PENDING_MAX || age < PENDING_GRACE_NS)) {
			/* the oldest left: when it may go */
			next = c->since_ns + (count < PENDING_MAX ?
						      PENDING_TIMEOUT_NS :
						      PENDING_GRACE_NS);
			break;
		}
		urdma_dbg("tcp: closing a connection that never finished MPA");
		conn_bury(c);
		count--;
	}
	listeners_pause(count >= PENDING_MAX);
	if (count >= PENDING_MAX)
		pending_look(now + PENDING_LOOK_NS < next ? now + PENDING_LOOK_NS :
							    next);
}

void tcp_tick(void)
{
	uint64_t look = atomic_load(&T.look_ns);

	if (!atomic_load(&T.paused))
		return;
	if (urdma_now_ns() < look) { /* brought by an earlier request */
		urdma_progress_by(look);
		return;
	}
	pthread_mutex_lock(&T.lock);
	if (atomic_load(&T.paused) &&
	    urdma_now_ns() >= atomic_load(&T.look_ns))
		pending_admit();
	pthread_mutex_unlock(&T.lock);
}

static void listener_cb(struct urdma_watcher *w, uint32_t events)
{
	struct tcp_listener *l = (struct tcp_listener *)w;
	(void)events;

	for (;;) {
		struct tcp_conn *c;
		int fd, err;

		pthread_mutex_lock(&T.lock);
		if (l->closed || atomic_load(&T.paused)) {
			pthread_mutex_unlock(&T.lock);
			return;
		}
		fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		err = fd < 0 ? errno : 0;
		if (err && err != EAGAIN && err != EINTR &&
		    err != ECONNABORTED) {
			/* out of fds or memory: the listener would stay
			 * readable; let the connections wait a while */
			urdma_dbg("tcp: accept: %s", strerror(err));
			listeners_pause(true);
			pending_look(urdma_now_ns() + ACCEPT_RETRY_NS);
		}
		pthread_mutex_unlock(&T.lock);
		if (err == EINTR || err == ECONNABORTED)
			continue;
		if (err)
			return;
		tcp_set_sock_opts(fd);
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
		pending_admit();
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
	    listen(l->fd, SOMAXCONN) ||
	    getsockname(l->fd, (struct sockaddr *)&sa, &len))
		goto err_close;
	l->port = ntohs(sa.sin6_port);
	if (urdma_progress_watch_events(l->fd,
					atomic_load(&T.paused) ? 0 : EPOLLIN,
					URDMA_WATCH_FN, &l->w, false))
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

int tcp_qpn_reserve(uint32_t *qpn)
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

void tcp_qpn_bind(struct urdma_qp *qp)
{
	struct tcp_listener *l;

	pthread_mutex_lock(&T.lock);
	l = tcp_listener_of(qp->ibqp.qp_num);
	if (l)
		l->reg[qp->ibqp.qp_num & 0xff].qp = qp;
	pthread_mutex_unlock(&T.lock);
}

/* The QP is gone: its number is free; the last one closes the listener. */
void tcp_qpn_release(uint32_t qpn)
{
	struct tcp_listener *l;

	pthread_mutex_lock(&T.lock);
	l = tcp_listener_of(qpn);
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

/* Dead by a socket error err: ETIMEDOUT is TCP_USER_TIMEOUT's (or our
 * own look's, conn_probe_overdue), set to the QP's retry budget. */
void conn_set_dead_err(struct tcp_conn *c, int err)
{
	/* (before dead, which publishes it; not for a stream already
	 * dead by another cause) */
	if (err == ETIMEDOUT && !atomic_load(&c->dead))
		atomic_store(&c->timed_out, true);
	conn_set_dead(c, strerror(err));
}

void conn_set_dead(struct tcp_conn *c, const char *why)
{
	if (atomic_load(&c->dead))
		return;
	c->dead_ns = urdma_now_ns(); /* (before dead, which publishes it) */
	if (atomic_exchange(&c->dead, true))
		return;
	urdma_info("tcp: qp %#x: connection to qp %#x lost: %s", c->local_qpn,
		   c->peer_qpn, why);
	urdma_progress_kick();
}
