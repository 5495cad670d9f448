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
#include <sys/mman.h>

#include "transport/transport.h"
#include "util/log.h"

/* ---- connection ---- */

static int shm_connect(struct urdma_qp *qp, const struct ibv_qp_attr *attr)
{
	struct urdma_shm_qp *pq;
	size_t size;

	pq = urdma_host_open("qp", attr->dest_qp_num, &size);
	if (!pq) {
		/* Like a NIC: the modify succeeds, traffic will time out. */
		urdma_info("qp %#x: no QP %#x on this host", qp->ibqp.qp_num,
			   attr->dest_qp_num);
		return 0;
	}
	if (pq->magic != URDMA_SHM_MAGIC || pq->version != URDMA_SHM_VERSION ||
	    pq->qpn != attr->dest_qp_num) {
		urdma_warn("qp %#x: QP %#x has an unknown layout", qp->ibqp.qp_num,
			   attr->dest_qp_num);
		munmap(pq, size);
		return -EINVAL;
	}
	qp->peer = urdma_peer_get(pq->ctx_id, pq->pid);
	if (!qp->peer) {
		munmap(pq, size);
		return 0; /* gone already: traffic will fail */
	}
	qp->peer_qp = pq;
	qp->peer_qp_size = size;
	return 0;
}

static void shm_disconnect(struct urdma_qp *qp)
{
	if (qp->peer_qp)
		munmap(qp->peer_qp, qp->peer_qp_size);
	qp->peer_qp = NULL;
	urdma_peer_put(qp->peer);
	qp->peer = NULL;
}

/* ---- responder side helpers ---- */

/* Is the responder ready for us?  Also tells it to wake us when it is. */
static bool responder_ready(struct urdma_qp *qp)
{
	struct urdma_shm_qp *t = qp->peer_qp;
	uint32_t st = atomic_load_explicit(&t->state, memory_order_acquire);

	return st == URDMA_SQPS_RTR &&
	       atomic_load_explicit(&t->dest_qpn, memory_order_relaxed) ==
		       qp->ibqp.qp_num;
}

/* Both QPs go to ERR: ask the responder, then the engine moves us. */
static void responder_error(struct urdma_qp *qp)
{
	atomic_store(&qp->peer_qp->error_req, 1);
	urdma_peer_wake(qp->peer);
}

/* The responder's owner fires its CQ from its progress thread. */
static void responder_notify(struct urdma_qp *qp, bool solicited)
{
	if (urdma_rq_notify_claim(qp->peer_qp, solicited)) {
		atomic_store(&qp->peer_qp->notify_fired, 1);
		urdma_peer_wake(qp->peer);
	}
}

/* Resolve [addr, addr+len) under rkey in the responder's memory. */
static int remote_span(struct urdma_qp *qp, struct urdma_swqe *w,
		       uint32_t access, uint64_t len, struct urdma_span *sp)
{
	sp->ptr = NULL;
	sp->len = len;
	return urdma_remote_lookup(urdma_peer_shm(qp->peer), qp->peer_qp,
				   w->rkey, w->remote_addr, len, access,
				   &sp->va);
}

/*
 * SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM: consume the responder's next
 * receive WR.  For the write, the data goes to the rkey's range first.
 */
static enum urdma_tx deliver(struct urdma_qp *qp, struct urdma_swqe *w,
			     enum ibv_wc_status *status)
{
	struct urdma_shm_qp *t = qp->peer_qp;
	struct urdma_span local[URDMA_MAX_SGE + 1], dst[URDMA_MAX_SGE + 1];
	enum ibv_wc_status rx_status = IBV_WC_SUCCESS;
	bool with_imm = w->opcode != IBV_WR_SEND;
	bool is_write = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	struct urdma_shm_rqe *e;
	uint32_t done, prod;
	int nl = 0, nd = 0, ret;
	uint64_t room = 0;

	*status = urdma_local_spans(qp, w, local, &nl, 0);
	if (*status != IBV_WC_SUCCESS)
		return URDMA_TX_DONE;

