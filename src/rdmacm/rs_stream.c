/* SPDX-License-Identifier: MIT */
/*
 * rsockets: the stream.  Sending (data as RDMA WRITE WITH IMMEDIATE into
 * the peer's ring, control messages, which WRs are signalled) and the data
 * calls: rsend, rrecv, rread, rwrite and their vector and msg forms.
 */

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "rdmacm/cma.h"
#include "rdmacm/rsocket_priv.h"
#include "util/alloc.h"

/* ------------------------------------------------------------------ */
/* Sending                                                            */
/* ------------------------------------------------------------------ */

/*
 * Signal a send WR only now and then: its completion retires the
 * unsignalled ones before it (RC completes in order), and over TCP every
 * signalled WR costs a confirmation.  Signalled: control messages (rclose
 * waits for the last one), every 64th WR, a WR that leaves half the send
 * queue in use, and one that brings the send buffer bytes not yet
 * signalled to an eighth of the buffer, so the buffer frees steadily (one
 * completion per 64 KiB of a 512 KiB buffer: large sends over TCP ran 2-5x
 * slower when their completions came in lumps).  A sender waiting for SQ
 * or buffer space always has a completion coming.
 */
static void rs_sign(struct rsocket *rs, struct ibv_send_wr *wr, uint64_t sbytes,
		    bool force)
{
	uint32_t cnt = rs->unsig_cnt + 1;
	uint64_t bytes = rs->unsig_bytes + sbytes;

	if (force || cnt >= 64 || rs->sq_used + 1 >= rs->sq_size / 2 ||
	    bytes >= rs->sbuf_size / 8) {
		wr->send_flags |= IBV_SEND_SIGNALED;
		wr->wr_id = ((uint64_t)cnt << 40) | bytes;
		rs->unsig_cnt = 0;
		rs->unsig_bytes = 0;
	} else {
		wr->wr_id = 0;
		rs->unsig_cnt = cnt;
		rs->unsig_bytes = bytes;
	}
}

/* The connection fails: nothing more goes over the QP.  err is reported
 * only if the peer did not end its stream cleanly. */
void rs_conn_fail(struct rsocket *rs, int err)
{
	if (rs->conn_dead)
		return;
	rs->conn_dead = true;
	if (err && !rs->peer_shut && !rs->closing && !rs->err)
		rs->err = err;
}

/* Post a control message (credits always ride along).  Needs an SQ slot
 * and min_credits credits.  Returns 0, or -EAGAIN without resources. */
static int rs_post_ctl(struct rsocket *rs, uint8_t type, uint64_t min_credits,
		       const struct rs_iomap_msg *im)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct rs_msg *m;
	uint32_t slot;

	if (rs->conn_dead)
		return -EPIPE;
	if (!rs_sq_free(rs) || rs_credits(rs) < min_credits)
		return -EAGAIN;
	slot = rs->ctl_seq++ % (uint32_t)rs->sq_size;
	m = (struct rs_msg *)(rs->sslots + (size_t)slot * RS_SLOT);
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->version = RS_PROTO_VERSION;
	m->freed = htobe64(rs->rx_head);
	m->granted = htobe64(rs->rx_posted);
	if (im) {
		m->index = htobe16(im->index);
		m->rkey = htobe32(im->rkey);
		m->offset = htobe64(im->offset);
		m->addr = htobe64(im->addr);
		m->len = htobe64(im->len);
	}
	sge.addr = (uintptr_t)m;
	sge.length = sizeof(*m);
	sge.lkey = rs->lmr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	rs_sign(rs, &wr, 0, true);
	if (ibv_post_send(rs->qp, &wr, &bad)) {
		rs_conn_fail(rs, ECONNRESET);
		return -EPIPE;
	}
	rs->sq_used++;
	rs->tx_msgs++;
	rs->rx_reported = rs->rx_head;
	rs->rx_granted_reported = rs->rx_posted;
	return 0;
}

