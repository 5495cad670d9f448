// SPDX-License-Identifier: MIT
/*
 * The device, its contexts and what ibv_query_* report.
 *
 * One device, urdma0, one port: ACTIVE, Ethernet link layer (InfiniBand
 * with URDMA_LINK_LAYER=ib), MTU 4096.  The GID table is built from the
 * addresses of the current network namespace: index 0 is a link-local GID
 * from the node GUID, then one IPv4-mapped GID per IPv4 address, then the
 * IPv6 addresses but link-local ones, loopback's last in each family (the
 * first IPv4 GID is one other hosts can reach, as UCX assumes) and always
 * kept (room is reserved for them); all of RoCE v2 type (IB type, and the
 * first IPv4 GID at index 0, on InfiniBand).  The LID is one per kernel and
 * network namespace (host_lid), the same for every process in one.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cm_link.h"
#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"

/* The verbs_device "ops" slot value: not any provider's. */
static const char urdma_device_tag[] = "urdma";

static struct urdma_device urdma_dev;
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
	const uint8_t *p = data;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t netns_id(void)
{
	struct stat st;

	return stat("/proc/self/ns/net", &st) ? 0 : st.st_ino;
}

static void dev_setup(void)
{
	struct ibv_device *d = &urdma_dev.ibdev;
	char machine[64] = "";
	uint64_t ns = netns_id();
	FILE *f;

	urdma_log_init();
	f = fopen("/etc/machine-id", "re");
	if (f) {
		if (!fgets(machine, sizeof(machine), f))
			machine[0] = 0;
		fclose(f);
	}
	urdma_dev.guid = fnv1a(0xcbf29ce484222325ull, machine, strlen(machine));
	urdma_dev.guid = fnv1a(urdma_dev.guid, &ns, sizeof(ns));
	urdma_dev.ops = urdma_device_tag;
	d->node_type = IBV_NODE_CA;
	d->transport_type = IBV_TRANSPORT_IB;
	snprintf(d->name, sizeof(d->name), "%s", URDMA_DEV_NAME);
	snprintf(d->dev_name, sizeof(d->dev_name), "uverbs-urdma0");
	snprintf(d->dev_path, sizeof(d->dev_path), "/dev/null");
	snprintf(d->ibdev_path, sizeof(d->ibdev_path),
		 "/sys/class/infiniband/%s", URDMA_DEV_NAME);
}

struct ibv_device **urdma_get_device_list(int *num)
{
	struct ibv_device **list;

	pthread_once(&dev_once, dev_setup);
	list = calloc(2, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	list[0] = &urdma_dev.ibdev;
	if (num)
		*num = 1;
	return list;
}

uint64_t urdma_device_guid(struct ibv_device *dev)
{
	return htobe64(container_of(dev, struct urdma_device, ibdev)->guid);
}

static void build_gids(struct urdma_context *uctx)
{
	struct ifaddrs *ifa, *i;
	uint64_t guid = urdma_dev.guid;
	union ibv_gid *g = &uctx->gids[0].gid;
	int n = 1;

	memset(g, 0, sizeof(*g));
	g->raw[0] = 0xfe;
	g->raw[1] = 0x80;
	memcpy(&g->raw[8], &guid, 8);
	uctx->gids[0].ifindex = 1;
	/* IPv4 then IPv6; in each, the host's addresses before loopback's:
	 * a program that takes the first RoCE v2 IPv4 GID (UCX) then names
	 * an address another host can reach. */
	if (getifaddrs(&ifa) == 0) {
		int nlo = 0;	/* loopback's GIDs always fit: room kept */

		for (i = ifa; i; i = i->ifa_next)
			if (i->ifa_addr && ((i->ifa_addr->sa_family == AF_INET &&
			     ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr) >> 24 == 127) ||
			    (i->ifa_addr->sa_family == AF_INET6 &&
			     IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))))
				nlo++;
		if (nlo > URDMA_MAX_GID - 1)
			nlo = URDMA_MAX_GID - 1;
		for (int pass = 0; pass < 4; pass++) {
			bool v6 = pass >= 2, lo = pass & 1;

			for (i = ifa; i; i = i->ifa_next) {
				union ibv_gid *x;

				if (!i->ifa_addr || n == URDMA_MAX_GID ||
				    (!lo && n >= URDMA_MAX_GID - nlo) ||
				    i->ifa_addr->sa_family != (v6 ? AF_INET6 : AF_INET))
					continue;
				x = &uctx->gids[n].gid;
				memset(x, 0, sizeof(*x));
				if (!v6) {
					struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;

					if (((ntohl(a.s_addr) >> 24) == 127) != lo)
						continue;
					x->raw[10] = x->raw[11] = 0xff;
					memcpy(&x->raw[12], &a, 4);
				} else {
					struct in6_addr *a = &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;

					if (IN6_IS_ADDR_LINKLOCAL(a) || IN6_IS_ADDR_LOOPBACK(a) != lo)
						continue;
					memcpy(x->raw, a, 16);
				}
				uctx->gids[n++].ifindex = if_nametoindex(i->ifa_name);
			}
		}
		freeifaddrs(ifa);
	}
	uctx->num_gids = n;
	/* InfiniBand: GID 0, the one programs take by default (Open MPI's
	 * udcm puts it in every address to another host), is the host's
	 * first IPv4 address, which routes; the link-local one follows. */
	if (uctx->link_layer == IBV_LINK_LAYER_INFINIBAND && n > 1 &&
	    IN6_IS_ADDR_V4MAPPED((struct in6_addr *)uctx->gids[1].gid.raw) &&
	    uctx->gids[1].gid.raw[12] != 127) {
		struct urdma_gid t = uctx->gids[0];

		uctx->gids[0] = uctx->gids[1];
		uctx->gids[1] = t;
	}
}


