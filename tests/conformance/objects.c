/* SPDX-License-Identifier: MIT */
/*
 * Conformance: lifetime and validation of the basic objects: protection
 * domains, memory regions, completion queues and completion channels.
 * Single process; no traffic.
 */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_LEN (64 * 1024)

static void pd_alloc_dealloc(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *a = ibv_alloc_pd(ctx);
	struct ibv_pd *b = ibv_alloc_pd(ctx);
	REQUIRE(a && b, "ibv_alloc_pd: %s", strerror(errno));
	CHECK(a != b, "two PDs are the same object");
	CHECK(a->context == ctx, "pd->context is not the context");
	int ret = ibv_dealloc_pd(a);
	CHECK(ret == 0, "ibv_dealloc_pd: %d", ret);
	ret = ibv_dealloc_pd(b);
	CHECK(ret == 0, "ibv_dealloc_pd: %d", ret);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

static void mr_access_flags(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *buf = t_alloc(BUF_LEN);
	static const unsigned int flags[] = {
		0, /* local read only */
		IBV_ACCESS_LOCAL_WRITE,
		IBV_ACCESS_REMOTE_READ,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_REMOTE_ATOMIC,
	};
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
		/* Not page aligned, odd length: registration is byte granular. */
		void *addr = buf + 3;
		size_t len = BUF_LEN - 100;
		errno = 0;
		struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, (int)flags[i]);
		if (!CHECK(mr != NULL, "ibv_reg_mr(access 0x%x): %s", flags[i], strerror(errno)))
			continue;
		CHECK(mr->addr == addr, "access 0x%x: mr->addr %p, expected %p", flags[i], mr->addr, addr);
		CHECK(mr->length == len, "access 0x%x: mr->length %zu, expected %zu", flags[i],
		      mr->length, len);
		CHECK(mr->pd == pd, "access 0x%x: mr->pd is wrong", flags[i]);
		CHECK(mr->context == ctx, "access 0x%x: mr->context is wrong", flags[i]);
		int ret = ibv_dereg_mr(mr);
		CHECK(ret == 0, "ibv_dereg_mr(access 0x%x): %d", flags[i], ret);
	}
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

/* ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is
 * set, then IBV_ACCESS_LOCAL_WRITE must be set too." -> EINVAL. */
static void mr_invalid_access(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *buf = t_alloc(BUF_LEN);
	static const unsigned int bad[] = {
		IBV_ACCESS_REMOTE_WRITE,
		IBV_ACCESS_REMOTE_ATOMIC,
		IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errno = 0;
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF_LEN, (int)bad[i]);
		int err = errno;
		CHECK(mr == NULL, "ibv_reg_mr(access 0x%x, no LOCAL_WRITE) succeeded", bad[i]);
		CHECK(mr != NULL || err == EINVAL, "ibv_reg_mr(access 0x%x): errno %d (%s), expected EINVAL",
		      bad[i], err, strerror(err));
		if (mr)
			ibv_dereg_mr(mr);
	}
	/* The PD is unaffected by the failed attempts. */
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd after failed registrations");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

/* Optional access bits (IBV_ACCESS_OPTIONAL_RANGE) must be ignored when not
 * supported, never rejected: rdma-core's ibv_reg_mr_iova2 masks them out. */
static void mr_optional_access(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *buf = t_alloc(BUF_LEN);

	/* A constant with an optional bit: verbs.h routes it to ibv_reg_mr_iova2. */
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF_LEN,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mr != NULL, "ibv_reg_mr(LOCAL_WRITE | RELAXED_ORDERING): %s", strerror(errno));
	if (mr)
		CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	/* The same through a variable (not a compile-time constant). */
	volatile unsigned int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_RELAXED_ORDERING;
	errno = 0;
	mr = ibv_reg_mr(pd, buf, BUF_LEN, access);
	CHECK(mr != NULL, "ibv_reg_mr(variable access 0x%x): %s", access, strerror(errno));
	if (mr)
		CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	/* Directly through ibv_reg_mr_iova2, an unknown optional bit too. */
	errno = 0;
	mr = ibv_reg_mr_iova2(pd, buf, BUF_LEN, (uintptr_t)buf,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_OPTIONAL_FIRST << 5);
	CHECK(mr != NULL, "ibv_reg_mr_iova2(LOCAL_WRITE | optional bit 0x%x): %s",
	      IBV_ACCESS_OPTIONAL_FIRST << 5, strerror(errno));
	if (mr)
		CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

