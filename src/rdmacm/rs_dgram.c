/* SPDX-License-Identifier: MIT */
/*
 * rsockets: datagram sockets (SOCK_DGRAM), one UD QP each.
 *
 * Identity.  A datagram rsocket is a real kernel UDP socket, and that
 * socket's fd is the rsocket number.  The kernel gives it its address
 * (rbind, or an ephemeral port on first use) and its port space, so two
 * datagram rsockets, or an rsocket and a UDP socket, never share a port.
 *
 * Data path.  Datagrams travel over the rsocket's UD QP (Q_Key
 * RS_DG_QKEY), each with a 4-byte header (struct rs_dg_hdr: version and the
 * sender's UDP port).  The receiver names the source from the GRH's source
 * GID (an IP address: RoCEv2's GIDs) and that port.  The sender's address
 * handle is by GID: the destination's IP; the source GID is the one of the
 * local address the kernel would send from (the bound address, else a
 * route lookup).  A datagram longer than the path MTU minus the header is
 * EMSGSIZE, as UDP's past 64 KiB.  Sends are copied into registered send
 * slots (one per send WR); receives land in slots of 40 (GRH) + MTU bytes
 * and are copied out by rrecvfrom.  As UDP: no flow control, a datagram no
 * receive takes is dropped.
 *
 * Resolution.  To reach an address over UD the sender needs the QPN behind
 * it.  Until it knows it, a datagram goes over the UDP socket instead,
 * framed by struct rs_dg_udp_hdr (DATA, with the sender's QPN); the
 * receiver delivers it like any other, learns the sender's QPN, and
 * answers REPLY with its own.  From then on both directions use UD.
 * rconnect sends a HELLO (the question alone), so a connected socket's
 * first send usually goes over UD already.  A UD datagram from an address
 * also teaches its QPN (a restarted peer is learned again this way), and a
 * destination not heard from for RS_DG_REFRESH_NS gets a HELLO again.  The
 * table of destinations is bounded (RS_DG_MAX_DEST, the oldest entry is
 * reused).  docs/wire-protocol.md has the bytes.
 *
 * Hostile input.  Anything on the UDP socket that is not a well-formed
 * header of ours, and any UD datagram without a GRH, with a bad header or
 * from a GID that is no IP address of the socket's family, is dropped and
 * counted (logged at info on close).  A forged REPLY or datagram can only
 * claim an address, as a forged UDP datagram can.
 *
 * Progress and waiting are rs_ctrl.c's (rs_progress, rs_wait, rpoll): the
 * rsocket's sleep fds are its completion channel and its UDP socket; the
 * UDP socket is read when it woke a sleeper, or at most every
 * RS_DG_UDP_CHECK_NS while spinning.
 */

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdmacm/cma.h"
#include "rdmacm/rs_dgram.h"
#include "util/alloc.h"
#include "util/log.h"

/* ------------------------------------------------------------------ */
/* Endpoint                                                           */
/* ------------------------------------------------------------------ */

static uint8_t *dg_rslot(const struct rsocket *rs, uint32_t s)
{
	return rs->rslots + (size_t)s * (RS_DG_GRH + rs->dg->mtu);
}

static int dg_post_recv(struct rsocket *rs, uint32_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)dg_rslot(rs, slot),
		.length = RS_DG_GRH + rs->dg->mtu,
		.lkey = rs->lmr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = RS_WR_RECV | slot, .sg_list = &sge,
				  .num_sge = 1 }, *bad;

	return ibv_post_recv(rs->qp, &wr, &bad) ? -1 : 0;
}

