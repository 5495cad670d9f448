// SPDX-License-Identifier: MIT
/*
 * The synchronous helpers of <rdma/rdma_verbs.h> (rdma_create_ep and
 * friends), options, ports and devices, and what is not supported.
 */
#include "rdmacm/cma_priv.h"

#include <errno.h>
#include <pthread.h>
#include <rdma/rdma_verbs.h>
#include <stdbool.h>
#include <stdlib.h>

/* ---- endpoints (the synchronous helpers of <rdma/rdma_verbs.h>) ---------- */

EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res,
			  struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct rdma_cm_id *cm_id;
	struct cma_id *cid;
	int ret;

	if (!id || !res)
		return cma_err(EINVAL);
	ret = rdma_create_id(NULL, &cm_id, NULL,
			     res->ai_port_space ? res->ai_port_space : RDMA_PS_TCP);
	if (ret)
		return ret;
	cid = to_cid(cm_id);
	if (qp_init_attr)
		qp_init_attr->qp_type = res->ai_qp_type ? res->ai_qp_type : IBV_QPT_RC;
	if (res->ai_flags & RAI_PASSIVE) {
		ret = res->ai_src_addr ? rdma_bind_addr(cm_id, res->ai_src_addr) :
					 cma_err(EINVAL);
		if (ret)
			goto fail;
		if (qp_init_attr) {
			cid->has_qp_init = true;
			cid->qp_init = *qp_init_attr;
			cid->ep_pd = pd;
		}
		*id = cm_id;
		return 0;
	}
	ret = rdma_resolve_addr(cm_id, res->ai_src_addr, res->ai_dst_addr, 2000);
	if (!ret)
		ret = rdma_resolve_route(cm_id, 2000);
	if (!ret && qp_init_attr)
		ret = rdma_create_qp(cm_id, pd, qp_init_attr);
	if (ret)
		goto fail;
	*id = cm_id;
	return 0;
fail:
	ret = errno;
	rdma_destroy_id(cm_id);
	return cma_err(ret);
}

EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct cma_id *lis;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *child;
	int ret;

	if (!listen || !id)
		return cma_err(EINVAL);
	lis = to_cid(listen);
	if (!lis->sync || lis->state != CS_LISTEN)
		return cma_err(EINVAL);
	ret = rdma_get_cm_event(listen->channel, &ev);
	if (ret)
		return ret;
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
		rdma_ack_cm_event(ev);
		return cma_err(EPROTO);
	}
	child = ev->id;
	/* The event stays readable as child->event until the next step. */
	if (lis->has_qp_init) {
		struct ibv_qp_init_attr a = lis->qp_init;

		ret = rdma_create_qp(child, lis->ep_pd, &a);
		if (ret) {
			ret = errno;
			rdma_ack_cm_event(ev);
			rdma_reject(child, NULL, 0);
			rdma_destroy_id(child);
			return cma_err(ret);
		}
	}
	pthread_mutex_lock(&cma_lock);
	/* Count it against the child from now on. */
	container_of(ev, struct cma_event, ev)->owner = to_cid(child);
	lis->outstanding--;
	to_cid(child)->outstanding++;
	pthread_cond_broadcast(&cma_cond);
	pthread_mutex_unlock(&cma_lock);
	child->event = ev;
	*id = child;
	return 0;
}

/* ---- options, ports, devices, and what is not supported ------------------ */

EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname,
			   void *optval, size_t optlen)
{
	struct cma_id *cid;
	int ret = 0;

	if (!id || !optval)
		return cma_err(EINVAL);
	cid = to_cid(id);
	if (level == RDMA_OPTION_IB)
		return cma_err(optname == RDMA_OPTION_IB_PATH ? EOPNOTSUPP : EINVAL);
	if (level != RDMA_OPTION_ID)
		return cma_err(EINVAL);
	pthread_mutex_lock(&cma_lock);
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		if (optlen != sizeof(uint8_t))
			ret = cma_err(EINVAL);
		else
			cid->tos = *(uint8_t *)optval;
		break;
	case RDMA_OPTION_ID_REUSEADDR:
		/* Ports are always reusable past TIME_WAIT (cma_socket). */
		if (optlen != sizeof(int))
			ret = cma_err(EINVAL);
		break;
	case RDMA_OPTION_ID_AFONLY:
		if (optlen != sizeof(int) || cid->state != CS_IDLE)
			ret = cma_err(EINVAL);
		else
			cid->afonly = *(int *)optval != 0;
		break;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (optlen != sizeof(uint8_t) || *(uint8_t *)optval > 31)
			ret = cma_err(EINVAL);
		else
			cid->ack_timeout = *(uint8_t *)optval;
		break;
	default:
		ret = cma_err(ENOPROTOOPT);
	}
	pthread_mutex_unlock(&cma_lock);
	return ret;
}

EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return id ? sa_port(&id->route.addr.src_addr) : 0;
}

EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return id ? sa_port(&id->route.addr.dst_addr) : 0;
}

EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list;

	if (cma_init())
		return NULL;
	list = calloc(2, sizeof(*list));
	if (!list)
		return NULL;
	list[0] = cma_ctx;
	if (num_devices)
		*num_devices = 1;
	return list;
}

EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	/* Our connections are established by the RTU, never by traffic. */
	(void)event;
	return id ? 0 : cma_err(EINVAL);
}

EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id, (void)ece;
	return cma_err(EOPNOTSUPP); /* no ECE on this device (ibv_query_ece) */
}

EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id, (void)ece;
	return cma_err(EOPNOTSUPP);
}
