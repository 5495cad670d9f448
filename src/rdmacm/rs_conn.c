/* SPDX-License-Identifier: MIT */
/*
 * rsockets: connections.  The endpoint (PD, CQ, QP, the rings and their
 * registrations, every receive posted) and the socket calls that make and
 * take connections: rsocket, rbind, rlisten, raccept, rconnect.
 */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <rdma/rsocket.h>

#include "rdmacm/cma.h"
#include "rdmacm/rsocket_priv.h"
#include "util/alloc.h"

/* ------------------------------------------------------------------ */
/* Endpoint                                                           */
/* ------------------------------------------------------------------ */

int rs_post_recv_slots(struct rsocket *rs, const uint32_t *slots, int n)
{
	struct ibv_recv_wr wr[32], *bad;
	struct ibv_sge sge[32];
	int i, done = 0;

	while (done < n) {
		int k = n - done > 32 ? 32 : n - done;

		for (i = 0; i < k; i++) {
			uint32_t s = slots[done + i];

			sge[i].addr = (uintptr_t)(rs->rslots + (size_t)s * RS_SLOT);
			sge[i].length = RS_SLOT;
			sge[i].lkey = rs->lmr->lkey;
			wr[i].wr_id = RS_WR_RECV | s;
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		if (ibv_post_recv(rs->qp, wr, &bad))
			return -1;
		done += k;
		rs->rx_posted += (uint64_t)k;
	}
	return 0;
}

/* Create PD, CQ, QP and buffers on rs->id (whose verbs is set) and post
 * every receive.  Lock held.  Returns 0 or -errno. */
static int rs_create_ep(struct rsocket *rs)
{
	struct ibv_qp_init_attr attr;
	struct ibv_device_attr dattr;
	struct ibv_context *ctx = rs->id->verbs;
	size_t rslots, sslots;
	uint32_t *slots = NULL;
	int ret, inl, i;

	if (!ctx)
		return -ENODEV;
	if (!ibv_query_device(ctx, &dattr)) {
		if (dattr.max_qp_wr > 0) {
			if (rs->sq_size > dattr.max_qp_wr)
				rs->sq_size = dattr.max_qp_wr;
			if (rs->rq_size > dattr.max_qp_wr)
				rs->rq_size = dattr.max_qp_wr;
		}
	}
	rs->pd = ibv_alloc_pd(ctx);
	if (!rs->pd)
		goto err;
	rs->cq_chan = ibv_create_comp_channel(ctx);
	if (!rs->cq_chan)
		goto err;
	if (fcntl(rs->cq_chan->fd, F_SETFL,
		  fcntl(rs->cq_chan->fd, F_GETFL) | O_NONBLOCK) < 0)
		goto err;
	rs->cq = ibv_create_cq(ctx, rs->sq_size + rs->rq_size, rs, rs->cq_chan, 0);
	if (!rs->cq)
		goto err;

	/* buffers: [receive slots | send slots | send buffer] and the ring */
	rslots = (size_t)rs->rq_size * RS_SLOT;
	sslots = (size_t)rs->sq_size * RS_SLOT;
	rs->lbuf_len = page_round(rslots + sslots + rs->sbuf_size);
	rs->lbuf = mmap(NULL, rs->lbuf_len, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rs->lbuf == MAP_FAILED) {
		rs->lbuf = NULL;
		goto err;
	}
	rs->rslots = rs->lbuf;
	rs->sslots = rs->lbuf + rslots;
	rs->sbuf = rs->lbuf + rslots + sslots;
	rs->rbuf_map = page_round(rs->rbuf_size);
	rs->rbuf = mmap(NULL, rs->rbuf_map, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rs->rbuf == MAP_FAILED) {
		rs->rbuf = NULL;
		goto err;
	}
	rs->lmr = ibv_reg_mr(rs->pd, rs->lbuf, rs->lbuf_len, IBV_ACCESS_LOCAL_WRITE);
	if (!rs->lmr)
		goto err;
	rs->rmr = ibv_reg_mr(rs->pd, rs->rbuf, rs->rbuf_size,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!rs->rmr)
		goto err;

	if (rs->iomap_size > 0) {
		rs->peer_iomap = urdma_zalloc_array((size_t)rs->iomap_size, sizeof(*rs->peer_iomap));
		if (!rs->peer_iomap)
			goto err;
	}

	/* the QP; an inline size the device refuses is halved until it fits */
	inl = rs->sq_inline;
	for (;;) {
		memset(&attr, 0, sizeof(attr));
		attr.qp_context = rs;
		attr.send_cq = rs->cq;
		attr.recv_cq = rs->cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = (uint32_t)rs->sq_size;
		attr.cap.max_recv_wr = (uint32_t)rs->rq_size;
		attr.cap.max_send_sge = 2;
		attr.cap.max_recv_sge = 1;
		attr.cap.max_inline_data = (uint32_t)inl;
		if (!rdma_create_qp(rs->id, rs->pd, &attr))
			break;
		if (inl == 0)
			goto err;
		inl /= 2;
	}
	rs->qp = rs->id->qp;
	rs->max_inline = rs->sq_inline < (int)attr.cap.max_inline_data ?
			 rs->sq_inline : (int)attr.cap.max_inline_data;
	if (rs->max_inline < 0)
		rs->max_inline = 0;

	slots = malloc(sizeof(*slots) * (size_t)rs->rq_size);
	if (!slots)
		goto err;
	for (i = 0; i < rs->rq_size; i++)
		slots[i] = (uint32_t)i;
	if (rs_post_recv_slots(rs, slots, rs->rq_size))
		goto err;
	free(slots);
	rs->rx_granted_reported = rs->rx_posted;
	return 0;

err:
	ret = errno ? -errno : -ENOMEM;
	free(slots);
	rs_free_ep(rs);
	return ret;
}

static void rs_format_conn_data(struct rsocket *rs, struct rs_conn_data *cd)
{
	memset(cd, 0, sizeof(*cd));
	cd->magic = htobe32(RS_CONN_MAGIC);
	cd->version = RS_PROTO_VERSION;
	cd->iomap_size = htobe16((uint16_t)rs->iomap_size);
	cd->credits = htobe32((uint32_t)rs->rx_posted);
	cd->rbuf_rkey = htobe32(rs->rmr->rkey);
	cd->rbuf_addr = htobe64((uintptr_t)rs->rbuf);
	cd->rbuf_size = htobe32(rs->rbuf_size);
}

bool rs_conn_data_ok(const void *pd, size_t len)
{
	struct rs_conn_data cd;

	if (!pd || len < sizeof(cd))
		return false;
	memcpy(&cd, pd, sizeof(cd));
	return be32toh(cd.magic) == RS_CONN_MAGIC &&
	       cd.version == RS_PROTO_VERSION && be32toh(cd.credits) >= 2 &&
	       be32toh(cd.rbuf_size) >= RS_MIN_BUF;
}

/* The peer's side of the connection, from its rs_conn_data. */
void rs_save_conn_data(struct rsocket *rs, const struct rs_conn_data *cd)
{
	rs->tx_addr = be64toh(cd->rbuf_addr);
	rs->tx_rkey = be32toh(cd->rbuf_rkey);
	rs->tx_size = be32toh(cd->rbuf_size);
	rs->tx_granted = be32toh(cd->credits);
	rs->peer_iomap_allow = be16toh(cd->iomap_size);
	if (rs->peer_iomap_allow > RS_MAX_IOMAP)
		rs->peer_iomap_allow = RS_MAX_IOMAP;
	rs->tx_sent = rs->tx_freed = rs->tx_msgs = 0;
}

/* ------------------------------------------------------------------ */
/* Socket calls                                                       */
/* ------------------------------------------------------------------ */

RS_EXPORT int rsocket(int domain, int type, int protocol)
{
	struct rsocket *rs;
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), ret;

	if (domain != AF_INET && domain != AF_INET6)
		return cma_err(EAFNOSUPPORT);
	if (base != SOCK_STREAM && base != SOCK_DGRAM)
		return cma_err(EPROTONOSUPPORT);
	if (protocol != 0 &&
	    protocol != (base == SOCK_STREAM ? IPPROTO_TCP : IPPROTO_UDP))
		return cma_err(EPROTONOSUPPORT);

	rs = rs_alloc(NULL, domain);
	if (!rs)
		return cma_err(ENOMEM);
	rs->nonblock = (type & SOCK_NONBLOCK) != 0;
	if (base == SOCK_DGRAM) {
		ret = rs_dg_create(rs, type & SOCK_CLOEXEC);
		if (!ret)
			ret = -rs_index_insert(rs);
		if (!ret)
			return rs->fd;
		rs_dg_free(rs);
		rs_free(rs);
		return cma_err(ret);
	}
	rs->chan = rdma_create_event_channel();
	if (!rs->chan)
		goto err;
	rs->fd = rs->chan->fd;
	if (rs_set_chan_flags(rs->chan))
		goto err;
	if (type & SOCK_CLOEXEC)
		fcntl(rs->fd, F_SETFD, FD_CLOEXEC);
	if (rdma_create_id(rs->chan, &rs->id, rs, RDMA_PS_TCP))
		goto err;
	ret = rs_index_insert(rs);
	if (ret) {
		errno = -ret;
		goto err;
	}
	return rs->fd;
err:
	ret = errno ? errno : ENOMEM;
	rs_free(rs);
	return cma_err(ret);
}

