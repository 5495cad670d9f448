// SPDX-License-Identifier: MIT
/*
 * The shared-memory transport: both QPs are on this host.
 *
 * The requester executes every operation itself, in the thread that posted
 * it: RDMA WRITE and READ are copies between its memory and the responder's
 * registered memory (mapped through the responder's identity memfd), atomics
 * are CPU atomics on that mapping, and SEND / WRITE_WITH_IMM take the next
 * receive WR from the responder's shared receive ring, fill it and complete
 * it in place.  The responder's process does nothing.
 *
 * Entering the responder's receive ring follows a Dekker handshake with the
 * owner: set busy, full fence, check the state; the owner sets its state,
 * full fence, waits for busy to clear.  So the owner can flush its ring
 * knowing nobody is inside.
 */
#include <errno.h>
#include <string.h>

#include "transport/shm/shm.h"
#include "util/log.h"

/* ---- connection ---- */

#define ATTACH_WAIT_MS 1000
int urdma_shm_srq_attach(struct urdma_shm_dest *d, struct urdma_peer *peer,
			 uint32_t ctx_id, const struct urdma_shm_qp *h)
{
	uint64_t va = READ_ONCE(h->srq_va), bytes = READ_ONCE(h->srq_bytes);
	struct urdma_shm_srq *s;
	uint64_t avail;

	d->srq = NULL;
	d->srq_ring = NULL;
	if (!bytes)
		return 0;
	if (bytes < sizeof(*s) || bytes > URDMA_SHM_BLOCK_MAX || (va & 4095) ||
	    va >> URDMA_VA_BITS)
		return -EINVAL;
	s = urdma_peer_ptr(peer, va, &avail);
	if (!s || avail < bytes ||
	    urdma_shm_srq_check(s, bytes, READ_ONCE(h->srqn), 0, ctx_id,
				&d->srq_rq, &d->srq_pd))
		return -EINVAL;
	d->srq_ring = (uint8_t *)s + sizeof(*s);
	d->srq = s;
	return 0;
}

/* The kind of QP a QP of kind t talks to. */
static uint32_t peer_kind(enum ibv_qp_type t)
{
	return t == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV :
	       t == IBV_QPT_XRC_RECV ? IBV_QPT_XRC_SEND :
				       t;
}

static bool rec_ok(const struct urdma_qp_rec *rec)
{
	return rec->size >= sizeof(struct urdma_shm_qp) &&
	       rec->size <= URDMA_SHM_BLOCK_MAX && !(rec->va & 4095) &&
	       !(rec->va >> URDMA_VA_BITS);
}

int urdma_shm_rec_find(uint32_t qpn, struct urdma_qp_rec *rec)
{
	int ret = urdma_host_qp_find(qpn, rec);

	return !ret && !rec_ok(rec) ? -EINVAL : ret;
}

struct urdma_shm_qp *urdma_shm_qp_map(struct urdma_peer *peer,
				      const struct urdma_qp_rec *rec,
				      uint32_t qpn, struct urdma_rq_geo *g)
{
	uint64_t avail;
	struct urdma_shm_qp *h = urdma_peer_ptr(peer, rec->va, &avail);

	if (!h || avail < rec->size ||
	    urdma_shm_qp_check(h, rec->size, qpn, rec->ctx_id, g))
		return NULL;
	return h;
}

/* Find and check the peer QP: its record (of our own user's), its context
 * (connected, the hello taken), its shared block (checked, the geometry
 * copied).  0: attached; -EAGAIN: its context has not answered yet;
 * -ENOENT: no QP of this user by that number on this host; else broken. */
