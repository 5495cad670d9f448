// SPDX-License-Identifier: MIT
/*
 * The receive queue, owner side: ibv_post_recv writes receive WRs into the
 * QP's shared receive ring; a deliverer (the peer's requester over shared
 * memory, our own receive path over TCP) completes them in place;
 * ibv_poll_cq harvests the completions.  Flushing on ERR, and waiting for
 * deliverers to leave the ring before the owner changes it.
 */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/log.h"

/* Wait until no deliverer is inside our receive queue.  The caller has
 * just published a state deliverers refuse, with a full fence. */
void urdma_rq_quiesce(struct urdma_qp *qp)
{
	atomic_thread_fence(memory_order_seq_cst);
	while (atomic_load(&qp->shm->busy)) {
		if (qp->peer && urdma_peer_dead(qp->peer))
			break;
		sched_yield();
	}
}

/* Complete every receive WR not yet completed with FLUSH_ERR.  Deliverers
 * are out: the shared state is ERR and urdma_rq_quiesce() ran. */
uint32_t urdma_rq_flush(struct urdma_qp *qp)
{
	struct urdma_shm_qp *s = qp->shm;
	uint32_t done, prod, n;

	pthread_mutex_lock(&qp->rq_lock);
	done = atomic_load(&s->rq_done);
	prod = atomic_load(&s->rq_prod);
	n = prod - done;
	for (; done != prod; done++) {
		struct urdma_shm_rqe *e = urdma_rqe(s, done);

		e->status = IBV_WC_WR_FLUSH_ERR;
		e->opcode = IBV_WC_RECV;
		e->byte_len = 0;
		e->wc_flags = 0;
	}
	atomic_store_explicit(&s->rq_done, done, memory_order_release);
	pthread_mutex_unlock(&qp->rq_lock);
	return n;
}

int urdma_qp_harvest(struct urdma_qp *qp, struct ibv_wc *wc, int max)
{
	struct urdma_shm_qp *s = qp->shm;
	uint32_t done = atomic_load_explicit(&s->rq_done, memory_order_acquire);
	uint32_t poll = qp->rq_poll;
	int n = 0;

	while (n < max && poll != done) {
		struct urdma_shm_rqe *e = urdma_rqe(s, poll);
		struct ibv_wc *w = &wc[n++];

		memset(w, 0, sizeof(*w));
		w->wr_id = e->wr_id;
		w->status = e->status;
		w->opcode = e->opcode;
		w->byte_len = e->byte_len;
		w->imm_data = e->imm_data;
		w->wc_flags = e->wc_flags;
		w->qp_num = qp->ibqp.qp_num;
		w->src_qp = e->src_qp;
		poll++;
	}
	__atomic_store_n(&qp->rq_poll, poll, __ATOMIC_RELEASE);
	return n;
}

int urdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		    struct ibv_recv_wr **bad)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	struct urdma_shm_qp *s = qp->shm;
	int ret = 0;
	uint32_t prod;

	pthread_mutex_lock(&qp->rq_lock);
	prod = atomic_load_explicit(&s->rq_prod, memory_order_relaxed);
	for (; wr; wr = wr->next) {
		struct urdma_shm_rqe *e;

		if (ibqp->state == IBV_QPS_RESET) {
			ret = EINVAL;
			break;
		}
		if ((uint32_t)wr->num_sge > qp->cap.max_recv_sge ||
		    wr->num_sge < 0) {
			ret = EINVAL;
			break;
		}
		if (prod - __atomic_load_n(&qp->rq_poll, __ATOMIC_ACQUIRE) >=
		    s->rq_size) {
			ret = ENOMEM;
			break;
		}
		e = urdma_rqe(s, prod);
		e->wr_id = wr->wr_id;
		e->num_sge = wr->num_sge;
		for (int i = 0; i < wr->num_sge; i++) {
			e->sge[i].addr = wr->sg_list[i].addr;
			e->sge[i].length = wr->sg_list[i].length;
			e->sge[i].lkey = wr->sg_list[i].lkey;
		}
		e->status = IBV_WC_SUCCESS;
		prod++;
		atomic_store_explicit(&s->rq_prod, prod, memory_order_release);
	}
	pthread_mutex_unlock(&qp->rq_lock);
	/* urdma_rq_flush takes rq_lock itself. */
	if (ibqp->state == IBV_QPS_ERR)
		urdma_rq_flush(qp);
	if (ret)
		*bad = wr;
	/* A sender waits for a receive: wake it. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&s->rnr_waiter, memory_order_relaxed) &&
	    atomic_exchange(&s->rnr_waiter, 0) && qp->peer)
		urdma_peer_wake(qp->peer);
	if (qp->tr && qp->tr->recv_posted)
		qp->tr->recv_posted(qp);
	if (ibqp->state == IBV_QPS_ERR)
		urdma_cq_notify(to_ucq(ibqp->recv_cq));
	return ret;
}
