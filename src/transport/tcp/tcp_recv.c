// SPDX-License-Identifier: MIT
/*
 * The TCP transport's receives: the receive WR a Send or an Immediate Data
 * message takes (of the QP's own ring, its SRQ, or for an XRC target the
 * XRC SRQ the message names, of whichever process), placing a Send into it
 * segment by segment, completing it; and what UC drops instead.  Called
 * from the receive path (tcp_rx.c) under conn->rx_lock.
 */
#include <arpa/inet.h>
#include <string.h>

#include "transport/tcp/iwarp_parse.h"
#include "transport/transport.h"
#include "util/log.h"
#include "transport/tcp/tcp.h"

/* An XRC target's message for XRC SRQ srqn: of its domain, of this
 * process or another of this user's (found by its record, placed into
 * through that context, as a shm deliverer does), entered
 * (urdma_xsrq_enter) until the segment is placed.  As rcv_claim. */
static int rcv_claim_xrc(struct tcp_conn *c, uint32_t srqn, uint32_t *term)
{
	struct urdma_xsrq_ref *r = &c->rcv_xref;
	struct urdma_shm_srq *s;
	uint32_t idx;
	bool wake;
	int ret = urdma_xsrq_ref_find(r, srqn, c->qp->xrcd->id);

	if (ret == -EAGAIN)
		return RX_STALL; /* its context is answering */
	if (ret || !urdma_xsrq_enter(r)) {
		urdma_info("qp %#x: a message for SRQ %#x, which is not one of "
			   "its domain", c->qp->ibqp.qp_num, srqn);
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_QN, TERM_HDRCT_D);
		return RX_ERR;
	}
	s = r->shm;
	if (urdma_srq_claim(s, r->ring, &r->rq, &idx, &wake)) {
		urdma_xsrq_leave(s);
		return RX_STALL; /* none, or the SRQ is corrupt */
	}
	if (wake)
		urdma_peer_wake(r->peer);
	c->rcv_e = urdma_rqe_at(r->ring, &r->rq, idx);
	c->rcv_srq = NULL;
	c->rcv_xsrq = s;
	c->rcv_idx = idx;
	c->rcv_got = 0;
	return 0;
}

/* Enter again, for a later segment, the XRC SRQ whose receive the
 * message holds: false if it is gone (its owner destroyed it), and the
 * receive with it. */
static bool rcv_xrc_reenter(struct tcp_conn *c)
{
	if (urdma_xsrq_enter(&c->rcv_xref))
		return true;
	c->rcv_active = false;
	c->rcv_xsrq = NULL;
	return false;
}

/* Claim the next receive WR (of the QP's ring or its SRQ's; an XRC
 * target's: of the SRQ of its domain the message names, ulp), with the
 * QP's ring entered.  0, RX_STALL (none posted), or RX_ERR (no such XRC
 * SRQ: *term). */
static int rcv_claim(struct tcp_conn *c, uint32_t ulp, uint32_t *term)
{
	struct urdma_qp *qp = c->qp;
	struct urdma_srq *srq = qp->srq;
	uint32_t done;
	bool wake;

	if (qp->xrcd)
		return rcv_claim_xrc(c, ulp, term);
	if (srq) {
		if (urdma_srq_claim(srq->shm, srq->ring, &srq->rq, &done,
				    &wake))
			return RX_STALL; /* none, or the SRQ is corrupt */
		if (wake)
			urdma_progress_kick();
		c->rcv_e = urdma_rqe_at(srq->ring, &srq->rq, done);
	} else {
		done = atomic_load(&qp->shm->rq_done);
		if (done == atomic_load_explicit(&qp->rq_prod,
						 memory_order_acquire))
			return RX_STALL;
		c->rcv_e = urdma_rq_entry(qp, done);
		/* Posted and not completed: its tag is its index (shared.h).
		 * rq_done is in shared memory: another process may have
		 * moved it onto a slot not lent to us. */
		if (!urdma_rqe_posted(c->rcv_e, done)) {
			urdma_warn("qp %#x: its receive queue is corrupt (entry "
				   "%u not posted)", qp->ibqp.qp_num, done);
			atomic_store(&qp->rq_bad, true);
			urdma_progress_kick();
			return RX_STALL;
		}
	}
	c->rcv_srq = srq;
	c->rcv_xsrq = NULL;
	c->rcv_idx = done;
	c->rcv_got = 0;
	return 0;
}

