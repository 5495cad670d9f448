/* SPDX-License-Identifier: MIT */
/*
 * rsockets: the socket-like API of <rdma/rsocket.h> (rsocket, rsend, rrecv,
 * rpoll, riowrite, ...) over RC queue pairs set up by the RDMA connection
 * manager.  Written only against the public <rdma/rdma_cma.h>,
 * <rdma/rdma_verbs.h> and <infiniband/verbs.h>: nothing here knows urdma's
 * internals.  Both ends run this file; the wire protocol is ours (it does
 * not interoperate with rdma-core's rsockets).
 *
 * Identity
 * --------
 * Every rsocket owns an rdma_event_channel, and the channel's fd (a real fd,
 * so it never collides with the application's) is the rsocket number.  A
 * two-level table maps fd -> struct rsocket (lock-free lookup); rpoll()
 * treats any fd not in the table as a normal fd.  An accepted connection
 * gets a fresh channel and its cm_id is moved there with rdma_migrate_id().
 *
 * Connection set-up
 * -----------------
 * rconnect: rdma_resolve_addr -> rdma_resolve_route -> create the endpoint
 * (PD, one CQ with a completion channel, the RC QP, buffers, every receive
 * posted) -> rdma_connect with struct rs_conn_data as private data ->
 * ESTABLISHED carries the peer's rs_conn_data.  rlisten/raccept: each
 * CONNECT_REQUEST is queued on the listener (up to the backlog; bad private
 * data is rejected); raccept moves it to its own channel, creates the
 * endpoint and rdma_accept()s with its own rs_conn_data.  The connection is
 * usable as soon as rdma_accept returns.  A non-blocking rconnect returns
 * EINPROGRESS; the state machine then advances in rpoll (POLLOUT when done,
 * POLLERR|POLLHUP and SO_ERROR on failure) or in any later call.
 *
 * rs_conn_data (32 bytes, big-endian): magic, version, the number of
 * receives posted (initial credits), the receive ring (address, rkey, size)
 * and how many iomapped buffers the sender accepts from its peer.
 *
 * Data path
 * ---------
 * Each side exposes a receive ring (SO_RCVBUF bytes, REMOTE_WRITE).  The
 * sender knows where the next byte goes (both sides count bytes from 0), so
 * a data message is one RDMA WRITE WITH IMMEDIATE of up to 64 KiB into the
 * peer's ring at (bytes sent mod ring size), never crossing the ring's end;
 * the immediate is the length.  Its source is the application buffer with
 * IBV_SEND_INLINE when the chunk is at most RDMA_INLINE bytes, otherwise a
 * copy in the registered send buffer (SO_SNDBUF bytes, a byte ring freed in
 * order by send completions; WRs are signalled now and then, see rs_sign).
 * The receiver learns of data from the receive completion (the write landed
 * before it, RC order) and rrecv copies it out of the ring.
 *
 * Control messages (credit update, shutdown, iomap update) are 48-byte SENDs
 * into 64-byte receive slots.  Every one of them carries two absolute
 * counters: the bytes of the peer's stream consumed so far (ring space) and
 * the receives posted so far (message credits).
 *
 * Flow control: the sender writes only into ring space the receiver has
 * reported free, and sends a message (data or control) only while it holds
 * a credit (a receive posted at the peer).  Data, shutdown and iomap
 * messages need two credits: the last one is kept for a credit update, so
 * two sides can never both be stuck without credits.  The receiver reports
 * (a credit update message) when a quarter of its ring has been consumed
 * since the last report, or when the peer's remaining credits fall to half
 * of the receive queue.  Receives are re-posted as their completions are
 * polled.
 *
 * Shutdown and errors: rshutdown(SHUT_WR) (and rclose) sends a SHUTDOWN
 * message after all data; the peer's rrecv returns 0 once it has read
 * everything before it.  rclose then waits (bounded, SO_LINGER) until all
 * its sends completed, so nothing in flight is lost, and disconnects.  A
 * connection that ends without SHUTDOWN (peer killed, abortive close with
 * SO_LINGER 0, a failed completion, DISCONNECTED) gives ECONNRESET once the
 * data already received has been read, then EOF; sends give ECONNRESET then
 * EPIPE.  SIGPIPE is never raised.
 *
 * Direct placement (riomap/riowrite): riomap(PROT_WRITE) registers the
 * buffer for remote writes and sends an IOMAP control message {index,
 * offset, address, length, rkey}; the peer keeps a table of RDMA_IOMAPSIZE
 * entries (set on the peer before it connects; by default 0: riomap with
 * PROT_WRITE then fails with ENOMEM).  riowrite is a plain RDMA WRITE into
 * the peer's mapping (no credit, no receive consumed; the receiver is not
 * told) through the same send buffer, ordered with the stream on the QP.
 * riounmap sends an IOMAP
 * message of length 0.
 *
 * Waiting: a blocking call (and rpoll) first polls the CQ for a short,
 * adaptive time (URDMA_RS_SPIN_US, default 30 us; shortened while waits keep
 * ending asleep), then arms the CQ and sleeps in poll() on the completion
 * channel fd and the CM channel fd (rpoll adds the application's normal fds).
 * A sleep is capped at 100 ms so that two threads sharing one rsocket can
 * never lose a wake-up for ever.
 *
 * Locking: one mutex per rsocket, released while sleeping; rpoll takes one
 * rsocket lock at a time.  fork() is not supported.
 *
 * SOCK_DGRAM rsockets (UD QPs) are rs_dgram.c's; the calls here and in
 * rs_conn.c, rs_stream.c, rs_ctrl.c and rs_poll.c hand them over.
 *
 * This file: the fd table, allocation, shutdown and close, addresses and
 * options.  rs_conn.c: the endpoint and the calls that connect; rs_stream.c:
 * sending and the data calls; rs_ctrl.c: completions, CM events, waiting;
 * rs_poll.c: rpoll/rselect; rs_iomap.c: direct placement; rsocket_priv.h:
 * what they share.
 */

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rdma/rsocket.h>

