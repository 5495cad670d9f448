// SPDX-License-Identifier: MIT
/*
 * UD datagrams: the transport table of UD QPs, and the delivery into a UD
 * QP's receive queue (ud.h).
 *
 * A UD QP's receive ring has many writers, so a deliverer first takes the
 * block's ud_lock from 0 to its pid by compare-and-swap: it is then the
 * ring's only writer.  Then the owner's Dekker handshake on busy, as for
 * RC.  A holder that died is taken over; one that holds the ring for
 * UD_ENTER_NS costs the datagram.  The block may be another QP's by then
 * (this one destroyed, its block reused): its gen says so.
 *
 * As UD does, the sender learns nothing of the receiver: a datagram no
 * receive takes (none posted, another Q_Key, too long for the receive, no
 * such QP) is dropped and counted, in the receiver's block (and on the
 * sender's QP, over shared memory), and the send completes successfully.
 */
#include <errno.h>
#include <stdlib.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "transport/ud.h"
#include "util/log.h"

#define UD_ENTER_NS 10000000ull /* the longest wait for a ring */

/* Become the only writer of t's ring, and enter it: false if a live
 * process holds it for UD_ENTER_NS. */
static bool ud_enter(struct urdma_shm_qp *t)
{
	uint32_t me = urdma_self_pid();
	uint64_t deadline = 0;

	for (int spins = 0;; spins++) {
		uint32_t cur = 0;

		if (atomic_compare_exchange_weak(&t->ud_lock, &cur, me))
			break;
		if (spins < 100)
			continue;
		if (!deadline) {
			deadline = urdma_now_ns() + UD_ENTER_NS;
		} else if (urdma_now_ns() > deadline) {
			/* (0, 1 and our own pid are never a dead holder) */
			if (cur <= 1 || cur == me || kill((pid_t)cur, 0) == 0 ||
			    errno != ESRCH ||
			    !atomic_compare_exchange_strong(&t->ud_lock, &cur,
							    me))
				return false;
			urdma_warn("ud qp %#x: process %u died inside its "
				   "receive queue", READ_ONCE(t->qpn), cur);
			break;
		}
		sched_yield();
	}
	urdma_rq_busy(t);
	return true;
}

static void ud_leave(struct urdma_shm_qp *t)
{
	urdma_rq_idle(t);
	atomic_store_explicit(&t->ud_lock, 0, memory_order_release);
}

/* Leave out the first n bytes of spans sp. */
static void spans_skip(struct urdma_span *sp, int *n, uint64_t skip)
{
	int i = 0;

	while (i < *n && skip >= sp[i].len)
		skip -= sp[i++].len;
	memmove(sp, sp + i, (size_t)(*n - i) * sizeof(*sp));
	*n -= i;
	if (*n && skip) {
		sp[0].va += skip;
		sp[0].len -= skip;
		if (sp[0].ptr)
			sp[0].ptr += skip;
	}
}

/* The datagram into the receive's spans dst: after the 40 bytes of the
 * GRH area, which it fills when there is a GRH.  0 or -errno. */
static int ud_copy(const struct urdma_ud_msg *m, struct urdma_peer *dpeer,
		   struct urdma_span *dst, int nd)
{
	struct urdma_span g = { .len = sizeof(*m->grh),
				.ptr = (uint8_t *)m->grh };
	struct urdma_span src = { .len = m->len, .ptr = (uint8_t *)m->data };
	int ret;

	if (m->grh) {
		ret = urdma_copy_spans(dpeer, dst, nd, NULL, &g, 1,
				       sizeof(*m->grh));
		if (ret)
			return ret;
	}
	spans_skip(dst, &nd, URDMA_GRH_BYTES);
	return urdma_copy_spans(dpeer, dst, nd, NULL, &src, 1, m->len);
}

static enum urdma_ud_res ud_drop(struct urdma_shm_qp *t, const char **why,
				 const char *reason)
{
	atomic_fetch_add_explicit(&t->ud_drops, 1, memory_order_relaxed);
	*why = reason;
	return URDMA_UD_DROPPED;
}