/* Send a credit update if the peer needs one. */
void rs_update_credits(struct rsocket *rs)
{
	uint64_t unreported = rs->rx_head - rs->rx_reported;
	uint64_t peer_left = rs->rx_granted_reported - rs->rx_msgs;

	if (rs->conn_dead || !rs->qp)
		return;
	if (unreported >= rs->rbuf_size / 4 ||
	    (peer_left <= (uint64_t)rs->rq_size / 2 &&
	     rs->rx_posted > rs->rx_granted_reported))
		rs_post_ctl(rs, RS_MSG_CREDIT, 1, NULL);
}

/* Post queued control messages (iomap updates, then shutdown). */
void rs_flush_ctl(struct rsocket *rs)
{
	while (rs->iomap_q && !rs->conn_dead) {
		struct rs_iomap_msg *q = rs->iomap_q;

		if (rs_post_ctl(rs, RS_MSG_IOMAP, 2, q))
			return;
		rs->iomap_q = q->next;
		if (!rs->iomap_q)
			rs->iomap_q_tail = NULL;
		urdma_free(q);
	}
	if (rs->wr_shut && !rs->shut_sent && !rs->conn_dead &&
	    !rs_post_ctl(rs, RS_MSG_SHUTDOWN, 2, NULL))
		rs->shut_sent = true;
}

/* ------------------------------------------------------------------ */
/* Data transfer                                                      */
/* ------------------------------------------------------------------ */

static void iter_skip_empty(struct rs_iter *it)
{
	while (it->cnt > 0 && it->off >= it->iov->iov_len) {
		it->iov++;
		it->cnt--;
		it->off = 0;
	}
}

/* Copy len bytes between buf and the iterator: out of the iovecs into buf
 * (to_buf), or from buf into them. */
void rs_iter_copy(struct rs_iter *it, uint8_t *buf, size_t len, bool to_buf)
{
	while (len) {
		uint8_t *at;
		size_t n;

		iter_skip_empty(it);
		n = it->iov->iov_len - it->off;
		if (n > len)
			n = len;
		at = (uint8_t *)it->iov->iov_base + it->off;
		if (to_buf)
			memcpy(buf, at, n);
		else
			memcpy(at, buf, n);
		buf += n;
		it->off += n;
		len -= n;
	}
}

/* Can len bytes at the iterator go inline (one contiguous piece)? */
bool rs_inline_ok(const struct rsocket *rs, struct rs_iter *it, size_t len)
{
	iter_skip_empty(it);
	return (int64_t)len <= rs->max_inline && it->cnt > 0 &&
	       it->iov->iov_len - it->off >= len;
}

/* Room for a data WR now: a send slot, credits (one kept for control
 * messages), space in the peer's ring and in ours, no riowrite queued. */
static bool rs_send_room(struct rsocket *rs)
{
	return rs_sq_free(rs) && rs_credits(rs) >= 2 && rs_tx_space(rs) > 0 &&
	       rs_sbuf_free(rs) > 0 && !rs->iomap_q;
}

/* A sender would not wait: room, or nothing more will ever go. */
bool rs_can_send(struct rsocket *rs)
{
	return rs->conn_dead || rs->wr_shut || rs_send_room(rs);
}

bool rs_can_iowrite(struct rsocket *rs)
{
	return rs->conn_dead || rs->wr_shut ||
	       (rs_sq_free(rs) && rs_sbuf_free(rs) > 0);
}

/* Post one RDMA WRITE (with immediate if imm) of len bytes taken from the
 * iterator to raddr.  Uses inline data when it can, else the send buffer
 * (which must have len bytes free).  Lock held; resources checked. */