/* Bind to an ephemeral port if not bound yet, and learn our port. */
static int dg_autobind(struct rsocket *rs)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct rs_dg_addr me;

	if (rs->dg->port)
		return 0;
	if (getsockname(rs->fd, (struct sockaddr *)&ss, &len))
		return errno;
	if (!dg_addr_from(&me, (struct sockaddr *)&ss))
		return EAFNOSUPPORT;
	if (!me.port) {
		memset(&ss, 0, sizeof(ss));
		ss.ss_family = (sa_family_t)rs->domain;
		if (bind(rs->fd, (struct sockaddr *)&ss,
			 rs->domain == AF_INET ? sizeof(struct sockaddr_in) :
						 sizeof(struct sockaddr_in6)))
			return errno;
		len = sizeof(ss);
		if (getsockname(rs->fd, (struct sockaddr *)&ss, &len) ||
		    !dg_addr_from(&me, (struct sockaddr *)&ss))
			return EADDRNOTAVAIL;
		rs->bound = true;
	}
	rs->dg->port = me.port;
	return 0;
}

/* The UD QP, its CQ and slots, every receive posted: made on first use so
 * that queue sizes can be set before.  Lock held.  0 or an errno. */
static int dg_ep(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr a;
	struct ibv_port_attr pa;
	struct ibv_context *ctx;
	size_t rlen;
	int n = 0, ret;

	if (rs->qp)
		return 0;
	ret = dg_autobind(rs);
	if (ret)
		return ret;
	if (!dg->devs) {
		dg->devs = rdma_get_devices(&n);
		if (!dg->devs || !n || !dg->devs[0])
			return ENODEV;
	}
	ctx = dg->devs[0];
	if (ibv_query_port(ctx, 1, &pa))
		return ENODEV;
	dg->mtu = 128u << (pa.active_mtu >= IBV_MTU_256 &&
			   pa.active_mtu <= IBV_MTU_4096 ? pa.active_mtu : 1);
	rlen = (size_t)rs->rq_size * (RS_DG_GRH + dg->mtu);
	rs->lbuf_len = page_round(rlen + (size_t)rs->sq_size * dg->mtu);
	if (!dg->rx)
		dg->rx = urdma_zalloc_array((size_t)rs->rq_size, sizeof(*dg->rx));
	if (!dg->udp_buf)
		dg->udp_buf = malloc(sizeof(struct rs_dg_udp_hdr) + dg->mtu);
	if (!dg->rx || !dg->udp_buf)
		return ENOMEM;
	rs->lbuf = mmap(NULL, rs->lbuf_len, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rs->lbuf == MAP_FAILED) {
		rs->lbuf = NULL;
		return ENOMEM;
	}
	rs->rslots = rs->lbuf;
	rs->sslots = rs->lbuf + rlen;
	rs->pd = ibv_alloc_pd(ctx);
	if (!rs->pd)
		goto err;
	rs->lmr = ibv_reg_mr(rs->pd, rs->lbuf, rs->lbuf_len, IBV_ACCESS_LOCAL_WRITE);
	rs->cq_chan = ibv_create_comp_channel(ctx);
	if (!rs->lmr || !rs->cq_chan ||
	    fcntl(rs->cq_chan->fd, F_SETFL,
		  fcntl(rs->cq_chan->fd, F_GETFL) | O_NONBLOCK) < 0)
		goto err;
	rs->cq = ibv_create_cq(ctx, rs->sq_size + rs->rq_size, rs, rs->cq_chan, 0);
	if (!rs->cq)
		goto err;
	memset(&init, 0, sizeof(init));
	init.send_cq = init.recv_cq = rs->cq;
	init.qp_type = IBV_QPT_UD;
	init.cap.max_send_wr = (uint32_t)rs->sq_size;
	init.cap.max_recv_wr = (uint32_t)rs->rq_size;
	init.cap.max_send_sge = init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = (uint32_t)rs->sq_inline;
	rs->qp = ibv_create_qp(rs->pd, &init);
	if (!rs->qp) {
		init.cap.max_inline_data = 0;
		rs->qp = ibv_create_qp(rs->pd, &init);
	}
	if (!rs->qp)
		goto err;
	rs->max_inline = (int)init.cap.max_inline_data < rs->sq_inline ?
			 (int)init.cap.max_inline_data : rs->sq_inline;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = RS_DG_QKEY;
	if (ibv_modify_qp(rs->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					IBV_QP_PORT | IBV_QP_QKEY))
		goto err;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(rs->qp, &a, IBV_QP_STATE))
		goto err;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(rs->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		goto err;
	for (uint32_t s = 0; s < (uint32_t)rs->rq_size; s++)
		if (dg_post_recv(rs, s))
			goto err;
	return 0;
err:
	ret = errno ? errno : ENOMEM;
	if (rs->qp) {
		ibv_destroy_qp(rs->qp);
		rs->qp = NULL;
	}
	rs_free_ep(rs);
	return ret;
}