/* Complete the claimed receive, with the ring (or the XRC SRQ) entered
 * (unless the owner flushed it meanwhile: an SRQ's entry is always
 * completed). */
static void rcv_complete(struct tcp_conn *c, enum ibv_wc_status st,
			 enum ibv_wc_opcode op, uint64_t byte_len,
			 uint32_t wc_flags, uint32_t imm_data)
{
	struct urdma_shm_rqe *e = c->rcv_e;
	struct urdma_srq *srq = c->rcv_srq;
	struct urdma_shm_srq *xs = c->rcv_xsrq;

	c->rcv_active = false;
	c->rcv_xsrq = NULL;
	if (!srq && !xs && atomic_load(&c->qp->shm->rq_done) != c->rcv_idx)
		return;
	e->status = st;
	e->opcode = op;
	e->byte_len = byte_len;
	e->imm_data = imm_data;
	e->wc_flags = wc_flags; /* imm_data: immediate or invalidated rkey */
	e->src_qp = c->peer_qpn;
	c->rx_recvs++;
	if (srq || xs) {
		urdma_srq_publish(e, c->rcv_idx, c->local_qpn);
	} else {
		urdma_ring_publish(c->qp->shm, e, c->rcv_idx);
		urdma_qp_bell_own(c->qp);
	}
	/* An XRC SRQ completes into its own CQ: its owner's progress thread
	 * takes it there and fires it, if armed (srq.c). */
	if (xs && urdma_rq_notify_claim(&xs->notify,
					c->rcv_se || st != IBV_WC_SUCCESS)) {
		atomic_store(&xs->notify_fired, 1);
		urdma_peer_wake(c->rcv_xref.peer);
	}
}

/* The spans of the claimed receive WR: checked in the MR table and PD of
 * the context and PD whose WR it is. */
static int rcv_spans(struct tcp_conn *c)
{
	struct urdma_qp *qp = c->qp;
	struct urdma_srq *srq = c->rcv_srq;
	const struct urdma_xsrq_ref *r = &c->rcv_xref;

	if (c->rcv_xsrq)
		return urdma_rqe_spans(urdma_peer_shm(r->peer), r->pd_id,
				       r->rq.max_sge, c->rcv_e, c->rcv_sp,
				       &c->rcv_n, &c->rcv_room);
	return urdma_rqe_spans(srq ? srq->uctx->shm : qp->uctx->shm,
			       to_upd(srq ? srq->ibsrq.pd : qp->ibqp.pd)->id,
			       srq ? srq->rq.max_sge : qp->rq.max_sge,
			       c->rcv_e, c->rcv_sp, &c->rcv_n, &c->rcv_room);
}

/* The QP stops receiving (error, disconnect) in the middle of a Send: an
 * SRQ's entry it holds completes as flushed, or the SRQ would wait for it.
 * (Its own ring's entries the owner flushes.)  Under rx_lock. */