int rs_post_data(struct rsocket *rs, struct rs_iter *it, size_t len,
		 uint64_t raddr, uint32_t rkey, bool imm)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge[2];
	uint64_t sbytes = 0;

	memset(&wr, 0, sizeof(wr));
	if (rs_inline_ok(rs, it, len)) {
		sge[0].addr = (uintptr_t)it->iov->iov_base + it->off;
		sge[0].length = (uint32_t)len;
		sge[0].lkey = 0;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_INLINE;
		it->off += len;
	} else {
		uint64_t pos = rs->sb_head % rs->sbuf_size;
		size_t first = rs->sbuf_size - pos;

		if (first > len)
			first = len;
		rs_iter_copy(it, rs->sbuf + pos, first, true);
		sge[0].addr = (uintptr_t)(rs->sbuf + pos);
		sge[0].length = (uint32_t)first;
		sge[0].lkey = rs->lmr->lkey;
		wr.num_sge = 1;
		if (first < len) {
			rs_iter_copy(it, rs->sbuf, len - first, true);
			sge[1].addr = (uintptr_t)rs->sbuf;
			sge[1].length = (uint32_t)(len - first);
			sge[1].lkey = rs->lmr->lkey;
			wr.num_sge = 2;
		}
		sbytes = len;
	}
	wr.sg_list = sge;
	wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	rs_sign(rs, &wr, sbytes, false);
	if (imm)
		wr.imm_data = htobe32((uint32_t)len);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(rs->qp, &wr, &bad)) {
		rs_conn_fail(rs, ECONNRESET);
		return -EPIPE;
	}
	rs->sq_used++;
	rs->sb_head += sbytes;
	return 0;
}

/* A send or receive on a socket still connecting waits for the connection
 * (blocking) or fails with EAGAIN, as TCP does.  Lock held.  Returns 0 or
 * an errno value. */
static int rs_wait_connected(struct rsocket *rs, bool nonblock)
{
	int e;

	if (rs->state != RS_ADDR_QUERY && rs->state != RS_ROUTE_QUERY &&
	    rs->state != RS_CONNECTING && rs->state != RS_FAILED)
		return 0;
	if (rs_wait(rs, rs_connect_done, nonblock, -1) == -EAGAIN)
		return EAGAIN;
	if (rs->state == RS_FAILED) {
		e = rs->err ? rs->err : ECONNREFUSED;
		rs->err = 0;
		return e;
	}
	return 0;
}

/* The error a send on a socket that cannot send reports. */
int rs_send_error(struct rsocket *rs)
{
	int e;

	if (rs->state != RS_CONNECTED)
		return ENOTCONN;
	if (rs->err) {
		e = rs->err;
		rs->err = 0;
		return e;
	}
	return EPIPE;
}

/* The arguments of a send or receive call: 0 and their total length, or
 * the errno to fail with. */
int rs_iov_check(const struct iovec *iov, int iovcnt, int flags, size_t *total)
{
	*total = 0;
	if (iovcnt < 0 || iovcnt > IOV_MAX)
		return EINVAL;
	if (iovcnt && !iov)
		return EFAULT;
	if (flags & (MSG_OOB | MSG_ERRQUEUE))
		return EOPNOTSUPP;
	for (int i = 0; i < iovcnt; i++) {
		if (iov[i].iov_len && !iov[i].iov_base)
			return EFAULT;
		if (iov[i].iov_len > SSIZE_MAX - *total)
			return EINVAL;
		*total += iov[i].iov_len;
	}
	return 0;
}

/* The start of a data call: the rsocket of socket, locked, once it is
 * connected (*ret 0) or it can't be (*ret an errno: unlock and fail); NULL
 * (-1 and errno) for a bad socket or vector. */
static struct rsocket *rs_io_start(int socket, const struct iovec *iov,
				   int iovcnt, int flags, size_t *total,
				   bool *nonblock, int *ret)
{
	struct rsocket *rs = rs_get(socket);

	*total = 0;
	if (!rs)
		return NULL;
	*ret = rs_iov_check(iov, iovcnt, flags, total);
	if (*ret) {
		cma_err(*ret);
		return NULL;
	}
	pthread_mutex_lock(&rs->lock);
	*nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	*ret = rs_wait_connected(rs, *nonblock);
	if (!*ret && rs->state != RS_CONNECTED)
		*ret = ENOTCONN;
	return rs;
}

/* A datagram rsocket's data call, locked; its result as a call's. */
static ssize_t rs_dg_result(struct rsocket *rs, ssize_t r)
{
	pthread_mutex_unlock(&rs->lock);
	return r < 0 ? cma_err((int)-r) : r;
}

