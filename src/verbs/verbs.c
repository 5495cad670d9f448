// SPDX-License-Identifier: MIT
/*
 * The libibverbs ABI: the exported entry points of rdma-core 44 that the
 * core implements.  Everything here converts between the ABI's conventions
 * (NULL + errno, errno values, -1 + errno) and the core's.  The version
 * node of each symbol is fixed by libibverbs.map.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/urdma.h"
#include "util/log.h"

/* Core functions not in urdma.h because only this layer calls them. */
struct ibv_device **urdma_get_device_list(int *num);
uint64_t urdma_device_guid(struct ibv_device *dev);
struct ibv_context *urdma_open_device(struct ibv_device *dev);
int urdma_close_device(struct ibv_context *ctx);
int urdma_query_gid(struct ibv_context *c, uint8_t port, int index,
		    union ibv_gid *gid);
int urdma_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
		       struct ibv_gid_entry *e);
int urdma_num_gids(struct ibv_context *c);
int urdma_get_async_event(struct ibv_context *c, struct ibv_async_event *ev);
struct ibv_pd *urdma_alloc_pd(struct ibv_context *context);
int urdma_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *urdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			    uint64_t iova, unsigned int access);
int urdma_dereg_mr(struct ibv_mr *mr);
int urdma_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
		   size_t length, int access);
struct ibv_comp_channel *urdma_create_comp_channel(struct ibv_context *c);
int urdma_destroy_comp_channel(struct ibv_comp_channel *ch);
struct ibv_cq *urdma_create_cq(struct ibv_context *c, int cqe, void *cq_ctx,
			       struct ibv_comp_channel *ch, int vec);
int urdma_resize_cq(struct ibv_cq *cq, int cqe);
int urdma_destroy_cq(struct ibv_cq *cq);
int urdma_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq,
		       void **cq_context);
void urdma_ack_cq_events(struct ibv_cq *cq, unsigned int n);
struct ibv_qp *urdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
int urdma_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
int urdma_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
		   struct ibv_qp_init_attr *init);
int urdma_destroy_qp(struct ibv_qp *qp);
struct ibv_qp_ex *urdma_qp_to_qp_ex(struct ibv_qp *qp);
struct ibv_srq *urdma_create_srq(struct ibv_pd *pd,
				 struct ibv_srq_init_attr *init);
int urdma_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask);
int urdma_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr);
int urdma_destroy_srq(struct ibv_srq *srq);

/* The sysfs-flavoured GID type of the PRIVATE ibv_query_gid_type. */
enum urdma_gid_type_sysfs { URDMA_GID_SYSFS_IB_ROCE_V1, URDMA_GID_SYSFS_ROCE_V2 };

struct ibv_device **ibv_get_device_list(int *num_devices)
{
	return urdma_get_device_list(num_devices);
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

__be64 ibv_get_device_guid(struct ibv_device *device)
{
	return urdma_device_guid(device);
}

int ibv_get_device_index(struct ibv_device *device)
{
	return 0;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	return urdma_open_device(device);
}

int ibv_close_device(struct ibv_context *context)
{
	return urdma_close_device(context);
}

int ibv_get_async_event(struct ibv_context *context,
			struct ibv_async_event *event)
{
	return urdma_get_async_event(context, event);
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	/* destroying the event's object waits for this (device.c) */
	urdma_ack_async_event(event);
}

int ibv_query_device(struct ibv_context *context,
		     struct ibv_device_attr *device_attr)
{
	return urdma_query_device(context, device_attr);
}

/* The exported one takes the 48-byte pre-v1.? layout; the inline wrapper in
 * verbs.h uses the verbs_context slot with the full size. */
#undef ibv_query_port
int ibv_query_port(struct ibv_context *context, uint8_t port_num,
		   struct _compat_ibv_port_attr *port_attr)
{
	struct ibv_port_attr full;
	int ret = urdma_query_port(context, port_num, &full);

	if (!ret)
		memcpy(port_attr, &full, URDMA_COMPAT_PORT_ATTR_SIZE);
	return ret;
}

int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
		  union ibv_gid *gid)
{
	return urdma_query_gid(context, port_num, index, gid);
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
		      uint32_t gid_index, struct ibv_gid_entry *entry,
		      uint32_t flags, size_t entry_size)
{
	struct ibv_gid_entry e;
	int ret;

	if (flags || entry_size < sizeof(e))
		return EINVAL;
	ret = urdma_query_gid_ex(context, port_num, gid_index, &e);
	if (!ret)
		memcpy(entry, &e, sizeof(e));
	return ret;
}