static int shm_attach(struct urdma_qp *qp, int wait_ms)
{
	uint32_t qpn = qp->attr.dest_qp_num;
	struct urdma_qp_rec rec;
	struct urdma_shm_qp *h;
	bool rec_read = qp->peer_rec_read; /* urdma_pick_transport read it */
	uint32_t type;
	int ret;

	qp->peer_rec_read = false;
	if (!qp->peer || qp->peer_stale) {
		struct urdma_peer *p;

		/* A QP that is not there, or not usable, is looked for
		 * again after a pause that doubles, not at every retry. */
		if (qp->peer_retry_ns && urdma_now_ns() < qp->peer_retry_ns)
			return -EAGAIN;
		if (rec_read) {
			rec = (struct urdma_qp_rec){ .ctx_id = qp->peer_ctx,
						     .va = qp->peer_va,
						     .size = qp->peer_size };
			ret = rec_ok(&rec) ? 0 : -EINVAL;
		} else {
			ret = urdma_shm_rec_find(qpn, &rec);
		}
		if (ret)
			return ret;
		p = urdma_peer_get(rec.ctx_id);
		if (!p)
			return -errno;
		urdma_peer_set(&qp->peer, p);
		qp->peer_va = rec.va;
		qp->peer_size = rec.size;
		qp->peer_ctx = rec.ctx_id;
		qp->peer_stale = false;
	}
	ret = urdma_peer_wait(qp->peer, wait_ms);
	if (ret)
		goto err;
	rec = (struct urdma_qp_rec){ .ctx_id = qp->peer_ctx,
				     .va = qp->peer_va,
				     .size = qp->peer_size };
	h = urdma_shm_qp_map(qp->peer, &rec, qpn, &qp->dst.rq);
	ret = -EINVAL;
	if (!h)
		goto err;
	/* An XRC send QP talks to an XRC target only, and only it does:
	 * the SRQ is then named per WR (xsrq_find).  (The type is read once:
	 * the peer may change it between two reads.) */
	type = READ_ONCE(h->qp_type);
	qp->peer_xrcd = type == IBV_QPT_XRC_RECV ? READ_ONCE(h->xrcd_id) : 0;
	if (type != peer_kind(qp->ibqp.qp_type) ||
	    (qp->ibqp.qp_type == IBV_QPT_XRC_SEND && !qp->peer_xrcd))
		goto err; /* RC talks to RC, UC to UC, XRC send to target */
	ret = qp->peer_xrcd ? 0 :
			      urdma_shm_srq_attach(&qp->dst, qp->peer,
						   qp->peer_ctx, h);
	if (ret)
		goto err;
	qp->dst.ring = (uint8_t *)h + sizeof(*h);
	urdma_dest_blocks(&qp->dst, qp->peer, h);
	qp->dst.prod = qp->dst.done = 0; /* read on first use */
	qp->peer_pause_ns = qp->peer_retry_ns = 0;
	__atomic_store_n(&qp->dst.qp, h, __ATOMIC_RELEASE);
	return 0;
err:
	/* Start again from the record next time. */
	if (ret != -EAGAIN)
		qp->peer_stale = true;
	return ret;
}

/* shm_attach failed for good: the next look waits 1 ms, 2, 4... 1 s. */
static void attach_pause(struct urdma_qp *qp)
{
	qp->peer_pause_ns = qp->peer_pause_ns ? qp->peer_pause_ns * 2 : 1000000;
	if (qp->peer_pause_ns > 1000000000ull)
		qp->peer_pause_ns = 1000000000ull;
	qp->peer_retry_ns = urdma_now_ns() + qp->peer_pause_ns;
}

static int shm_connect(struct urdma_qp *qp, const struct ibv_qp_attr *attr)
{
	int ret;

	qp->peer_pause_ns = qp->peer_retry_ns = 0;
	ret = shm_attach(qp, ATTACH_WAIT_MS);
	if (ret && ret != -EAGAIN)
		attach_pause(qp);

	/* Like a NIC, the modify succeeds whatever: traffic retries, then
	 * times out. */
	if (ret == -ENOENT)
		urdma_info("qp %#x: no QP %#x of this user on this host",
			   qp->ibqp.qp_num, attr->dest_qp_num);
	else if (ret && ret != -EAGAIN)
		urdma_warn("qp %#x: QP %#x on this host is not usable: %s",
			   qp->ibqp.qp_num, attr->dest_qp_num, strerror(-ret));
	return 0;
}

static void shm_disconnect(struct urdma_qp *qp)
{
	urdma_xsrq_ref_drop(&qp->xsrq);
	qp->inv_next = 0;
	qp->dst.qp = NULL;
	qp->dst.ring = NULL;
	qp->dst.srq = NULL;
	qp->dst.srq_ring = NULL;
	qp->peer_stale = qp->peer_rec_read = false;
	urdma_peer_set(&qp->peer, NULL);
}

/* ---- XRC: the SRQ a WR names ---- */

/* The context whose memory and keys a WR reaches: the responder QP's, or
 * for an XRC target, that of the SRQ the WR named. */
static struct urdma_peer *rpeer(struct urdma_qp *qp)
{
	return qp->peer_xrcd ? qp->xsrq.peer : qp->peer;
}

