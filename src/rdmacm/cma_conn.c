// SPDX-License-Identifier: MIT
/*
 * The connection protocol: listening, connecting, accepting, rejecting and
 * disconnecting (the application's side), and the CM thread's side: new
 * connections on a listener, reading and acting on CM messages, a socket
 * that ends, timeouts.  docs/rdmacm.md has the messages.
 */
#include "rdmacm/cma_priv.h"
#include "util/alloc.h"
#include "util/list.h"
#include "util/log.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ---- listening and connecting ------------------------------------------- */

static int cma_watch(struct cma_id *cid, uint32_t events, int op)
{
	struct epoll_event ev = { .events = events, .data.u64 = cid->handle };

	return epoll_ctl(cma_epfd, op, cid->fd, &ev);
}

EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct cma_id *cid;
	int e;

	cma_release_held();
	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state == CS_IDLE) {
		struct sockaddr_in any = { .sin_family = AF_INET };

		if (cma_bind_locked(cid, (struct sockaddr *)&any))
			goto fail;
	}
	if (cid->state != CS_BOUND) {
		errno = EINVAL;
		goto fail;
	}
	if (listen(cid->fd, backlog > 0 ? backlog : SOMAXCONN) ||
	    cma_watch(cid, EPOLLIN, EPOLL_CTL_ADD))
		goto fail;
	cid->state = CS_LISTEN;
	pthread_mutex_unlock(&cma_lock);
	return 0;
fail:
	e = errno;
	pthread_mutex_unlock(&cma_lock);
	return cma_err(e);
}

static bool cma_pdata_ok(const struct rdma_conn_param *p)
{
	return !p || (p->private_data_len <= CMA_MAX_PDATA &&
		      (!p->private_data_len || p->private_data));
}

static void cma_take_param(struct cma_id *cid, const struct rdma_conn_param *p,
			   bool passive)
{
	if (!p)
		return;
	cid->responder_resources = p->responder_resources < cma_dev_attr.max_qp_rd_atom ?
					   p->responder_resources :
					   cma_dev_attr.max_qp_rd_atom;
	cid->initiator_depth = p->initiator_depth < cma_dev_attr.max_qp_init_rd_atom ?
				       p->initiator_depth :
				       cma_dev_attr.max_qp_init_rd_atom;
	if (!passive) /* "ignored when accepting": the requester's count */
		cid->retry_count = p->retry_count > 7 ? 7 : p->retry_count;
	cid->rnr_retry = p->rnr_retry_count > 7 ? 7 : p->rnr_retry_count;
	cid->qp_num = p->qp_num & 0xffffff; /* for a QP that is not ours */
}

EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cma_id *cid;
	int e = 0;

	cma_release_held();
	if (!id || !cma_pdata_ok(conn_param))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_ROUTE_RESOLVED && cid->state != CS_ADDR_RESOLVED) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	if (!id->qp && !conn_param) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	cma_take_param(cid, conn_param, false);
	/* The REQ's private data waits in rbuf until the socket connects. */
	cid->rlen = conn_param ? conn_param->private_data_len : 0;
	if (cid->rlen)
		memcpy(cid->rbuf, conn_param->private_data, cid->rlen);
	if (connect(cid->fd, &id->route.addr.dst_addr,
		    sa_len(&id->route.addr.dst_addr)) && errno != EINPROGRESS) {
		e = errno;
	} else {
		socklen_t l = sizeof(id->route.addr.src_storage);

		/* the port connect() chose (cma_bind_sock) */
		getsockname(cid->fd, &id->route.addr.src_addr, &l);
	}
	cid->state = CS_CONNECTING;
	if (e) {
		cid->state = CS_FAILED;
		cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, -e, NULL);
	} else if (cma_watch(cid, EPOLLOUT, EPOLL_CTL_ADD)) {
		e = errno;
		cid->state = CS_ROUTE_RESOLVED;
		pthread_mutex_unlock(&cma_lock);
		return cma_err(e);
	} else if (cma_deadline(cid, CMA_CONNECT_TIMEOUT_MS)) {
		/* The CM thread must wait less (it watches the socket
		 * already: epoll needs no wake-up for that). */
		cma_kick();
	}
	pthread_mutex_unlock(&cma_lock);
	if (!cid->sync)
		return 0;
	return cma_sync_wait(cid, id->qp || id->qp_type == IBV_QPT_UD ?
					  RDMA_CM_EVENT_ESTABLISHED :
					  RDMA_CM_EVENT_CONNECT_RESPONSE);
}

EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct cma_id *cid;
	int ret;

	cma_release_held();
	if (!id || !cma_pdata_ok(conn_param))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_REQ_RCVD || (!id->qp && !conn_param)) {
		ret = cid->state == CS_FAILED ? ECONNRESET : EINVAL;
		pthread_mutex_unlock(&cma_lock);
		return cma_err(ret);
	}
	if (conn_param) {
		cma_take_param(cid, conn_param, true);
	} else {
		/* As many as the requester can use. */
		if (cid->peer.initiator_depth < cid->responder_resources)
			cid->responder_resources = cid->peer.initiator_depth;
		if (cid->peer.responder_resources < cid->initiator_depth)
			cid->initiator_depth = cid->peer.responder_resources;
	}
	/* (a UD QP is ready already: the REP tells its number and Q_Key) */
	ret = id->qp_type == IBV_QPT_UD ? 0 : cma_qp_connect(cid);
	if (!ret)
		ret = cma_send(cid, CMA_REP, conn_param ? conn_param->private_data : NULL,
			       conn_param ? conn_param->private_data_len : 0, 0);
	if (ret) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(-ret);
	}
	if (id->qp_type == IBV_QPT_UD) { /* the exchange is over */
		cma_close_fd(cid);
		cid->state = CS_UD_DONE;
		pthread_mutex_unlock(&cma_lock);
		return 0;
	}
	cid->state = CS_REP_SENT;
	pthread_mutex_unlock(&cma_lock);
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data,
		       uint8_t private_data_len)
{
	struct cma_id *cid;
	int ret;

	if (!id || private_data_len > CMA_MAX_PDATA ||
	    (private_data_len && !private_data))
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_REQ_RCVD) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	ret = cma_send(cid, CMA_REJ, private_data, private_data_len,
		       CMA_REJ_CONSUMER);
	cma_close_fd(cid);
	cid->state = CS_REJECTED;
	pthread_mutex_unlock(&cma_lock);
	return ret ? cma_err(-ret) : 0;
}

EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data,
			   uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	struct cma_id *cid;
	int ret;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (cid->state != CS_REP_RCVD) {
		pthread_mutex_unlock(&cma_lock);
		return cma_err(EINVAL);
	}
	ret = cma_send(cid, CMA_RTU, NULL, 0, 0);
	if (!ret)
		cid->state = CS_ESTABLISHED;
	pthread_mutex_unlock(&cma_lock);
	return ret ? cma_err(-ret) : 0;
}

/* The connection is over: report it once; by_peer: the QP goes to ERR as
 * the application takes the event.  Under cma_lock. */
static void cma_disconnected(struct cma_id *cid, bool by_peer)
{
	struct cma_event *e;

	cma_close_fd(cid);
	cid->state = CS_DISCONNECTED;
	e = cma_post(cid, RDMA_CM_EVENT_DISCONNECTED, 0, NULL);
	if (e)
		e->qp_err = by_peer;
}

EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct cma_id *cid;
	int ret = 0;

	if (!id)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	switch (cid->state) {
	case CS_ESTABLISHED:
	case CS_REP_SENT:
	case CS_REP_RCVD:
		/* Flushed first, as the peer will flush when told. */
		cma_qp_error(cid);
		cma_send(cid, CMA_DREQ, NULL, 0, 0);
		cma_disconnected(cid, false);
		break;
	case CS_DISCONNECTED: /* the peer went first: nothing more to say */
		break;
	default:
		ret = cma_err(EINVAL);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

/* ---- the CM thread's side ----------------------------------------------- */

/* A new connection on a listener: a child id, unseen until its REQ. */
static void cma_accept_one(struct cma_id *lis)
{
	struct cma_channel *c;
	struct cma_id *cid;
	int fd = accept4(lis->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	int one = 1;

	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			urdma_warn("accept: %s", strerror(errno));
		return;
	}
	c = lis->sync ? cma_channel_new(true) : to_cch(lis->id.channel);
	cid = c ? cma_id_new(c, lis->id.context, lis->id.ps) : NULL;
	if (!cid) {
		if (c && c->sync)
			cma_channel_free(c);
		close(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	cid->fd = fd;
	cid->listen = lis;
	lis->nchildren++;
	cid->state = CS_ACCEPT_WAIT;
	cid->tos = lis->tos;
	cid->ack_timeout = lis->ack_timeout;
	cma_set_route(cid, true);
	cma_deadline(cid, CMA_REQ_TIMEOUT_MS);
	if (cma_watch(cid, EPOLLIN, EPOLL_CTL_ADD))
		cma_id_free(cid);
}

/* Free an id the application never saw.  Under cma_lock. */
void cma_id_free(struct cma_id *cid)
{
	struct cma_channel *c = to_cch(cid->id.channel);

	cma_close_fd(cid);
	cma_id_unlink(cid);
	if (c->sync)
		cma_channel_free(c);
	urdma_free(cid);
}

/* Read what the socket has.  1: a whole message in rbuf, 0: not yet,
 * -errno: the connection ended or sent garbage (-EPROTO). */
static int cma_recv(struct cma_id *cid)
{
	struct cma_msg *m = (struct cma_msg *)cid->rbuf;
	size_t want = sizeof(*m);

	for (;;) {
		ssize_t r;

		if (cid->rlen >= sizeof(*m)) {
			if (ntohl(m->magic) != CMA_MAGIC || m->pdata_len > CMA_MAX_PDATA ||
			    m->type < CMA_REQ || m->type > CMA_DREQ)
				return -EPROTO;
			want = sizeof(*m) + m->pdata_len;
			if (cid->rlen == want)
				return 1;
		}
		r = recv(cid->fd, cid->rbuf + cid->rlen, want - cid->rlen, 0);
		if (r > 0) {
			cid->rlen += r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		return -errno;
	}
}

/* Is the connected socket fd connected to itself?  TCP's simultaneous open
 * does that to a socket that connects to the address and port it is
 * bound to (an ephemeral port that a listener had just freed, say). */
static bool cma_self_connected(int fd)
{
	struct sockaddr_storage a, b;
	socklen_t la = sizeof(a), lb = sizeof(b);

	return !getsockname(fd, (struct sockaddr *)&a, &la) &&
	       !getpeername(fd, (struct sockaddr *)&b, &lb) && la == lb &&
	       !memcmp(&a, &b, la);
}

static void cma_connected_out(struct cma_id *cid)
{
	int err = 0;
	socklen_t l = sizeof(err);
	uint8_t pdata[CMA_MAX_PDATA];
	size_t plen = cid->rlen;

	getsockopt(cid->fd, SOL_SOCKET, SO_ERROR, &err, &l);
	/* Nobody listens there: refused, as a port nobody listens on is. */
	if (!err && cma_self_connected(cid->fd))
		err = ECONNREFUSED;
	memcpy(pdata, cid->rbuf, plen);
	cid->rlen = 0;
	if (!err) {
		cma_set_route(cid, true);
		err = -cma_send(cid, CMA_REQ, pdata, plen, 0);
	}
	if (err || cma_watch(cid, EPOLLIN, EPOLL_CTL_MOD)) {
		cma_close_fd(cid);
		cid->state = CS_FAILED;
		cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, -(err ? err : errno), NULL);
		return;
	}
	cma_deadline(cid, 0);
	cid->state = CS_REQ_SENT;
}

static void cma_handle_msg(struct cma_id *cid, const struct cma_msg *m)
{
	int ret;

	switch (cid->state) {
	case CS_ACCEPT_WAIT:
		if (m->type != CMA_REQ)
			break;
		/* A request of another port space (its service ID, on IB) is
		 * not for this listener: RC and UD ids don't meet. */
		if (ntohl(m->reason) && ntohl(m->reason) != cid->id.ps) {
			cma_send(cid, CMA_REJ, NULL, 0, CMA_REJ_INVALID_SID);
			cma_id_free(cid);
			return;
		}
		cid->peer = *m;
		cma_deadline(cid, 0);
		cid->state = CS_REQ_RCVD;
		{
			struct cma_event *e = cma_post(cid, RDMA_CM_EVENT_CONNECT_REQUEST,
						       0, m);
			if (e) {
				/* Reported on the listener, which counts it. */
				e->ev.listen_id = &cid->listen->id;
				e->owner = cid->listen;
				if (cid->sync) {
					/* rdma_get_request reads the listener's
					 * channel: move it there. */
					struct cma_channel *c = to_cch(cid->id.channel);
					struct cma_channel *lc = to_cch(cid->listen->id.channel);
					list_del(&e->node);
					cma_channel_sync(c);
					list_add_tail(&e->node, &lc->events);
					cma_channel_sync(lc);
				}
			}
		}
		return;
	case CS_REQ_SENT:
		if (m->type == CMA_REJ && cid->id.qp_type == IBV_QPT_UD) {
			/* As a SIDR reply that rejects. */
			cma_close_fd(cid);
			cid->state = CS_REJECTED;
			cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, CMA_SIDR_REJECT, m);
			return;
		}
		if (m->type == CMA_REJ) {
			cma_close_fd(cid);
			cid->state = CS_REJECTED;
			cma_post(cid, RDMA_CM_EVENT_REJECTED, (int)ntohl(m->reason), m);
			return;
		}
		if (m->type != CMA_REP)
			break;
		cid->peer = *m;
		if (cid->id.qp_type == IBV_QPT_UD) {
			/* The peer's QP number, Q_Key and address: no RTU. */
			cma_close_fd(cid);
			cid->state = CS_UD_DONE;
			cma_post(cid, RDMA_CM_EVENT_ESTABLISHED, 0, m);
			return;
		}
		if (!cid->id.qp) {
			cid->state = CS_REP_RCVD;
			cma_post(cid, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, m);
			return;
		}
		ret = cma_qp_connect(cid);
		if (!ret)
			ret = cma_send(cid, CMA_RTU, NULL, 0, 0);
		if (ret) {
			cma_qp_error(cid);
			cma_close_fd(cid);
			cid->state = CS_FAILED;
			cma_post(cid, RDMA_CM_EVENT_CONNECT_ERROR, ret, NULL);
			return;
		}
		cid->state = CS_ESTABLISHED;
		cma_post(cid, RDMA_CM_EVENT_ESTABLISHED, 0, m);
		return;
	case CS_REP_SENT:
		if (m->type == CMA_RTU) {
			cid->state = CS_ESTABLISHED;
			cma_post(cid, RDMA_CM_EVENT_ESTABLISHED, 0, NULL);
			return;
		}
		if (m->type == CMA_DREQ) {
			cma_disconnected(cid, true);
			return;
		}
		break;
	case CS_ESTABLISHED:
	case CS_REP_RCVD:
		if (m->type == CMA_DREQ) {
			cma_disconnected(cid, true);
			return;
		}
		break;
	default:
		break;
	}
	urdma_warn("cm id %p: unexpected CM message %u in state %d",
		   (void *)&cid->id, m->type, cid->state);
	cma_closed(cid, -EPROTO);
}

/* The socket ended (or broke the protocol) with error e.  Under cma_lock. */
void cma_closed(struct cma_id *cid, int e)
{
	switch (cid->state) {
	case CS_ACCEPT_WAIT: /* nobody has seen it */
		cma_id_free(cid);
		return;
	case CS_CONNECTING:
	case CS_REQ_SENT:
		cma_close_fd(cid);
		cid->state = CS_FAILED;
		cma_post(cid, RDMA_CM_EVENT_UNREACHABLE, e, NULL);
		return;
	case CS_REQ_RCVD:
	case CS_REP_SENT: {
		struct cma_event *ev;

		cma_close_fd(cid);
		cid->state = CS_FAILED;
		ev = cma_post(cid, RDMA_CM_EVENT_CONNECT_ERROR, e, NULL);
		if (ev)
			ev->qp_err = true;
		return;
	}
	case CS_ESTABLISHED:
	case CS_REP_RCVD:
		cma_disconnected(cid, true);
		return;
	default:
		cma_close_fd(cid);
	}
}

void cma_handle_io(struct cma_id *cid)
{
	int r;

	if (cid->state == CS_LISTEN) {
		cma_accept_one(cid);
		return;
	}
	if (cid->state == CS_CONNECTING) {
		cma_connected_out(cid);
		return;
	}
	while ((r = cma_recv(cid)) == 1) {
		uint8_t buf[sizeof(struct cma_msg) + CMA_MAX_PDATA];
		uint64_t handle = cid->handle;

		memcpy(buf, cid->rbuf, cid->rlen);
		cid->rlen = 0;
		cma_handle_msg(cid, (struct cma_msg *)buf);
		if (!cma_find(handle) || cid->fd < 0)
			return; /* closed (or freed) on the way */
	}
	if (r < 0)
		cma_closed(cid, r);
}
