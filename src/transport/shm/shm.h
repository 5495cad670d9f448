/* SPDX-License-Identifier: MIT */
/*
 * What the shared-memory transport's two engines share: RC, UC and XRC
 * (shm_transport.c), UD (shm_ud.c).  A deliverer writes a receive WR of a
 * peer QP it found and checked (struct urdma_shm_dest).
 */
#ifndef URDMA_SHM_H
#define URDMA_SHM_H

#include "transport/transport.h"

/* The receive WR a message takes: an entry of the QP's ring, or of its
 * SRQ's, and how to publish it. */
struct urdma_shm_rcv {
	struct urdma_shm_rqe *e;
	uint32_t idx;	  /* the ring's rq_done, or the SRQ entry's index */
	uint32_t pd_id;	  /* the PD its SGEs are checked in */
	uint32_t max_sge;
};

/* The record of QP qpn of this user on this host, its fields checked:
 * 0, or as urdma_host_qp_find, or -EINVAL. */
int urdma_shm_rec_find(uint32_t qpn, struct urdma_qp_rec *rec);
/* The block of QP qpn that rec names, in peer's memory (ready), checked,
 * its ring's geometry copied into *g: or NULL. */
struct urdma_shm_qp *urdma_shm_qp_map(struct urdma_peer *peer,
				      const struct urdma_qp_rec *rec,
				      uint32_t qpn, struct urdma_rq_geo *g);
/* The SRQ the peer QP h (of context ctx_id, in peer's memory) receives
 * from, if any, into d: found in the same memfd, checked, its geometry
 * copied.  0, or -EINVAL. */
int urdma_shm_srq_attach(struct urdma_shm_dest *d, struct urdma_peer *peer,
			 uint32_t ctx_id, const struct urdma_shm_qp *h);
/* The next receive WR of d's own ring: 0, URDMA_TX_RNR (none posted; with
 * URDMA_RING_RNR_WAIT the owner is asked to wake us on its next post), or
 * -1 (the ring's indices are nonsense).  The caller is in the ring (busy)
 * and publishes with urdma_shm_ring_publish.  URDMA_RING_SHARED: others
 * write the ring too (UD): a reset since we last read rq_prod is told by
 * the ring's rq_epoch, not by rq_done, which they move too. */
enum { URDMA_RING_RNR_WAIT = 1, URDMA_RING_SHARED = 2 };
int urdma_shm_take_ring(struct urdma_shm_dest *d, unsigned flags,
			struct urdma_shm_rcv *r);
void urdma_shm_ring_publish(struct urdma_shm_dest *d,
			    const struct urdma_shm_rcv *r);
/* The next receive WR of d's SRQ, claimed (owner: the SRQ's context, woken
 * when its armed limit is crossed; NULL: ours): as urdma_shm_take_ring;
 * published with urdma_srq_publish. */
int urdma_shm_take_srq(struct urdma_shm_dest *d, struct urdma_peer *owner,
		       struct urdma_shm_rcv *r);

#endif