void rcv_abandon(struct tcp_conn *c)
{
	struct urdma_shm_srq *xs = c->rcv_xsrq;

	if (!c->rcv_active)
		return;
	if (xs) { /* unless its owner destroyed it meanwhile */
		if (rcv_xrc_reenter(c)) {
			rcv_complete(c, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0,
				     0);
			urdma_xsrq_leave(xs);
		}
	} else if (c->rcv_srq) {
		rcv_complete(c, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
	}
}

/* A UC Send the receiver cannot take (no receive, too long) is dropped,
 * the rest of its segments with it, without a word to the sender: UC has
 * no acknowledgements. */
static int uc_drop_send(struct tcp_conn *c, const struct iwarp_msg *m,
			const char *why)
{
	if (why)
		urdma_dbg("qp %#x: a uc Send dropped: %s", c->local_qpn, why);
	c->rcv_active = false;
	c->rx_dropping = !m->last;
	if (m->last) {
		c->imm_pending = false;
		c->rx_msn[DDP_QN_SEND]++;
	}
	return RX_OK;
}

/* A Send segment: the first claims a receive WR, each is placed at its
 * MO, the last completes the WR.  One pass through the ring's handshake
 * per segment. */
int rx_send(struct tcp_conn *c, const struct iwarp_msg *m, uint32_t *term)
{
	struct urdma_qp *qp = c->qp;
	bool done = false, solicited = m->opcode == RDMAP_SEND_SE ||
				       m->opcode == RDMAP_SEND_SE_INV;
	bool inv = m->opcode == RDMAP_SEND_INV ||
		   m->opcode == RDMAP_SEND_SE_INV;
	struct urdma_shm_srq *entered = NULL; /* an XRC SRQ, for the segment */
	bool uc = qp->ibqp.qp_type == IBV_QPT_UC;
	int r = RX_OK;

	if (!rq_enter(qp))
		return RX_OK; /* the QP left RTR: the stream is closing */
	if (c->rx_dropping) {
		r = uc_drop_send(c, m, NULL);
		goto out;
	}
	/* An XRC send QP receives nothing; an XRC target's Sends name their
	 * SRQ in the field a Send with Invalidate would use; UC has no Send
	 * with Invalidate. */
	if (qp->ibqp.qp_type == IBV_QPT_XRC_SEND ||
	    (inv && (qp->xrcd || qp->ibqp.qp_type == IBV_QPT_UC))) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		r = RX_ERR;
		goto out;
	}
	/* An STag to invalidate that names no window of the QP: refused
	 * before a receive is taken (RFC 5040 7.2). */
	if (inv && !m->mo && !c->rcv_active &&
	    !urdma_mw_remote_invalidate(qp, m->stag, true)) {
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
				  TERM_RDMAP_EC_INV_STAG, TERM_HDRCT_D);
		r = RX_ERR;
		goto out;
	}
	c->rcv_se = solicited;
	if (c->rcv_active && c->rcv_xsrq) { /* a later segment */
		entered = c->rcv_xsrq;
		if (!rcv_xrc_reenter(c)) { /* the SRQ went meanwhile */
			entered = NULL;
			*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
					  TERM_DDP_EC_U_INV_QN, TERM_HDRCT_D);
			r = RX_ERR;
			goto out;
		}
	}
	if (!m->mo && !c->rcv_active) {
		r = rcv_claim(c, m->stag, term);
		if (r == RX_STALL && uc) {
			r = uc_drop_send(c, m, "no receive is posted");
			goto out;
		}
		if (r) /* RX_STALL, like RNR: hold the stream */
			goto out;
		entered = c->rcv_xsrq;
		c->rcv_active = true;
		if (rcv_spans(c)) {
			rcv_complete(c, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0,
				     0, 0);
			*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
					  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
			r = RX_ERR;
			goto out_done;
		}
	}
	if (!c->rcv_active || m->mo != c->rcv_got) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_MO, TERM_HDRCT_D);
		r = RX_ERR;
		goto out;
	}
	if (c->rcv_got + m->len > c->rcv_room && uc) {
		/* An SRQ's claimed entry completes (IBA's UC class E); the
		 * QP's own ring's is left for the next message. */
		bool srq = c->rcv_srq != NULL;

		if (srq)
			rcv_complete(c, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, 0,
				     0, 0);
		r = uc_drop_send(c, m, "longer than the receive");
		if (srq) {
			solicited = true; /* an error completion: notified */
			goto out_done;
		}
		goto out;
	}
	if (c->rcv_got + m->len > c->rcv_room) {
		rcv_complete(c, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, 0, 0);
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_TOO_LONG, TERM_HDRCT_D);
		r = RX_ERR;
		goto out_done;
	}
	if (m->len && spans_put(c->rcv_xsrq ? c->rcv_xref.peer : NULL,
				c->rcv_sp, c->rcv_n, c->rcv_got, m->payload,
				m->len)) {
		rcv_complete(c, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, 0, 0);
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_UNSPEC, TERM_HDRCT_D);
		r = RX_ERR;
		goto out_done;
	}
	c->rcv_got += m->len;
	if (!m->last)
		goto out;
	if (inv) {
		/* Send with Invalidate: ours to do, before the completion;
		 * a key that names no window of the QP is a protection
		 * error. */
		if (urdma_mw_remote_invalidate(qp, m->stag, false)) {
			struct urdma_srq *srq = c->rcv_srq;

			/* (in our private memory: rq.c does not do it again) */
			if (srq)
				srq->rq_wr[c->rcv_idx & (srq->rq.size - 1)]
					.inv_done = true;
			else
				qp->rq_wr[c->rcv_idx & (qp->rq.size - 1)]
					.inv_done = true;
			rcv_complete(c, IBV_WC_SUCCESS, IBV_WC_RECV, c->rcv_got,
				     IBV_WC_WITH_INV, m->stag);
		} else {
			/* RFC 5040 7.2: an invalid STag to invalidate */
			rcv_complete(c, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, 0,
				     0);
			*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_PROT,
					  TERM_RDMAP_EC_INV_STAG, TERM_HDRCT_D);
			r = RX_ERR;
		}
	} else {
		rcv_complete(c, IBV_WC_SUCCESS, IBV_WC_RECV, c->rcv_got,
			     c->imm_pending ? IBV_WC_WITH_IMM : 0, c->imm);
	}
	c->imm_pending = false;
	c->rx_msn[DDP_QN_SEND]++;