#include "rdmacm/cma.h"
#include "rdmacm/rsocket_priv.h"
#include "util/alloc.h"

/* ------------------------------------------------------------------ */
/* Small helpers                                                      */
/* ------------------------------------------------------------------ */

int rs_spin_us = -1;
static pthread_once_t rs_once = PTHREAD_ONCE_INIT;

static void rs_global_init(void)
{
	const char *s = getenv("URDMA_RS_SPIN_US");

	rs_spin_us = RS_DEF_SPIN_US;
	if (s && *s) {
		long v = strtol(s, NULL, 10);

		if (v >= 0 && v <= 100000)
			rs_spin_us = (int)v;
	}
}

static uint32_t clamp_u32(uint64_t v, uint32_t lo, uint32_t hi)
{
	return v < lo ? lo : v > hi ? hi : (uint32_t)v;
}

size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return (n + pg - 1) & ~(pg - 1);
}

/* ------------------------------------------------------------------ */
/* fd -> rsocket table                                                */
/* ------------------------------------------------------------------ */

#define RS_IDX_LEAF_BITS 10
#define RS_IDX_LEAF	(1 << RS_IDX_LEAF_BITS)
#define RS_IDX_ROOT	(1 << 12)	/* fds below 4 Mi */

static _Atomic(struct rsocket *) *rs_index[RS_IDX_ROOT];
static pthread_mutex_t rs_index_lock = PTHREAD_MUTEX_INITIALIZER;

struct rsocket *rs_lookup(int fd)
{
	_Atomic(struct rsocket *) *leaf;

	if (fd < 0 || fd >= RS_IDX_ROOT * RS_IDX_LEAF)
		return NULL;
	leaf = __atomic_load_n(&rs_index[fd >> RS_IDX_LEAF_BITS], __ATOMIC_ACQUIRE);
	if (!leaf)
		return NULL;
	return atomic_load_explicit(&leaf[fd & (RS_IDX_LEAF - 1)],
				    memory_order_acquire);
}