/* The SRQ a WR names, in the target's domain, as peer_srq: as
 * urdma_xsrq_ref_find. */
static int xsrq_find(struct urdma_qp *qp, uint32_t srqn)
{
	struct urdma_xsrq_ref *r = &qp->xsrq;
	int ret = urdma_xsrq_ref_find(r, srqn, qp->peer_xrcd);

	qp->dst.srq = ret ? NULL : r->shm;
	qp->dst.srq_ring = r->ring;
	qp->dst.srq_rq = r->rq;
	qp->dst.srq_pd = r->pd_id;
	return ret;
}

/* ---- responder side helpers ---- */

/* Is the responder ready for us?  Also tells it to wake us when it is. */
static bool responder_ready(struct urdma_qp *qp)
{
	struct urdma_shm_qp *t = qp->dst.qp;
	uint32_t st = atomic_load_explicit(&t->state, memory_order_acquire);

	return st == URDMA_SQPS_RTR &&
	       atomic_load_explicit(&t->dest_qpn, memory_order_relaxed) ==
		       qp->ibqp.qp_num;
}

/* Both QPs go to ERR: ask the responder, then the engine moves us. */
static void responder_error(struct urdma_qp *qp)
{
	atomic_store(&qp->dst.qp->error_req, 1);
	urdma_peer_wake(qp->peer);
}

/* A receive of the responder completed: ring its CQ's bell and claim its
 * notify, before the deliverer leaves the ring (the QP's busy count keeps
 * the CQ's block alive until then: core/bell.c).  What to wake, after:
 * NOTE_CQ its owner, who fires the CQ (a thread of it that sleeps in
 * ibv_get_cq_event, or its progress thread); NOTE_XRC the XRC SRQ's. */
enum { NOTE_NONE, NOTE_CQ, NOTE_XRC };

static int responder_claim(struct urdma_qp *qp, bool solicited)
{
	if (qp->peer_xrcd) { /* the XRC SRQ's CQ */
		if (!urdma_rq_notify_claim(&qp->dst.srq->notify, solicited))
			return NOTE_NONE;
		atomic_store(&qp->dst.srq->notify_fired, 1);
		return NOTE_XRC;
	}
	return urdma_dest_notify(&qp->dst, qp->peer, solicited) ? NOTE_CQ :
								  NOTE_NONE;
}

static void responder_wake(struct urdma_qp *qp, int note)
{
	if (note == NOTE_XRC)
		urdma_peer_wake(qp->xsrq.peer);
	else if (note == NOTE_CQ && !urdma_wake_owner(qp->dst.wake))
		urdma_peer_wake(qp->peer);
}

/* The completion flags of a receive that w fills. */
static uint32_t rx_flags(const struct urdma_swqe *w)
{
	switch (w->opcode) {
	case IBV_WR_SEND:
		return 0;
	case IBV_WR_SEND_WITH_INV:
		return IBV_WC_WITH_INV; /* imm_data: the rkey */
	default:
		return IBV_WC_WITH_IMM;
	}
}

/*
 * A Send with Invalidate delivered: the responder's owner invalidates the
 * window when it takes the completion (its MR table is not ours to
 * write), which may be after our next WR.  Until then our own accesses
 * refuse that key, as a NIC that ran the invalidation in order would: the
 * key and the entry's seq as they were; a bind since changes seq.
 */
static void inv_note(struct urdma_qp *qp, const struct urdma_swqe *w)
{
	const struct urdma_shm_mr *e;

	if (w->opcode != IBV_WR_SEND_WITH_INV)
		return;
	e = &urdma_peer_shm(qp->peer)->mr[URDMA_MR_IDX(w->imm_data)];
	qp->inv_key[qp->inv_next % URDMA_INV_KEYS] = w->imm_data;
	qp->inv_seq[qp->inv_next % URDMA_INV_KEYS] =
		atomic_load_explicit(&e->seq, memory_order_acquire);
	qp->inv_next++;
}

static bool inv_noted(struct urdma_qp *qp, uint32_t rkey)
{
	const struct urdma_shm_mr *e =
		&urdma_peer_shm(qp->peer)->mr[URDMA_MR_IDX(rkey)];

	for (uint32_t i = 0; i < URDMA_INV_KEYS && i < qp->inv_next; i++)
		if (qp->inv_key[i] == rkey &&
		    qp->inv_seq[i] == atomic_load_explicit(
					      &e->seq, memory_order_acquire))
			return true;
	return false;
}