int rs_dg_create(struct rsocket *rs, bool cloexec)
{
	int fd = socket(rs->domain, SOCK_DGRAM | SOCK_NONBLOCK |
			(cloexec ? SOCK_CLOEXEC : 0), 0);

	if (fd < 0)
		return errno;
	rs->dg = urdma_zalloc(sizeof(*rs->dg));
	if (!rs->dg) {
		close(fd);
		return ENOMEM;
	}
	for (int i = 0; i < RS_DG_BUCKETS; i++)
		rs->dg->bucket[i] = -1;
	rs->fd = fd;
	return 0;
}

void rs_dg_free(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;

	if (!dg)
		return;
	if (dg->drops || dg->udp_drops || dg->overflow)
		urdma_info("rsocket %d: dropped %llu bad datagrams over UD, %llu "
			   "over UDP, %llu for want of room", rs->fd,
			   (unsigned long long)dg->drops,
			   (unsigned long long)dg->udp_drops,
			   (unsigned long long)dg->overflow);
	for (int i = 0; i < dg->ndest; i++)
		if (dg->dest[i].ah)
			ibv_destroy_ah(dg->dest[i].ah);
	free(dg->dest);
	if (rs->qp) {
		ibv_destroy_qp(rs->qp);
		rs->qp = NULL;
	}
	rs_free_ep(rs);
	while (dg->udq_head != dg->udq_tail)
		free(dg->udq[dg->udq_head++ % RS_DG_UDQ].buf);
	urdma_free(dg->rx);
	free(dg->udp_buf);
	if (dg->devs)
		rdma_free_devices(dg->devs);
	if (rs->fd >= 0)
		close(rs->fd);
	urdma_free(dg);
	rs->dg = NULL;
}

/* ------------------------------------------------------------------ */
/* Progress                                                           */
/* ------------------------------------------------------------------ */

static void dg_poll_cq(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;
	struct ibv_wc wc[32];
	int n;

	if (!rs->cq)
		return;
	while ((n = ibv_poll_cq(rs->cq, 32, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];

			if (!(w->wr_id & RS_WR_RECV)) {
				rs->sq_used--;
				if (w->status != IBV_WC_SUCCESS &&
				    w->status != IBV_WC_WR_FLUSH_ERR) {
					/* a UD send error: SQE; resume */
					struct ibv_qp_attr a = {
						.qp_state = IBV_QPS_RTS,
						.cur_qp_state = IBV_QPS_SQE,
					};

					dg->drops++;
					ibv_modify_qp(rs->qp, &a, IBV_QP_STATE |
						      IBV_QP_CUR_STATE);
				}
				continue;
			}
			uint32_t slot = (uint32_t)(w->wr_id & 0xffffffffu);

			if (slot >= (uint32_t)rs->rq_size)
				continue;
			if (w->status != IBV_WC_SUCCESS) {
				if (w->status != IBV_WC_WR_FLUSH_ERR &&
				    !dg_post_recv(rs, slot))
					dg->drops++;
				continue;
			}
			dg->rx[dg->rx_tail++ % (uint32_t)rs->rq_size] =
				(struct rs_dg_rx){
					.slot = slot,
					.len = w->byte_len,
					.src_qp = w->src_qp,
					.grh = w->wc_flags & IBV_WC_GRH,
				};
		}
		if (n < 32)
			break;
	}
}