int rs_index_insert(struct rsocket *rs)
{
	int fd = rs->fd, r = fd >> RS_IDX_LEAF_BITS;
	_Atomic(struct rsocket *) *leaf;

	if (fd < 0 || fd >= RS_IDX_ROOT * RS_IDX_LEAF)
		return -EMFILE;
	pthread_mutex_lock(&rs_index_lock);
	leaf = rs_index[r];
	if (!leaf) {
		leaf = urdma_zalloc_array(RS_IDX_LEAF, sizeof(*leaf));
		if (!leaf) {
			pthread_mutex_unlock(&rs_index_lock);
			return -ENOMEM;
		}
		__atomic_store_n(&rs_index[r], leaf, __ATOMIC_RELEASE);
	}
	atomic_store_explicit(&leaf[fd & (RS_IDX_LEAF - 1)], rs,
			      memory_order_release);
	pthread_mutex_unlock(&rs_index_lock);
	return 0;
}

static void rs_index_remove(struct rsocket *rs)
{
	_Atomic(struct rsocket *) *leaf;

	pthread_mutex_lock(&rs_index_lock);
	leaf = rs_index[rs->fd >> RS_IDX_LEAF_BITS];
	if (leaf && atomic_load(&leaf[rs->fd & (RS_IDX_LEAF - 1)]) == rs)
		atomic_store(&leaf[rs->fd & (RS_IDX_LEAF - 1)], NULL);
	pthread_mutex_unlock(&rs_index_lock);
}

/* The rsocket of fd, or NULL with errno: EBADF for no open fd, ENOTSOCK
 * for an fd that is not an rsocket. */
struct rsocket *rs_get(int fd)
{
	struct rsocket *rs = rs_lookup(fd);

	if (!rs)
		errno = (fd >= 0 && fcntl(fd, F_GETFD) >= 0) ? ENOTSOCK : EBADF;
	return rs;
}

/* ------------------------------------------------------------------ */
/* Allocation                                                         */
/* ------------------------------------------------------------------ */

struct rsocket *rs_alloc(const struct rsocket *from, int domain)
{
	struct rsocket *rs = urdma_zalloc(sizeof(*rs));

	if (!rs)
		return NULL;
	pthread_once(&rs_once, rs_global_init);
	pthread_mutex_init(&rs->lock, NULL);
	rs->fd = -1;
	rs->domain = domain;
	rs->state = RS_IDLE;
	if (from) {
		/* accepted sockets inherit the listener's options, as TCP's do
		 * (O_NONBLOCK is not inherited, as on Linux) */
		rs->sq_size = from->sq_size;
		rs->rq_size = from->rq_size;
		rs->sq_inline = from->sq_inline;
		rs->iomap_size = from->iomap_size;
		rs->sbuf_size = from->sbuf_size;
		rs->rbuf_size = from->rbuf_size;
		rs->reuseaddr = from->reuseaddr;
		rs->keepalive = from->keepalive;
		rs->keepidle = from->keepidle;
		rs->keepintvl = from->keepintvl;
		rs->keepcnt = from->keepcnt;
		rs->nodelay = from->nodelay;
		rs->maxseg = from->maxseg;
		rs->oobinline = from->oobinline;
		rs->v6only = from->v6only;
		rs->linger = from->linger;
	} else {
		rs->sq_size = RS_DEF_SQSIZE;
		rs->rq_size = RS_DEF_RQSIZE;
		rs->sq_inline = RS_DEF_INLINE;
		rs->sbuf_size = RS_DEF_BUF;
		rs->rbuf_size = RS_DEF_BUF;
		rs->keepidle = 7200;
		rs->keepintvl = 75;
		rs->keepcnt = 9;
	}
	return rs;
}

