// SPDX-License-Identifier: MIT
/*
 * UD over shared memory: each WR's datagram goes to the QP it names, on
 * this host, found by its record like an RC peer (shm_transport.c) and
 * kept in a small per-QP table of destinations; ../ud.c delivers it.
 * A QP that is not one of this user's here is left to UDP.
 */
#include <errno.h>
#include <string.h>

#include "transport/ud.h"
#include "util/alloc.h"
#include "util/log.h"

#define UD_DESTS 16
#define UD_ABSENT_NS 1000000ull	     /* no such QP: look again after */
#define UD_SILENT_NS 1000000000ull   /* its context did not answer */

enum { DEST_FREE, DEST_LIVE, DEST_ABSENT };

struct ud_dest {
	uint32_t qpn;
	uint32_t state; /* DEST_* */
	uint64_t used;	/* for eviction: the table's clock when last used */
	uint64_t retry_ns; /* DEST_ABSENT: until when */
	struct urdma_peer *peer;
	struct urdma_shm_dest d;
};

struct urdma_ud_dests {
	uint64_t clock;
	struct ud_dest e[UD_DESTS];
};

static void dest_forget(struct ud_dest *u)
{
	urdma_peer_set(&u->peer, NULL);
	memset(&u->d, 0, sizeof(u->d));
	u->state = DEST_FREE;
}

/* Find QP qpn (of ours, on this host, a UD QP) into u, waiting up to
 * wait_ms for a new context's hello: 0 or -errno. */
static int dest_attach(struct ud_dest *u, uint32_t qpn, int wait_ms)
{
	struct urdma_qp_rec rec;
	struct urdma_shm_qp *h;
	struct urdma_peer *p;
	int ret = urdma_shm_rec_find(qpn, &rec);

	if (ret)
		return ret;
	p = urdma_peer_get(rec.ctx_id);
	if (!p)
		return -errno;
	urdma_peer_set(&u->peer, p);
	ret = urdma_peer_wait(p, wait_ms);
	if (ret)
		return ret;
	h = urdma_shm_qp_map(p, &rec, qpn, &u->d.rq);
	if (!h || READ_ONCE(h->qp_type) != IBV_QPT_UD ||
	    urdma_shm_srq_attach(&u->d, p, rec.ctx_id, h))
		return -EINVAL;
	u->d.ring = (uint8_t *)h + sizeof(*h);
	u->d.prod = u->d.done = 0;
	u->d.gen = READ_ONCE(h->gen);
	urdma_dest_blocks(&u->d, p, h);
	u->d.qp = h;
	u->state = DEST_LIVE;
	return 0;
}

/* The destination QP qpn, found now or before; NULL (and why) if the
 * datagram can't go. */
static struct ud_dest *dest_get(struct urdma_qp *qp, uint32_t qpn,
				int wait_ms, const char **why)
{
	struct urdma_ud_dests *ds = qp->ud;
	struct ud_dest *u = NULL, *victim;
	int ret;

	if (!ds) {
		ds = qp->ud = urdma_zalloc(sizeof(*ds));
		if (!ds) {
			*why = "no memory for its destination";
			return NULL;
		}
	}
	victim = &ds->e[0];
	for (int i = 0; i < UD_DESTS; i++) {
		struct ud_dest *x = &ds->e[i];

		if (x->state != DEST_FREE && x->qpn == qpn) {
			u = x;
			break;
		}
		if (x->used < victim->used)
			victim = x;
	}
	if (u && u->state == DEST_LIVE && !urdma_peer_dead(u->peer)) {
		u->used = ++ds->clock;
		return u;
	}
	if (u && u->state == DEST_ABSENT && urdma_now_ns() < u->retry_ns) {
		*why = "no such QP of this user on this host";
		return NULL;
	}
	if (!u)
		u = victim;
	dest_forget(u);
	u->qpn = qpn;
	u->used = ++ds->clock;
	ret = dest_attach(u, qpn, wait_ms);
	if (ret) {
		dest_forget(u);
		u->qpn = qpn;
		u->state = DEST_ABSENT;
		/* (a context that did not say hello in UD_WAIT_MS is not
		 * waited for again at each WR) */
		u->retry_ns = urdma_now_ns() +
			      (ret == -EAGAIN ? UD_SILENT_NS : UD_ABSENT_NS);
		*why = ret == -ENOENT ? "no such QP of this user on this host" :
					"the QP is not a usable UD QP";
		return NULL;
	}
	return u;
}

/* Send a datagram over shared memory (ud.h). */
enum urdma_ud_res urdma_shm_ud_send(struct urdma_qp *qp,
				    const struct urdma_swqe *w,
				    const struct urdma_ud_msg *m, uint32_t qpn,
				    int wait_ms)
{
	struct urdma_ud_msg to = *m;
	enum urdma_ud_res res;
	struct ud_dest *u;
	const char *why = NULL;
	int tell;

	to.qpn = qpn;
	/* A QP found before may be gone, its number another's now: look
	 * again, once. */
	for (int tries = 0; tries < 2; tries++) {
		u = dest_get(qp, qpn, wait_ms, &why);
		if (!u)
			return URDMA_UD_GONE; /* not one of ours here: UDP */
		res = urdma_ud_deliver(&u->d, u->peer, urdma_peer_shm(u->peer),
				       &to, &tell, &why);
		if (res == URDMA_UD_DONE) {
			/* a fired CQ: a thread of the owner asleep in
			 * ibv_get_cq_event fires it (core/wake.c) */
			if (tell && !(tell == URDMA_UD_NOTIFY &&
				      urdma_wake_owner(u->d.wake)))
				urdma_peer_wake(u->peer);
			return res;
		}
		if (res != URDMA_UD_GONE)
			break;
		dest_forget(u);
	}
	qp->ud_drops++;
	urdma_dbg("qp %#x: datagram %#llx to QP %#x dropped: %s",
		  qp->ibqp.qp_num, (unsigned long long)w->wr_id, qpn, why);
	return URDMA_UD_DONE;
}

void urdma_shm_ud_forget(struct urdma_qp *qp)
{
	if (!qp->ud)
		return;
	for (int i = 0; i < UD_DESTS; i++)
		dest_forget(&qp->ud->e[i]);
	urdma_free(qp->ud);
	qp->ud = NULL;
}