static void mr_iova2(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *buf = t_alloc(BUF_LEN);
	const uint64_t iova = 0x100000000ull; /* unrelated to the address */
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr_iova2(pd, buf, BUF_LEN, iova,
					     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						     IBV_ACCESS_REMOTE_READ);
	REQUIRE(mr != NULL, "ibv_reg_mr_iova2: %s", strerror(errno));
	/* As in rdma-core, mr->addr is the process address, not the iova. */
	CHECK(mr->addr == buf, "mr->addr %p, expected the buffer %p", mr->addr, (void *)buf);
	CHECK(mr->length == BUF_LEN, "mr->length %zu", mr->length);
	CHECK(mr->pd == pd, "mr->pd");
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	/* ibv_reg_mr_iova (the older entry point) as well. */
	mr = ibv_reg_mr_iova(pd, buf, BUF_LEN, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL, "ibv_reg_mr_iova(iova 0): %s", strerror(errno));
	if (mr)
		CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

static void mr_rereg(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *a = t_alloc(BUF_LEN);
	char *b = t_alloc(2 * BUF_LEN);
	struct ibv_mr *mr = ibv_reg_mr(pd, a, BUF_LEN, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));

	/* Change access. */
	int ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(ret == 0, "ibv_rereg_mr(CHANGE_ACCESS): %d (errno %d)", ret, errno);
	CHECK(mr->addr == a && mr->length == BUF_LEN,
	      "CHANGE_ACCESS alone changed the translation (addr %p len %zu)", mr->addr, mr->length);

	/* Change translation: the MR now describes b. */
	ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b + 8, 2 * BUF_LEN - 8, 0);
	CHECK(ret == 0, "ibv_rereg_mr(CHANGE_TRANSLATION): %d (errno %d)", ret, errno);
	if (ret == 0) {
		CHECK(mr->addr == b + 8, "after CHANGE_TRANSLATION mr->addr %p, expected %p", mr->addr,
		      (void *)(b + 8));
		CHECK(mr->length == 2 * BUF_LEN - 8, "after CHANGE_TRANSLATION mr->length %zu",
		      mr->length);
	}

	/* Both at once. */
	ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, NULL,
			   a, BUF_LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(ret == 0, "ibv_rereg_mr(TRANSLATION | ACCESS): %d (errno %d)", ret, errno);

	/* Change PD. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	REQUIRE(pd2, "ibv_alloc_pd");
	ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
	CHECK(ret == 0, "ibv_rereg_mr(CHANGE_PD): %d (errno %d)", ret, errno);
	if (ret == 0) {
		CHECK(mr->pd == pd2, "after CHANGE_PD mr->pd is not the new PD");
		/* The old PD has nothing left: it can go. */
		CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd(old PD) after the MR moved away");
		pd = NULL;
	}

	/* Invalid: REMOTE_WRITE without LOCAL_WRITE. The old MR stays valid. */
	ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE);
	CHECK(ret != 0, "ibv_rereg_mr(CHANGE_ACCESS to REMOTE_WRITE without LOCAL_WRITE) succeeded");
	/* Invalid: access given without IBV_REREG_MR_CHANGE_ACCESS (rdma-core:
	 * IBV_REREG_MR_ERR_INPUT, errno EINVAL). */
	errno = 0;
	ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, a, BUF_LEN,
			   IBV_ACCESS_LOCAL_WRITE);
	CHECK(ret == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "ibv_rereg_mr(access without CHANGE_ACCESS): %d errno %d, expected "
	      "IBV_REREG_MR_ERR_INPUT (%d) and EINVAL", ret, errno, IBV_REREG_MR_ERR_INPUT);
	/* Invalid: CHANGE_TRANSLATION with a zero length. */
	errno = 0;
	ret = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, a, 0, 0);
	CHECK(ret == IBV_REREG_MR_ERR_INPUT, "ibv_rereg_mr(CHANGE_TRANSLATION, length 0): %d, "
	      "expected IBV_REREG_MR_ERR_INPUT", ret);

	ret = ibv_dereg_mr(mr);
	CHECK(ret == 0, "ibv_dereg_mr after rereg: %d", ret);
	if (pd)
		CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_dealloc_pd(pd2) == 0, "ibv_dealloc_pd(pd2)");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(a);
	free(b);
}