int rs_set_chan_flags(struct rdma_event_channel *chan)
{
	int fl = fcntl(chan->fd, F_GETFL);

	if (fl < 0 || fcntl(chan->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return 0;
}

/* Tear down the data path (QP, CQ, buffers).  Lock held. */
void rs_free_ep(struct rsocket *rs)
{
	struct rs_iomap_local *m, *mn;
	struct rs_iomap_msg *q, *qn;

	for (m = rs->iomaps; m; m = mn) {
		mn = m->next;
		if (m->mr)
			ibv_dereg_mr(m->mr);
		urdma_free(m);
	}
	rs->iomaps = NULL;
	for (q = rs->iomap_q; q; q = qn) {
		qn = q->next;
		urdma_free(q);
	}
	rs->iomap_q = rs->iomap_q_tail = NULL;
	urdma_free(rs->peer_iomap);
	rs->peer_iomap = NULL;

	if (rs->qp && rs->id) {
		rdma_destroy_qp(rs->id);
		rs->qp = NULL;
	}
	if (rs->cq) {
		if (rs->cq_events)
			ibv_ack_cq_events(rs->cq, (unsigned)rs->cq_events);
		rs->cq_events = 0;
		ibv_destroy_cq(rs->cq);
		rs->cq = NULL;
	}
	if (rs->cq_chan) {
		ibv_destroy_comp_channel(rs->cq_chan);
		rs->cq_chan = NULL;
	}
	if (rs->lmr) {
		ibv_dereg_mr(rs->lmr);
		rs->lmr = NULL;
	}
	if (rs->rmr) {
		ibv_dereg_mr(rs->rmr);
		rs->rmr = NULL;
	}
	if (rs->lbuf) {
		munmap(rs->lbuf, rs->lbuf_len);
		rs->lbuf = NULL;
	}
	if (rs->rbuf) {
		munmap(rs->rbuf, rs->rbuf_map);
		rs->rbuf = NULL;
	}
	if (rs->pd) {
		ibv_dealloc_pd(rs->pd);
		rs->pd = NULL;
	}
}

/* Drop a queued connect request. */
void rs_req_free(struct rs_req *r, bool reject)
{
	if (reject)
		rdma_reject(r->id, NULL, 0);
	rdma_destroy_id(r->id);
	urdma_free(r);
}

void rs_free(struct rsocket *rs)
{
	struct rs_req *r, *rn;

	for (r = rs->req_head; r; r = rn) {
		rn = r->next;
		rs_req_free(r, !r->dead);
	}
	rs->req_head = rs->req_tail = NULL;
	rs_free_ep(rs);
	if (rs->id) {
		rdma_destroy_id(rs->id);
		rs->id = NULL;
	}
	if (rs->chan) {
		rdma_destroy_event_channel(rs->chan);
		rs->chan = NULL;
	}
	pthread_mutex_destroy(&rs->lock);
	urdma_free(rs);
}

/* ------------------------------------------------------------------ */
/* Shutdown and close                                                 */
/* ------------------------------------------------------------------ */

static bool rs_ctl_sent(struct rsocket *rs)
{
	return rs->conn_dead || (rs->shut_sent && !rs->iomap_q);
}

static bool rs_sends_done(struct rsocket *rs)
{
	return rs->conn_dead || rs->sq_used == 0 ||
	       rs->sq_used == (int)rs->unsig_cnt;	/* no completion will come */
}

RS_EXPORT int rshutdown(int socket, int how)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0;

	if (!rs)
		return -1;
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return cma_err(EINVAL);
	pthread_mutex_lock(&rs->lock);
	if (rs->dg) {
		ret = rs_dg_shutdown(rs, how);
		goto out;
	}
	if (rs->state != RS_CONNECTED) {
		ret = ENOTCONN;
		goto out;
	}
	if (how == SHUT_RD || how == SHUT_RDWR)
		rs->rd_shut = true;
	if ((how == SHUT_WR || how == SHUT_RDWR) && !rs->wr_shut) {
		rs->wr_shut = true;
		rs_progress(rs);	/* posts the SHUTDOWN if it can */
		if (!rs->shut_sent && !rs->conn_dead)
			rs_wait(rs, rs_ctl_sent, rs->nonblock, RS_CLOSE_MS);
	}
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rclose(int socket)
{
	struct rsocket *rs = rs_get(socket);

	if (!rs)
		return -1;
	rs_index_remove(rs);
	pthread_mutex_lock(&rs->lock);
	if (rs->dg) {
		/* as UDP: what is not sent yet goes with the socket */
		rs_dg_free(rs);
		pthread_mutex_unlock(&rs->lock);
		rs_free(rs);
		return 0;
	}
	if (rs->state == RS_CONNECTED && !rs->conn_dead) {
		bool abort = rs->linger.l_onoff && rs->linger.l_linger == 0;
		int ms = rs->linger.l_onoff ? rs->linger.l_linger * 1000 : RS_CLOSE_MS;

		if (!abort) {
			/* end of stream first, then let what is in flight land */
			rs->wr_shut = true;
			rs_wait(rs, rs_ctl_sent, false, ms);
			rs_wait(rs, rs_sends_done, false, ms);
		}
	}
	rs->closing = true;
	if (rs->id && !rs->disconnected &&
	    (rs->state == RS_CONNECTED || rs->state == RS_CONNECTING)) {
		rdma_disconnect(rs->id);
		rs->disconnected = true;
	}
	/* events still queued must be acknowledged before the id goes */
	if (rs->chan) {
		struct rdma_cm_event *ev;

		while (!rdma_get_cm_event(rs->chan, &ev)) {
			if (rs->state == RS_LISTENING)
				rs_listener_event(rs, ev);
			else
				rdma_ack_cm_event(ev);
		}
	}
	pthread_mutex_unlock(&rs->lock);
	rs_free(rs);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Addresses                                                          */
/* ------------------------------------------------------------------ */

static int rs_getname(int socket, struct sockaddr *addr, socklen_t *addrlen,
		      bool peer)
{
	struct rsocket *rs = rs_get(socket);

	if (!rs)
		return -1;
	if (!addr || !addrlen)
		return cma_err(EFAULT);
	pthread_mutex_lock(&rs->lock);
	if (rs->dg) {
		int ret = rs_dg_getname(rs, addr, addrlen, peer);

		pthread_mutex_unlock(&rs->lock);
		return ret ? cma_err(ret) : 0;
	}
	if (peer && rs->state != RS_CONNECTED) {
		pthread_mutex_unlock(&rs->lock);
		return cma_err(ENOTCONN);
	}
	rs_copy_addr(addr, addrlen,
		     peer ? rdma_get_peer_addr(rs->id) :
		     rs->id ? rdma_get_local_addr(rs->id) : NULL,
		     rs->domain);
	pthread_mutex_unlock(&rs->lock);
	return 0;
}

RS_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	return rs_getname(socket, addr, addrlen, true);
}

RS_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	return rs_getname(socket, addr, addrlen, false);
}

/* ------------------------------------------------------------------ */
/* Options                                                            */
/* ------------------------------------------------------------------ */

static int rs_opt_int(const void *optval, socklen_t optlen, int *v)
{
	if (!optval)
		return EFAULT;
	if (optlen < (socklen_t)sizeof(int))
		return EINVAL;
	memcpy(v, optval, sizeof(int));
	return 0;
}

/* Before the endpoint exists, queue sizes can change. */
static bool rs_configurable(const struct rsocket *rs)
{
	if (rs->dg)
		return !rs->qp;
	return rs->state == RS_IDLE || rs->state == RS_LISTENING ||
	       rs->state == RS_ADDR_QUERY;
}

RS_EXPORT int rsetsockopt(int socket, int level, int optname,
			  const void *optval, socklen_t optlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0, v = 0;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	switch (level) {
	case SOL_SOCKET:
		if (optname == SO_LINGER) {
			if (!optval) {
				ret = EFAULT;
				break;
			}
			if (optlen < (socklen_t)sizeof(struct linger)) {
				ret = EINVAL;
				break;
			}
			memcpy(&rs->linger, optval, sizeof(struct linger));
			if (rs->linger.l_linger < 0)
				rs->linger.l_linger = 0;
			break;
		}
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		switch (optname) {
		case SO_REUSEADDR:
			rs->reuseaddr = v != 0;
			if (rs->dg && setsockopt(rs->fd, SOL_SOCKET, SO_REUSEADDR,
						 &v, sizeof(v)))
				ret = errno;
			/* passed on to the CM; refused there only before the
			 * CM supports it, which changes nothing on one host */
			if (rs->id)
				rdma_set_option(rs->id, RDMA_OPTION_ID,
						RDMA_OPTION_ID_REUSEADDR, &v, sizeof(v));
			break;
		case SO_SNDBUF:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			if (rs_configurable(rs))
				rs->sbuf_size = clamp_u32((uint64_t)v, RS_MIN_BUF, RS_MAX_BUF);
			break;
		case SO_RCVBUF:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			if (rs_configurable(rs))
				rs->rbuf_size = clamp_u32((uint64_t)v, RS_MIN_BUF, RS_MAX_BUF);
			break;
		case SO_KEEPALIVE:	/* accepted, no effect (as rdma-core) */
			rs->keepalive = v != 0;
			break;
		case SO_OOBINLINE:
			rs->oobinline = v != 0;
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_TCP:
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		if (rs->dg) {
			ret = ENOPROTOOPT;
			break;
		}
		switch (optname) {
		case TCP_NODELAY:	/* we never delay */
			rs->nodelay = v != 0;
			break;
		case TCP_MAXSEG:
			if (v < 88 || v > 65535) {
				ret = EINVAL;
				break;
			}
			rs->maxseg = v;
			break;
		case TCP_KEEPIDLE:
		case TCP_KEEPINTVL:
		case TCP_KEEPCNT:
			if (v < 1 || v > 32767) {
				ret = EINVAL;
				break;
			}
			if (optname == TCP_KEEPIDLE)
				rs->keepidle = v;
			else if (optname == TCP_KEEPINTVL)
				rs->keepintvl = v;
			else
				rs->keepcnt = v;
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_IPV6:
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		if (optname != IPV6_V6ONLY || rs->domain != AF_INET6) {
			ret = ENOPROTOOPT;
			break;
		}
		if (rs->state != RS_IDLE || rs->bound) {
			ret = EINVAL;
			break;
		}
		if (rs->dg && setsockopt(rs->fd, IPPROTO_IPV6, IPV6_V6ONLY,
					 &v, sizeof(v))) {
			ret = errno;
			break;
		}
		rs->v6only = v != 0;
		if (rs->id)
			rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY,
					&v, sizeof(v));
		break;
	case SOL_RDMA:
		if (optname == RDMA_ROUTE) {
			/* path records: meaningless here (no IB subnet) */
			if (!optval)
				ret = EFAULT;
			else if (optlen % sizeof(struct ibv_path_data) || !optlen)
				ret = EINVAL;
			else if (!rs_configurable(rs))
				ret = EINVAL;
			break;
		}
		ret = rs_opt_int(optval, optlen, &v);
		if (ret)
			break;
		if (optname != RDMA_SQSIZE && optname != RDMA_RQSIZE &&
		    optname != RDMA_INLINE &&
		    (optname != RDMA_IOMAPSIZE || rs->dg)) {
			ret = ENOPROTOOPT;
			break;
		}
		if (!rs_configurable(rs)) {
			ret = EINVAL;	/* the endpoint exists: too late */
			break;
		}
		switch (optname) {
		case RDMA_SQSIZE:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			rs->sq_size = (int)clamp_u32((uint64_t)v, RS_MIN_QSIZE, RS_MAX_QSIZE);
			break;
		case RDMA_RQSIZE:
			if (v <= 0) {
				ret = EINVAL;
				break;
			}
			rs->rq_size = (int)clamp_u32((uint64_t)v, RS_MIN_QSIZE, RS_MAX_QSIZE);
			break;
		case RDMA_INLINE:
			if (v < 0) {
				ret = EINVAL;
				break;
			}
			rs->sq_inline = v > 4096 ? 4096 : v;
			break;
		case RDMA_IOMAPSIZE:
			if (v < 0) {
				ret = EINVAL;
				break;
			}
			rs->iomap_size = v > RS_MAX_IOMAP ? RS_MAX_IOMAP : v;
			break;
		}
		break;
	default:
		ret = ENOPROTOOPT;
		break;
	}
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rgetsockopt(int socket, int level, int optname,
			  void *optval, socklen_t *optlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0, v = 0;
	bool is_int = true;

	if (!rs)
		return -1;
	if (!optval || !optlen)
		return cma_err(EFAULT);
	pthread_mutex_lock(&rs->lock);
	switch (level) {
	case SOL_SOCKET:
		switch (optname) {
		case SO_ERROR:
			rs_progress(rs);
			v = rs->err;
			rs->err = 0;
			break;
		case SO_REUSEADDR:
			v = rs->reuseaddr;
			break;
		case SO_SNDBUF:
			v = (int)rs->sbuf_size;
			break;
		case SO_RCVBUF:
			v = (int)rs->rbuf_size;
			break;
		case SO_KEEPALIVE:
			v = rs->keepalive;
			break;
		case SO_OOBINLINE:
			v = rs->oobinline;
			break;
		case SO_TYPE:
			v = rs->dg ? SOCK_DGRAM : SOCK_STREAM;
			break;
		case SO_DOMAIN:
			v = rs->domain;
			break;
		case SO_PROTOCOL:
			v = rs->dg ? IPPROTO_UDP : IPPROTO_TCP;
			break;
		case SO_ACCEPTCONN:
			v = rs->state == RS_LISTENING;
			break;
		case SO_LINGER:
			is_int = false;
			if (*optlen < (socklen_t)sizeof(struct linger)) {
				ret = EINVAL;
				break;
			}
			memcpy(optval, &rs->linger, sizeof(struct linger));
			*optlen = sizeof(struct linger);
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_TCP:
		if (rs->dg) {
			ret = ENOPROTOOPT;
			break;
		}
		switch (optname) {
		case TCP_NODELAY:
			v = rs->nodelay;
			break;
		case TCP_MAXSEG:
			v = rs->maxseg ? rs->maxseg : RS_MSS;
			break;
		case TCP_KEEPIDLE:
			v = rs->keepidle;
			break;
		case TCP_KEEPINTVL:
			v = rs->keepintvl;
			break;
		case TCP_KEEPCNT:
			v = rs->keepcnt;
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	case IPPROTO_IPV6:
		if (optname != IPV6_V6ONLY || rs->domain != AF_INET6)
			ret = ENOPROTOOPT;
		else
			v = rs->v6only;
		break;
	case SOL_RDMA:
		switch (optname) {
		case RDMA_SQSIZE:
			v = rs->sq_size;
			break;
		case RDMA_RQSIZE:
			v = rs->rq_size;
			break;
		case RDMA_INLINE:
			v = rs->qp ? rs->max_inline : rs->sq_inline;
			break;
		case RDMA_IOMAPSIZE:
			if (rs->dg)
				ret = ENOPROTOOPT;
			v = rs->iomap_size;
			break;
		case RDMA_ROUTE:
			is_int = false;
			*optlen = 0;	/* no path records */
			break;
		default:
			ret = ENOPROTOOPT;
			break;
		}
		break;
	default:
		ret = ENOPROTOOPT;
		break;
	}
	if (!ret && is_int) {
		if (*optlen < (socklen_t)sizeof(int)) {
			ret = EINVAL;
		} else {
			memcpy(optval, &v, sizeof(int));
			*optlen = sizeof(int);
		}
	}
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rfcntl(int socket, int cmd, ... /* arg */)
{
	struct rsocket *rs = rs_get(socket);
	va_list ap;
	long arg;
	int ret = 0;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	switch (cmd) {
	case F_GETFL:
		ret = O_RDWR | (rs->nonblock ? O_NONBLOCK : 0);
		break;
	case F_SETFL:
		va_start(ap, cmd);
		arg = va_arg(ap, long);
		va_end(ap);
		rs->nonblock = (arg & O_NONBLOCK) != 0;
		break;
	case F_GETFD:
		ret = fcntl(rs->fd, F_GETFD);
		break;
	case F_SETFD:
		va_start(ap, cmd);
		arg = va_arg(ap, long);
		va_end(ap);
		ret = fcntl(rs->fd, F_SETFD, (int)arg);
		break;
	default:
		ret = cma_err(EINVAL);
		break;
	}
	pthread_mutex_unlock(&rs->lock);
	return ret;
}
