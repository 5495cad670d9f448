// SPDX-License-Identifier: MIT
/*
 * abi_misc.c - the device-independent part of the libibverbs.so.1 ABI.
 *
 * libibverbs.map lists 146 default-version exports.  The device verbs
 * (device list, contexts, PD/MR/CQ/QP/SRQ/AH, GIDs...) live in verbs.c.
 * This file holds everything else:
 *
 *  - helpers with real implementations: enum-to-string, rate
 *    conversions, kernel-struct marshalling, sysfs reading, fork hooks;
 *  - verbs that urdma refuses on purpose (import/export of objects,
 *    dma-buf MRs, ECE, Ethernet L2 resolution); each one fails with the
 *    documented error, never silently;
 *  - IBVERBS_PRIVATE_34: the provider-facing interface.  Debian's real
 *    libmlx5/libefa import it, and perftest, UCX and libfabric load them.
 *    They must be able to load against us, run their constructor (which
 *    registers a driver), and then never touch our device.  So every entry
 *    here is an inert stub.
 *
 * The prototypes of the sysfs helpers, the fork-range helpers, the
 * marshalling helpers and all of IBVERBS_PRIVATE_34 live in rdma-core
 * headers that Debian does not install (driver.h, marshall.h); they are
 * declared below.  Their arguments are never used, so private structure
 * types are left incomplete or passed as void *.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

/* Private rdma-core types: only ever seen through pointers. */
struct ibv_command_buffer;
struct verbs_context_ops;
struct verbs_counters;
struct verbs_cq;
struct verbs_device_ops;
struct verbs_dm;
struct verbs_flow_action;
struct verbs_mr;
struct verbs_qp;
struct verbs_srq;
struct verbs_sysfs_dev;
struct verbs_xrcd;

/* Public exports whose prototypes are not in the installed headers. */
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf,
			size_t size);
int ibv_read_ibdev_sysfs_file(char *buf, size_t size,
			      struct verbs_sysfs_dev *sysfs_dev,
			      const char *fnfmt, ...)
	__attribute__((format(printf, 4, 5)));
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst,
				struct ib_uverbs_ah_attr *src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst,
				struct ib_uverbs_qp_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst,
				 struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst,
			       struct ibv_sa_path_rec *src);

/* ------------------------------------------------------------------ */
/* Enum to string.  The texts are those of rdma-core 44 (checked by   */
/* calling Debian's library for every value); tools print them.        */
/* ------------------------------------------------------------------ */

static const char *enum_str(const char *const *tab, size_t n, long v)
{
	if (v < 0 || (size_t)v >= n || !tab[v])
		return "unknown";
	return tab[v];
}

#define ENUM_STR(tab, v) enum_str(tab, sizeof(tab) / sizeof(tab[0]), (long)(v))

const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const names[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};

	return ENUM_STR(names, node_type);
}

const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const names[] = {
		[IBV_PORT_NOP] = "no state change (NOP)",
		[IBV_PORT_DOWN] = "down",
		[IBV_PORT_INIT] = "init",
		[IBV_PORT_ARMED] = "armed",
		[IBV_PORT_ACTIVE] = "active",
		[IBV_PORT_ACTIVE_DEFER] = "active defer",
	};

	return ENUM_STR(names, port_state);
}

const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const names[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};

	return ENUM_STR(names, event);
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};

	return ENUM_STR(names, status);
}

/* ------------------------------------------------------------------ */
/* Static rate conversions.                                            */
/* ------------------------------------------------------------------ */

/*
 * One row per IB static rate: its multiple of 2.5 Gb/s (0 when it is not
 * a whole multiple: those rates come from 14/25/50 Gb/s lane encodings)
 * and its exact data rate in Mb/s.  The enum values are not in speed
 * order, hence the table instead of arithmetic.
 */