static void mr_keys_unique(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *buf = t_alloc(BUF_LEN);
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *m1 = ibv_reg_mr(pd, buf, BUF_LEN, access);
	struct ibv_mr *m2 = ibv_reg_mr(pd, buf, BUF_LEN, access);
	REQUIRE(m1 && m2, "registering the same buffer twice must work: %s", strerror(errno));
	CHECK(m1->lkey != m2->lkey, "two registrations share lkey 0x%x", m1->lkey);
	CHECK(m1->rkey != m2->rkey, "two registrations share rkey 0x%x", m1->rkey);
	/* Dereg of one leaves the other alone. */
	CHECK(ibv_dereg_mr(m1) == 0, "ibv_dereg_mr(first)");
	struct ibv_mr *m3 = ibv_reg_mr(pd, buf, BUF_LEN, access);
	REQUIRE(m3, "ibv_reg_mr: %s", strerror(errno));
	CHECK(m3->lkey != m2->lkey && m3->rkey != m2->rkey,
	      "a new registration reuses the keys of a live one (lkey 0x%x rkey 0x%x)", m3->lkey,
	      m3->rkey);
	CHECK(ibv_dereg_mr(m2) == 0, "ibv_dereg_mr(second)");
	CHECK(ibv_dereg_mr(m3) == 0, "ibv_dereg_mr(third)");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

/* ibv_alloc_pd(3): ibv_dealloc_pd "will fail if any other resource is still
 * associated with the PD being freed" and returns the errno (EBUSY). */
static void pd_busy(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	char *buf = t_alloc(BUF_LEN);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF_LEN, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
	int ret = ibv_dealloc_pd(pd);
	CHECK(ret == EBUSY, "ibv_dealloc_pd with an MR registered: %d, expected EBUSY (%d)", ret,
	      EBUSY);
	if (ret == 0)
		t_abort(); /* the PD is gone: nothing below is meaningful */
	/* The MR still works as an object. */
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	/* Same with a QP on the PD. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	REQUIRE(cq, "ibv_create_cq");
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	REQUIRE(qp, "ibv_create_qp: %s", strerror(errno));
	ret = ibv_dealloc_pd(pd);
	CHECK(ret == EBUSY, "ibv_dealloc_pd with a QP on it: %d, expected EBUSY", ret);
	if (ret == 0)
		t_abort();
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	ret = ibv_dealloc_pd(pd);
	CHECK(ret == 0, "ibv_dealloc_pd once empty: %d", ret);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

static void cq_lifecycle(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_device_attr da;
	REQUIRE(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
	int cookie;
	struct ibv_cq *cq = ibv_create_cq(ctx, 10, &cookie, NULL, 0);
	REQUIRE(cq, "ibv_create_cq(10): %s", strerror(errno));
	CHECK(cq->cqe >= 10, "cq->cqe %d < 10 requested", cq->cqe);
	CHECK(cq->cq_context == &cookie, "cq->cq_context not kept");
	CHECK(cq->context == ctx, "cq->context is wrong");

	/* An empty CQ polls empty. */
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "a new CQ is not empty");

	int ret = ibv_resize_cq(cq, 300);
	CHECK(ret == 0, "ibv_resize_cq(300): %d", ret);
	if (ret == 0)
		CHECK(cq->cqe >= 300, "after resize cq->cqe %d < 300", cq->cqe);
	ret = ibv_resize_cq(cq, 20);
	CHECK(ret == 0, "ibv_resize_cq(20) of an empty CQ: %d", ret);
	if (ret == 0)
		CHECK(cq->cqe >= 20, "after resize cq->cqe %d < 20", cq->cqe);
	ret = ibv_resize_cq(cq, da.max_cqe + 1);
	CHECK(ret != 0, "ibv_resize_cq(max_cqe + 1 = %d) succeeded", da.max_cqe + 1);
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");

	/* Beyond the device limit. */
	errno = 0;
	cq = ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0);
	CHECK(cq == NULL, "ibv_create_cq(max_cqe + 1 = %d) succeeded", da.max_cqe + 1);
	if (cq)
		ibv_destroy_cq(cq);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* Destroying a CQ that a QP still uses fails with EBUSY (rdma-core/kernel). */
