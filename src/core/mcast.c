// SPDX-License-Identifier: MIT
/*
 * Multicast: UD QPs attached to groups (ibv_attach_mcast).
 *
 * A group is its GID.  Attaching a QP publishes a record
 * mcg-<gid in hex>-<qpn> in the host directory (the same record as
 * qp-<qpn>: its context, so a dead process's are swept), which a sender
 * of this host reads to find the group's QPs here (transport/ud.c), and
 * asks the UDP transport to join the group's IP address, so datagrams of
 * other hosts reach the QP too (transport/udp/udp.c).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/urdma.h"
#include "transport/ud.h"
#include "util/log.h"

static void mcg_kind(const union ibv_gid *g, char *kind, size_t len)
{
	int n = snprintf(kind, len, "mcg-");

	for (int i = 0; i < 16 && n < (int)len; i++)
		n += snprintf(kind + n, len - n, "%02x", g->raw[i]);
}

static int mcg_find(const struct urdma_qp *qp, const union ibv_gid *g)
{
	for (int i = 0; i < qp->nmcg; i++)
		if (!memcmp(qp->mcg[i].raw, g->raw, 16))
			return i;
	return -1;
}

int urdma_attach_mcast(struct ibv_qp *ibqp, const union ibv_gid *gid,
		       uint16_t lid)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	char kind[48];
	int ret = 0;

	(void)lid; /* (a group is its GID here) */
	if (!gid || ibqp->qp_type != IBV_QPT_UD || !urdma_gid_is_mcast(gid->raw))
		return EINVAL;
	pthread_mutex_lock(&qp->sq_lock);
	if (mcg_find(qp, gid) >= 0)
		goto out; /* attached already */
	if (qp->nmcg == URDMA_MCG_PER_QP) {
		ret = ENOMEM;
		goto out;
	}
	mcg_kind(gid, kind, sizeof(kind));
	ret = -urdma_host_rec_publish(kind, ibqp->qp_num, qp->uctx->ctx_id, 0,
				      0);
	if (!ret) {
		ret = -urdma_udp_mcast_join(qp, gid);
		if (ret)
			urdma_host_rec_unpublish(kind, ibqp->qp_num);
	}
	if (!ret)
		qp->mcg[qp->nmcg++] = *gid;
out:
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

/* Under sq_lock. */
static void mcg_detach(struct urdma_qp *qp, int i)
{
	char kind[48];

	mcg_kind(&qp->mcg[i], kind, sizeof(kind));
	urdma_host_rec_unpublish(kind, qp->ibqp.qp_num);
	urdma_udp_mcast_leave(qp, &qp->mcg[i]);
	qp->mcg[i] = qp->mcg[--qp->nmcg];
}

int urdma_detach_mcast(struct ibv_qp *ibqp, const union ibv_gid *gid,
		       uint16_t lid)
{
	struct urdma_qp *qp = to_uqp(ibqp);
	int i, ret = 0;

	(void)lid;
	if (!gid || ibqp->qp_type != IBV_QPT_UD)
		return EINVAL;
	pthread_mutex_lock(&qp->sq_lock);
	i = mcg_find(qp, gid);
	if (i < 0)
		ret = EINVAL;
	else
		mcg_detach(qp, i);
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

void urdma_mcast_detach_all(struct urdma_qp *qp)
{
	pthread_mutex_lock(&qp->sq_lock);
	while (qp->nmcg)
		mcg_detach(qp, 0);
	pthread_mutex_unlock(&qp->sq_lock);
}

int urdma_mcast_members(const uint8_t *gid, uint32_t *qpns, int max)
{
	union ibv_gid g;
	char kind[48];
	size_t klen;
	DIR *d;
	struct dirent *e;
	int n = 0;

	memcpy(g.raw, gid, 16);
	mcg_kind(&g, kind, sizeof(kind));
	klen = strlen(kind);
	d = urdma_host_opendir();
	if (!d)
		return 0;
	/* Any process of the user may write here: a name counts only in
	 * its canonical form, once, and when its record and the QP's own
	 * name the same context (a QPN reused since is another QP). */
	while ((e = readdir(d))) {
		struct urdma_qp_rec mrec, qrec;
		unsigned int qpn;
		char tail[2], name[64];
		bool seen = false;

		if (strncmp(e->d_name, kind, klen) || e->d_name[klen] != '-' ||
		    sscanf(e->d_name + klen + 1, "%x%1s", &qpn, tail) != 1 ||
		    qpn > 0xffffff)
			continue;
		snprintf(name, sizeof(name), "%s-%x", kind, qpn);
		for (int i = 0; i < n && !seen; i++)
			seen = qpns[i] == qpn;
		if (seen || strcmp(name, e->d_name) ||
		    urdma_host_rec_find(kind, qpn, &mrec) ||
		    urdma_host_qp_find(qpn, &qrec) ||
		    mrec.ctx_id != qrec.ctx_id)
			continue;
		if (n == max) {
			urdma_info("multicast group: more than %d QPs on this "
				   "host; the others get nothing", max);
			break;
		}
		qpns[n++] = qpn;
	}
	closedir(d);
	return n;
}