static ssize_t rs_dg_send(int socket, const struct iovec *iov, int iovcnt,
			  int flags, const struct sockaddr *to, socklen_t tolen)
{
	struct rsocket *rs = rs_get(socket);

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	return rs_dg_result(rs, rs_dg_sendv(rs, iov, iovcnt, flags, to, tolen));
}

static ssize_t rs_dg_recv(int socket, const struct iovec *iov, int iovcnt,
			  int flags, struct sockaddr *src, socklen_t *srclen,
			  int *msg_flags)
{
	struct rsocket *rs = rs_get(socket);

	if (!rs)
		return -1;
	pthread_mutex_lock(&rs->lock);
	return rs_dg_result(rs, rs_dg_recvv(rs, iov, iovcnt, flags, src, srclen,
					    msg_flags));
}

static bool rs_is_dgram(int socket)
{
	struct rsocket *rs = rs_lookup(socket);

	return rs && rs->dg;
}

static ssize_t rs_sendv(int socket, const struct iovec *iov, int iovcnt,
			int flags)
{
	struct rs_iter it = { iov, iovcnt, 0 };
	size_t total, sent = 0;
	bool nonblock;
	int ret;
	struct rsocket *rs;

	if (rs_is_dgram(socket))
		return rs_dg_send(socket, iov, iovcnt, flags, NULL, 0);
	rs = rs_io_start(socket, iov, iovcnt, flags, &total, &nonblock, &ret);
	if (!rs)
		return -1;
	if (ret)
		goto out;
	if (rs->cq)
		rs_poll_cq(rs);
	while (sent < total || total == 0) {
		uint64_t chunk, pos;

		if (rs->conn_dead || rs->wr_shut) {
			if (!sent)
				ret = rs->wr_shut ? EPIPE : rs_send_error(rs);
			break;
		}
		if (total == 0)
			break;
		if (!rs_send_room(rs)) {
			int w = rs_wait(rs, rs_can_send, nonblock, -1);

			if (w == -EAGAIN) {
				if (!sent)
					ret = EAGAIN;
				break;
			}
			continue;
		}
		pos = rs->tx_sent % rs->tx_size;
		chunk = total - sent;
		if (chunk > RS_MAX_CHUNK)
			chunk = RS_MAX_CHUNK;
		if (chunk > rs_tx_space(rs))
			chunk = rs_tx_space(rs);
		if (chunk > rs->tx_size - pos)
			chunk = rs->tx_size - pos;
		if (!rs_inline_ok(rs, &it, chunk) && chunk > rs_sbuf_free(rs))
			chunk = rs_sbuf_free(rs);
		if (rs_post_data(rs, &it, chunk, rs->tx_addr + pos, rs->tx_rkey, true))
			continue;	/* conn_dead now */
		rs->tx_sent += chunk;
		rs->tx_msgs++;
		sent += chunk;
	}
out:
	pthread_mutex_unlock(&rs->lock);
	if (ret)
		return cma_err(ret);
	return (ssize_t)sent;
}

RS_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
	struct iovec iov = { (void *)buf, len };

	return rs_sendv(socket, &iov, 1, flags);
}

RS_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags,
			  const struct sockaddr *dest_addr, socklen_t addrlen)
{
	struct iovec iov = { (void *)buf, len };

	if (rs_is_dgram(socket))
		return rs_dg_send(socket, &iov, 1, flags, dest_addr, addrlen);
	/* connection-mode socket: the address is ignored, as TCP does */
	return rs_sendv(socket, &iov, 1, flags);
}

RS_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
	if (!msg)
		return cma_err(EFAULT);
	if (rs_is_dgram(socket))
		return rs_dg_send(socket, msg->msg_iov, (int)msg->msg_iovlen,
				  flags, msg->msg_name, msg->msg_namelen);
	return rs_sendv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

RS_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count)
{
	return rsend(socket, buf, count, 0);
}

RS_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
	return rs_sendv(socket, iov, iovcnt, 0);
}