static void *compat_unsupported(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}


static int compat_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	return urdma_query_device(c, a);
}

static int compat_query_port(struct ibv_context *c, uint8_t port,
			     struct _compat_ibv_port_attr *a)
{
	struct ibv_port_attr full;
	int ret = urdma_query_port(c, port, &full);

	if (!ret)
		memcpy(a, &full, URDMA_COMPAT_PORT_ATTR_SIZE);
	return ret;
}

static int ctx_query_port(struct ibv_context *c, uint8_t port,
			  struct ibv_port_attr *a, size_t len)
{
	struct ibv_port_attr full;
	int ret = urdma_query_port(c, port, &full);

	if (!ret)
		memcpy(a, &full, len < sizeof(full) ? len : sizeof(full));
	return ret;
}

static void set_ops(struct ibv_context_ops *o)
{
	void *(**p)(void) = (void *(**)(void))o;

	/* Every legacy slot non-NULL: inline wrappers call them blindly. */
	for (size_t i = 0; i < sizeof(*o) / sizeof(*p); i++)
		p[i] = compat_unsupported;
	o->_compat_query_device = compat_query_device;
	o->_compat_query_port = compat_query_port;
	o->alloc_mw = urdma_alloc_mw;
	o->bind_mw = urdma_bind_mw;
	o->dealloc_mw = urdma_dealloc_mw;
	o->poll_cq = urdma_poll_cq;
	o->req_notify_cq = urdma_req_notify_cq;
	o->post_srq_recv = urdma_post_srq_recv;
	o->post_send = urdma_post_send;
	o->post_recv = urdma_post_recv;
}

static const struct verbs_ex_private cm_link = {
	.magic = URDMA_CM_LINK_MAGIC,
	.qp_error_if_live = urdma_qp_error_if_live,
	.release_held = urdma_release_held,
	.stop_seq = urdma_stop_seq,
};

/*
 * The LID: one per host, that is per kernel (its boot id: the same in
 * every container of a machine, another on every machine) and network
 * namespace (the one this context is opened in), so that every process
 * of a namespace has the same, and a LID-only address to another host is
 * seen to be one.  By the namespace's inode alone every machine's first
 * namespace had the same LID (0x4000 here).
 */
static uint16_t host_lid(void)
{
	char boot[64] = "";
	uint64_t ns = netns_id(), h;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			boot[0] = 0;
		fclose(f);
	}
	h = fnv1a(0xcbf29ce484222325ull, boot, strlen(boot));
	h = fnv1a(h, &ns, sizeof(ns));
	return (uint16_t)(1 + h % 0xbffe);
}