static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} rate_tab[] = {
	{ IBV_RATE_2_5_GBPS,	1,	2500 },
	{ IBV_RATE_5_GBPS,	2,	5000 },
	{ IBV_RATE_10_GBPS,	4,	10000 },
	{ IBV_RATE_20_GBPS,	8,	20000 },
	{ IBV_RATE_30_GBPS,	12,	30000 },
	{ IBV_RATE_40_GBPS,	16,	40000 },
	{ IBV_RATE_60_GBPS,	24,	60000 },
	{ IBV_RATE_80_GBPS,	32,	80000 },
	{ IBV_RATE_120_GBPS,	48,	120000 },
	{ IBV_RATE_14_GBPS,	0,	14062 },
	{ IBV_RATE_56_GBPS,	0,	56250 },
	{ IBV_RATE_112_GBPS,	0,	112500 },
	{ IBV_RATE_168_GBPS,	0,	168750 },
	{ IBV_RATE_25_GBPS,	0,	25781 },
	{ IBV_RATE_100_GBPS,	0,	103125 },
	{ IBV_RATE_200_GBPS,	0,	206250 },
	{ IBV_RATE_300_GBPS,	0,	309375 },
	{ IBV_RATE_28_GBPS,	11,	28125 },
	{ IBV_RATE_50_GBPS,	20,	53125 },
	{ IBV_RATE_400_GBPS,	160,	425000 },
	{ IBV_RATE_600_GBPS,	240,	637500 },
	{ IBV_RATE_800_GBPS,	320,	850000 },
	{ IBV_RATE_1200_GBPS,	480,	1275000 },
};

#define RATE_TAB_LEN (sizeof(rate_tab) / sizeof(rate_tab[0]))

int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < RATE_TAB_LEN; i++)
		if (rate_tab[i].rate == rate)
			return rate_tab[i].mult ? rate_tab[i].mult : -1;
	return -1;
}

enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < RATE_TAB_LEN; i++)
		if (mult > 0 && rate_tab[i].mult == mult)
			return rate_tab[i].rate;
	return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < RATE_TAB_LEN; i++)
		if (rate_tab[i].rate == rate)
			return rate_tab[i].mbps;
	return -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < RATE_TAB_LEN; i++)
		if (rate_tab[i].mbps == mbps)
			return rate_tab[i].rate;
	return IBV_RATE_MAX;
}

/* ------------------------------------------------------------------ */
/* Kernel uAPI structure marshalling.  Debian's real librdmacm calls   */
/* these on top of us, so they must be faithful field-by-field copies. */
/* ------------------------------------------------------------------ */

void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst,
				struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;

	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

/*
 * qp_state is deliberately NOT copied: rdma-core never has, and its
 * librdmacm relies on that (rdma_init_qp_attr() callers set
 * attr->qp_state to the state they ask for before the call).  Measured
 * against Debian's library with random input.
 */
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst,
				struct ib_uverbs_qp_attr *src)
{
	dst->cur_qp_state = src->cur_qp_state;
	dst->path_mtu = src->path_mtu;
	dst->path_mig_state = src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;

	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;

	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);

	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst,
				 struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));

	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->reversible = src->reversible;
	dst->mtu = src->mtu;
	dst->pkey = src->pkey;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->numb_path = src->numb_path;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time_selector = src->packet_life_time_selector;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
}

void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst,
			       struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));

	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->reversible = src->reversible;
	dst->mtu = src->mtu;
	dst->pkey = src->pkey;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->numb_path = src->numb_path;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time_selector = src->packet_life_time_selector;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
}

/* ------------------------------------------------------------------ */
/* sysfs helpers.  Clients use them on real paths (ibv_devinfo reads   */
/* board_id, Debian's librdmacm reads the ucma abi_version), so they   */
/* do real I/O.                                                        */
/* ------------------------------------------------------------------ */

static pthread_once_t sysfs_once = PTHREAD_ONCE_INIT;
static const char *sysfs_path = "/sys";

static void sysfs_path_init(void)
{
	const char *env;
	char *dup;
	size_t len;

	/* Like rdma-core: honour $SYSFS_PATH, but not in set-uid programs. */
	if (getuid() != geteuid())
		return;
	env = getenv("SYSFS_PATH");
	if (!env)
		return;
	dup = strndup(env, PATH_MAX);
	if (!dup)
		return;
	len = strlen(dup);
	while (len > 0 && dup[len - 1] == '/')
		dup[--len] = '\0';
	sysfs_path = dup;	/* lives as long as the process */
}