static void cq_busy(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	REQUIRE(scq && rcq, "ibv_create_cq");
	struct ibv_qp_init_attr ia = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
					      .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	REQUIRE(qp, "ibv_create_qp: %s", strerror(errno));
	CHECK(qp->send_cq == scq && qp->recv_cq == rcq, "qp->send_cq/recv_cq not as created");
	int ret = ibv_destroy_cq(scq);
	CHECK(ret == EBUSY, "ibv_destroy_cq(send CQ of a live QP): %d, expected EBUSY", ret);
	if (ret == 0)
		t_abort();
	ret = ibv_destroy_cq(rcq);
	CHECK(ret == EBUSY, "ibv_destroy_cq(recv CQ of a live QP): %d, expected EBUSY", ret);
	if (ret == 0)
		t_abort();
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(scq) == 0, "ibv_destroy_cq(send) after the QP is gone");
	CHECK(ibv_destroy_cq(rcq) == 0, "ibv_destroy_cq(recv) after the QP is gone");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

static void comp_channel(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	REQUIRE(ch, "ibv_create_comp_channel: %s", strerror(errno));
	CHECK(ch->fd >= 0, "channel fd %d", ch->fd);
	CHECK(ch->context == ctx, "channel->context is wrong");
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	int r = poll(&pfd, 1, 0);
	CHECK(r == 0, "poll(channel fd, 0) returned %d revents 0x%x: expected 0 (no event)", r,
	      pfd.revents);

	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	REQUIRE(cq, "ibv_create_cq with channel: %s", strerror(errno));
	CHECK(cq->channel == ch, "cq->channel is not the channel");
	/* Arming an empty CQ produces no event. */
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	r = poll(&pfd, 1, 50);
	CHECK(r == 0, "poll(channel fd) after arming an empty CQ returned %d", r);

	/* The channel is in use by the CQ: EBUSY (rdma-core). */
	int ret = ibv_destroy_comp_channel(ch);
	CHECK(ret == EBUSY, "ibv_destroy_comp_channel with a CQ attached: %d, expected EBUSY", ret);
	if (ret == 0)
		t_abort();
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	ret = ibv_destroy_comp_channel(ch);
	CHECK(ret == 0, "ibv_destroy_comp_channel: %d", ret);

	/* comp_vector must be < num_comp_vectors. */
	CHECK(ctx->num_comp_vectors >= 1, "num_comp_vectors %d", ctx->num_comp_vectors);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors);
	CHECK(cq == NULL, "ibv_create_cq(comp_vector = num_comp_vectors = %d) succeeded",
	      ctx->num_comp_vectors);
	if (cq)
		ibv_destroy_cq(cq);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* Is addr inside the "[heap]" mapping of /proc/self/maps? */
static bool on_brk_heap(const void *addr)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	bool heap = false;

	REQUIRE(f, "/proc/self/maps: %s", strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)addr >= lo &&
		    (uintptr_t)addr < hi) {
			heap = strstr(line, "[heap]") != NULL;
			break;
		}
	}
	fclose(f);
	return heap;
}

/* The objects the library hands out (and those behind them) must not share
 * a page with the application's malloc'd memory: ibv_reg_mr of a buffer on
 * that page would copy it into the identity memfd and map the copy over it,
 * losing what the library's threads write meanwhile (util/alloc.h). */