/*
 * The port's link layer: Ethernet (RoCE-like: GIDs route, also between
 * hosts), or with URDMA_LINK_LAYER=ib InfiniBand, for programs that work
 * only there (Open MPI's openib BTL: its udcm refuses Ethernet).  Nothing
 * else changes: on one host a LID-only address reaches the QP by its
 * number; another host is reached by its GID only (no LID routing).
 */
static uint8_t link_layer(void)
{
	const char *e = getenv("URDMA_LINK_LAYER");

	if (!e || !*e || !strcasecmp(e, "ethernet") || !strcasecmp(e, "eth"))
		return IBV_LINK_LAYER_ETHERNET;
	if (!strcasecmp(e, "ib") || !strcasecmp(e, "infiniband"))
		return IBV_LINK_LAYER_INFINIBAND;
	urdma_warn("URDMA_LINK_LAYER=%s: not ib or ethernet; Ethernet it is",
		   e);
	return IBV_LINK_LAYER_ETHERNET;
}

struct ibv_context *urdma_open_device(struct ibv_device *dev)
{
	struct urdma_context *uctx;
	int ret;

	if (dev != &urdma_dev.ibdev) {
		errno = ENODEV;
		return NULL;
	}
	ret = urdma_host_init();
	if (ret) {
		errno = ret;
		return NULL;
	}
	static pthread_once_t sweep_once = PTHREAD_ONCE_INIT;
	pthread_once(&sweep_once, urdma_host_sweep);

	uctx = urdma_zalloc(sizeof(*uctx));
	if (!uctx)
		goto err;
	uctx->mrs = urdma_zalloc_array(URDMA_MAX_MR, sizeof(*uctx->mrs));
	if (!uctx->mrs)
		goto err_free;
	pthread_mutex_init(&uctx->lock, NULL);
	pthread_mutex_init(&uctx->mw_lock, NULL);
	pthread_mutex_init(&uctx->ev_lock, NULL);
	pthread_mutex_init(&uctx->lid_lock, NULL);
	list_init(&uctx->qps);
	list_init(&uctx->srqs);
	uctx->vctx.sz = sizeof(struct verbs_context);
	uctx->vctx.query_port = ctx_query_port;
	uctx->vctx.query_device_ex = urdma_query_device_ex;
	uctx->vctx.query_rt_values = urdma_query_rt_values;
	uctx->vctx.create_cq_ex = urdma_create_cq_ex;
	uctx->vctx.modify_cq = urdma_modify_cq;
	uctx->vctx.create_qp_ex = urdma_create_qp_ex;
	uctx->vctx.create_srq_ex = urdma_create_srq_ex;
	uctx->vctx.open_xrcd = urdma_open_xrcd;
	uctx->vctx.close_xrcd = urdma_close_xrcd;
	uctx->vctx.get_srq_num = urdma_get_srq_num;
	uctx->vctx.open_qp = urdma_open_qp;
	uctx->vctx.alloc_td = urdma_alloc_td;
	uctx->vctx.dealloc_td = urdma_dealloc_td;
	uctx->vctx.alloc_parent_domain = urdma_alloc_parent_domain;
	uctx->vctx.priv = (struct verbs_ex_private *)&cm_link;
	uctx->vctx.context.device = dev;
	uctx->vctx.context.cmd_fd = -1;
	uctx->vctx.context.num_comp_vectors = 1;
	uctx->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&uctx->vctx.context.mutex, NULL);
	set_ops(&uctx->vctx.context.ops);
	uctx->vctx.context.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (uctx->vctx.context.async_fd < 0)
		goto err_free;
	uctx->link_layer = link_layer();
	build_gids(uctx);
	uctx->lid = host_lid();

	ret = -urdma_host_ctx_open(uctx);
	if (ret) {
		errno = ret;
		goto err_close;
	}
	ret = urdma_progress_add_ctx(uctx);
	if (ret) {
		errno = -ret;
		goto err_host;
	}
	urdma_dbg("context %x opened", uctx->ctx_id);
	return &uctx->vctx.context;

err_host:
	urdma_host_ctx_close(uctx);
err_close:
	close(uctx->vctx.context.async_fd);