const char *ibv_get_sysfs_path(void)
{
	pthread_once(&sysfs_once, sysfs_path_init);
	return sysfs_path;
}

/*
 * Read dir/file into buf.  On success the result is NUL-terminated with
 * any trailing newline removed and its length is returned.  Contents that
 * fill buf completely without a trailing newline cannot be terminated, so
 * that is an error (-1) rather than a silently truncated string.
 */
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf,
			size_t size)
{
	char path[PATH_MAX];
	ssize_t len;
	int n, fd;

	n = snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (n < 0 || (size_t)n >= sizeof(path)) {
		errno = ENAMETOOLONG;
		return -1;
	}

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	do {
		len = read(fd, buf, size);
	} while (len < 0 && errno == EINTR);
	close(fd);

	if (len <= 0)
		return len;
	if (buf[len - 1] == '\n')
		buf[--len] = '\0';
	else if ((size_t)len < size)
		buf[len] = '\0';
	else
		return -1;
	return len;
}

/* urdma devices have no node under /sys/class/infiniband. */
int ibv_read_ibdev_sysfs_file(char *buf, size_t size,
			      struct verbs_sysfs_dev *sysfs_dev,
			      const char *fnfmt, ...)
{
	(void)buf;
	(void)size;
	(void)sysfs_dev;
	(void)fnfmt;
	errno = ENOENT;
	return -1;
}

/* ------------------------------------------------------------------ */
/* fork() support.  A hardware NIC DMAs into pinned physical pages, so */
/* a copy-on-write fault after fork() would leave it writing into the  */
/* wrong copy; rdma-core guards against that with MADV_DONTFORK.  The  */
/* urdma "NIC" is software that accesses registered memory through the */
/* owning process' virtual addresses, so fork() needs no preparation.  */
/* ------------------------------------------------------------------ */

int ibv_fork_init(void)
{
	return 0;
}

enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Verbs urdma refuses on purpose.  Importing objects needs a shared   */
/* kernel uverbs fd, dma-buf needs a device driver, ECE is a Mellanox  */
/* CM extension, and L2 resolution needs a kernel RoCE GID table.      */
/* ------------------------------------------------------------------ */

struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	errno = EOPNOTSUPP;
	return NULL;
}

struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)context;
	(void)pd_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)pd;
	(void)mr_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)context;
	(void)dm_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

/* Nothing can have been imported, so there is nothing to release. */
void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				 size_t length, uint64_t iova, int fd,
				 int access)
{
	(void)pd;
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

/* Like rdma-core without a provider hook: the error is the return value. */
int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context *context,
				struct ibv_ah_attr *attr,
				uint8_t eth_mac[ETHERNET_LL_SIZE],
				uint16_t *vid)
{
	(void)context;
	(void)attr;
	(void)eth_mac;
	(void)vid;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* ------------------------------------------------------------------ */
/* IBVERBS_PRIVATE_34: the interface rdma-core offers its providers.   */
/* ------------------------------------------------------------------ */

/*
 * Read by providers when a device was hot-unplugged; urdma devices never
 * disassociate, and no provider ever gets one of our devices anyway.
 */
bool verbs_allow_disassociate_destroy = false;

/*
 * Called from every provider's constructor (before main) when the
 * provider library is loaded.  Accept and ignore: urdma never matches
 * hardware to providers, so the ops must never be called.
 */
void verbs_register_driver_34(const struct verbs_device_ops *ops);
void verbs_register_driver_34(const struct verbs_device_ops *ops)
{
	(void)ops;
}

/* Provider debug logging: providers never run on our devices. */
void __verbs_log(struct verbs_context *ctx, uint32_t level,
		 const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void __verbs_log(struct verbs_context *ctx, uint32_t level,
		 const char *fmt, ...)
{
	(void)ctx;
	(void)level;
	(void)fmt;
}

/*
 * Sizes the on-stack attribute array a provider builds before calling
 * execute_ioctl().  Returning the caller's own count keeps that array
 * large enough for what the caller writes; execute_ioctl() then fails.
 * (Returning 0 as an "error" would make the caller overflow its stack.)
 */
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
				     struct ibv_command_buffer *link);
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs,
				     struct ibv_command_buffer *link)
{
	(void)link;
	return num_attrs;
}

