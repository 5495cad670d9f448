// SPDX-License-Identifier: MIT
/*
 * Address handles, and what a UD receive tells of its sender.
 *
 * An address handle is its attributes, checked: a UD WR copies them when
 * it is posted (sq.c), so the handle may go while WRs that named it are
 * queued.  A LID names this host (its machine and network namespace):
 * another host is reached by GID (transport/ud.c), or by a LID whose GID
 * an address told before (below); so is a multicast group: a multicast
 * LID is EOPNOTSUPP when the handle is made.
 */
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/log.h"

#define LID_MULTICAST 0xc000 /* LIDs from here on name multicast groups */

static _Atomic uint32_t next_ah_handle = 1;

/* Can attr be an address handle of uctx?  0, or an errno. */
static int ah_check(const struct urdma_context *uctx,
		    const struct ibv_ah_attr *attr)
{
	if (attr->port_num != 1 || attr->sl > 15)
		return EINVAL;
	if (attr->is_global) {
		if (attr->grh.sgid_index >= uctx->num_gids)
			return EINVAL;
		return 0; /* this host, or another over UDP; or a group */
	}
	if (!attr->dlid)
		return EINVAL;
	if (attr->dlid >= LID_MULTICAST) {
		urdma_info("ah: a multicast group is addressed by its GID");
		return EOPNOTSUPP;
	}
	if (attr->dlid != uctx->lid) {
		/* Another network namespace's LID: another host, which has
		 * no route by LID. */
		urdma_info("ah: LID %u is not this host's (%u): another host "
			   "is reached by its GID (is_global)", attr->dlid,
			   uctx->lid);
		return EOPNOTSUPP;
	}
	return 0;
}

/*
 * Other hosts' LIDs.  A LID names one host (machine and network namespace,
 * device.c): nothing routes one to another host.  An address that carries
 * both another host's LID and a GID of it (one that a program made: Open
 * MPI's udcm makes one to each peer before it moves its RC QPs to RTR by
 * LID alone) teaches this context that pairing, with the source GID index
 * it used, and an address by that LID alone then goes that way (on the
 * InfiniBand link layer only, URDMA_LINK_LAYER=ib).  Nothing
 * is forgotten (a job may start many connections before any reaches
 * RTR): the table grows.  A LID has 0xbffe values, so two hosts of a job
 * may share one (about 1 in 1,000 for 10 hosts): a LID learned again
 * with another GID, or this host's own with a GID not of this host, is
 * said in a warning.  Only the application's own calls teach: a datagram
 * from the network says slid 0.
 */
static bool foreign_lid(const struct urdma_context *uctx, uint16_t lid)
{
	return lid && lid < LID_MULTICAST && lid != uctx->lid;
}

/* The entry of lid, or NULL.  Under lid_lock. */
static struct urdma_lid_gid *lid_find(struct urdma_context *uctx,
				      uint16_t lid)
{
	for (unsigned int i = 0; i < uctx->nlids; i++)
		if (uctx->lids[i].lid == lid)
			return &uctx->lids[i];
	return NULL;
}

void urdma_lid_learn(struct urdma_context *uctx, const struct ibv_ah_attr *a)
{
	struct urdma_lid_gid *e;

	/* (on Ethernet a LID means nothing next to a GRH: RoCE ignores it,
	 * and programs put anything there) */
	if (uctx->link_layer != IBV_LINK_LAYER_INFINIBAND ||
	    !a->is_global || !a->dlid || a->dlid >= LID_MULTICAST ||
	    a->grh.dgid.raw[0] == 0xff || /* a group */
	    urdma_gid_is_local(uctx, a->grh.dgid.raw))
		return;
	if (a->dlid == uctx->lid) {
		urdma_warn("an address gives LID %u, this host's own, to a GID "
			   "of another host: two hosts share a LID, and an "
			   "address by that LID alone reaches this one",
			   a->dlid);
		return;
	}
	pthread_mutex_lock(&uctx->lid_lock);
	e = lid_find(uctx, a->dlid);
	if (e && memcmp(&e->gid, &a->grh.dgid, sizeof(e->gid)))
		urdma_warn("LID %u was another GID's: two hosts share a LID; "
			   "it goes to the newer one now", a->dlid);
	if (!e && uctx->nlids == uctx->lid_cap) {
		unsigned int cap = uctx->lid_cap ? uctx->lid_cap * 2 : 16;
		struct urdma_lid_gid *n = urdma_ring_move(
			uctx->lids, uctx->lid_cap, 0, uctx->nlids, cap,
			sizeof(*n));

		if (n) {
			uctx->lids = n;
			uctx->lid_cap = cap;
		}
	}
	if (!e && uctx->nlids < uctx->lid_cap)
		e = &uctx->lids[uctx->nlids++];
	if (e)
		*e = (struct urdma_lid_gid){ .lid = a->dlid,
					     .gid = a->grh.dgid,
					     .sgid_index = a->grh.sgid_index };
	pthread_mutex_unlock(&uctx->lid_lock);
}