void rs_dg_progress(struct rsocket *rs)
{
	uint64_t now;

	/* a bound socket can be sent to: it needs its QP to answer */
	if (!rs->qp && (!rs->bound || dg_ep(rs)))
		return;
	dg_poll_cq(rs);
	now = urdma_now_ns();
	if (rs->cm_due || now >= rs->dg->udp_next_ns) {
		rs->cm_due = false;
		rs->dg->udp_next_ns = now + RS_DG_UDP_CHECK_NS;
		dg_udp_input(rs);
	}
}

static bool dg_readable(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;

	return dg->rx_head != dg->rx_tail || dg->udq_head != dg->udq_tail ||
	       rs->err || rs->rd_shut;
}

static bool dg_writable(struct rsocket *rs)
{
	return !rs->qp || rs_sq_free(rs) || rs->err || rs->wr_shut;
}

short rs_dg_revents(struct rsocket *rs)
{
	short r = 0;

	if (dg_readable(rs))
		r |= POLLIN;
	if (dg_writable(rs))
		r |= POLLOUT;
	if (rs->err)
		r |= POLLERR;
	return r;
}

int rs_dg_sleep_fds(struct rsocket *rs, struct pollfd *p)
{
	int n = 0;

	p[n++] = (struct pollfd){ .fd = rs->fd, .events = POLLIN };
	if (rs->cq_chan)
		p[n++] = (struct pollfd){ .fd = rs->cq_chan->fd, .events = POLLIN };
	return n;
}

/* ------------------------------------------------------------------ */
/* The socket calls                                                   */
/* ------------------------------------------------------------------ */

int rs_dg_bind(struct rsocket *rs, const struct sockaddr *addr, socklen_t len)
{
	if (rs->bound)
		return EINVAL;
	if (bind(rs->fd, addr, len))
		return errno;
	rs->bound = true;
	return dg_autobind(rs);
}

int rs_dg_connect(struct rsocket *rs, const struct sockaddr *addr, socklen_t len)
{
	struct rs_dgram *dg = rs->dg;
	struct rs_dest *d;
	int ret;

	if (addr && len >= (socklen_t)sizeof(sa_family_t) &&
	    addr->sa_family == AF_UNSPEC) {
		/* dissolve the association, as UDP does */
		connect(rs->fd, addr, len);
		dg->connected = false;
		rs->rd_shut = rs->wr_shut = false;
		return 0;
	}
	if (connect(rs->fd, addr, len))
		return errno;
	if (!dg_addr_from(&dg->peer, addr))
		return EAFNOSUPPORT;
	dg->connected = true;
	dg->port = 0;		/* connect may have bound us */
	rs->bound = true;
	ret = dg_autobind(rs);
	if (!ret)
		ret = dg_ep(rs);
	if (ret)
		return ret;
	/* a HELLO, so that the first send finds the peer's QPN */
	d = dg_dest(dg, &dg->peer);
	if (d && !d->qpn) {
		d->hello_ns = urdma_now_ns();
		dg_udp_send(rs, &dg->peer, RS_DG_OP_HELLO, NULL, 0, true);
	}
	return 0;
}

static int dg_wait_err(struct rsocket *rs)
{
	int e = rs->err;

	rs->err = 0;
	return e;
}