err_free:
	urdma_free(uctx->mrs);
	urdma_free(uctx);
err:
	if (!errno)
		errno = ENOMEM;
	return NULL;
}

int urdma_close_device(struct ibv_context *ctx)
{
	struct urdma_context *uctx = to_uctx(ctx);

	urdma_host_ctx_close(uctx);
	urdma_progress_del_ctx(uctx);
	close(ctx->async_fd);
	urdma_free(uctx->events);
	urdma_free(uctx->mrs);
	urdma_free(uctx->lids);
	urdma_free(uctx);
	return 0;
}

int urdma_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "0.1.0");
	a->node_guid = urdma_device_guid(c->device);
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = URDMA_MAX_MR_SIZE;
	a->page_size_cap = 4096;
	a->vendor_id = URDMA_VENDOR_ID;
	a->vendor_part_id = URDMA_VENDOR_PART;
	a->hw_ver = 1;
	a->max_qp = URDMA_MAX_QP;
	a->max_qp_wr = URDMA_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN |
			      IBV_DEVICE_SHUTDOWN_PORT |
			      IBV_DEVICE_PORT_ACTIVE_EVENT |
			      IBV_DEVICE_SYS_IMAGE_GUID |
			      IBV_DEVICE_MEM_WINDOW |
			      IBV_DEVICE_MEM_WINDOW_TYPE_2B |
			      IBV_DEVICE_XRC;
	a->max_mw = URDMA_MAX_MR;
	a->max_sge = URDMA_MAX_SGE;
	a->max_sge_rd = URDMA_MAX_SGE;
	a->max_cq = URDMA_MAX_QP;
	a->max_cqe = URDMA_MAX_CQE;
	a->max_mr = URDMA_MAX_MR;
	a->max_pd = URDMA_MAX_PD;
	a->max_qp_rd_atom = URDMA_MAX_RD_ATOM;
	a->max_qp_init_rd_atom = URDMA_MAX_RD_ATOM;
	a->max_res_rd_atom = URDMA_MAX_RD_ATOM * URDMA_MAX_QP;
	a->atomic_cap = IBV_ATOMIC_HCA;
	a->max_srq = URDMA_MAX_SRQ;
	a->max_srq_wr = URDMA_MAX_SRQ_WR;
	a->max_srq_sge = URDMA_MAX_SGE;
	a->max_pkeys = 1;
	a->max_ah = 1 << 20; /* (not counted: memory is the limit) */
	a->max_mcast_grp = 64;	      /* a process's (transport/udp/udp.c) */
	a->max_mcast_qp_attach = 16;  /* QPs of a process per group */
	a->max_total_mcast_qp_attach = 64 * 16;
	a->local_ca_ack_delay = 1;
	a->phys_port_cnt = 1;
	return 0;
}

/* What the extended query adds, as far as urdma has it; the rest (ODP,
 * TSO, RSS, packet pacing, tag matching, device memory)
 * stays 0: not supported. */
int urdma_query_device_ex(struct ibv_context *c,
			  const struct ibv_query_device_ex_input *input,
			  struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr_ex a;

	if ((input && input->comp_mask) ||
	    attr_size < offsetof(struct ibv_device_attr_ex, comp_mask))
		return EINVAL;
	memset(&a, 0, sizeof(a));
	urdma_query_device(c, &a.orig_attr);
	/* The clock of completion timestamps (cq_ex.c): CLOCK_MONOTONIC ns. */
	a.completion_timestamp_mask = UINT64_MAX;
	a.hca_core_clock = 1000000; /* kHz */
	a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
	a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
	a.cq_mod_caps.max_cq_count = UINT16_MAX; /* ibv_modify_cq, cq.c */
	a.cq_mod_caps.max_cq_period = UINT16_MAX;
	memset(attr, 0, attr_size);
	memcpy(attr, &a, attr_size < sizeof(a) ? attr_size : sizeof(a));
	return 0;
}

int urdma_query_port(struct ibv_context *c, uint8_t port,
		     struct ibv_port_attr *a)
{
	struct urdma_context *uctx = to_uctx(c);

