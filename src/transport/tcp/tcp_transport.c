// SPDX-License-Identifier: MIT
/*
 * The TCP transport: RC queue pairs between hosts, framed as iWARP
 * (MPA / DDP / RDMAP, RFC 5044 / 5041 / 5040, RFC 7306 for atomics and
 * immediate data).  docs/wire-protocol.md describes the bytes.
 *
 * This file holds the transport operations (connect at RTR, execute a send
 * WR, the progress thread's upkeep); the engines are in tcp_conn.c
 * (listeners, QP numbers, connections), tcp_mpa.c (connection setup),
 * tcp_tx.c (the send path and responses), tcp_rx.c (the receive path and
 * placement), tcp_park.c (parking) and tcp_ident.c (who may connect);
 * tcp.h has what they share.
 *
 * Threads.  Send WRs run in the posting thread (sq_lock), as for the other
 * transports: a Send or Write completes when TCP has taken all its bytes;
 * a Read or an atomic completes when its response arrives.
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
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"
#include "transport/tcp/tcp.h"

/* ---- the transport operations ---- */

/* The peer's address from the QP's AV; only IPv4-mapped or global IPv6.
 * Without a GID the peer is on this host (a LID names this network
 * namespace): loopback. */
int tcp_peer_addr(struct urdma_qp *qp, const struct ibv_qp_attr *attr,
		     struct sockaddr_in6 *sa)
{
	static const union ibv_gid loopback = {
		.raw = { [10] = 0xff, [11] = 0xff, 127, 0, 0, 1 }
	};
	const union ibv_gid *g = attr->ah_attr.is_global ?
					 &attr->ah_attr.grh.dgid :
					 &loopback;