/* Does the rkey a Send with Invalidate names belong to a window bound to
 * the responder QP?  Read in its MR table, as a responder would check it
 * before taking a receive; the owner invalidates it (rq.c). */
static bool inv_valid(struct urdma_qp *qp, uint32_t rkey)
{
	const struct urdma_shm_mr *e =
		&urdma_peer_shm(qp->peer)->mr[URDMA_MR_IDX(rkey)];

	return rkey &&
	       atomic_load_explicit(&e->key, memory_order_acquire) == rkey &&
	       (atomic_load_explicit(&e->flags, memory_order_relaxed) &
		URDMA_MR_F_MW) &&
	       READ_ONCE(e->qpn) == qp->attr.dest_qp_num;
}

/* Resolve [addr, addr+len) under rkey in the responder's memory. */
static int remote_span(struct urdma_qp *qp, struct urdma_swqe *w,
		       uint32_t access, uint64_t len, struct urdma_span *sp)
{
	struct urdma_shm_qp *t = qp->dst.qp;

	if (qp->inv_next && len && inv_noted(qp, w->rkey))
		return -EINVAL;

	/* Through an XRC target: the keys of the SRQ's context and PD. */
	return urdma_remote_lookup(urdma_peer_shm(rpeer(qp)),
				   READ_ONCE(t->access),
				   qp->peer_xrcd ? qp->dst.srq_pd :
						   READ_ONCE(t->pd_id),
				   qp->attr.dest_qp_num, w->rkey,
				   w->remote_addr, len, access, sp);
}

int urdma_shm_take_ring(struct urdma_shm_dest *d, unsigned flags,
			struct urdma_shm_rcv *r)
{
	struct urdma_shm_qp *t = d->qp;
	uint32_t done, prod;

	/* How far the owner posted: the last value read, until the ring
	 * looks empty by it (a cached tail, as UCX's FIFO keeps: rq_prod's
	 * line moves to the owner with each ibv_post_recv, and reading it per
	 * message cost 13 % of the 8 B ib_send_bw rate here).  Read again if
	 * rq_done is not what we left it (a reset, another writer of a ring
	 * that has many, or a scribble), or the ring was reset since: with
	 * many writers, one may have brought rq_done back to what we left. */
	done = atomic_load_explicit(&t->rq_done, memory_order_relaxed);
	prod = d->prod;
	if (done != d->done || prod - done - 1 >= d->rq.size ||
	    ((flags & URDMA_RING_SHARED) &&
	     atomic_load_explicit(&t->rq_epoch, memory_order_relaxed) !=
		     d->epoch)) {
		d->epoch = atomic_load_explicit(&t->rq_epoch,
						memory_order_relaxed);
		prod = d->prod = atomic_load_explicit(&t->rq_prod,
						      memory_order_acquire);
	}
	if (prod - done > d->rq.size) {
		/* Indices no owner writes: someone scribbled on the ring. */
		urdma_warn("the receive queue of QP %#x is corrupt (%u posted, "
			   "%u done)", READ_ONCE(t->qpn), prod, done);
		return -1;
	}
	if (done == prod) {
		/* RNR: ask for a wake-up, then look once more. */
		if (flags & URDMA_RING_RNR_WAIT)
			atomic_store(&t->rnr_waiter, 1);
		atomic_thread_fence(memory_order_seq_cst);
		prod = d->prod = atomic_load_explicit(&t->rq_prod,
						      memory_order_acquire);
		if (done == prod)
			return URDMA_TX_RNR;
	}
	*r = (struct urdma_shm_rcv){ urdma_rqe_at(d->ring, &d->rq, done), done,
				     READ_ONCE(t->pd_id), d->rq.max_sge };
	/* Posted and not completed: its tag is its index (shared.h).  An
	 * rq_done moved by someone onto a slot not lent to us is refused. */
	if (!urdma_rqe_posted(r->e, done)) {
		urdma_warn("the receive queue of QP %#x is corrupt (entry %u "
			   "not posted)", READ_ONCE(t->qpn), done);
		return -1;
	}
	return 0;
}

void urdma_shm_ring_publish(struct urdma_shm_dest *d,
			    const struct urdma_shm_rcv *r)
{
	urdma_ring_publish(d->qp, r->e, r->idx);
	d->done = r->idx + 1;
}