static int rs_check_addr(struct rsocket *rs, const struct sockaddr *addr,
			 socklen_t len)
{
	if (!addr)
		return EFAULT;
	if (len < (socklen_t)sizeof(sa_family_t))
		return EINVAL;
	if (addr->sa_family == AF_INET) {
		if (len < (socklen_t)sizeof(struct sockaddr_in))
			return EINVAL;
		if (rs->domain != AF_INET && rs->domain != AF_INET6)
			return EAFNOSUPPORT;
		return rs->domain == AF_INET6 && rs->v6only ? EAFNOSUPPORT : 0;
	}
	if (addr->sa_family == AF_INET6) {
		if (len < (socklen_t)sizeof(struct sockaddr_in6))
			return EINVAL;
		return rs->domain == AF_INET6 ? 0 : EAFNOSUPPORT;
	}
	return EAFNOSUPPORT;
}

RS_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	ret = rs_check_addr(rs, addr, addrlen);
	if (!ret && rs->dg) {
		ret = rs_dg_bind(rs, addr, addrlen);
		goto out;
	}
	if (!ret && (rs->bound || rs->state != RS_IDLE))
		ret = EINVAL;
	if (!ret && rdma_bind_addr(rs->id, (struct sockaddr *)addr))
		ret = errno ? errno : EADDRINUSE;
	if (!ret)
		rs->bound = true;
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT int rlisten(int socket, int backlog)
{
	struct rsocket *rs = rs_get(socket);
	int ret = 0;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	if (rs->dg) {
		ret = EOPNOTSUPP;	/* as UDP's listen */
		goto out;
	}
	if (backlog <= 0)
		backlog = 1;
	if (backlog > 4096)
		backlog = 4096;
	if (rs->state == RS_LISTENING) {
		rs->backlog = backlog;
		goto out;
	}
	if (rs->state != RS_IDLE) {
		ret = EINVAL;
		goto out;
	}
	if (!rs->bound) {
		struct sockaddr_storage ss;

		memset(&ss, 0, sizeof(ss));
		ss.ss_family = (sa_family_t)rs->domain;
		if (rdma_bind_addr(rs->id, (struct sockaddr *)&ss)) {
			ret = errno ? errno : EADDRINUSE;
			goto out;
		}
		rs->bound = true;
	}
	if (rdma_listen(rs->id, backlog)) {
		ret = errno ? errno : EADDRINUSE;
		goto out;
	}
	rs->backlog = backlog;
	rs->state = RS_LISTENING;
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

static bool rs_has_request(struct rsocket *rs)
{
	return rs->req_head != NULL || rs->state != RS_LISTENING;
}

void rs_copy_addr(struct sockaddr *dst, socklen_t *len,
		  const struct sockaddr *src, int domain)
{
	socklen_t sz;
	struct sockaddr_storage tmp;

	if (!dst || !len)
		return;
	memset(&tmp, 0, sizeof(tmp));
	if (src && src->sa_family == AF_INET6)
		sz = sizeof(struct sockaddr_in6);
	else if (src && src->sa_family == AF_INET)
		sz = sizeof(struct sockaddr_in);
	else {
		tmp.ss_family = (sa_family_t)domain;
		sz = domain == AF_INET6 ? sizeof(struct sockaddr_in6) :
					  sizeof(struct sockaddr_in);
		src = (struct sockaddr *)&tmp;
	}
	memcpy(dst, src, *len < sz ? *len : sz);
	*len = sz;
}

/* Accept one queued request into a new rsocket.  Listener lock held.
 * Returns the new fd or -errno. */
static int rs_accept_one(struct rsocket *ls, struct rs_req *r)
{
	struct rdma_conn_param param;
	struct rs_conn_data cd;
	struct rsocket *rs;
	int ret;

	rs = rs_alloc(ls, ls->domain);
	if (!rs) {
		rs_req_free(r, true);
		return -ENOMEM;
	}
	rs->chan = rdma_create_event_channel();
	if (!rs->chan || rs_set_chan_flags(rs->chan))
		goto err_reject;
	rs->fd = rs->chan->fd;
	if (rdma_migrate_id(r->id, rs->chan))
		goto err_reject;
	rs->id = r->id;
	rs->id->context = rs;
	rs_save_conn_data(rs, &r->cd);
	r->id = NULL;
	urdma_free(r);
	r = NULL;
	rs->bound = true;

	ret = rs_create_ep(rs);
	if (ret) {
		errno = -ret;
		goto err_reject;
	}
	memset(&param, 0, sizeof(param));
	rs_format_conn_data(rs, &cd);
	param.private_data = &cd;
	param.private_data_len = sizeof(cd);
	param.rnr_retry_count = 7;
	if (rdma_accept(rs->id, &param))
		goto err_reject;
	rs->state = RS_CONNECTED;
	rs->cm_next_check = urdma_now_ns() + RS_CM_CHECK_NS;
	ret = rs_index_insert(rs);
	if (ret) {
		errno = -ret;
		rdma_disconnect(rs->id);
		goto err;
	}
	return rs->fd;

err_reject:
	if (r) {
		ret = errno ? errno : ENOMEM;
		rs_req_free(r, true);
		errno = ret;
	} else if (rs->id) {
		ret = errno;
		rdma_reject(rs->id, NULL, 0);
		errno = ret;
	}
err:
	ret = errno ? -errno : -ENOMEM;
	rs_free(rs);
	return ret;
}

RS_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	struct rsocket *ls = rs_get(socket), *rs;
	struct rs_req *r;
	int ret;

	if (!ls)
		return -1;
	pthread_mutex_lock(&ls->lock);
	for (;;) {
		if (ls->state != RS_LISTENING) {
			pthread_mutex_unlock(&ls->lock);
			return cma_err(ls->dg ? EOPNOTSUPP : EINVAL);
		}
		ret = rs_wait(ls, rs_has_request, ls->nonblock, -1);
		if (ret) {
			pthread_mutex_unlock(&ls->lock);
			return cma_err(-ret);
		}
		if (ls->state != RS_LISTENING)
			continue;
		r = ls->req_head;
		ls->req_head = r->next;
		if (!ls->req_head)
			ls->req_tail = NULL;
		ls->req_count--;
		r->next = NULL;
		if (r->dead) {
			rs_req_free(r, false);
			continue;
		}
		ret = rs_accept_one(ls, r);
		if (ret < 0) {
			if (ls->nonblock) {
				pthread_mutex_unlock(&ls->lock);
				return cma_err(-ret == EAGAIN ? ECONNABORTED : -ret);
			}
			continue;
		}
		rs = rs_lookup(ret);
		pthread_mutex_lock(&rs->lock);
		rs_copy_addr(addr, addrlen, rdma_get_peer_addr(rs->id), rs->domain);
		pthread_mutex_unlock(&rs->lock);
		pthread_mutex_unlock(&ls->lock);
		return ret;
	}
}