ssize_t rs_dg_sendv(struct rsocket *rs, const struct iovec *iov, int iovcnt,
		    int flags, const struct sockaddr *to, socklen_t tolen)
{
	struct rs_dgram *dg = rs->dg;
	struct rs_iter it = { iov, iovcnt, 0 };
	bool nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	struct rs_dg_addr a;
	struct rs_dest *d;
	size_t total;
	uint64_t now;
	int ret;

	ret = rs_iov_check(iov, iovcnt, flags, &total);
	if (ret)
		return -ret;
	if (to) {
		if (tolen < (socklen_t)sizeof(sa_family_t))
			return -EINVAL;
		if ((to->sa_family == AF_INET && tolen < (socklen_t)sizeof(struct sockaddr_in)) ||
		    (to->sa_family == AF_INET6 && tolen < (socklen_t)sizeof(struct sockaddr_in6)))
			return -EINVAL;
		if (!dg_addr_from(&a, to) ||
		    (rs->domain == AF_INET && to->sa_family != AF_INET))
			return -EAFNOSUPPORT;
		if (!a.port)
			return -EINVAL;
	} else if (dg->connected) {
		a = dg->peer;
	} else {
		return -EDESTADDRREQ;
	}
	if (rs->wr_shut)
		return -EPIPE;
	if (rs->err)
		return -dg_wait_err(rs);
	ret = dg_ep(rs);
	if (ret)
		return -ret;
	if (total > dg->mtu - sizeof(struct rs_dg_hdr))
		return -EMSGSIZE;
	rs_dg_progress(rs);
	d = dg_dest(dg, &a);
	if (!d || !d->qpn) {
		/* not resolved: over UDP, which also asks for the QPN */
		ret = dg_udp_send(rs, &a, RS_DG_OP_DATA, &it, total, nonblock);
		return ret ? -ret : (ssize_t)total;
	}
	now = urdma_now_ns();
	if (now - d->heard_ns > RS_DG_REFRESH_NS &&
	    now - d->hello_ns > RS_DG_HELLO_GAP_NS) {
		d->hello_ns = now;
		dg_udp_send(rs, &a, RS_DG_OP_HELLO, NULL, 0, true);
	}
	if (!rs_sq_free(rs)) {
		if (rs_wait(rs, dg_writable, nonblock, -1) == -EAGAIN)
			return -EAGAIN;
		if (rs->err)
			return -dg_wait_err(rs);
		if (rs->wr_shut)
			return -EPIPE;
		d = dg_find(dg, &a);	/* the table may have moved */
		if (!d || !d->qpn)
			return rs_dg_sendv(rs, iov, iovcnt, flags, to, tolen);
	}
	{
		uint32_t slot = (uint32_t)(dg->sq_head % (uint64_t)rs->sq_size);
		uint8_t *buf = rs->sslots + (size_t)slot * dg->mtu;
		struct rs_dg_hdr h = { .version = RS_DG_VERSION, .port = dg->port };
		struct ibv_sge sge = {
			.addr = (uintptr_t)buf,
			.length = (uint32_t)(sizeof(h) + total),
			.lkey = rs->lmr->lkey,
		};
		struct ibv_send_wr wr = {
			.wr_id = slot,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		}, *bad;

		memcpy(buf, &h, sizeof(h));
		rs_iter_copy(&it, buf + sizeof(h), total, true);
		if ((int)sge.length <= rs->max_inline)
			wr.send_flags |= IBV_SEND_INLINE;
		wr.wr.ud.ah = d->ah;
		wr.wr.ud.remote_qpn = d->qpn;
		wr.wr.ud.remote_qkey = RS_DG_QKEY;
		ret = ibv_post_send(rs->qp, &wr, &bad);
		if (ret)
			return -ret;
		dg->sq_head++;
		rs->sq_used++;
	}
	return (ssize_t)total;
}

/* The next datagram, or false: a UD one checked and its source named (a
 * bad one is dropped and its receive posted again). */
static bool dg_next(struct rsocket *rs, const uint8_t **data, size_t *len,
		    struct rs_dg_addr *from, bool *udp)
{
	struct rs_dgram *dg = rs->dg;