enum urdma_ud_res urdma_ud_deliver(struct urdma_shm_dest *d,
				   struct urdma_peer *dpeer,
				   const struct urdma_shm_ctx *mrs,
				   const struct urdma_ud_msg *m, int *tell,
				   const char **why)
{
	struct urdma_shm_qp *t = d->qp;
	struct urdma_span dst[URDMA_MAX_SGE + 1];
	enum ibv_wc_status rx_status = IBV_WC_SUCCESS;
	uint64_t len = URDMA_GRH_BYTES + (uint64_t)m->len, room = 0;
	struct urdma_shm_rcv r;
	struct urdma_shm_rqe *e;
	bool solicited;
	int nd = 0, ret;

	*tell = 0;
	if (!ud_enter(t))
		return ud_drop(t, why, "its receive queue is held");
	if (READ_ONCE(t->gen) != d->gen || READ_ONCE(t->qpn) != m->qpn) {
		/* The block is another QP's now: this one is gone. */
		ud_leave(t);
		*why = "no such QP any more";
		return URDMA_UD_GONE;
	}
	if (atomic_load_explicit(&t->state, memory_order_acquire) !=
	    URDMA_SQPS_RTR) {
		ud_leave(t);
		return ud_drop(t, why, "the QP is not ready to receive");
	}
	if (READ_ONCE(t->qkey) != m->qkey) {
		ud_leave(t);
		return ud_drop(t, why, "its Q_Key is not the QP's");
	}
	ret = d->srq ? urdma_shm_take_srq(d, dpeer, &r) :
		       urdma_shm_take_ring(d, URDMA_RING_SHARED, &r);
	if (ret == URDMA_TX_RNR) {
		ud_leave(t);
		return ud_drop(t, why, "no receive is posted");
	}
	if (ret) { /* (warned) */
		ud_leave(t);
		*why = "its receive queue is corrupt";
		return URDMA_UD_GONE;
	}
	/* A receive too short (for the 40 bytes of GRH too) completes in
	 * error, as on a NIC; one whose memory can't be reached puts the
	 * QP in error.  (The datagram is in the sender's memory, copied out
	 * before: what fails here is the receiver's.) */
	e = r.e;
	if (urdma_rqe_spans(mrs, r.pd_id, r.max_sge, e, dst, &nd, &room))
		rx_status = IBV_WC_LOC_PROT_ERR;
	else if (room < len)
		rx_status = IBV_WC_LOC_LEN_ERR;
	else if (ud_copy(m, dpeer, dst, nd))
		rx_status = IBV_WC_LOC_PROT_ERR;
	e->status = rx_status;
	e->opcode = IBV_WC_RECV;
	e->byte_len = rx_status == IBV_WC_SUCCESS ? (uint32_t)len : 0;
	e->imm_data = m->imm;
	e->wc_flags = rx_status == IBV_WC_SUCCESS && m->with_imm ?
			      IBV_WC_WITH_IMM :
			      0;
	e->src_qp = m->src_qp;
	e->ud_src = m->ud_src;
	if (d->srq)
		urdma_srq_publish(e, r.idx, m->qpn);
	else
		urdma_shm_ring_publish(d, &r);
	/* Its CQ rung, and its notify claimed, before we leave the ring
	 * (the busy count keeps the CQ's block alive: core/bell.c). */
	if (rx_status == IBV_WC_LOC_PROT_ERR) {
		/* A receive it can't use puts the receiver in error (its poll
		 * finds the completion: the bell). */
		urdma_dest_ring(d, dpeer);
		ud_leave(t);
		atomic_store(&t->error_req, 1);
		*tell = URDMA_UD_ERROR;
		return URDMA_UD_DONE;
	}
	solicited = m->solicited || rx_status != IBV_WC_SUCCESS;
	if (urdma_dest_notify(d, dpeer, solicited))
		*tell = URDMA_UD_NOTIFY;
	ud_leave(t);
	return URDMA_UD_DONE;
}

/* ---- the transport table ---- */

bool urdma_ud_net(void)
{
	static int net = -1;

	if (net < 0) {
		const char *e = getenv("URDMA_TRANSPORT");

		net = e && !strcmp(e, "tcp");
	}
	return net;
}

#define QKEY_CONTROLLED 0x80000000u
#define MCAST_LOCAL_MAX 256   /* QPs of this host a multicast reaches */
#define MCAST_WAIT_NS 200000000ull /* for new contexts' hellos, per WR */

/* A multicast: to each QP of this host attached to the group, over shared
 * memory, and to the group's IP address for other hosts' (udp.c).  Its
 * destination QPN is 0xffffff, or it reaches nobody, as on a NIC. */
static void ud_multicast(struct urdma_qp *qp, const struct urdma_swqe *w,
			 const struct urdma_ud_msg *m)
{
	uint32_t qpns[MCAST_LOCAL_MAX];
	uint64_t until = urdma_now_ns() + MCAST_WAIT_NS;
	int n;

	if (w->ud_qpn != 0xffffff) {
		qp->ud_drops++;
		return;
	}
	n = urdma_mcast_members(w->av.dgid, qpns, MCAST_LOCAL_MAX);
	for (int i = 0; i < n; i++) {
		uint64_t now = urdma_now_ns();

		if (qpns[i] == qp->ibqp.qp_num && qp->block_self_mcast)
			continue;
		urdma_shm_ud_send(qp, w, m, qpns[i],
				  now < until ? (int)((until - now) / 1000000) :
						0);
	}
	urdma_udp_send(qp, w, m);
}

