/* SPDX-License-Identifier: MIT */
/*
 * rsockets: direct data placement (riomap, riounmap, riowrite).
 */

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <rdma/rsocket.h>

#include "rdmacm/cma.h"
#include "rdmacm/rsocket_priv.h"
#include "util/alloc.h"

/* ------------------------------------------------------------------ */
/* Direct data placement                                              */
/* ------------------------------------------------------------------ */

static int rs_queue_iomap(struct rsocket *rs, const struct rs_iomap_local *m,
			  bool unmap)
{
	struct rs_iomap_msg *q = urdma_zalloc(sizeof(*q));

	if (!q)
		return -ENOMEM;
	q->index = (uint16_t)m->index;
	q->rkey = m->mr->rkey;
	q->offset = m->offset;
	q->addr = (uintptr_t)m->buf;
	q->len = unmap ? 0 : m->len;
	if (rs->iomap_q_tail)
		rs->iomap_q_tail->next = q;
	else
		rs->iomap_q = q;
	rs->iomap_q_tail = q;
	return 0;
}

RS_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags,
		       off_t offset)
{
	struct rsocket *rs = rs_get(socket);
	struct rs_iomap_local *m, *it;
	bool used[RS_MAX_IOMAP + 1];
	int ret = 0, idx = -1;

	if (!rs)
		return -1;
	if (!buf || !len || flags || (prot != PROT_WRITE && prot != PROT_NONE) ||
	    (offset < 0 && offset != -1))
		return cma_err(EINVAL);
	pthread_mutex_lock(&rs->lock);
	if (rs->dg || rs->state != RS_CONNECTED || !rs->pd || rs->conn_dead) {
		ret = rs->dg ? EOPNOTSUPP : EINVAL;	/* no iomaps on UD */
		goto out;
	}
	if (prot == PROT_WRITE) {
		memset(used, 0, sizeof(bool) * (size_t)(rs->peer_iomap_allow + 1));
		for (it = rs->iomaps; it; it = it->next)
			if (it->index >= 0 && it->index < rs->peer_iomap_allow)
				used[it->index] = true;
		for (int i = 0; i < rs->peer_iomap_allow; i++)
			if (!used[i]) {
				idx = i;
				break;
			}
		if (idx < 0) {
			ret = ENOMEM;
			goto out;
		}
	}
	m = urdma_zalloc(sizeof(*m));
	if (!m) {
		ret = ENOMEM;
		goto out;
	}
	m->mr = ibv_reg_mr(rs->pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
			   (prot == PROT_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0));
	if (!m->mr) {
		ret = errno ? errno : ENOMEM;
		urdma_free(m);
		goto out;
	}
	m->buf = buf;
	m->len = len;
	m->offset = offset == -1 ? (uint64_t)(uintptr_t)buf : (uint64_t)offset;
	m->index = idx;
	if (idx >= 0 && rs_queue_iomap(rs, m, false)) {
		ibv_dereg_mr(m->mr);
		urdma_free(m);
		ret = ENOMEM;
		goto out;
	}
	m->next = rs->iomaps;
	rs->iomaps = m;
	rs_progress(rs);	/* sends the update if it can */
	offset = (off_t)m->offset;
out:
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : offset;
}

RS_EXPORT int riounmap(int socket, void *buf, size_t len)
{
	struct rsocket *rs = rs_get(socket);
	struct rs_iomap_local **pp, *m;
	int ret = EINVAL;

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	for (pp = &rs->iomaps; (m = *pp); pp = &m->next) {
		if (m->buf != buf || m->len != len)
			continue;
		*pp = m->next;
		if (m->index >= 0 && !rs->conn_dead)
			rs_queue_iomap(rs, m, true);
		ibv_dereg_mr(m->mr);
		urdma_free(m);
		rs_progress(rs);
		ret = 0;
		break;
	}
	pthread_mutex_unlock(&rs->lock);
	return ret ? cma_err(ret) : 0;
}

RS_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset,
			  int flags)
{
	struct rsocket *rs = rs_get(socket);
	struct iovec iov = { (void *)buf, count };
	struct rs_iter it = { &iov, 1, 0 };
	size_t done = 0;
	bool nonblock;
	int ret = 0;

	if (!rs)
		return (size_t)-1;
	if ((count && !buf) || offset < 0)
		return (size_t)cma_err(count && !buf ? EFAULT : EINVAL);
	pthread_mutex_lock(&rs->lock);
	nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	if (rs->dg || rs->state != RS_CONNECTED) {
		ret = rs->dg ? EOPNOTSUPP : ENOTCONN;
		goto out;
	}
	if (rs->cq)
		rs_poll_cq(rs);
	while (done < count) {
		struct rs_iomap_peer *p = NULL;
		uint64_t off = (uint64_t)offset + done, chunk;

		if (rs->conn_dead || rs->wr_shut) {
			if (!done)
				ret = rs->wr_shut ? EPIPE : rs_send_error(rs);
			break;
		}
		for (int i = 0; rs->peer_iomap && i < rs->iomap_size; i++) {
			struct rs_iomap_peer *e = &rs->peer_iomap[i];

			if (e->len && off >= e->offset && off - e->offset < e->len) {
				p = e;
				break;
			}
		}
		if (!p) {
			if (!done)
				ret = EINVAL;	/* no mapping of the peer there */
			break;
		}
		if (!(rs_sq_free(rs) && rs_sbuf_free(rs) > 0)) {
			int w = rs_wait(rs, rs_can_iowrite, nonblock, -1);

			if (w == -EAGAIN) {
				if (!done)
					ret = EAGAIN;
				break;
			}
			continue;
		}
		chunk = count - done;
		if (chunk > RS_MAX_CHUNK)
			chunk = RS_MAX_CHUNK;
		if (chunk > p->len - (off - p->offset))
			chunk = p->len - (off - p->offset);
		if (!rs_inline_ok(rs, &it, chunk) && chunk > rs_sbuf_free(rs))
			chunk = rs_sbuf_free(rs);
		if (rs_post_data(rs, &it, chunk, p->addr + (off - p->offset),
				 p->rkey, false))
			continue;
		done += chunk;
	}
out:
	pthread_mutex_unlock(&rs->lock);
	if (ret)
		return (size_t)cma_err(ret);
	return done;
}