	if (port != 1)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = uctx->num_gids;
	a->port_cap_flags = IBV_PORT_CM_SUP;
	a->max_msg_sz = 1u << 31;
	a->pkey_tbl_len = 1;
	a->lid = uctx->lid;
	a->sm_lid = 0;
	a->lmc = 0;
	a->max_vl_num = 1;
	a->active_width = 2;  /* 4X */
	a->active_speed = 32; /* EDR */
	a->phys_state = 5;    /* LinkUp */
	a->link_layer = uctx->link_layer;
	return 0;
}

int urdma_query_gid(struct ibv_context *c, uint8_t port, int index,
		    union ibv_gid *gid)
{
	struct urdma_context *uctx = to_uctx(c);

	if (port != 1 || index < 0 || index >= uctx->num_gids) {
		errno = EINVAL;
		return -1;
	}
	*gid = uctx->gids[index].gid;
	return 0;
}

int urdma_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
		       struct ibv_gid_entry *e)
{
	struct urdma_context *uctx = to_uctx(c);

	if (port != 1)
		return EINVAL;
	if (index >= (uint32_t)uctx->num_gids)
		return ENODATA;
	e->gid = uctx->gids[index].gid;
	e->gid_index = index;
	e->port_num = port;
	e->gid_type = uctx->link_layer == IBV_LINK_LAYER_INFINIBAND ?
			      IBV_GID_TYPE_IB :
			      IBV_GID_TYPE_ROCE_V2;
	e->ndev_ifindex = uctx->gids[index].ifindex;
	return 0;
}

int urdma_num_gids(struct ibv_context *c)
{
	return to_uctx(c)->num_gids;
}

/* ---- async events ----
 *
 * A queue under ev_lock.  The eventfd is readable exactly while the queue
 * holds an event: its count is 1 from the push that fills the empty queue
 * to the take (or drop) that empties it, both under ev_lock, so a read of
 * it never blocks.  An event names its object; as the verbs require,
 * destroying the object drops its events nobody has read and waits until
 * those read are acknowledged. */

/* Under ev_lock: the queue was emptied; the eventfd's count goes. */
static void ev_emptied(struct urdma_context *uctx)
{
	uint64_t v;

	if (read(uctx->vctx.context.async_fd, &v, sizeof(v)) != sizeof(v))
		urdma_err("async event: %m");
}

/* The object an event names, NULL for a port or device event. */
static void *ev_obj(const struct ibv_async_event *e)
{
	switch (e->event_type) {
	case IBV_EVENT_CQ_ERR:
		return e->element.cq;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return e->element.qp;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		return e->element.srq;
	case IBV_EVENT_WQ_FATAL:
		return e->element.wq;
	default:
		return NULL;
	}
}

/* Where an event's object counts what was read of its events and what
 * was acknowledged, and the lock and condition of the latter. */
static uint32_t *ev_counts(const struct ibv_async_event *e, uint32_t **done,
			   pthread_mutex_t **mu, pthread_cond_t **cond,
			   bool **gone)
{
	switch (e->event_type) {
	case IBV_EVENT_CQ_ERR: {
		struct urdma_cq *cq = to_ucq(e->element.cq);

		*done = &cq->ibcq.async_events_completed;
		*mu = &cq->ibcq.mutex;
		*cond = &cq->ibcq.cond;
		*gone = &cq->async_gone;
		return &cq->async_reported;
	}
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: {
		struct urdma_srq *srq = to_usrq(e->element.srq);

		*done = &srq->ibsrq.events_completed;
		*mu = &srq->ibsrq.mutex;
		*cond = &srq->ibsrq.cond;
		*gone = &srq->async_gone;
		return &srq->async_reported;
	}
	case IBV_EVENT_WQ_FATAL:
		return NULL;	/* (no WQs here) */
	default:
		if (!ev_obj(e))
			return NULL;
		*done = &e->element.qp->events_completed;
		*mu = &e->element.qp->mutex;
		*cond = &e->element.qp->cond;
		*gone = &to_uqp(e->element.qp)->async_gone;
		return &to_uqp(e->element.qp)->async_reported;
	}
}