ssize_t _ibv_query_gid_table(struct ibv_context *context,
			     struct ibv_gid_entry *entries, size_t max_entries,
			     uint32_t flags, size_t entry_size)
{
	int n = urdma_num_gids(context);

	if (flags || entry_size < sizeof(struct ibv_gid_entry))
		return -EINVAL;
	if ((size_t)n > max_entries)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		urdma_query_gid_ex(context, 1, i,
				   (struct ibv_gid_entry *)((char *)entries +
							    i * entry_size));
	return n;
}

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
		       unsigned int index, enum urdma_gid_type_sysfs *type)
{
	struct ibv_gid_entry e;
	int ret = urdma_query_gid_ex(context, port_num, index, &e);

	if (ret) {
		errno = ret;
		return -1;
	}
	*type = e.gid_type == IBV_GID_TYPE_IB ? URDMA_GID_SYSFS_IB_ROCE_V1 :
						URDMA_GID_SYSFS_ROCE_V2;
	return 0;
}

int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index,
		   __be16 *pkey)
{
	if (port_num != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}

int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num,
		       __be16 pkey)
{
	if (port_num != 1 || be16toh(pkey) != 0xffff)
		return -ENOENT;
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	return urdma_alloc_pd(context);
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	return urdma_dealloc_pd(pd);
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			  int access)
{
	return urdma_reg_mr(pd, addr, length, (uintptr_t)addr, access);
}

#undef ibv_reg_mr_iova
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
			       uint64_t iova, int access)
{
	return urdma_reg_mr(pd, addr, length, iova, access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
				uint64_t iova, unsigned int access)
{
	return urdma_reg_mr(pd, addr, length, iova, access);
}

int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
		 size_t length, int access)
{
	return urdma_rereg_mr(mr, flags, pd, addr, length, access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	return urdma_dereg_mr(mr);
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	return urdma_create_comp_channel(context);
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	return urdma_destroy_comp_channel(channel);
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe,
			     void *cq_context, struct ibv_comp_channel *channel,
			     int comp_vector)
{
	return urdma_create_cq(context, cqe, cq_context, channel, comp_vector);
}

int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	return urdma_resize_cq(cq, cqe);
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	return urdma_destroy_cq(cq);
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
		     void **cq_context)
{
	return urdma_get_cq_event(channel, cq, cq_context);
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	urdma_ack_cq_events(cq, nevents);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr)
{
	return urdma_create_qp(pd, qp_init_attr);
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	return urdma_modify_qp(qp, attr, attr_mask);
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr)
{
	return urdma_query_qp(qp, attr, attr_mask, init_attr);
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	return urdma_destroy_qp(qp);
}

/* NULL unless the QP was created with send ops flags (ibv_create_qp_ex). */
struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	return urdma_qp_to_qp_ex(qp);
}

int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op,
			       uint32_t flags)
{
	return 0; /* no in-order placement guarantee beyond the verbs rules */
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd,
			       struct ibv_srq_init_attr *srq_init_attr)
{
	return urdma_create_srq(pd, srq_init_attr);
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		   int srq_attr_mask)
{
	return urdma_modify_srq(srq, srq_attr, srq_attr_mask);
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr)
{
	return urdma_query_srq(srq, srq_attr);
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	return urdma_destroy_srq(srq);
}

/* ---- address handles (core/ud.c) ---- */

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	return urdma_create_ah(pd, attr);
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
	return urdma_destroy_ah(ah);
}

int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num,
			struct ibv_wc *wc, struct ibv_grh *grh,
			struct ibv_ah_attr *ah_attr)
{
	return urdma_init_ah_from_wc(context, port_num, wc, grh, ah_attr);
}

struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
				     struct ibv_grh *grh, uint8_t port_num)
{
	struct ibv_ah_attr attr;

	if (!pd ||
	    urdma_init_ah_from_wc(pd->context, port_num, wc, grh, &attr))
		return NULL;
	return urdma_create_ah(pd, &attr);
}

/* ---- multicast (core/mcast.c) ---- */

int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return urdma_attach_mcast(qp, gid, lid);
}

int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	return urdma_detach_mcast(qp, gid, lid);
}
