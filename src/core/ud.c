// SPDX-License-Identifier: MIT
/*
 * Address handles, and what a UD receive tells of its sender.
 *
 * An address handle is its attributes, checked: a UD WR copies them when
 * it is posted (sq.c), so the handle may go while WRs that named it are
 * queued.  A LID names this host (its network namespace): another host is
 * reached by GID (transport/ud.c), and so is a multicast group: a
 * multicast LID is EOPNOTSUPP when the handle is made.
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
 * Other hosts' LIDs.  A LID names this host only (device.c): nothing
 * routes one to another host.  An address that carries both another
 * host's LID and a GID of it (one that a program made: Open MPI's udcm
 * makes one to each peer before it moves its RC QPs to RTR by LID alone)
 * teaches this context that pairing, and an address by that LID alone
 * then goes to that GID.  The newest URDMA_LID_MAP pairs are kept.
 */
static bool foreign_lid(const struct urdma_context *uctx, uint16_t lid)
{
	return lid && lid < LID_MULTICAST && lid != uctx->lid;
}

void urdma_lid_learn(struct urdma_context *uctx, const struct ibv_ah_attr *a)
{
	unsigned int i;

	if (!a->is_global || !foreign_lid(uctx, a->dlid) ||
	    a->grh.dgid.raw[0] == 0xff || /* a group */
	    urdma_gid_is_local(uctx, a->grh.dgid.raw))
		return;
	pthread_mutex_lock(&uctx->lid_lock);
	for (i = 0; i < URDMA_LID_MAP && uctx->lids[i].lid != a->dlid; i++)
		;
	if (i == URDMA_LID_MAP)
		i = uctx->lid_next++ % URDMA_LID_MAP;
	uctx->lids[i].lid = a->dlid;
	uctx->lids[i].gid = a->grh.dgid;
	pthread_mutex_unlock(&uctx->lid_lock);
}

/* The index of our first GID of the same family as gid (IPv4-mapped or
 * not), not loopback's; or 0. */
static uint8_t sgid_for(const struct urdma_context *uctx, const uint8_t *gid)
{
	bool v4 = IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)gid);

	for (int i = 0; i < uctx->num_gids; i++) {
		const uint8_t *g = uctx->gids[i].gid.raw;
		bool gv4 = IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)g);

		if (gv4 == v4 && !(gv4 && g[12] == 127) &&
		    !IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)g) &&
		    !IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)g))
			return (uint8_t)i;
	}
	return 0;
}

bool urdma_lid_route(struct urdma_context *uctx, struct ibv_ah_attr *a)
{
	bool found = false;

	if (a->is_global || !foreign_lid(uctx, a->dlid))
		return false;
	pthread_mutex_lock(&uctx->lid_lock);
	for (unsigned int i = 0; i < URDMA_LID_MAP && !found; i++) {
		if (uctx->lids[i].lid != a->dlid)
			continue;
		a->is_global = 1;
		a->grh.dgid = uctx->lids[i].gid;
		a->grh.hop_limit = 64;
		found = true;
	}
	pthread_mutex_unlock(&uctx->lid_lock);
	if (found)
		a->grh.sgid_index = sgid_for(uctx, a->grh.dgid.raw);
	return found;
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
	urdma_lid_learn(to_uctx(pd->context), attr);
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
