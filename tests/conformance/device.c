/* SPDX-License-Identifier: MIT */
/*
 * Conformance: the device and its port as seen through the query verbs.
 *
 * urdma presents exactly one device, "urdma0", with one port (1) whose link
 * layer is Ethernet (RoCE-like), active MTU 4096, and a GID table holding an
 * IPv4-mapped RoCE v2 entry.
 */
#include "harness.h"

#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <string.h>

static void one_device(void *arg)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	REQUIRE(list != NULL, "ibv_get_device_list: %s", strerror(errno));
	CHECK(n == 1, "expected exactly one device, got %d", n);
	if (n >= 1) {
		CHECK(list[n] == NULL, "the device list is not NULL-terminated");
		const char *name = ibv_get_device_name(list[0]);
		CHECK(name && strcmp(name, "urdma0") == 0, "device name is \"%s\", expected \"urdma0\"",
		      name ? name : "(null)");
		struct ibv_context *ctx = ibv_open_device(list[0]);
		CHECK(ctx != NULL, "ibv_open_device: %s", strerror(errno));
		if (ctx) {
			CHECK(ctx->device == list[0], "context->device does not point at the device opened");
			/* A second context on the same device must be possible. */
			struct ibv_context *ctx2 = ibv_open_device(list[0]);
			CHECK(ctx2 != NULL, "second ibv_open_device: %s", strerror(errno));
			if (ctx2)
				CHECK(ibv_close_device(ctx2) == 0, "ibv_close_device (second)");
			CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
		}
	}
	ibv_free_device_list(list);
}