	if (urdma_gid_is_linklocal(g->raw)) {
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
	int ret = tcp_peer_addr(qp, attr, &sa);

	if (ret)
		return ret;
	active = qp->ibqp.qp_num < attr->dest_qp_num ||
		 (qp->ibqp.qp_num == attr->dest_qp_num &&
		  memcmp(sgid, attr->ah_attr.grh.dgid.raw, 16) < 0);
	pthread_mutex_lock(&T.lock);
	l = tcp_listener_of(qp->ibqp.qp_num);
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
	ret = conn_start(c);
	if (ret == -EMFILE || ret == -ENFILE || ret == -ENOBUFS ||
	    ret == -ENOMEM || ret == -ENOSPC) { /* ENOSPC: epoll's watches */
		/* Out of sockets here: the QP stays in INIT, and
		 * ibv_modify_qp says why (its WRs would only time out). */
		pthread_mutex_unlock(&T.lock);
		urdma_warn("qp %#x: no socket for its stream: %s",
			   qp->ibqp.qp_num, strerror(-ret));
		conn_release(&c->w); /* not watched: its socket failed */
		return ret;
	}
	/* Not in T.pending, which holds only the passive side's: every
	 * arrival walks it (pending_admit), and 8,192 active streams in it
	 * made setting them up quadratic. */
	qp->tr_priv = c;
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
	l = tcp_listener_of(qp->ibqp.qp_num);
	if (l)
		l->reg[qp->ibqp.qp_num & 0xff].ready = false;
	if (c) {
		/* closing first: a sender waiting for room gives up.  The
		 * answers a peer waits for go if the socket takes them. */
		atomic_store(&c->closing, true);
		/* The rest of a cut message frames no more of its memory,
		 * which may go with the QP. */
		tx_rest_forget(c);
		rsp_send(c);
		pthread_mutex_lock(&c->rx_lock);
		rcv_abandon(c);
		c->qp = NULL;
		pthread_mutex_unlock(&c->rx_lock);
		/* out of the CQs' readiness sets before the socket closes
		 * (conn_release) and the QP is freed (cq_watch.c) */
		urdma_cq_unwatch_fd(qp, c->fd);
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

	tx_frame_ctrl(c, &c->tx_tail[c->ntail++], RDMAP_READ_REQ, DDP_QN_READ,
		      &rr, sizeof(rr), 0);
}

/* Send or Write (with or without immediate data).  Under tx_lock.  A
 * failed write leaves the connection dead: tcp_maintain then fails the
 * unconfirmed messages, this one first. */
static void tx_send_write(struct tcp_conn *c, struct urdma_qp *qp,
			  struct urdma_swqe *w, const struct urdma_span *sp,
			  int n)
{
	bool send = w->opcode == IBV_WR_SEND ||
		    w->opcode == IBV_WR_SEND_WITH_IMM ||
		    w->opcode == IBV_WR_SEND_WITH_INV;
	bool imm = w->opcode == IBV_WR_SEND_WITH_IMM ||
		   w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	bool se = w->send_flags & IBV_SEND_SOLICITED;
	/* UC: nothing confirms a message (tcp_execute completes it). */
	bool uc = qp->ibqp.qp_type == IBV_QPT_UC;
	bool sig = !uc && (qp->sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED));
	uint8_t h[sizeof(struct ddp_untagged_hdr)];
	uint32_t tag = 0, hl;
	struct tcp_unc *u;

	if (!uc) {
		pthread_mutex_lock(&c->ord_lock);
		u = unc_push(c, qp->sq_head, send ? K_SEND : K_WRITE,
			     c->tx_msn[DDP_QN_SEND] + (imm && send));
		u->stag = w->rkey;
		u->to = w->remote_addr;
		u->len = w->byte_len;
		if (sig) {
			tag = ++c->next_tag;
			unc_push(c, qp->sq_head, K_FLUSH,
				 c->tx_msn[DDP_QN_READ])->tag = tag;
		}
		pthread_mutex_unlock(&c->ord_lock);
	}
	if (send) {
		if (imm) {
			/* Before the Send, in the same write (tx_msg): one
			 * system call and one segment per message, not two. */
			struct rdmap_imm im = {
				.imm = w->imm_data,
				.flags = htonl(URDMA_IMM_FOR_SEND),
			};

			tx_frame_ctrl(c, &c->tx_head, RDMAP_IMM, DDP_QN_SEND,
				      &im, sizeof(im), w->xrc_srqn);
		}
		if (w->opcode == IBV_WR_SEND_WITH_INV)
			hl = tcp_put_untagged_inv(
				h, se ? RDMAP_SEND_SE_INV : RDMAP_SEND_INV,
				DDP_QN_SEND, c->tx_msn[DDP_QN_SEND]++,
				w->imm_data);
		else /* an XRC send QP's: the SRQ, in the same field */
			hl = tcp_put_untagged_inv(
				h, se ? RDMAP_SEND_SE : RDMAP_SEND,
				DDP_QN_SEND, c->tx_msn[DDP_QN_SEND]++,
				w->xrc_srqn);
	} else {
		hl = tcp_put_tagged(h, RDMAP_WRITE, w->rkey, w->remote_addr);
	}
	if (imm && !send) {
		/* A Write's Immediate Data follows it, in the same write */
		struct rdmap_imm im = { .imm = w->imm_data };

		tx_frame_ctrl(c, &c->tx_tail[c->ntail++],
			      se ? RDMAP_IMM_SE : RDMAP_IMM, DDP_QN_SEND, &im,
			      sizeof(im), w->xrc_srqn);
	}
	if (sig)
		tx_flush_tail(c, tag); /* rides with the message's end */
	if (tx_msg(c, h, hl, sp, n, w->byte_len) == -EINPROGRESS)
		return; /* its rest, tails and all, goes later */
	c->ntail = 0; /* sent, or the stream is dead */
	c->tx_head.hlen = 0;
}

/* When the WRs of a dead stream fail: the QP's loss grace after it was
 * found dead, which a NIC's retries would have taken; at once if it was
 * found dead by a timeout, since that was the retry budget. */
static uint64_t conn_dead_due(struct tcp_conn *c, struct urdma_qp *qp)
{
	return c->dead_ns + (c->timed_out ? 0 : urdma_qp_loss_grace_ns(qp));
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

enum urdma_tx tcp_execute(struct urdma_qp *qp, struct urdma_swqe *w,
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

	if (c && atomic_load(&c->dead) && qp->ibqp.qp_type == IBV_QPT_UC) {
		/* UC: sent into the void, as with no responder at all. */
		*status = IBV_WC_SUCCESS;
		return URDMA_TX_DONE;
	}
	if (c && atomic_load(&c->dead)) {
		bool unconfirmed;

		pthread_mutex_lock(&c->ord_lock);
		unconfirmed = c->unc_head != c->unc_tail;
		pthread_mutex_unlock(&c->ord_lock);
		/* Once an error has been reported on this stream the QP is on
		 * its way to ERR: later WRs are flushed.  With messages still
		 * unconfirmed, tcp_maintain fails the first of them: wait for
		 * it.  Otherwise this WR is the first to find the peer gone:
		 * it fails once the retry budget has passed since, as a NIC's
		 * retries run out; not at once, for a peer that exits right
		 * after the messages it needed (ibv_srq_pingpong's server
		 * does) leaves the time to finish that a NIC's retries give
		 * (net_rc_pingpong "srq" failed that way now and then). */
		if (!c->dead_handled && unconfirmed)
			return URDMA_TX_WAIT;
		if (!c->dead_handled) {
			uint64_t due = conn_dead_due(c, qp);

			if (urdma_now_ns() < due) {
				urdma_progress_by(due);
				return URDMA_TX_WAIT;
			}
		}
		*status = atomic_load(&c->dead_reported) ?
				  IBV_WC_WR_FLUSH_ERR :
				  IBV_WC_RETRY_EXC_ERR;
		return URDMA_TX_DONE;
	}
	if (!c || atomic_load(&c->state) != C_UP)
		return tcp_setup_moving(qp) ? URDMA_TX_SETTING_UP :
					      URDMA_TX_NOT_READY;
	if (rx_owner == c)
		return URDMA_TX_WAIT; /* run from poll_cq or the progress thread */
	*status = urdma_local_spans(qp, w, sp, &n,
				    rd ? IBV_ACCESS_LOCAL_WRITE : 0);
	if (*status != IBV_WC_SUCCESS)
		return URDMA_TX_DONE;
	long_park = !rd && w->byte_len >= TX_PARK_MIN &&
		    !atomic_load(&c->resting) && tx_park(c);
	/* The answer to what a receiving poll parked the stream for: from
	 * now on the application is not one that left it to spin on memory
	 * (tcp_maintain), even if its CPU is taken from it in the send.  The
	 * load first: no locked instruction per message otherwise. */
	answer = atomic_load(&c->tx_parked) == TXP_RECV &&
		 atomic_compare_exchange_strong(&c->tx_parked, &recv, TXP_NONE);
	pthread_mutex_lock(&c->tx_lock);
	/* The rest of a message a full socket cut goes first; while some
	 * is left, this WR waits (the progress thread runs it then:
	 * tx_rest_resume). */
	if (atomic_load(&c->resting)) {
		tx_rest_push(c); /* (never waits) */
		if (atomic_load(&c->resting)) {
			r = URDMA_TX_WAIT; /* nothing of it sent */
			goto out;
		}
	}
	/* A Send or Write that finds no room while our own receiving waits
	 * for a receive WR is cut: its rest goes later, and the application
	 * can post that receive.  On the progress thread, one that finds no
	 * room is cut: it serves every stream and must not wait on one.
	 * (UC's peer never waits for a receive, and its message completes
	 * as it is sent: not cut.) */
	c->tx_cut = qp->ibqp.qp_type == IBV_QPT_UC ? TXC_NEVER :
		    urdma_progress_self()	       ? TXC_ALWAYS :
							 TXC_STALLED;
	conn_sync_timeout(c, qp);
	/* More WRs to run after this one: TCP holds this one's bytes for
	 * theirs (MSG_MORE), and the engine's end pushes them (tcp_flush):
	 * a list of WRs, or the Reads that answers let go, goes out in one
	 * segment, one wake-up of the peer. */
	c->tx_more = qp->sq_head + 1 != qp->sq_tail;
	if (rd) {
		r = tx_read_atomic(c, qp, w, sp, n);
	} else {
		tx_send_write(c, qp, w, sp, n);
		if (qp->ibqp.qp_type == IBV_QPT_UC)
			r = URDMA_TX_DONE; /* sent: UC has no acknowledgements */
	}
out:
	c->tx_more = false;
	c->tx_cut = TXC_NEVER;
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
 * With bytes unacknowledged for the budget the stream breaks here (TCP's
 * own timeout waits for its next retransmission).
 * A probe's answer confirms what came before, like any flush.  The pass
 * that sees the oldest waiting asks for the one a budget later.  Under
 * rx_lock.
 */
static void conn_probe_overdue(struct tcp_conn *c, struct urdma_qp *qp)
{
	uint64_t now = urdma_now_ns(), budget = urdma_qp_retry_ns(qp);
	struct rdmap_read_req rr = { 0 };
	struct tcp_info ti;
	socklen_t tl = sizeof(ti);
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
	if (now - c->watch_ns < budget) {
		urdma_progress_by(c->watch_ns + budget);
		return;
	}
	if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
	    ti.tcpi_unacked && ti.tcpi_retransmits) {
		/* Bytes out, retransmitted, and nothing acknowledged for the
		 * budget: the path is gone, as a NIC's retries would have run
		 * out.  TCP_USER_TIMEOUT says so only at a retransmission, up
		 * to a second later (net_faults link-reads: 0.75 or 1.2 s for
		 * a budget of 268 ms).  (Not without a retransmission: bytes
		 * just sent on a stream quiet for longer, its oldest message
		 * waiting for a receive the peer has not posted, are not a
		 * dead path.) */
		uint64_t quiet = ti.tcpi_last_ack_recv * 1000000ull;

		if (quiet >= budget) {
			conn_set_dead_err(c, ETIMEDOUT);
			return;
		}
		urdma_progress_by(now + budget - quiet);
	}
	if (used + 1 >= c->unc_size) {
		/* no room for a probe: look again a budget on (watch_ns +
		 * budget is past: asking for it made the thread spin) */
		urdma_progress_by(now + budget);
		return;
	}
	if (pthread_mutex_trylock(&c->tx_lock)) {
		/* a sender holds the stream: its bytes are timed; look
		 * again soon (a pass asked for now may not come back) */
		urdma_progress_by(now + HOLD_NEAR_NS);
		return;
	}
	if (atomic_load(&c->resting)) {
		/* The rest of a cut message waits for room: its bytes are
		 * timed (TCP_USER_TIMEOUT).  The watch starts again when it
		 * has gone (tx_rest_resume asks for a pass then). */
		c->watch_ns = now;
		tx_unlock(c);
		return;
	}
	c->watch_ns = now;
	pthread_mutex_lock(&c->ord_lock);
	rr.sink_stag = htonl(++c->next_tag);
	unc_push(c, c->unc[(c->unc_tail - 1) & (c->unc_size - 1)].wr_idx,
		 K_FLUSH, c->tx_msn[DDP_QN_READ])->tag = c->next_tag;
	pthread_mutex_unlock(&c->ord_lock);
	tx_ctrl(c, RDMAP_READ_REQ, DDP_QN_READ, &rr, sizeof(rr));
	tx_unlock(c);
}


/* A Send half placed into a receive WR of the QP's SRQ (rcv_abandon lets
 * go of it once the QP is in error: tcp_maintain). */
static bool tcp_srq_held(struct urdma_qp *qp)
{
	struct tcp_conn *c = qp->tr_priv;

	return c && __atomic_load_n(&c->rcv_active, __ATOMIC_RELAXED) &&
	       (__atomic_load_n(&c->rcv_srq, __ATOMIC_RELAXED) ||
		__atomic_load_n(&c->rcv_xsrq, __ATOMIC_RELAXED));
}

bool tcp_maintain(struct urdma_qp *qp)
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
		rcv_abandon(c);
		if (!atomic_load(&c->dead)) {
			/* The peer learns it from the stream's end: its
			 * unconfirmed WRs fail as if our QP stopped answering.
			 * The answers it already earned go first. */
			rsp_send(c);
			conn_shut(c);
			c->dead_handled = true;
			atomic_store(&c->dead_reported, true);
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
			bool away = !tcp_app_polling(c);

			left = away && atomic_load(&c->tx_parked) == TXP_RECV;
			if (away || tcp_cq_armed(c)) {
				conn_park(c, false);
				unread = true;
			}
		}
		if (unread || atomic_load(&c->stalled))
			rx_locked(c, tcp_progress_hold_ns(c));
		if (left && c->rx_bytes != seen)
			conn_spins(c);
		if (atomic_load(&c->parked))
			urdma_progress_by(urdma_now_ns() + PARK_LOOK_NS);
		again = atomic_load(&c->stalled);
		conn_probe_overdue(c, qp);
		/* A lost stream fails the QP once its retry budget has
		 * passed (1 s without one), as a NIC's retries run out:
		 * unconfirmed messages first with RETRY_EXC_ERR, then the QP
		 * to ERR, as over shared memory when the peer process dies
		 * (receives flushed, QP_FATAL), while completions that came
		 * before stay to be polled.  Not at once: a peer that closed
		 * right after the messages it needed (ibv_srq_pingpong keeps
		 * a Send in flight per QP) must not fail a sender that is
		 * about to finish, as it does not on a NIC. */
		if (atomic_load(&c->dead) && !c->dead_handled) {
			uint64_t due = conn_dead_due(c, qp);

			if (urdma_now_ns() >= due) {
				c->dead_handled = true;
				if (c->unc_head != c->unc_tail) {
					unc_settle(c, c->unc_head,
						   IBV_WC_RETRY_EXC_ERR);
					atomic_store(&c->dead_reported, true);
				}
				/* (UC never learns of it: it drops) */
				fail = qp->ibqp.qp_type != IBV_QPT_UC;
			} else {
				urdma_progress_by(due);
				again = true;
			}
		}
	}
	pthread_mutex_unlock(&c->rx_lock);
	tx_rest_resume(c);
	tx_hold_push(c);
	rsp_send_due(c);
	if (fail) /* sq_lock is outer to rx_lock */
		urdma_qp_lost(qp);
	return again;
}


