// SPDX-License-Identifier: MIT
/*
 * Multicast on UD ids: rdma_join_multicast attaches the id's QP to the
 * group whose GID is the address's (an IPv4 group's is IPv4-mapped, as on
 * RoCE) and reports RDMA_CM_EVENT_MULTICAST_JOIN with what a sender needs:
 * an address handle's attributes for the group, QPN 0xffffff and the
 * Q_Key.  There is no subnet manager to ask: as on RoCE, the host joins
 * the group's IP address on the interface of the id's address (a socket
 * held while the id is joined), so that other hosts' datagrams to it come
 * in (libibverbs' UDP transport receives them).
 */
#include "rdmacm/cma_priv.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

bool cma_sa_multicast(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return IN_MULTICAST(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
	return sa->sa_family == AF_INET6 &&
	       IN6_IS_ADDR_MULTICAST(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* Join IPv4 group addr on the interface of the id's address: a socket
 * that holds the membership, or -1 (an IPv6 group, or the interface
 * can't: then this host's QPs only get the group's datagrams). */
static int mc_ip_join(struct cma_id *cid, const struct sockaddr *addr)
{
	const struct sockaddr_in *src =
		(const struct sockaddr_in *)&cid->id.route.addr.src_addr;
	struct ip_mreqn mr = { .imr_multiaddr =
				       ((const struct sockaddr_in *)addr)->sin_addr };
	int fd;

	if (addr->sa_family != AF_INET || src->sin_family != AF_INET)
		return -1;
	mr.imr_address = src->sin_addr;
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof(mr))) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void mc_drop(struct cma_id *cid, int i)
{
	if (cid->mc[i].ip_fd >= 0)
		close(cid->mc[i].ip_fd);
	cid->mc[i] = cid->mc[--cid->nmc];
}

static int mc_find(struct cma_id *cid, const struct sockaddr *addr)
{
	for (int i = 0; i < cid->nmc; i++)
		if (!memcmp(&cid->mc[i].addr, addr, sa_len(addr)))
			return i;
	return -1;
}

EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id,
				  struct rdma_cm_join_mc_attr_ex *attr,
				  void *context)
{
	struct cma_event *e;
	struct cma_id *cid;
	struct cma_mc *mc;
	bool send_only;
	int ret = 0;

	if (!id || !attr || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
	    !attr->addr || !sa_len(attr->addr) || !cma_sa_multicast(attr->addr) ||
	    id->qp_type != IBV_QPT_UD ||
	    ((attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) &&
	     attr->join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER &&
	     attr->join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER))
		return cma_err(EINVAL);
	send_only = (attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) &&
		    attr->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	if (!id->verbs || mc_find(cid, attr->addr) >= 0) {
		ret = EINVAL; /* not bound to a device yet, or joined */
		goto out;
	}
	if (cid->nmc == CMA_MC_MAX) {
		ret = ENOMEM;
		goto out;
	}
	mc = &cid->mc[cid->nmc];
	memset(mc, 0, sizeof(*mc));
	memcpy(&mc->addr, attr->addr, sa_len(attr->addr));
	sa_to_gid(attr->addr, &mc->mgid);
	/* A send-only member receives nothing. */
	if (id->qp && !send_only) {
		ret = ibv_attach_mcast(id->qp, &mc->mgid, 0);
		if (ret)
			goto out;
		mc->attached = true;
	}
	/* (a send-only member joins no IP group: it receives nothing) */
	mc->ip_fd = send_only ? -1 : mc_ip_join(cid, attr->addr);
	cid->nmc++;
	e = cma_post(cid, RDMA_CM_EVENT_MULTICAST_JOIN, 0, NULL);
	if (e) {
		struct rdma_ud_param *u = &e->ev.param.ud;

		u->private_data = context; /* as rdma-core reports it */
		u->ah_attr.is_global = 1;
		u->ah_attr.grh.dgid = mc->mgid;
		u->ah_attr.grh.sgid_index =
			cma_gid_index(&id->route.addr.addr.ibaddr.sgid);
		u->ah_attr.grh.hop_limit = 64; /* as RoCEv2's */
		u->ah_attr.grh.traffic_class = cid->tos;
		u->ah_attr.port_num = id->port_num ? id->port_num : 1;
		u->qp_num = 0xffffff;
		u->qkey = cma_ud_qkey(cid);
	} else {
		/* No event to report it (out of memory): not joined, rather
		 * than joined without a word (a synchronous id would wait for
		 * it for ever). */
		if (mc->attached)
			ibv_detach_mcast(id->qp, &mc->mgid, 0);
		mc_drop(cid, cid->nmc - 1);
		ret = ENOMEM;
	}
out:
	pthread_mutex_unlock(&cma_lock);
	if (ret)
		return cma_err(ret);
	return cid->sync ? cma_sync_wait(cid, RDMA_CM_EVENT_MULTICAST_JOIN) : 0;
}

EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr,
			       void *context)
{
	struct rdma_cm_join_mc_attr_ex attr = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS |
			     RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
		.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER,
		.addr = addr,
	};

	return rdma_join_multicast_ex(id, &attr, context);
}

EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct cma_id *cid;
	int i, ret = 0;

	if (!id || !addr)
		return cma_err(EINVAL);
	cid = to_cid(id);
	pthread_mutex_lock(&cma_lock);
	i = mc_find(cid, addr);
	if (i < 0) {
		ret = EADDRNOTAVAIL;
	} else {
		if (cid->mc[i].attached && id->qp)
			ibv_detach_mcast(id->qp, &cid->mc[i].mgid, 0);
		mc_drop(cid, i);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret ? cma_err(ret) : 0;
}

/* The id goes: its IP memberships too (its QP, if it still has one,
 * stays attached until it is destroyed: it may be dangling). */
void cma_mc_free(struct cma_id *cid)
{
	while (cid->nmc)
		mc_drop(cid, 0);
}

/* The id's QP goes: destroying it detaches it from its groups. */
void cma_mc_qp_gone(struct cma_id *cid)
{
	for (int i = 0; i < cid->nmc; i++)
		cid->mc[i].attached = false;
}