int urdma_shm_take_srq(struct urdma_shm_dest *d, struct urdma_peer *owner,
		       struct urdma_shm_rcv *r)
{
	bool wake;
	int ret = urdma_srq_claim(d->srq, d->srq_ring, &d->srq_rq, &r->idx,
				  &wake);

	if (ret == -EAGAIN)
		return URDMA_TX_RNR;
	if (ret) {
		urdma_warn("the SRQ of QP %#x is corrupt", READ_ONCE(d->qp->qpn));
		return -1;
	}
	if (wake && owner)
		urdma_peer_wake(owner);
	else if (wake) /* our own SRQ */
		urdma_progress_kick();
	r->e = urdma_rqe_at(d->srq_ring, &d->srq_rq, r->idx);
	r->pd_id = d->srq_pd;
	r->max_sge = d->srq_rq.max_sge;
	return 0;
}

/* A UC message the responder does not take is dropped, as UC drops it:
 * the sender, which no acknowledgement tells, completes it. */
static enum urdma_tx uc_drop(struct urdma_qp *qp, const struct urdma_swqe *w,
			     const char *why, enum ibv_wc_status *status)
{
	urdma_dbg("qp %#x: uc message %#llx dropped: %s", qp->ibqp.qp_num,
		  (unsigned long long)w->wr_id, why);
	*status = IBV_WC_SUCCESS;
	return URDMA_TX_DONE;
}

/*
 * SEND, SEND_WITH_IMM, SEND_WITH_INV and RDMA_WRITE_WITH_IMM: consume the
 * responder's next receive WR, of its ring or its SRQ.  For the write,
 * the data goes to the rkey's range first.
 */
static enum urdma_tx deliver(struct urdma_qp *qp, struct urdma_swqe *w,
			     enum ibv_wc_status *status)
{
	struct urdma_shm_qp *t = qp->dst.qp;
	struct urdma_span local[URDMA_MAX_SGE + 1], dst[URDMA_MAX_SGE + 1];
	enum ibv_wc_status rx_status = IBV_WC_SUCCESS;
	bool is_write = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	bool uc = qp->ibqp.qp_type == IBV_QPT_UC, inl;
	struct urdma_shm_rqe *e;
	struct urdma_shm_rcv r;
	int nl = 0, nd = 0, ret, note = NOTE_NONE;
	uint64_t room = 0;

	*status = urdma_local_spans(qp, w, local, &nl, 0);
	if (*status != IBV_WC_SUCCESS)
		return URDMA_TX_DONE;