/*
 * Everything else is a kernel-command or provider-context helper.  There
 * is no kernel uverbs device behind urdma, so each one fails: int-returning
 * ones return EOPNOTSUPP (rdma-core's ibv_cmd_* return a positive errno),
 * pointer-returning ones return NULL, void ones do nothing; errno is set
 * to EOPNOTSUPP in the failing cases.  The parameter lists follow
 * rdma-core 44's driver.h, with private command/response structs as void *.
 * The arguments are deliberately unused.
 */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define STUB_INT(name, ...)						\
	int name(__VA_ARGS__);						\
	int name(__VA_ARGS__)						\
	{								\
		errno = EOPNOTSUPP;					\
		return EOPNOTSUPP;					\
	}

#define STUB_PTR(type, name, ...)					\
	type *name(__VA_ARGS__);					\
	type *name(__VA_ARGS__)						\
	{								\
		errno = EOPNOTSUPP;					\
		return NULL;						\
	}

#define STUB_VOID(name, ...)						\
	void name(__VA_ARGS__);						\
	void name(__VA_ARGS__)						\
	{								\
	}

/* Provider context and CQ plumbing. */
STUB_PTR(void, _verbs_init_and_alloc_context, struct ibv_device *device,
	 int cmd_fd, size_t alloc_size, struct verbs_context *context_offset,
	 uint32_t driver_id)
STUB_PTR(struct ibv_context, verbs_open_device, struct ibv_device *device,
	 void *private_data)
STUB_VOID(verbs_uninit_context, struct verbs_context *context)
STUB_VOID(verbs_set_ops, struct verbs_context *vctx,
	  const struct verbs_context_ops *ops)
STUB_VOID(verbs_init_cq, struct ibv_cq *cq, struct ibv_context *context,
	  struct ibv_comp_channel *channel, void *cq_context)
STUB_INT(execute_ioctl, struct ibv_context *context,
	 struct ibv_command_buffer *cmd)

/* Context and device. */
STUB_INT(ibv_cmd_get_context, struct verbs_context *context, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_query_context, struct ibv_context *ctx,
	 struct ibv_command_buffer *driver)
STUB_INT(ibv_cmd_query_device_any, struct ibv_context *context,
	 const struct ibv_query_device_ex_input *input,
	 struct ibv_device_attr_ex *attr, size_t attr_size, void *resp,
	 size_t *resp_size)
STUB_INT(ibv_cmd_query_port, struct ibv_context *context, uint8_t port_num,
	 struct ibv_port_attr *port_attr, void *cmd, size_t cmd_size)

/* PD, XRCD, MR, MW, DM. */
STUB_INT(ibv_cmd_alloc_pd, struct ibv_context *context, struct ibv_pd *pd,
	 void *cmd, size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_dealloc_pd, struct ibv_pd *pd)
STUB_INT(ibv_cmd_open_xrcd, struct ibv_context *context,
	 struct verbs_xrcd *xrcd, int vxrcd_size,
	 struct ibv_xrcd_init_attr *attr, void *cmd, size_t cmd_size,
	 void *resp, size_t resp_size)
STUB_INT(ibv_cmd_close_xrcd, struct verbs_xrcd *xrcd)
STUB_INT(ibv_cmd_reg_mr, struct ibv_pd *pd, void *addr, size_t length,
	 uint64_t hca_va, int access, struct verbs_mr *vmr, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_rereg_mr, struct verbs_mr *vmr, uint32_t flags, void *addr,
	 size_t length, uint64_t hca_va, int access, struct ibv_pd *pd,
	 void *cmd, size_t cmd_sz, void *resp, size_t resp_sz)
STUB_INT(ibv_cmd_dereg_mr, struct verbs_mr *vmr)
STUB_INT(ibv_cmd_query_mr, struct ibv_pd *pd, struct verbs_mr *vmr,
	 uint32_t mr_handle)
