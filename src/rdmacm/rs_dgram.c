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
 * RS_DG_QKEY), each with an 8-byte header (struct rs_dg_hdr: version, the
 * sender's UDP port, the receiver's).  The sender's address handle is by
 * GID: the destination's IP; the source GID is the one of the local
 * address the kernel would send from (the bound address, else a route
 * lookup).  The receiver names the source from the GRH's source GID (an IP
 * address: RoCEv2's GIDs) and the sender's port.  A datagram longer than
 * the MTU less the header (4088 bytes) is EMSGSIZE, as UDP's past 64 KiB.
 * Sends are copied into registered send slots (one per send WR); receives
 * land in slots of 40 (GRH) + MTU bytes and are copied out by rrecvfrom.
 * As UDP: no flow control, a datagram no receive takes is dropped.
 *
 * Resolution (rs_dg_resolve.c).  To reach an address over UD the sender
 * needs the QPN behind it.  Until it knows it, a datagram goes over the
 * UDP socket instead, framed by struct rs_dg_udp_hdr (DATA, with the
 * sender's QPN and a nonce); the receiver delivers it like any other,
 * learns the sender's QPN, and answers REPLY with its own and the nonce.
 * From then on both directions use UD.  rconnect sends a HELLO (the
 * question alone), so a connected socket's first send usually goes over
 * UD already.  The table learns only what the kernel vouches for: the
 * source of a DATA or HELLO, a REPLY from the address asked that echoes
 * its nonce.  A destination silent for RS_DG_REFRESH_NS gets a HELLO a
 * second; after RS_DG_HELLO_MAX unanswered its QPN is forgotten and
 * datagrams go over UDP again (where a dead socket is refused and a new
 * one answers).  The table is bounded (RS_DG_MAX_DEST; the oldest entry is
 * reused) and its hash keyed.  docs/wire-protocol.md has the bytes.
 *
 * Hostile input.  Anything on the UDP socket that is not a well-formed
 * header of ours is dropped.  A UD datagram is taken only with a GRH, our
 * header naming our port (a QPN freed and taken by another socket of its
 * process is not mistaken for the old one), a source of the socket's
 * family (and its peer's, when connected), and a source the table vouches
 * for: its address at the QPN it came from (urdma's UDP transport already
 * refuses a SrcQP that is not of the port a datagram came from).  A source
 * not vouched for may be a peer whose REPLY is still on the UDP socket: it
 * is read, and else the source asked with a HELLO (one per
 * RS_DG_ASK_GAP_NS).  Everything dropped is counted (logged at info on
 * close), and checked before rpoll says POLLIN.  Link-local IPv6 peers
 * are not supported (no scope id is kept).
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
 * that queue sizes can be set before.  Lock held.  0 or an errno; a
 * failure stays (ep_err: not tried again on every progress). */
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
	if (dg->ep_err)
		return dg->ep_err;
	ret = dg_autobind(rs);
	if (ret)
		return ret;
	ret = ENODEV;
	if (!dg->devs)
		dg->devs = rdma_get_devices(&n);
	if (!dg->devs || !dg->devs[0] || ibv_query_port(dg->devs[0], 1, &pa))
		goto err;
	ctx = dg->devs[0];
	dg->mtu = 128u << (pa.active_mtu >= IBV_MTU_256 &&
			   pa.active_mtu <= IBV_MTU_4096 ? pa.active_mtu : 1);
	ret = ENOMEM;
	dg->rx_cap = (uint32_t)rs->rq_size;
	dg->rx = urdma_zalloc_array(dg->rx_cap, sizeof(*dg->rx));
	dg->udp_cap = sizeof(struct rs_dg_udp_hdr) + dg->mtu;
	dg->udp_buf = malloc(dg->udp_cap);
	rlen = (size_t)rs->rq_size * (RS_DG_GRH + dg->mtu);
	rs->lbuf_len = page_round(rlen + (size_t)rs->sq_size * dg->mtu);
	rs->lbuf = mmap(NULL, rs->lbuf_len, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (rs->lbuf == MAP_FAILED)
		rs->lbuf = NULL;
	if (!dg->rx || !dg->udp_buf || !rs->lbuf)
		goto err;
	rs->rslots = rs->lbuf;
	rs->sslots = rs->lbuf + rlen;
	ret = EIO;
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
	ret = ibv_modify_qp(rs->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					      IBV_QP_PORT | IBV_QP_QKEY);
	if (!ret) {
		a.qp_state = IBV_QPS_RTR;
		ret = ibv_modify_qp(rs->qp, &a, IBV_QP_STATE);
	}
	if (!ret) {
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		ret = ibv_modify_qp(rs->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	for (uint32_t s = 0; !ret && s < (uint32_t)rs->rq_size; s++)
		ret = dg_post_recv(rs, s) ? ENOMEM : 0;
	if (!ret)
		return 0;
err:
	if (rs->qp) {
		ibv_destroy_qp(rs->qp);
		rs->qp = NULL;
	}
	rs_free_ep(rs);
	urdma_free(dg->rx);
	dg->rx = NULL;
	free(dg->udp_buf);
	dg->udp_buf = NULL;
	dg->ep_err = ret;
	urdma_warn("rsocket %d: no UD endpoint: %s", rs->fd, strerror(ret));
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
	rs->dg->seed = dg_random();
	rs->fd = fd;
	return 0;
}

void rs_dg_free(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;

	if (!dg)
		return;
	if (dg->drops || dg->unverified || dg->udp_drops || dg->overflow)
		urdma_info("rsocket %d: dropped %llu bad datagrams and %llu from "
			   "unverified sources over UD, %llu bad over UDP, %llu "
			   "for want of room", rs->fd,
			   (unsigned long long)dg->drops,
			   (unsigned long long)dg->unverified,
			   (unsigned long long)dg->udp_drops,
			   (unsigned long long)dg->overflow);
	for (int i = 0; i < dg->ndest; i++)
		dg_forget(&dg->dest[i]);
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
/* Receiving over UD                                                  */
/* ------------------------------------------------------------------ */

/* Is (from, src_qp) a source the table vouches for?  A source not known,
 * or at another QPN, may be one whose REPLY is still on the UDP socket:
 * read that once per batch of completions (*drained), then ask the source
 * (at most one such HELLO per RS_DG_ASK_GAP_NS).  now: the batch's time. */
static bool dg_verified(struct rsocket *rs, const struct rs_dg_addr *from,
			uint32_t src_qp, uint64_t now, bool *drained)
{
	struct rs_dgram *dg = rs->dg;
	struct rs_dest *d = dg_find(dg, from);

	if (d && d->qpn == src_qp)
		goto yes;
	if (*drained)
		goto no;
	*drained = true;
	dg_udp_input(rs);
	d = dg_find(dg, from);
	if (d && d->qpn == src_qp)
		goto yes;
no:
	if (now - dg->ask_ns >= RS_DG_ASK_GAP_NS) {
		dg->ask_ns = now;
		d = dg_dest(dg, from);
		if (d)
			dg_hello(rs, d, now);
	}
	dg->unverified++;
	return false;
yes:
	d->heard_ns = now;
	return true;
}

/* A receive completed: keep it (checked, its source named) or post it
 * again.  A UD datagram is ours when it has a GRH, our header naming our
 * port, a source of our family, and the table vouches for its source. */
static void dg_rx_take(struct rsocket *rs, const struct ibv_wc *w, uint32_t slot,
		       uint64_t now, bool *drained)
{
	struct rs_dgram *dg = rs->dg;
	const uint8_t *b = dg_rslot(rs, slot);
	struct rs_dg_rx *x;
	struct ibv_grh grh;
	struct rs_dg_hdr h;
	struct rs_dg_addr from;
	struct sockaddr_storage ss;
	socklen_t sl;

	if (w->status != IBV_WC_SUCCESS || !(w->wc_flags & IBV_WC_GRH) ||
	    w->byte_len < RS_DG_GRH + sizeof(h) ||
	    w->byte_len > RS_DG_GRH + dg->mtu)
		goto drop;
	memcpy(&grh, b, sizeof(grh));
	memcpy(&h, b + RS_DG_GRH, sizeof(h));
	memcpy(from.ip, grh.sgid.raw, 16);
	from.port = h.sport;
	if (h.version != RS_DG_VERSION || !h.sport || h.dport != dg->port ||
	    !dg_addr_to(rs, &from, &ss, &sl) ||
	    (dg->connected && !dg_addr_eq(&from, &dg->peer)))
		goto drop;
	if (!dg_verified(rs, &from, w->src_qp, now, drained))
		goto again;
	x = &dg->rx[dg->rx_tail++ % dg->rx_cap];
	x->slot = slot;
	x->len = w->byte_len - RS_DG_GRH - (uint32_t)sizeof(h);
	x->from = from;
	return;
drop:
	if (w->status != IBV_WC_WR_FLUSH_ERR)
		dg->drops++;
again:
	if (w->status != IBV_WC_WR_FLUSH_ERR && dg_post_recv(rs, slot))
		rs->err = EIO;
}

static void dg_poll_cq(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;
	struct ibv_wc wc[32];
	int n;

	if (!rs->cq)
		return;
	while ((n = ibv_poll_cq(rs->cq, 32, wc)) > 0) {
		uint64_t now = urdma_now_ns();
		bool drained = false;

		for (int i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];
			uint32_t slot = (uint32_t)(w->wr_id & 0xffffffffu);

			if (w->wr_id & RS_WR_RECV) {
				if (slot < (uint32_t)rs->rq_size)
					dg_rx_take(rs, w, slot, now, &drained);
				continue;
			}
			rs->sq_used--;
			if (w->status != IBV_WC_SUCCESS &&
			    w->status != IBV_WC_WR_FLUSH_ERR) {
				/* a UD send error: SQE; resume */
				struct ibv_qp_attr a = {
					.qp_state = IBV_QPS_RTS,
					.cur_qp_state = IBV_QPS_SQE,
				};

				dg->drops++;
				ibv_modify_qp(rs->qp, &a,
					      IBV_QP_STATE | IBV_QP_CUR_STATE);
			}
		}
		if (n < 32)
			break;
	}
}

/* ------------------------------------------------------------------ */
/* Progress                                                           */
/* ------------------------------------------------------------------ */

void rs_dg_progress(struct rsocket *rs)
{
	uint64_t now;

	/* a bound socket can be sent to: it needs its QP to answer */
	if (!rs->qp && (!rs->bound || rs->dg->ep_err || dg_ep(rs)))
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
	       rs->err || dg->ep_err || rs->rd_shut;
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
	if (rs->err || rs->dg->ep_err)
		r |= POLLERR;
	return r;
}

int rs_dg_sleep_fds(struct rsocket *rs, struct pollfd *p)
{
	int n = 0;

	/* (without an endpoint nothing reads the UDP socket: not a wake-up) */
	if (!rs->dg->ep_err)
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

/* After connect(AF_UNSPEC) the kernel lets go of a port it chose (or we
 * chose by binding port 0): keep ours, the one our peers know, bound. */
static void dg_keep_port(struct rsocket *rs)
{
	struct rs_dgram *dg = rs->dg;
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct rs_dg_addr me;

	if (getsockname(rs->fd, (struct sockaddr *)&ss, &len) ||
	    !dg_addr_from(&me, (struct sockaddr *)&ss) || me.port == dg->port)
		return;
	if (ss.ss_family == AF_INET)
		((struct sockaddr_in *)&ss)->sin_port = dg->port;
	else
		((struct sockaddr_in6 *)&ss)->sin6_port = dg->port;
	if (!dg->port || bind(rs->fd, (struct sockaddr *)&ss, len)) {
		/* taken meanwhile: another port, and peers learn it anew */
		dg->port = 0;
		rs->bound = false;
		if (rs->qp)
			dg_autobind(rs);
	}
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
		dg_keep_port(rs);
		return 0;
	}
	if (connect(rs->fd, addr, len))
		return errno;
	dg->connected = true;
	if (!dg_addr_from(&dg->peer, addr))
		ret = EAFNOSUPPORT;
	else if (!(ret = dg_autobind(rs)))
		ret = dg_ep(rs);
	if (ret) {
		struct sockaddr un = { .sa_family = AF_UNSPEC };

		connect(rs->fd, &un, sizeof(un));
		dg->connected = false;
		return ret;
	}
	rs->bound = true;
	/* a HELLO, so that the first send finds the peer's QPN */
	d = dg_dest(dg, &dg->peer);
	if (d && !d->qpn)
		dg_hello(rs, d, urdma_now_ns());
	return 0;
}

static int dg_take_err(struct rsocket *rs)
{
	int e = rs->err ? rs->err : rs->dg->ep_err;

	rs->err = 0;
	return e;
}

/* A send WR of the data at it: header, then the data, copied into the
 * next send slot. */
static int dg_post(struct rsocket *rs, struct rs_dest *d, struct rs_iter *it,
		   size_t total)
{
	struct rs_dgram *dg = rs->dg;
	uint32_t slot = (uint32_t)(dg->sq_head % (uint64_t)rs->sq_size);
	uint8_t *buf = rs->sslots + (size_t)slot * dg->mtu;
	struct rs_dg_hdr h = {
		.version = RS_DG_VERSION,
		.sport = dg->port,
		.dport = d->a.port,
	};
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
	int ret;

	memcpy(buf, &h, sizeof(h));
	rs_iter_copy(it, buf + sizeof(h), total, true);
	if ((int)sge.length <= rs->max_inline)
		wr.send_flags |= IBV_SEND_INLINE;
	wr.wr.ud.ah = d->ah;
	wr.wr.ud.remote_qpn = d->qpn;
	wr.wr.ud.remote_qkey = RS_DG_QKEY;
	ret = ibv_post_send(rs->qp, &wr, &bad);
	if (ret)
		return ret;
	dg->sq_head++;
	rs->sq_used++;
	return 0;
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
		return -dg_take_err(rs);
	ret = dg_ep(rs);
	if (ret)
		return -ret;
	if (total > dg->mtu - sizeof(struct rs_dg_hdr))
		return -EMSGSIZE;
	rs_dg_progress(rs);
	for (;;) {
		d = dg_dest(dg, &a);
		now = urdma_now_ns();
		/* silent too long: ask again (and give up on it, at last) */
		if (d && d->qpn && now - d->heard_ns > RS_DG_REFRESH_NS &&
		    now - d->hello_ns > RS_DG_HELLO_GAP_NS)
			dg_hello(rs, d, now);
		if (!d || !d->qpn) {
			/* not resolved: over UDP, which also asks */
			ret = dg_udp_send(rs, &a, RS_DG_OP_DATA,
					  d ? d->nonce : 0, &it, total, nonblock);
			return ret ? -ret : (ssize_t)total;
		}
		if (rs_sq_free(rs))
			break;
		if (rs_wait(rs, dg_writable, nonblock, -1) == -EAGAIN)
			return -EAGAIN;
		if (rs->err)
			return -dg_take_err(rs);
		if (rs->wr_shut)
			return -EPIPE;
		/* (the lock was let go: the table may have changed) */
	}
	ret = dg_post(rs, d, &it, total);
	return ret ? -ret : (ssize_t)total;
}

/* The next datagram: false if none. */
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
	if (dg->rx_head != dg->rx_tail) {
		struct rs_dg_rx *x = &dg->rx[dg->rx_head % dg->rx_cap];

		*data = dg_rslot(rs, x->slot) + RS_DG_GRH + sizeof(struct rs_dg_hdr);
		*len = x->len;
		*from = x->from;
		*udp = false;
		return true;
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
		uint32_t slot = dg->rx[dg->rx_head % dg->rx_cap].slot;

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
	/* (an unbound socket has no port: nothing can come, as on UDP) */
	if (rs->bound) {
		ret = dg_ep(rs);
		if (ret)
			return -ret;
	}
	for (;;) {
		rs_dg_progress(rs);
		if (dg_next(rs, &data, &len, &from, &udp))
			break;
		if (rs->rd_shut)
			return 0;
		if (rs->err || rs->dg->ep_err)
			return -dg_take_err(rs);
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