	urdma_rq_busy(t);
	if (!responder_ready(qp)) {
		atomic_store(&t->rnr_waiter, 1);
		urdma_rq_idle(t);
		return URDMA_TX_NOT_READY;
	}
	done = atomic_load_explicit(&t->rq_done, memory_order_relaxed);
	prod = atomic_load_explicit(&t->rq_prod, memory_order_acquire);
	if (done == prod) {
		/* RNR: ask for a wake-up, then look once more. */
		atomic_store(&t->rnr_waiter, 1);
		atomic_thread_fence(memory_order_seq_cst);
		prod = atomic_load_explicit(&t->rq_prod, memory_order_acquire);
		if (done == prod) {
			urdma_rq_idle(t);
			return URDMA_TX_RNR;
		}
	}
	e = urdma_rqe(t, done);
	if (is_write) {
		ret = remote_span(qp, w, IBV_ACCESS_REMOTE_WRITE, w->byte_len,
				  &dst[0]);
		if (ret) {
			*status = IBV_WC_REM_ACCESS_ERR;
			goto out_error;
		}
		nd = 1;
	} else {
		if (urdma_rqe_spans(urdma_peer_shm(qp->peer), t, e, dst, &nd,
				    &room)) {
			rx_status = IBV_WC_LOC_PROT_ERR;
			*status = IBV_WC_REM_OP_ERR;
			goto out_error;
		}
		if (room < w->byte_len) {
			rx_status = IBV_WC_LOC_LEN_ERR;
			*status = IBV_WC_REM_INV_REQ_ERR;
			goto out_error;
		}
	}
	if (urdma_copy_spans(qp->peer, dst, nd, NULL, local, nl, w->byte_len)) {
		/* Our own pages vanished: a local protection error. */
		rx_status = IBV_WC_WR_FLUSH_ERR;
		*status = IBV_WC_LOC_PROT_ERR;
		goto out_error;
	}
	e->status = IBV_WC_SUCCESS;
	e->opcode = is_write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
	e->byte_len = w->byte_len;
	e->imm_data = w->imm_data;
	e->wc_flags = with_imm ? IBV_WC_WITH_IMM : 0;
	e->src_qp = qp->ibqp.qp_num;
	atomic_store_explicit(&t->rq_done, done + 1, memory_order_release);
	urdma_rq_idle(t);
	responder_notify(qp, w->send_flags & IBV_SEND_SOLICITED);
	*status = IBV_WC_SUCCESS;
	return URDMA_TX_DONE;

out_error:
	if (rx_status != IBV_WC_SUCCESS) {
		/* The receive WR completes in error at the responder. */
		e->status = rx_status;
		e->opcode = IBV_WC_RECV;
		e->byte_len = 0;
		e->wc_flags = 0;
		e->src_qp = qp->ibqp.qp_num;
		atomic_store_explicit(&t->rq_done, done + 1,
				      memory_order_release);
	}
	urdma_rq_idle(t);
	responder_error(qp);
	return URDMA_TX_DONE;
}

static enum urdma_tx shm_execute(struct urdma_qp *qp, struct urdma_swqe *w,
				 enum ibv_wc_status *status)
{
	struct urdma_span local[URDMA_MAX_SGE + 1], remote;
	int nl = 0, ret;

	if (!qp->peer_qp) {
		/* The peer QP did not exist at RTR: look again. */
		if (shm_connect(qp, &qp->attr) || !qp->peer_qp)
			return URDMA_TX_NOT_READY;
	}
	if (urdma_peer_dead(qp->peer))
		return URDMA_TX_NOT_READY;

	switch (w->opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return deliver(qp, w, status);
	default:
		break;
	}
	/* One-sided: no receive WR; the responder only has to be there. */
	if (!responder_ready(qp))
		return URDMA_TX_NOT_READY;

	switch (w->opcode) {
	case IBV_WR_RDMA_WRITE:
		*status = urdma_local_spans(qp, w, local, &nl, 0);
		if (*status)
			return URDMA_TX_DONE;
		ret = remote_span(qp, w, IBV_ACCESS_REMOTE_WRITE, w->byte_len,
				  &remote);
		if (ret)
			break;
		if (urdma_copy_spans(qp->peer, &remote, 1, NULL, local, nl,
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
		if (urdma_copy_spans(NULL, local, nl, qp->peer, &remote, 1,
				     w->byte_len))
			*status = IBV_WC_LOC_PROT_ERR;
		return URDMA_TX_DONE;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		uint64_t avail, old, *target, *result;

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
		target = urdma_space_ptr(qp->peer, remote.va, &avail);
		result = urdma_space_ptr(NULL, local[0].va, &avail);
		if (!target || !result || avail < 8) {
			*status = IBV_WC_LOC_PROT_ERR;
			return URDMA_TX_DONE;
		}
		old = urdma_atomic_apply(target,
					 w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP,
					 w->compare_add, w->swap);
		memcpy(result, &old, 8);
		return URDMA_TX_DONE;
	}
	default:
		*status = IBV_WC_LOC_QP_OP_ERR;
		return URDMA_TX_DONE;
	}
	/* A remote key, bound or right was refused. */
	*status = IBV_WC_REM_ACCESS_ERR;
	responder_error(qp);
	return URDMA_TX_DONE;
}

const struct urdma_transport_ops urdma_shm_transport = {
	.name = "shm",
	.connect = shm_connect,
	.disconnect = shm_disconnect,
	.execute = shm_execute,
};