bool urdma_lid_route(struct urdma_context *uctx, struct ibv_ah_attr *a)
{
	struct urdma_lid_gid *e;

	if (a->is_global || !foreign_lid(uctx, a->dlid))
		return false;
	pthread_mutex_lock(&uctx->lid_lock);
	e = lid_find(uctx, a->dlid);
	if (e) {
		a->is_global = 1;
		a->grh.dgid = e->gid;
		a->grh.sgid_index = e->sgid_index;
		a->grh.hop_limit = 64;
	}
	pthread_mutex_unlock(&uctx->lid_lock);
	return e != NULL;
}

struct ibv_ah *urdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct ibv_ah_attr routed;
	struct urdma_ah *ah;
	int ret;

	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	if (!attr->is_global) {
		routed = *attr;
		if (urdma_lid_route(to_uctx(pd->context), &routed))
			attr = &routed;
	}
	ret = ah_check(to_uctx(pd->context), attr);
	if (ret) {
		errno = ret;
		return NULL;
	}
	urdma_lid_learn(to_uctx(pd->context), attr);
	ah = urdma_zalloc(sizeof(*ah));
	if (!ah) {
		errno = ENOMEM;
		return NULL;
	}
	ah->av = (struct urdma_av){
		.flow_label = attr->grh.flow_label & 0xfffff,
		.dlid = attr->dlid,
		.sl = attr->sl,
		.is_global = !!attr->is_global,
		.sgid_index = attr->grh.sgid_index,
		.hop_limit = attr->grh.hop_limit,
		.tclass = attr->grh.traffic_class,
	};
	if (attr->is_global)
		memcpy(ah->av.dgid, attr->grh.dgid.raw, 16);
	ah->ibah.context = pd->context;
	ah->ibah.pd = pd;
	ah->ibah.handle = atomic_fetch_add(&next_ah_handle, 1);
	atomic_fetch_add(&to_upd(pd)->usecnt, 1);
	return &ah->ibah;
}

int urdma_destroy_ah(struct ibv_ah *ibah)
{
	if (!ibah)
		return EINVAL;
	atomic_fetch_sub(&to_upd(ibah->pd)->usecnt, 1);
	urdma_free(to_uah(ibah));
	return 0;
}

int urdma_init_ah_from_wc(struct ibv_context *context, uint8_t port_num,
			  const struct ibv_wc *wc, const struct ibv_grh *grh,
			  struct ibv_ah_attr *ah)
{
	const struct urdma_context *uctx = to_uctx(context);

	if (!wc || !ah || port_num != 1 ||
	    ((wc->wc_flags & IBV_WC_GRH) && !grh)) {
		errno = EINVAL;
		return -1;
	}
	memset(ah, 0, sizeof(*ah));
	ah->dlid = wc->slid;
	ah->sl = wc->sl;
	ah->src_path_bits = wc->dlid_path_bits;
	ah->port_num = port_num;
	if (wc->wc_flags & IBV_WC_GRH) {
		uint32_t v = be32toh(grh->version_tclass_flow);
		int i;

		/* Our GID the datagram was sent to is the source of the
		 * answer. */
		for (i = 0; i < uctx->num_gids; i++)
			if (!memcmp(uctx->gids[i].gid.raw, grh->dgid.raw, 16))
				break;
		if (i == uctx->num_gids) {
			errno = EINVAL;
			return -1;
		}
		ah->is_global = 1;
		ah->grh.dgid = grh->sgid;
		ah->grh.sgid_index = i;
		ah->grh.flow_label = v & 0xfffff;
		ah->grh.traffic_class = (v >> 20) & 0xff;
		ah->grh.hop_limit = 0xff;
	}
	return 0;
}

void urdma_grh_build(const struct urdma_context *uctx,
		     const struct urdma_av *av, uint32_t len,
		     struct ibv_grh *grh)
{
	/* IBA 8.3: version 6, then what a BTH, a DETH and the ICRC add. */
	grh->version_tclass_flow = htobe32(6u << 28 | (uint32_t)av->tclass << 20 |
					   av->flow_label);
	grh->paylen = htobe16((uint16_t)(len + 12 + 8 + 4));
	grh->next_hdr = 0x1b;
	grh->hop_limit = av->hop_limit;
	grh->sgid = uctx->gids[av->sgid_index].gid;
	memcpy(grh->dgid.raw, av->dgid, 16);
}

void urdma_rqe_source(const struct urdma_qp *qp, const struct urdma_shm_rqe *e,
		      struct ibv_wc *w)
{
	uint32_t v;

	if (qp->ibqp.qp_type != IBV_QPT_UD) {
		w->src_qp = qp->attr.dest_qp_num;
		return;
	}
	w->src_qp = READ_ONCE(e->src_qp) & 0xffffff;
	if (w->status != IBV_WC_SUCCESS)
		return;
	v = READ_ONCE(e->ud_src);
	w->slid = v & 0xffff;
	w->sl = (v >> URDMA_RQE_UD_SL_SHIFT) & 15;
	w->pkey_index = 0;
	if (v & URDMA_RQE_UD_GRH)
		w->wc_flags |= IBV_WC_GRH;
}