/* The datagram of w, read out of our memory once into data (so that a
 * copy that fails later, inside a receiver's ring, is the receiver's),
 * with what every receiver is told of it: IBV_WC_SUCCESS, or the local
 * error that fails w. */
static enum ibv_wc_status ud_msg(struct urdma_qp *qp,
				 const struct urdma_swqe *w,
				 struct urdma_ud_msg *m, uint8_t *data,
				 struct ibv_grh *grh)
{
	struct urdma_span local[URDMA_MAX_SGE + 1];
	struct urdma_span d = { .len = URDMA_UD_MTU, .ptr = data };
	enum ibv_wc_status st;
	int nl = 0;

	st = urdma_local_spans(qp, (struct urdma_swqe *)w, local, &nl, 0);
	if (st != IBV_WC_SUCCESS)
		return st;
	if (urdma_copy_spans(NULL, &d, 1, NULL, local, nl, w->byte_len))
		return IBV_WC_LOC_PROT_ERR;
	*m = (struct urdma_ud_msg){
		.data = data,
		.len = w->byte_len,
		.qpn = w->ud_qpn,
		/* A controlled Q_Key in the WR means our QP's own. */
		.qkey = w->ud_qkey & QKEY_CONTROLLED ? qp->attr.qkey :
						       w->ud_qkey,
		.src_qp = qp->ibqp.qp_num,
		.ud_src = qp->uctx->lid |
			  (uint32_t)w->av.sl << URDMA_RQE_UD_SL_SHIFT |
			  (w->av.is_global ? URDMA_RQE_UD_GRH : 0),
		.imm = w->imm_data,
		.with_imm = w->opcode == IBV_WR_SEND_WITH_IMM,
		.solicited = w->send_flags & IBV_SEND_SOLICITED,
	};
	if (w->av.is_global) {
		urdma_grh_build(qp->uctx, &w->av, w->byte_len, grh);
		m->grh = grh;
	}
	return IBV_WC_SUCCESS;
}

static enum urdma_tx ud_execute(struct urdma_qp *qp, struct urdma_swqe *w,
				enum ibv_wc_status *status)
{
	uint8_t data[URDMA_UD_MTU];
	struct urdma_ud_msg m;
	struct ibv_grh grh;

	/* UD tells the sender nothing: only a local error fails w. */
	*status = ud_msg(qp, w, &m, data, &grh);
	if (*status != IBV_WC_SUCCESS)
		return URDMA_TX_DONE;
	/* Over shared memory when the destination is one of this user's QPs
	 * on this host (a LID always names this host: ud.c), unless told
	 * otherwise; over UDP else. */
	if (w->av.is_global && urdma_gid_is_mcast(w->av.dgid))
		ud_multicast(qp, w, &m);
	else if (urdma_ud_net() ||
		 (w->av.is_global &&
		  !urdma_gid_is_local(qp->uctx, w->av.dgid)) ||
		 urdma_shm_ud_send(qp, w, &m, w->ud_qpn, URDMA_UD_WAIT_MS) ==
			 URDMA_UD_GONE)
		urdma_udp_send(qp, w, &m);
	return URDMA_TX_DONE;
}

static int ud_connect(struct urdma_qp *qp, const struct ibv_qp_attr *attr)
{
	(void)qp;
	(void)attr;
	return 0;
}

static void ud_disconnect(struct urdma_qp *qp)
{
	if (qp->ud_drops)
		urdma_info("qp %#x: %llu datagrams dropped on the way out",
			   qp->ibqp.qp_num, (unsigned long long)qp->ud_drops);
	qp->ud_drops = 0;
	urdma_shm_ud_forget(qp);
}

const struct urdma_transport_ops urdma_ud_transport = {
	.name = "ud",
	.connect = ud_connect,
	.disconnect = ud_disconnect,
	.execute = ud_execute,
	.poll = urdma_udp_poll,
	.armed = urdma_udp_armed,
	.tick = urdma_udp_tick,
	.qpn_reserve = urdma_udp_qpn_reserve,
	.qpn_bind = urdma_udp_qpn_bind,
	.qpn_unbind = urdma_udp_qpn_unbind,
	.qpn_release = urdma_udp_qpn_release,
};