static bool rs_readable(struct rsocket *rs)
{
	return rs->rx_tail != rs->rx_head || rs->peer_shut || rs->conn_dead ||
	       rs->rd_shut || rs->state != RS_CONNECTED;
}

static ssize_t rs_recvv(int socket, const struct iovec *iov, int iovcnt,
			int flags)
{
	struct rs_iter it = { iov, iovcnt, 0 };
	size_t total, got = 0;
	bool nonblock, peek = flags & MSG_PEEK;
	int i, ret;
	struct rsocket *rs;

	if (rs_is_dgram(socket))
		return rs_dg_recv(socket, iov, iovcnt, flags, NULL, NULL, NULL);
	rs = rs_io_start(socket, iov, iovcnt, flags, &total, &nonblock, &ret);
	if (!rs)
		return -1;
	if (ret)
		goto out;
	while (got < total) {
		uint64_t avail, pos, n;

		if (rs->rd_shut)
			break;
		if (rs->cq && rs->rx_tail == rs->rx_head)
			rs_poll_cq(rs);
		avail = rs->rx_tail - rs->rx_head;
		if (peek && got)
			break;
		if (!avail) {
			if (got && !(flags & MSG_WAITALL))
				break;
			if (rs->peer_shut)
				break;	/* EOF */
			if (rs->conn_dead) {
				if (!got && rs->err) {
					ret = rs->err;
					rs->err = 0;
				}
				break;
			}
			i = rs_wait(rs, rs_readable, nonblock, -1);
			if (i == -EAGAIN) {
				if (!got)
					ret = EAGAIN;
				break;
			}
			continue;
		}
		/* copy out of the ring, in at most two pieces */
		pos = rs->rx_head % rs->rbuf_size;
		n = total - got;
		if (n > avail)
			n = avail;
		if (n > rs->rbuf_size - pos) {
			uint64_t first = rs->rbuf_size - pos;

			rs_iter_copy(&it, rs->rbuf + pos, first, false);
			rs_iter_copy(&it, rs->rbuf, n - first, false);
		} else {
			rs_iter_copy(&it, rs->rbuf + pos, n, false);
		}
		got += n;
		if (!peek) {
			rs->rx_head += n;
			rs_update_credits(rs);
		} else {
			break;
		}
	}
out:
	pthread_mutex_unlock(&rs->lock);
	if (ret)
		return cma_err(ret);
	return (ssize_t)got;
}

RS_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
	struct iovec iov = { buf, len };

	return rs_recvv(socket, &iov, 1, flags);
}

RS_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags,
			    struct sockaddr *src_addr, socklen_t *addrlen)
{
	struct iovec iov = { buf, len };
	ssize_t ret;

	if (rs_is_dgram(socket))
		return rs_dg_recv(socket, &iov, 1, flags, src_addr, addrlen, NULL);
	ret = rrecv(socket, buf, len, flags);
	/* a connection-mode socket returns no address, as TCP does */
	if (ret >= 0 && src_addr && addrlen)
		*addrlen = 0;
	return ret;
}

RS_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
	ssize_t ret;

	if (!msg)
		return cma_err(EFAULT);
	if (rs_is_dgram(socket)) {
		socklen_t nl = msg->msg_namelen;

		ret = rs_dg_recv(socket, msg->msg_iov, (int)msg->msg_iovlen,
				 flags, msg->msg_name, msg->msg_name ? &nl : NULL,
				 &msg->msg_flags);
		if (ret >= 0) {
			msg->msg_namelen = msg->msg_name ? nl : 0;
			msg->msg_controllen = 0;
		}
		return ret;
	}
	ret = rs_recvv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
	if (ret >= 0) {
		msg->msg_namelen = 0;
		msg->msg_controllen = 0;
		msg->msg_flags = 0;
	}
	return ret;
}

RS_EXPORT ssize_t rread(int socket, void *buf, size_t count)
{
	return rrecv(socket, buf, count, 0);
}

RS_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
	return rs_recvv(socket, iov, iovcnt, 0);
}