void urdma_async_event(struct urdma_context *uctx, struct ibv_async_event *ev)
{
	uint64_t one = 1;
	uint32_t *done;
	pthread_mutex_t *mu;
	pthread_cond_t *cond;
	bool *gone = NULL;

	pthread_mutex_lock(&uctx->ev_lock);
	/* an object being destroyed reports nothing more (nobody could
	 * follow the event to it) */
	if (ev_counts(ev, &done, &mu, &cond, &gone) && *gone) {
		pthread_mutex_unlock(&uctx->ev_lock);
		return;
	}
	if (uctx->ev_count == uctx->ev_cap) {
		unsigned int ncap = uctx->ev_cap ? uctx->ev_cap * 2 : 16;
		struct ibv_async_event *n =
			urdma_ring_move(uctx->events, uctx->ev_cap, uctx->ev_head,
					uctx->ev_count, ncap, sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&uctx->ev_lock);
			return;
		}
		uctx->events = n;
		uctx->ev_cap = ncap;
		uctx->ev_head = 0;
	}
	uctx->events[(uctx->ev_head + uctx->ev_count++) % uctx->ev_cap] = *ev;
	if (uctx->ev_count == 1 &&
	    write(uctx->vctx.context.async_fd, &one, sizeof(one)) < 0)
		urdma_err("async event: %m");
	pthread_mutex_unlock(&uctx->ev_lock);
}

int urdma_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	struct urdma_context *uctx = to_uctx(c);
	uint32_t *done, *reported;
	pthread_mutex_t *mu;
	pthread_cond_t *cond;
	bool *gone;

	pthread_mutex_lock(&uctx->ev_lock);
	while (!uctx->ev_count) {
		struct pollfd p = { .fd = c->async_fd, .events = POLLIN };
		int fl = fcntl(c->async_fd, F_GETFL);

		pthread_mutex_unlock(&uctx->ev_lock);
		/* as a read of the fd would: wait, unless it is O_NONBLOCK */
		if (fl < 0 || (fl & O_NONBLOCK)) {
			errno = fl < 0 ? errno : EAGAIN;
			return -1;
		}
		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -1;
		pthread_mutex_lock(&uctx->ev_lock);
	}
	*ev = uctx->events[uctx->ev_head];
	uctx->ev_head = (uctx->ev_head + 1) % uctx->ev_cap;
	if (!--uctx->ev_count)
		ev_emptied(uctx);
	reported = ev_counts(ev, &done, &mu, &cond, &gone);
	if (reported)
		++*reported;
	pthread_mutex_unlock(&uctx->ev_lock);
	return 0;
}

void urdma_ack_async_event(struct ibv_async_event *ev)
{
	uint32_t *done;
	pthread_mutex_t *mu;
	pthread_cond_t *cond;
	bool *gone;

	if (!ev || !ev_counts(ev, &done, &mu, &cond, &gone))
		return;
	pthread_mutex_lock(mu);
	++*done;
	pthread_cond_broadcast(cond);
	pthread_mutex_unlock(mu);
}

/* obj (a QP, CQ or SRQ) is being destroyed: it raises no more events
 * (*gone), its events nobody read are taken out of the queue; wait until
 * those read (*reported of them) are acknowledged (*done, under mu, on
 * cond). */
void urdma_async_release(struct urdma_context *uctx, void *obj,
			 const uint32_t *reported, const uint32_t *done,
			 pthread_mutex_t *mu, pthread_cond_t *cond, bool *gone)
{
	uint32_t want;

	pthread_mutex_lock(&uctx->ev_lock);
	*gone = true;	/* (what the engine raises from now on is dropped) */
	if (uctx->ev_count) {
		unsigned int kept = 0;

		for (unsigned int i = 0; i < uctx->ev_count; i++) {
			struct ibv_async_event *e =
				&uctx->events[(uctx->ev_head + i) % uctx->ev_cap];

			if (ev_obj(e) != obj)
				uctx->events[(uctx->ev_head + kept++) %
					     uctx->ev_cap] = *e;
		}
		uctx->ev_count = kept;
		if (!kept)
			ev_emptied(uctx);
	}
	want = *reported;
	pthread_mutex_unlock(&uctx->ev_lock);
	pthread_mutex_lock(mu);
	while ((int32_t)(want - *done) > 0)
		pthread_cond_wait(cond, mu);
	pthread_mutex_unlock(mu);
}