static void device_attr(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_device_attr a;
	memset(&a, 0, sizeof(a));
	int ret = ibv_query_device(ctx, &a);
	REQUIRE(ret == 0, "ibv_query_device: %d", ret);
	t_note("max_qp %d max_qp_wr %d max_sge %d max_cq %d max_cqe %d max_mr %d "
	       "max_mr_size %llu max_pd %d max_qp_rd_atom %d max_qp_init_rd_atom %d "
	       "atomic_cap %d vendor_id 0x%x phys_port_cnt %u fw_ver \"%s\"",
	       a.max_qp, a.max_qp_wr, a.max_sge, a.max_cq, a.max_cqe, a.max_mr,
	       (unsigned long long)a.max_mr_size, a.max_pd, a.max_qp_rd_atom,
	       a.max_qp_init_rd_atom, a.atomic_cap, a.vendor_id, a.phys_port_cnt, a.fw_ver);
	CHECK(a.phys_port_cnt == 1, "phys_port_cnt %u, expected 1", a.phys_port_cnt);
	CHECK(a.max_qp >= 2, "max_qp %d", a.max_qp);
	CHECK(a.max_qp_wr >= 64, "max_qp_wr %d (the tests need at least 64)", a.max_qp_wr);
	CHECK(a.max_sge >= 2, "max_sge %d", a.max_sge);
	CHECK(a.max_cq >= 2, "max_cq %d", a.max_cq);
	CHECK(a.max_cqe >= 256, "max_cqe %d", a.max_cqe);
	CHECK(a.max_mr >= 2, "max_mr %d", a.max_mr);
	CHECK(a.max_pd >= 1, "max_pd %d", a.max_pd);
	CHECK(a.max_mr_size >= (1ull << 20), "max_mr_size %llu is below 1 MiB",
	      (unsigned long long)a.max_mr_size);
	CHECK(a.max_qp_rd_atom >= 1, "max_qp_rd_atom %d", a.max_qp_rd_atom);
	CHECK(a.max_qp_init_rd_atom >= 1, "max_qp_init_rd_atom %d", a.max_qp_init_rd_atom);
	CHECK(a.atomic_cap != IBV_ATOMIC_NONE, "atomic_cap is IBV_ATOMIC_NONE");
	CHECK(a.vendor_id != 0, "vendor_id is 0");
	CHECK(a.max_pkeys >= 1, "max_pkeys %u", a.max_pkeys);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

static void port_attr(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_port_attr p;
	memset(&p, 0, sizeof(p));
	int ret = ibv_query_port(ctx, 1, &p);
	REQUIRE(ret == 0, "ibv_query_port(1): %d", ret);
	t_note("state %d max_mtu %d active_mtu %d gid_tbl_len %d lid %u link_layer %u "
	       "pkey_tbl_len %u",
	       p.state, p.max_mtu, p.active_mtu, p.gid_tbl_len, p.lid, p.link_layer,
	       p.pkey_tbl_len);
	CHECK(p.state == IBV_PORT_ACTIVE, "port state %d, expected IBV_PORT_ACTIVE", p.state);
	CHECK(p.link_layer == IBV_LINK_LAYER_ETHERNET, "link_layer %u, expected Ethernet (%u)",
	      p.link_layer, IBV_LINK_LAYER_ETHERNET);
	CHECK(p.active_mtu == IBV_MTU_4096, "active_mtu %d, expected IBV_MTU_4096 (%d)",
	      p.active_mtu, IBV_MTU_4096);
	CHECK(p.max_mtu >= p.active_mtu, "max_mtu %d < active_mtu %d", p.max_mtu, p.active_mtu);
	/* The tests connect with sgid_index 1, so the table has >= 2 entries. */
	CHECK(p.gid_tbl_len >= 2, "gid_tbl_len %d", p.gid_tbl_len);
	CHECK(p.pkey_tbl_len >= 1, "pkey_tbl_len %u", p.pkey_tbl_len);

	/* There is exactly one port: port 0 and port 2 do not exist. */
	struct ibv_port_attr bad;
	CHECK(ibv_query_port(ctx, 2, &bad) != 0, "ibv_query_port(2) succeeded");
	CHECK(ibv_query_port(ctx, 0, &bad) != 0, "ibv_query_port(0) succeeded");

	/* The default P_Key: RoCE devices report the full-membership default
	 * 0xffff at index 0 (real hardware via rdma-core does). */
	__be16 pkey = 0;
	ret = ibv_query_pkey(ctx, 1, 0, &pkey);
	CHECK(ret == 0, "ibv_query_pkey(1, 0): %d", ret);
	if (ret == 0)
		CHECK(be16toh(pkey) == 0xffff, "pkey[0] = 0x%04x, expected 0xffff", be16toh(pkey));
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

static bool is_ipv4_mapped(const union ibv_gid *g)
{
	static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

static void gid_table(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_port_attr p;
	REQUIRE(ibv_query_port(ctx, 1, &p) == 0, "ibv_query_port");
	REQUIRE(p.gid_tbl_len >= 1, "gid_tbl_len %d", p.gid_tbl_len);

	int found_v2_ipv4 = -1;
	for (int i = 0; i < p.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		memset(&e, 0, sizeof(e));
		int ret = ibv_query_gid_ex(ctx, 1, (uint32_t)i, &e, 0);
		if (ret == ENODATA)
			continue; /* an empty slot: rdma-core reports ENODATA */
		if (!CHECK(ret == 0, "ibv_query_gid_ex(1, %d): %d", i, ret))
			continue;
		CHECK(e.gid_index == (uint32_t)i, "entry %d reports gid_index %u", i, e.gid_index);
		CHECK(e.port_num == 1, "entry %d reports port_num %u", i, e.port_num);
		/* ibv_query_gid must agree with ibv_query_gid_ex. */
		union ibv_gid g;
		CHECK(ibv_query_gid(ctx, 1, i, &g) == 0, "ibv_query_gid(1, %d)", i);
		CHECK(memcmp(&g, &e.gid, sizeof(g)) == 0,
		      "ibv_query_gid and ibv_query_gid_ex disagree at index %d", i);
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && is_ipv4_mapped(&e.gid) && found_v2_ipv4 < 0)
			found_v2_ipv4 = i;
	}
	CHECK(found_v2_ipv4 >= 0, "no IPv4-mapped GID entry of type RoCE v2 in the table (%d entries)",
	      p.gid_tbl_len);
	if (found_v2_ipv4 >= 0)
		t_note("IPv4-mapped RoCE v2 GID at index %d", found_v2_ipv4);

	/* Past the end of the table: an error, not garbage. */
	struct ibv_gid_entry e;
	CHECK(ibv_query_gid_ex(ctx, 1, (uint32_t)p.gid_tbl_len, &e, 0) != 0,
	      "ibv_query_gid_ex(index gid_tbl_len = %d) succeeded", p.gid_tbl_len);
	union ibv_gid g;
	CHECK(ibv_query_gid(ctx, 1, p.gid_tbl_len, &g) != 0,
	      "ibv_query_gid(index gid_tbl_len = %d) succeeded", p.gid_tbl_len);
	CHECK(ibv_query_gid_ex(ctx, 2, 0, &e, 0) != 0, "ibv_query_gid_ex(port 2) succeeded");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

static void async_fd(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	CHECK(ctx->async_fd >= 0, "async_fd is %d", ctx->async_fd);
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	int r = poll(&pfd, 1, 0);
	CHECK(r == 0, "poll(async_fd, timeout 0) returned %d (revents 0x%x, errno %d): "
	      "expected 0, nothing pending", r, pfd.revents, r < 0 ? errno : 0);
	CHECK(!(pfd.revents & (POLLERR | POLLNVAL)), "async_fd revents 0x%x", pfd.revents);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* The calls of issue 20's last items, each as documented: fork needs no
 * preparation, the one P_Key's index, imports refused, no in-order
 * placement promised. */
static void misc_calls(void *arg)
{
	(void)arg;
	struct t_opts o = t_opts_default();
	struct t_res r;

	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "fork status %d",
	      (int)ibv_is_fork_initialized());
	t_res_open(&r, &o);
	CHECK(ibv_get_pkey_index(r.ctx, 1, htobe16(0xffff)) == 0, "index of the default P_Key");
	CHECK(ibv_get_pkey_index(r.ctx, 1, htobe16(0x1234)) < 0, "an unknown P_Key");
	CHECK(ibv_get_pkey_index(r.ctx, 2, htobe16(0xffff)) < 0, "port 2");
	errno = 0;
	CHECK(!ibv_import_device(r.ctx->cmd_fd) && errno == EOPNOTSUPP, "import device: %d",
	      errno);
	errno = 0;
	CHECK(!ibv_import_pd(r.ctx, 1) && errno == EOPNOTSUPP, "import PD: %d", errno);
	errno = 0;
	CHECK(!ibv_import_mr(r.pd, 1) && errno == EOPNOTSUPP, "import MR: %d", errno);
	CHECK(ibv_query_qp_data_in_order(r.qp, IBV_WR_RDMA_WRITE, 0) == 0,
	      "no in-order placement promised");
	t_res_close(&r);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("misc_calls", misc_calls, NULL);
	t_case("one_device", one_device, NULL);
	t_case("device_attr", device_attr, NULL);
	t_case("port_attr", port_attr, NULL);
	t_case("gid_table", gid_table, NULL);
	t_case("async_fd", async_fd, NULL);
	return t_finish();
}