/* After the route is resolved: endpoint, then rdma_connect.  Lock held. */
void rs_start_connect(struct rsocket *rs)
{
	struct rdma_conn_param param;
	struct rs_conn_data cd;
	int ret;

	ret = rs_create_ep(rs);
	if (ret) {
		rs_fail_connect(rs, -ret);
		return;
	}
	memset(&param, 0, sizeof(param));
	rs_format_conn_data(rs, &cd);
	param.private_data = &cd;
	param.private_data_len = sizeof(cd);
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	if (rdma_connect(rs->id, &param)) {
		rs_fail_connect(rs, errno ? errno : ECONNREFUSED);
		return;
	}
	rs->state = RS_CONNECTING;
}

bool rs_connect_done(struct rsocket *rs)
{
	return rs->state == RS_CONNECTED || rs->state == RS_FAILED;
}

RS_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	struct rsocket *rs = rs_get(socket);
	int ret;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	if (rs->dg) {
		if (!addr)
			ret = EFAULT;
		else if (addrlen >= (socklen_t)sizeof(sa_family_t) &&
			 addr->sa_family == AF_UNSPEC)
			ret = rs_dg_connect(rs, addr, addrlen);
		else if (!(ret = rs_check_addr(rs, addr, addrlen)))
			ret = rs_dg_connect(rs, addr, addrlen);
		goto out;
	}
	switch (rs->state) {
	case RS_CONNECTED:
		ret = EISCONN;
		goto out;
	case RS_ADDR_QUERY:
	case RS_ROUTE_QUERY:
	case RS_CONNECTING:
		ret = EALREADY;
		goto out;
	case RS_LISTENING:
		ret = EINVAL;
		goto out;
	case RS_FAILED:
		ret = rs->err ? rs->err : ECONNREFUSED;
		rs->err = 0;
		goto out;
	case RS_IDLE:
		break;
	}
	ret = rs_check_addr(rs, addr, addrlen);
	if (ret)
		goto out;
	if (rdma_resolve_addr(rs->id, NULL, (struct sockaddr *)addr, RS_RESOLVE_MS)) {
		ret = errno ? errno : EHOSTUNREACH;
		goto out;
	}
	rs->state = RS_ADDR_QUERY;
	rs->err = 0;
	if (rs->nonblock) {
		rs_progress(rs);
		ret = rs->state == RS_CONNECTED ? 0 : EINPROGRESS;
		if (rs->state == RS_FAILED) {
			ret = rs->err;
			rs->err = 0;
		}
		goto out;
	}
	rs_wait(rs, rs_connect_done, false, -1);
	if (rs->state == RS_CONNECTED)
		ret = 0;
	else {
		ret = rs->err ? rs->err : ECONNREFUSED;
		rs->err = 0;
	}
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}