STUB_INT(ibv_cmd_advise_mr, struct ibv_pd *pd,
	 enum ibv_advise_mr_advice advice, uint32_t flags,
	 struct ibv_sge *sg_list, uint32_t num_sge)
STUB_INT(ibv_cmd_reg_dmabuf_mr, struct ibv_pd *pd, uint64_t offset,
	 size_t length, uint64_t iova, int fd, int access,
	 struct verbs_mr *vmr)
STUB_INT(ibv_cmd_alloc_mw, struct ibv_pd *pd, enum ibv_mw_type type,
	 struct ibv_mw *mw, void *cmd, size_t cmd_size, void *resp,
	 size_t resp_size)
STUB_INT(ibv_cmd_dealloc_mw, struct ibv_mw *mw)
STUB_INT(ibv_cmd_alloc_dm, struct ibv_context *ctx,
	 const struct ibv_alloc_dm_attr *dm_attr, struct verbs_dm *dm,
	 struct ibv_command_buffer *link)
STUB_INT(ibv_cmd_free_dm, struct verbs_dm *dm)
STUB_INT(ibv_cmd_reg_dm_mr, struct ibv_pd *pd, struct verbs_dm *dm,
	 uint64_t offset, size_t length, unsigned int access,
	 struct verbs_mr *vmr, struct ibv_command_buffer *link)

/* CQ. */
STUB_INT(ibv_cmd_create_cq, struct ibv_context *context, int cqe,
	 struct ibv_comp_channel *channel, int comp_vector,
	 struct ibv_cq *cq, void *cmd, size_t cmd_size, void *resp,
	 size_t resp_size)
STUB_INT(ibv_cmd_create_cq_ex, struct ibv_context *context,
	 const struct ibv_cq_init_attr_ex *cq_attr, struct verbs_cq *cq,
	 void *cmd, size_t cmd_size, void *resp, size_t resp_size,
	 uint32_t cmd_flags)
STUB_INT(ibv_cmd_poll_cq, struct ibv_cq *cq, int ne, struct ibv_wc *wc)
STUB_INT(ibv_cmd_req_notify_cq, struct ibv_cq *cq, int solicited_only)
STUB_INT(ibv_cmd_resize_cq, struct ibv_cq *cq, int cqe, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_destroy_cq, struct ibv_cq *cq)
STUB_INT(ibv_cmd_modify_cq, struct ibv_cq *cq,
	 struct ibv_modify_cq_attr *attr, void *cmd, size_t cmd_size)

/* SRQ. */
STUB_INT(ibv_cmd_create_srq, struct ibv_pd *pd, struct ibv_srq *srq,
	 struct ibv_srq_init_attr *attr, void *cmd, size_t cmd_size,
	 void *resp, size_t resp_size)
STUB_INT(ibv_cmd_create_srq_ex, struct ibv_context *context,
	 struct verbs_srq *srq, struct ibv_srq_init_attr_ex *attr_ex,
	 void *cmd, size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_modify_srq, struct ibv_srq *srq,
	 struct ibv_srq_attr *srq_attr, int srq_attr_mask, void *cmd,
	 size_t cmd_size)
STUB_INT(ibv_cmd_query_srq, struct ibv_srq *srq,
	 struct ibv_srq_attr *srq_attr, void *cmd, size_t cmd_size)
STUB_INT(ibv_cmd_destroy_srq, struct ibv_srq *srq)
STUB_INT(ibv_cmd_post_srq_recv, struct ibv_srq *srq, struct ibv_recv_wr *wr,
	 struct ibv_recv_wr **bad_wr)

/* QP. */
STUB_INT(ibv_cmd_create_qp, struct ibv_pd *pd, struct ibv_qp *qp,
	 struct ibv_qp_init_attr *attr, void *cmd, size_t cmd_size,
	 void *resp, size_t resp_size)