	if (dg->udq_head != dg->udq_tail) {
		struct rs_dg_udp_msg *q = &dg->udq[dg->udq_head % RS_DG_UDQ];

		*data = q->buf;
		*len = q->len;
		*from = q->from;
		*udp = true;
		return true;
	}
	while (dg->rx_head != dg->rx_tail) {
		struct rs_dg_rx *x = &dg->rx[dg->rx_head % (uint32_t)rs->rq_size];
		const uint8_t *b = dg_rslot(rs, x->slot);
		struct ibv_grh grh;
		struct rs_dg_hdr h;
		struct sockaddr_storage ss;
		socklen_t sl;

		memcpy(&grh, b, sizeof(grh));
		memcpy(&h, b + RS_DG_GRH, sizeof(h));
		memcpy(from->ip, grh.sgid.raw, 16);
		from->port = h.port;
		if (x->grh && x->len >= RS_DG_GRH + sizeof(h) &&
		    x->len <= RS_DG_GRH + dg->mtu && h.version == RS_DG_VERSION &&
		    h.port && dg_addr_to(rs, from, &ss, &sl) &&
		    (!dg->connected || dg_addr_eq(from, &dg->peer))) {
			struct rs_dest *d = dg_find(dg, from);

			/* learn it, or again if it changed (a restarted
			 * peer); reply from the GID it was sent to */
			if (!d || d->qpn != x->src_qp)
				dg_learn(rs, from, x->src_qp,
					 dg_gid_index(rs->qp->context,
						      grh.dgid.raw));
			else
				d->heard_ns = urdma_now_ns();
			*data = b + RS_DG_GRH + sizeof(h);
			*len = x->len - RS_DG_GRH - sizeof(h);
			*udp = false;
			return true;
		}
		dg->drops++;
		dg->rx_head++;
		if (dg_post_recv(rs, x->slot))
			rs->err = EIO;
	}
	return false;
}

static void dg_consume(struct rsocket *rs, bool udp)
{
	struct rs_dgram *dg = rs->dg;

	if (udp) {
		free(dg->udq[dg->udq_head % RS_DG_UDQ].buf);
		dg->udq_head++;
	} else {
		uint32_t slot = dg->rx[dg->rx_head % (uint32_t)rs->rq_size].slot;

		dg->rx_head++;
		if (dg_post_recv(rs, slot))
			rs->err = EIO;
	}
}

ssize_t rs_dg_recvv(struct rsocket *rs, const struct iovec *iov, int iovcnt,
		    int flags, struct sockaddr *src, socklen_t *srclen,
		    int *msg_flags)
{
	struct rs_iter it = { iov, iovcnt, 0 };
	bool nonblock = rs->nonblock || (flags & MSG_DONTWAIT);
	const uint8_t *data;
	struct rs_dg_addr from;
	size_t total, len, n;
	bool udp;
	int ret;

	ret = rs_iov_check(iov, iovcnt, flags, &total);
	if (ret)
		return -ret;
	ret = dg_ep(rs);
	if (ret)
		return -ret;
	for (;;) {
		rs_dg_progress(rs);
		if (rs->rd_shut)
			return 0;
		if (dg_next(rs, &data, &len, &from, &udp))
			break;
		if (rs->err)
			return -dg_wait_err(rs);
		if (rs_wait(rs, dg_readable, nonblock, -1) == -EAGAIN)
			return -EAGAIN;
	}
	n = len < total ? len : total;
	rs_iter_copy(&it, (uint8_t *)data, n, false);
	if (msg_flags)
		*msg_flags = len > total ? MSG_TRUNC : 0;
	if (src && srclen) {
		struct sockaddr_storage ss;
		socklen_t sl = 0;

		dg_addr_to(rs, &from, &ss, &sl);
		memcpy(src, &ss, *srclen < sl ? *srclen : sl);
		*srclen = sl;
	}
	if (!(flags & MSG_PEEK))
		dg_consume(rs, udp);
	return (ssize_t)(flags & MSG_TRUNC ? len : n);
}

int rs_dg_getname(struct rsocket *rs, struct sockaddr *addr,
		  socklen_t *addrlen, bool peer)
{
	if (peer && !rs->dg->connected)
		return ENOTCONN;
	if (peer ? getpeername(rs->fd, addr, addrlen) :
		   getsockname(rs->fd, addr, addrlen))
		return errno;
	return 0;
}

int rs_dg_shutdown(struct rsocket *rs, int how)
{
	if (!rs->dg->connected)
		return ENOTCONN;
	if (how == SHUT_RD || how == SHUT_RDWR)
		rs->rd_shut = true;
	if (how == SHUT_WR || how == SHUT_RDWR)
		rs->wr_shut = true;
	return 0;
}