	urdma_rq_busy(t);
	if (!responder_ready(qp)) {
		if (uc) {
			urdma_rq_idle(t);
			return uc_drop(qp, w, "the responder is not ready",
				       status);
		}
		atomic_store(&t->rnr_waiter, 1);
		urdma_rq_idle(t);
		return URDMA_TX_NOT_READY;
	}
	/* What is refused takes no receive WR: a Write's rkey, the key of a
	 * Send with Invalidate.  Both QPs to ERR, the receives flushed (UC:
	 * the message is dropped). */
	if ((is_write && remote_span(qp, w, IBV_ACCESS_REMOTE_WRITE,
				     w->byte_len, &dst[0])) ||
	    (w->opcode == IBV_WR_SEND_WITH_INV && !inv_valid(qp, w->imm_data))) {
		urdma_rq_idle(t);
		if (uc)
			return uc_drop(qp, w, "its rkey is refused", status);
		*status = IBV_WC_REM_ACCESS_ERR;
		responder_error(qp);
		return URDMA_TX_DONE;
	}
	ret = qp->dst.srq ? urdma_shm_take_srq(&qp->dst, rpeer(qp), &r) :
			    urdma_shm_take_ring(&qp->dst,
						uc ? 0 : URDMA_RING_RNR_WAIT, &r);
	if (ret) {
		urdma_rq_idle(t);
		if (ret == URDMA_TX_RNR && uc)
			return uc_drop(qp, w, "no receive is posted", status);
		if (ret == URDMA_TX_RNR)
			return URDMA_TX_RNR;
		*status = IBV_WC_REM_OP_ERR;
		responder_error(qp);
		return URDMA_TX_DONE;
	}
	e = r.e;
	if (is_write) {
		nd = 1;
	} else if (urdma_rqe_spans(urdma_peer_shm(rpeer(qp)), r.pd_id,
				   r.max_sge, e, dst, &nd, &room)) {
		rx_status = IBV_WC_LOC_PROT_ERR;
		*status = IBV_WC_REM_OP_ERR;
	} else if (room < w->byte_len) {
		if (uc && !qp->dst.srq) { /* taken back: not published */
			urdma_rq_idle(t);
			return uc_drop(qp, w, "it is longer than the receive",
				       status);
		}
		/* (UC: the SRQ's entry is claimed, so it completes) */
		rx_status = uc ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_LOC_LEN_ERR;
		*status = IBV_WC_REM_INV_REQ_ERR;
	}
	/* A small Send into a QP's own ring goes in the entry, in its first
	 * SGE's place, for the owner to copy (URDMA_RQE_INLINE, shared.h). */
	inl = rx_status == IBV_WC_SUCCESS && !is_write && !qp->dst.srq &&
	      w->byte_len && w->byte_len <= URDMA_RQE_INLINE &&
	      READ_ONCE(e->sge[0].length) >= w->byte_len;
	if (inl)
		dst[0] = (struct urdma_span){ .ptr = (uint8_t *)e->sge,
					      .len = w->byte_len };
	if (rx_status == IBV_WC_SUCCESS &&
	    urdma_copy_spans(inl ? NULL : rpeer(qp), dst, inl ? 1 : nd, NULL,
			     local, nl, w->byte_len)) {
		/* Our own pages vanished: a local protection error. */
		rx_status = IBV_WC_WR_FLUSH_ERR;
		*status = IBV_WC_LOC_PROT_ERR;
	}
	/* The receive WR completes, in error at the responder if need be. */
	if (inl && rx_status == IBV_WC_SUCCESS)
		e->inline_len = w->byte_len;
	e->status = rx_status;
	e->opcode = is_write && rx_status == IBV_WC_SUCCESS ?
			    IBV_WC_RECV_RDMA_WITH_IMM :
			    IBV_WC_RECV;
	e->byte_len = rx_status == IBV_WC_SUCCESS ? w->byte_len : 0;
	e->imm_data = w->imm_data;
	e->wc_flags = rx_status == IBV_WC_SUCCESS ? rx_flags(w) : 0;
	e->src_qp = qp->ibqp.qp_num;
	if (qp->dst.srq) {
		urdma_srq_publish(e, r.idx, qp->attr.dest_qp_num);
	} else {
		urdma_shm_ring_publish(&qp->dst, &r);
	}
	/* An error completion always fires an armed CQ: that of the
	 * responder's ring, its SRQ's QP or its XRC SRQ.  But a UC receive
	 * the responder could not use: no event, but its poll finds the
	 * completion. */
	if (uc && rx_status == IBV_WC_LOC_PROT_ERR)
		urdma_dest_ring(&qp->dst, qp->peer);
	else
		note = responder_claim(qp, (w->send_flags & IBV_SEND_SOLICITED) ||
						   rx_status != IBV_WC_SUCCESS);
	urdma_rq_idle(t);
	responder_wake(qp, note);
	if (uc && rx_status != IBV_WC_WR_FLUSH_ERR) {
		/* No acknowledgement tells the sender.  A receive the
		 * responder could not use puts it in error; a length error
		 * does not (IBA's UC error classes). */
		if (rx_status == IBV_WC_LOC_PROT_ERR)
			responder_error(qp);
		*status = IBV_WC_SUCCESS;
		return URDMA_TX_DONE;
	}
	if (rx_status != IBV_WC_SUCCESS) {
		responder_error(qp);
		return URDMA_TX_DONE;
	}
	inv_note(qp, w);
	*status = IBV_WC_SUCCESS;
	return URDMA_TX_DONE;
}

/* Run WR w against the attached responder. */
static enum urdma_tx run_wr(struct urdma_qp *qp, struct urdma_swqe *w,
			    enum ibv_wc_status *status)
{
	struct urdma_span local[URDMA_MAX_SGE + 1], remote;
	int nl = 0, ret;

	switch (w->opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return deliver(qp, w, status);
	default:
		break;
	}
	/* One-sided: no receive WR; the responder only has to be there. */
	if (!responder_ready(qp))
		return qp->ibqp.qp_type == IBV_QPT_UC ?
			       uc_drop(qp, w, "the responder is not ready",
				       status) :
			       URDMA_TX_NOT_READY;