static void tcp_recv_posted(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (c && atomic_load(&c->stalled))
		urdma_progress_kick();
}


/* A WR the stream took completes in error or flushed: the rest of a cut
 * message reads no more of its memory.  Under sq_lock, which keeps the
 * connection. */
static void tcp_quiesce(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (c)
		tx_rest_forget(c);
}

/* The engine stops: what MSG_MORE held back goes now.  Setting TCP_NODELAY
 * (on already) pushes what TCP holds.  sq_lock keeps the connection:
 * qp_disconnect runs under it. */
void tcp_flush(struct urdma_qp *qp)
{
	struct tcp_conn *c = __atomic_load_n(&qp->tr_priv, __ATOMIC_ACQUIRE);

	if (!c || !atomic_load_explicit(&c->corked, memory_order_relaxed))
		return;
	pthread_mutex_lock(&c->tx_lock);
	if (atomic_exchange(&c->corked, false))
		setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 },
			   sizeof(int));
	tx_unlock(c);
}

/* Answers held back for our next message (a flush's) go now.  sq_lock
 * keeps the connection: qp_disconnect runs under it. */
void tcp_release(struct urdma_qp *qp)
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
	.drain = tcp_drain,
	.recv_posted = tcp_recv_posted,
	.srq_held = tcp_srq_held,
	.armed = tcp_armed,
	.release = tcp_release,
	.flush = tcp_flush,
	.quiesce = tcp_quiesce,
	.qpn_reserve = tcp_qpn_reserve,
	.qpn_bind = tcp_qpn_bind,
	.qpn_release = tcp_qpn_release,
	.tick = tcp_tick,
};