STUB_INT(ibv_cmd_create_qp_ex, struct ibv_context *context,
	 struct verbs_qp *qp, struct ibv_qp_init_attr_ex *attr_ex, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_create_qp_ex2, struct ibv_context *context,
	 struct verbs_qp *qp, struct ibv_qp_init_attr_ex *qp_attr, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_open_qp, struct ibv_context *context, struct verbs_qp *qp,
	 int vqp_sz, struct ibv_qp_open_attr *attr, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_query_qp, struct ibv_qp *qp, struct ibv_qp_attr *qp_attr,
	 int attr_mask, struct ibv_qp_init_attr *qp_init_attr, void *cmd,
	 size_t cmd_size)
STUB_INT(ibv_cmd_modify_qp, struct ibv_qp *qp, struct ibv_qp_attr *attr,
	 int attr_mask, void *cmd, size_t cmd_size)
STUB_INT(ibv_cmd_modify_qp_ex, struct ibv_qp *qp, struct ibv_qp_attr *attr,
	 int attr_mask, void *cmd, size_t cmd_size, void *resp,
	 size_t resp_size)
STUB_INT(ibv_cmd_destroy_qp, struct ibv_qp *qp)
STUB_INT(ibv_cmd_post_send, struct ibv_qp *ibqp, struct ibv_send_wr *wr,
	 struct ibv_send_wr **bad_wr)
STUB_INT(ibv_cmd_post_recv, struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
	 struct ibv_recv_wr **bad_wr)
STUB_INT(ibv_cmd_attach_mcast, struct ibv_qp *qp, const union ibv_gid *gid,
	 uint16_t lid)
STUB_INT(ibv_cmd_detach_mcast, struct ibv_qp *qp, const union ibv_gid *gid,
	 uint16_t lid)

/* AH. */
STUB_INT(ibv_cmd_create_ah, struct ibv_pd *pd, struct ibv_ah *ah,
	 struct ibv_ah_attr *attr, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_destroy_ah, struct ibv_ah *ah)

/* Flow steering, flow actions, WQ, RWQ indirection, counters. */
STUB_INT(ibv_cmd_create_flow, struct ibv_qp *qp, struct ibv_flow *flow_id,
	 struct ibv_flow_attr *flow_attr, void *ucmd, size_t ucmd_size)
STUB_INT(ibv_cmd_destroy_flow, struct ibv_flow *flow_id)
STUB_INT(ibv_cmd_create_flow_action_esp, struct ibv_context *ctx,
	 struct ibv_flow_action_esp_attr *attr,
	 struct verbs_flow_action *flow_action,
	 struct ibv_command_buffer *driver)
STUB_INT(ibv_cmd_modify_flow_action_esp,
	 struct verbs_flow_action *flow_action,
	 struct ibv_flow_action_esp_attr *attr,
	 struct ibv_command_buffer *driver)
STUB_INT(ibv_cmd_destroy_flow_action, struct verbs_flow_action *action)
STUB_INT(ibv_cmd_create_wq, struct ibv_context *context,
	 struct ibv_wq_init_attr *wq_init_attr, struct ibv_wq *wq, void *cmd,
	 size_t cmd_size, void *resp, size_t resp_size)
STUB_INT(ibv_cmd_modify_wq, struct ibv_wq *wq, struct ibv_wq_attr *attr,
	 void *cmd, size_t cmd_size)
STUB_INT(ibv_cmd_destroy_wq, struct ibv_wq *wq)
STUB_INT(ibv_cmd_create_rwq_ind_table, struct ibv_context *context,
	 struct ibv_rwq_ind_table_init_attr *init_attr,
	 struct ibv_rwq_ind_table *rwq_ind_table, void *resp,
	 size_t resp_size)
STUB_INT(ibv_cmd_destroy_rwq_ind_table,
	 struct ibv_rwq_ind_table *rwq_ind_table)
STUB_INT(ibv_cmd_create_counters, struct ibv_context *context,
	 struct ibv_counters_init_attr *init_attr,
	 struct verbs_counters *vcounters, struct ibv_command_buffer *link)
STUB_INT(ibv_cmd_destroy_counters, struct verbs_counters *vcounters)
STUB_INT(ibv_cmd_read_counters, struct verbs_counters *vcounters,
	 uint64_t *counters_value, uint32_t ncounters, uint32_t flags,
	 struct ibv_command_buffer *link)

#pragma GCC diagnostic pop