out_done:
	done = true;
out:
	if (entered)
		urdma_xsrq_leave(entered);
	urdma_rq_idle(qp->shm);
	if (done) /* errors always notify */
		rq_note(c, solicited || r == RX_ERR);
	return r;
}

/* Immediate Data: for the next Send, or completing a Write's receive. */
int rx_imm(struct tcp_conn *c, const struct iwarp_msg *m, uint32_t *term)
{
	struct urdma_qp *qp = c->qp;
	struct urdma_shm_srq *entered;
	int r;

	if (qp->ibqp.qp_type == IBV_QPT_XRC_SEND) { /* receives nothing */
		*term = term_ctrl(TERM_LAYER_RDMAP, TERM_RDMAP_ET_OP,
				  TERM_RDMAP_EC_OPCODE, TERM_HDRCT_D);
		return RX_ERR;
	}
	/* Not inside a Send still being placed (or dropped): its receive
	 * is claimed. */
	if (c->rcv_active || c->rx_dropping) {
		*term = term_ctrl(TERM_LAYER_DDP, TERM_DDP_ET_UNTAGGED,
				  TERM_DDP_EC_U_INV_MSN, TERM_HDRCT_D);
		return RX_ERR;
	}

	if (m->u.imm.flags & URDMA_IMM_FOR_SEND) {
		c->imm_pending = true;
		c->imm = m->u.imm.imm;
		c->rx_msn[DDP_QN_SEND]++;
		return RX_OK;
	}
	if (qp->ibqp.qp_type == IBV_QPT_UC && c->last_write_dropped) {
		c->last_write_dropped = false; /* its Write was dropped */
		c->rx_msn[DDP_QN_SEND]++;
		return RX_OK;
	}
	if (!rq_enter(qp))
		return RX_OK;
	c->rcv_se = m->opcode == RDMAP_IMM_SE;
	r = rcv_claim(c, m->stag, term);
	if (r == RX_STALL && qp->ibqp.qp_type == IBV_QPT_UC) {
		urdma_rq_idle(qp->shm); /* no receive: dropped */
		c->rx_msn[DDP_QN_SEND]++;
		return RX_OK;
	}
	if (r) {
		urdma_rq_idle(qp->shm);
		return r;
	}
	entered = c->rcv_xsrq;
	rcv_complete(c, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
		     c->last_write_len, IBV_WC_WITH_IMM, m->u.imm.imm);
	if (entered)
		urdma_xsrq_leave(entered);
	urdma_rq_idle(qp->shm);
	rq_note(c, m->opcode == RDMAP_IMM_SE);
	c->rx_msn[DDP_QN_SEND]++;
	return RX_OK;
}