	switch (w->opcode) {
	case IBV_WR_RDMA_WRITE:
		*status = urdma_local_spans(qp, w, local, &nl, 0);
		if (*status)
			return URDMA_TX_DONE;
		ret = remote_span(qp, w, IBV_ACCESS_REMOTE_WRITE, w->byte_len,
				  &remote);
		if (ret)
			break;
		if (urdma_copy_spans(rpeer(qp), &remote, 1, NULL, local, nl,
				     w->byte_len))
			*status = IBV_WC_LOC_PROT_ERR;
		return URDMA_TX_DONE;
	case IBV_WR_RDMA_READ:
		*status = urdma_local_spans(qp, w, local, &nl,
					    IBV_ACCESS_LOCAL_WRITE);
		if (*status)
			return URDMA_TX_DONE;
		ret = remote_span(qp, w, IBV_ACCESS_REMOTE_READ, w->byte_len,
				  &remote);
		if (ret)
			break;
		if (urdma_copy_spans(NULL, local, nl, rpeer(qp), &remote, 1,
				     w->byte_len))
			*status = IBV_WC_LOC_PROT_ERR;
		return URDMA_TX_DONE;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		struct urdma_span result = { .len = 8 };
		uint64_t old;

		*status = urdma_local_spans(qp, w, local, &nl,
					    IBV_ACCESS_LOCAL_WRITE);
		if (*status)
			return URDMA_TX_DONE;
		if (w->remote_addr & 7) {
			*status = IBV_WC_REM_INV_REQ_ERR;
			responder_error(qp);
			return URDMA_TX_DONE;
		}
		ret = remote_span(qp, w, IBV_ACCESS_REMOTE_ATOMIC, 8, &remote);
		if (ret)
			break;
		if (urdma_atomic_span(rpeer(qp), urdma_peer_shm(rpeer(qp)),
				      &remote,
				      w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP,
				      w->compare_add, w->swap, &old)) {
			/* The target's memory is out of our reach. */
			*status = IBV_WC_REM_OP_ERR;
			responder_error(qp);
			return URDMA_TX_DONE;
		}
		result.ptr = (uint8_t *)&old;
		if (urdma_copy_spans(NULL, local, nl, NULL, &result, 1, 8))
			*status = IBV_WC_LOC_PROT_ERR;
		return URDMA_TX_DONE;
	}
	default:
		*status = IBV_WC_LOC_QP_OP_ERR;
		return URDMA_TX_DONE;
	}
	/* A remote key, bound or right was refused. */
	if (qp->ibqp.qp_type == IBV_QPT_UC)
		return uc_drop(qp, w, "its rkey is refused", status);
	*status = IBV_WC_REM_ACCESS_ERR;
	responder_error(qp);
	return URDMA_TX_DONE;
}

static enum urdma_tx shm_execute(struct urdma_qp *qp, struct urdma_swqe *w,
				 enum ibv_wc_status *status)
{
	struct urdma_shm_srq *xs;
	enum urdma_tx r;
	int ret;

	if (!__atomic_load_n(&qp->dst.qp, __ATOMIC_ACQUIRE)) {
		ret = shm_attach(qp, 0); /* not there at RTR: look again */
		if (ret) {
			if (ret != -EAGAIN)
				attach_pause(qp);
			return URDMA_TX_NOT_READY;
		}
	}
	if (urdma_peer_dead(qp->peer))
		return URDMA_TX_NOT_READY;
	if (!qp->peer_xrcd)
		return run_wr(qp, w, status);
	/* Through an XRC target: the SRQ the WR names, entered for the
	 * length of the WR (it may be destroyed at any time). */
	ret = xsrq_find(qp, w->xrc_srqn);
	if (ret == -EAGAIN)
		return URDMA_TX_NOT_READY;
	xs = qp->dst.srq;
	if (ret || !urdma_xsrq_enter(&qp->xsrq)) {
		qp->dst.srq = NULL;
		*status = IBV_WC_REM_INV_REQ_ERR; /* no such SRQ there */
		responder_error(qp);
		return URDMA_TX_DONE;
	}
	r = run_wr(qp, w, status);
	urdma_xsrq_leave(xs);
	return r;
}

const struct urdma_transport_ops urdma_shm_transport = {
	.name = "shm",
	.connect = shm_connect,
	.disconnect = shm_disconnect,
	.execute = shm_execute,
};