static void objects_off_malloc_pages(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	static char buf[64];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = pd && cq ? ibv_create_qp(pd, &qa) : NULL;
	const void *objs[] = { ctx, ch, pd, cq, mr, qp };
	const char *names[] = { "context", "channel", "pd", "cq", "mr", "qp" };
	void *blocks[256];

	REQUIRE(ch && pd && cq && mr && qp, "objects: %s", strerror(errno));
	for (int i = 0; i < 256; i++)
		blocks[i] = malloc(16 + (size_t)(i % 5) * 48);
	for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
		uintptr_t page = (uintptr_t)objs[i] & ~(uintptr_t)4095;
		bool shared = false;

		for (int k = 0; k < 256; k++)
			shared |= ((uintptr_t)blocks[k] & ~(uintptr_t)4095) == page;
		CHECK(!on_brk_heap(objs[i]) && !shared,
		      "the %s is on a page malloc also uses (%s)", names[i],
		      shared ? "next to a malloc'd block" : "the [heap] mapping");
	}
	for (int i = 0; i < 256; i++)
		free(blocks[i]);
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0 &&
	      ibv_destroy_comp_channel(ch) == 0 && ibv_dealloc_pd(pd) == 0, "destroy");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* A thread domain and a parent domain: the parent stands for its PD
 * (MRs, QPs, an extended CQ made with it), keeps PD and TD busy, and
 * refuses custom allocators (urdma's buffers are its own). */
static void td_parent_domain(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	struct ibv_td_init_attr ta = { 0 };
	struct ibv_td *td = ibv_alloc_td(ctx, &ta);
	REQUIRE(td, "ibv_alloc_td: %s", strerror(errno));
	ta.comp_mask = 1;
	errno = 0;
	CHECK(!ibv_alloc_td(ctx, &ta) && errno == EINVAL, "a TD with an unknown comp_mask");
	int cookie;
	struct ibv_parent_domain_init_attr pa = {
		.pd = pd, .td = td, .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.pd_context = &cookie,
	};
	struct ibv_pd *par = ibv_alloc_parent_domain(ctx, &pa);
	REQUIRE(par, "ibv_alloc_parent_domain: %s", strerror(errno));
	CHECK(par->context == ctx, "the parent domain's context");
	struct ibv_parent_domain_init_attr bad = pa;
	bad.comp_mask |= IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &bad) && errno == EOPNOTSUPP,
	      "custom allocators: errno %d, expected EOPNOTSUPP", errno);
	bad = pa;
	bad.pd = par;
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &bad) && errno == EINVAL,
	      "a parent domain of a parent domain: errno %d", errno);
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "the PD of a parent domain freed");
	CHECK(ibv_dealloc_td(td) == EBUSY, "the TD of a parent domain freed");

	char *buf = t_alloc(BUF_LEN);
	struct ibv_mr *mr = ibv_reg_mr(par, buf, BUF_LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && mr->pd == par, "ibv_reg_mr on a parent domain: %s", strerror(errno));
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					  .parent_domain = par };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cqx, "ibv_create_cq_ex with a parent domain: %s", strerror(errno));
	ca.parent_domain = pd;
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EINVAL,
	      "IBV_CQ_INIT_ATTR_MASK_PD with a plain PD: errno %d", errno);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	REQUIRE(cq, "ibv_create_cq");
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(par, &qa);
	CHECK(qp && qp->pd == par, "ibv_create_qp on a parent domain: %s", strerror(errno));
	/* A receive with an MR of the PD itself: one PD. */
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf, BUF_LEN, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr2, "ibv_reg_mr");
	if (qp) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
		CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS) == 0, "to INIT");
		CHECK(t_post_recv(qp, 1, buf, 64, mr2->lkey) == 0, "post_recv");
		CHECK(ibv_dealloc_pd(par) == EBUSY, "a parent domain with a QP freed");
		CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	}
	CHECK(ibv_dereg_mr(mr2) == 0 && (!mr || ibv_dereg_mr(mr) == 0), "ibv_dereg_mr");
	if (cqx)
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(par) == 0, "ibv_dealloc_pd(parent domain)");
	CHECK(ibv_dealloc_td(td) == 0 && ibv_dealloc_pd(pd) == 0, "TD and PD freed after");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	free(buf);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_case("pd_alloc_dealloc", pd_alloc_dealloc, NULL);
	t_case("mr_access_flags", mr_access_flags, NULL);
	t_case("mr_invalid_access", mr_invalid_access, NULL);
	t_case("mr_optional_access", mr_optional_access, NULL);
	t_case("mr_iova2", mr_iova2, NULL);
	t_case("mr_rereg", mr_rereg, NULL);
	t_case("mr_keys_unique", mr_keys_unique, NULL);
	t_case("pd_busy", pd_busy, NULL);
	t_case("cq_lifecycle", cq_lifecycle, NULL);
	t_case("cq_busy", cq_busy, NULL);
	t_case("comp_channel", comp_channel, NULL);
	t_case("objects_off_malloc_pages", objects_off_malloc_pages, NULL);
	t_case("td_and_parent_domain", td_parent_domain, NULL);
	return t_finish();
}
