/* SPDX-License-Identifier: MIT */
/*
 * Conformance: XRC.  Domains (shared through a file, O_CREAT / O_EXCL),
 * XRC SRQs and their numbers, XRC send and target QPs (the kernel's rules
 * for their attributes), ibv_open_qp; the data path: Sends naming an SRQ
 * of the target's domain complete in that SRQ's CQ (of this process or of
 * another one), one-sided operations through the target, an SRQ the
 * domain has not refused with the right completion, armed CQ events.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MSG 64

static bool over_tcp(void)
{
	const char *t = getenv("URDMA_TRANSPORT");

	return t && !strcmp(t, "tcp");
}

/* A file of its own for a domain. */
static int domain_file(char *path, size_t n)
{
	snprintf(path, n, "/tmp/urdma-conf-xrc-%d-XXXXXX", (int)getpid());
	int fd = mkstemp(path);

	REQUIRE(fd >= 0, "mkstemp: %s", strerror(errno));
	return fd;
}

/* The name in the host directory of the XRC domain this process holds
 * (xrc.c: a shared flock on xrcd-<id>, seen in /proc/locks), or "". */
static void held_domain_name(char *name, size_t n)
{
	const char *e = getenv("URDMA_SHM_DIR");
	char dir[200], line[256], path[512];
	unsigned long long ino[16];
	int nino = 0;
	FILE *f = fopen("/proc/locks", "r");
	struct dirent *d;
	DIR *dd;

	name[0] = 0;
	if (e && *e)
		snprintf(dir, sizeof(dir), "%s", e);
	else
		snprintf(dir, sizeof(dir), "/dev/shm/urdma-%u", (unsigned)geteuid());
	/* every flock of ours: the domain's is one of them */
	while (f && nino < 16 && fgets(line, sizeof(line), f)) {
		int pid;
		unsigned long long i;

		if (sscanf(line, "%*d: FLOCK %*s %*s %d %*x:%*x:%llu", &pid, &i) == 2 &&
		    pid == (int)getpid())
			ino[nino++] = i;
	}
	if (f)
		fclose(f);
	dd = nino ? opendir(dir) : NULL;
	while (dd && (d = readdir(dd))) {
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
		if (strncmp(d->d_name, "xrcd-", 5) || stat(path, &st))
			continue;
		for (int k = 0; k < nino; k++)
			if (st.st_ino == ino[k])
				snprintf(name, n, "%s", path);
	}
	if (dd)
		closedir(dd);
}

static struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags)
{
	struct ibv_xrcd_init_attr a = {
		.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd,
		.oflags = oflags,
	};

	errno = 0;
	return ibv_open_xrcd(ctx, &a);
}

static struct ibv_srq *xsrq(struct t_res *r, struct ibv_xrcd *x, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a = {
		.attr = { .max_wr = 32, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_XRC,
		.xrcd = x,
		.cq = cq,
		.pd = r->pd,
	};
	struct ibv_srq *s = ibv_create_srq_ex(r->ctx, &a);

	REQUIRE(s, "ibv_create_srq_ex (XRC): %s", strerror(errno));
	return s;
}

static struct ibv_qp *tgt_qp(struct t_res *r, struct ibv_xrcd *x)
{
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD,
		.xrcd = x,
	};
	struct ibv_qp *q = ibv_create_qp_ex(r->ctx, &a);

	REQUIRE(q, "XRC target QP: %s", strerror(errno));
	return q;
}

static struct ibv_qp *ini_qp(struct t_res *r)
{
	/* Only a PD: ibv_create_qp_ex goes through ibv_create_qp. */
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_XRC_SEND,
		.send_cq = r->send_cq,
		.cap = { .max_send_wr = 32, .max_send_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = r->pd,
	};
	struct ibv_qp *q = ibv_create_qp_ex(r->ctx, &a);

	REQUIRE(q, "XRC send QP: %s", strerror(errno));
	return q;
}

/* Connect ini (ours) and tgt (ours, or described by remote) with the
 * harness's attributes, which include what each kind has no use for (as
 * perftest does): the kernel drops those. */
static void connect_qp(struct t_res *r, struct ibv_qp *qp, const struct t_conn *remote,
		       bool rts)
{
	struct ibv_qp *keep = r->qp;

	r->qp = qp;
	REQUIRE(t_modify_init(r) == 0, "qp %#x to INIT", qp->qp_num);
	REQUIRE(t_modify_rtr(r, remote) == 0, "qp %#x to RTR", qp->qp_num);
	if (rts)
		REQUIRE(t_modify_rts(r) == 0, "qp %#x to RTS", qp->qp_num);
	r->qp = keep;
}

/* The INI and TGT of one process connected to each other. */
static void connect_local(struct t_res *r, struct ibv_qp *ini, struct ibv_qp *tgt)
{
	struct t_conn c;

	r->qp = ini;
	t_conn_local(r, NULL, &c);
	c.qpn = tgt->qp_num;
	connect_qp(r, ini, &c, true);
	c.qpn = ini->qp_num;
	connect_qp(r, tgt, &c, true);
	r->qp = NULL;
}

/* The send QP went to error: a new pair. */
static void fresh_pair(struct t_res *r, struct ibv_xrcd *x, struct ibv_qp **ini,
		       struct ibv_qp **tgt)
{
	CHECK(ibv_destroy_qp(*ini) == 0 && ibv_destroy_qp(*tgt) == 0, "destroy QPs");
	*tgt = tgt_qp(r, x);
	*ini = ini_qp(r);
	connect_local(r, *ini, *tgt);
}

static int post_xrc(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, void *buf,
		    uint32_t len, uint32_t lkey, uint32_t srqn, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, lkey };
	struct ibv_send_wr wr = {
		.wr_id = id,
		.sg_list = &sge,
		.num_sge = len ? 1 : 0,
		.opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(0x1234u + (uint32_t)id),
	}, *bad = NULL;

	wr.qp_type.xrc.remote_srqn = srqn;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

static void post_srq(struct ibv_srq *s, uint64_t id, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	REQUIRE(ibv_post_srq_recv(s, &wr, &bad) == 0, "ibv_post_srq_recv");
}

/* ---- Domains, SRQ numbers, QP kinds and what is refused ---- */

static void xrc_rules(void *arg)
{
	(void)arg;
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	struct t_res r;
	t_res_open(&r, &o);
	char path[64];
	int fd = domain_file(path, sizeof(path));

	CHECK(r.dev_attr.device_cap_flags & IBV_DEVICE_XRC, "IBV_DEVICE_XRC not reported");
	CHECK(!open_xrcd(r.ctx, -1, 0) && errno == EINVAL, "no file and no O_CREAT: %d", errno);
	CHECK(!open_xrcd(r.ctx, fd, O_TRUNC) && errno == EINVAL, "O_TRUNC: %d", errno);
	CHECK(!open_xrcd(r.ctx, fd, 0) && errno == ENOENT, "nobody has it, no O_CREAT: %d",
	      errno);
	struct ibv_xrcd *x = open_xrcd(r.ctx, fd, O_CREAT);
	REQUIRE(x, "O_CREAT: %s", strerror(errno));
	char held[512];
	held_domain_name(held, sizeof(held));
	CHECK(held[0], "no xrcd-<id> held in the host directory");
	CHECK(!open_xrcd(r.ctx, fd, O_CREAT | O_EXCL) && errno == EEXIST,
	      "O_EXCL on an open domain: %d", errno);
	struct ibv_xrcd *x2 = open_xrcd(r.ctx, fd, 0);
	CHECK(x2, "the open domain without O_CREAT: %s", strerror(errno));
	struct ibv_xrcd *priv = open_xrcd(r.ctx, -1, O_CREAT);
	CHECK(priv, "a domain of no file: %s", strerror(errno));

	/* XRC SRQs: a domain and a CQ; a number each. */
	struct ibv_srq_init_attr_ex sa = {
		.attr = { .max_wr = 8, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_XRC,
		.xrcd = x,
		.pd = r.pd,
	};
	errno = 0;
	CHECK(!ibv_create_srq_ex(r.ctx, &sa) && errno == EINVAL, "XRC SRQ without a CQ: %d",
	      errno);
	struct ibv_srq *s1 = xsrq(&r, x, r.recv_cq), *s2 = xsrq(&r, x2 ? x2 : x, r.recv_cq);
	uint32_t n1 = 0, n2 = 0;
	CHECK(ibv_get_srq_num(s1, &n1) == 0 && ibv_get_srq_num(s2, &n2) == 0 && n1 && n2 &&
	      n1 != n2 && n1 <= 0xffffff && n2 <= 0xffffff, "SRQ numbers %#x %#x", n1, n2);
	struct ibv_srq_init_attr bi = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *basic = ibv_create_srq(r.pd, &bi);
	REQUIRE(basic, "basic SRQ");
	CHECK(ibv_get_srq_num(basic, &n2) == EINVAL, "a basic SRQ has no XRC number");
	CHECK(ibv_close_xrcd(x) == EBUSY, "closing a domain with an SRQ");

	/* QPs: a target needs a domain (and ibv_create_qp_ex); neither
	 * kind has a receive queue; a target has no send queue. */
	struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_XRC_RECV,
					  .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = r.pd };
	errno = 0;
	CHECK(!ibv_create_qp_ex(r.ctx, &qa) && errno == EINVAL, "a target without a domain: %d",
	      errno);
	struct ibv_qp_init_attr qi = { .qp_type = IBV_QPT_RC, .send_cq = r.send_cq,
				       .recv_cq = r.recv_cq, .srq = s1,
				       .cap = { .max_send_wr = 1, .max_send_sge = 1 } };
	errno = 0;
	CHECK(!ibv_create_qp(r.pd, &qi) && errno == EINVAL, "an RC QP on an XRC SRQ: %d", errno);
	struct ibv_qp *tgt = tgt_qp(&r, x), *ini = ini_qp(&r);
	CHECK(tgt->qp_type == IBV_QPT_XRC_RECV && !tgt->pd && !tgt->send_cq && !tgt->recv_cq,
	      "target fields");
	CHECK(ini->qp_type == IBV_QPT_XRC_SEND && ini->pd == r.pd && !ini->recv_cq,
	      "send QP fields");
	char *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(t_post_recv(ini, 1, buf, 8, mr->lkey) == EINVAL, "receive on an XRC send QP");
	CHECK(t_post_recv(tgt, 1, buf, 8, mr->lkey) == EINVAL, "receive on an XRC target");
	connect_local(&r, ini, tgt);
	CHECK(t_qp_state(tgt) == IBV_QPS_RTS && t_qp_state(ini) == IBV_QPS_RTS,
	      "states %d %d", t_qp_state(tgt), t_qp_state(ini));
	CHECK(post_xrc(tgt, 1, IBV_WR_SEND, buf, 8, mr->lkey, n1, 0, 0) == EINVAL,
	      "a send on an XRC target");
	CHECK(post_xrc(ini, 1, IBV_WR_SEND, buf, 8, mr->lkey, 0, 0, 0) == EINVAL,
	      "no SRQ number");
	CHECK(post_xrc(ini, 1, IBV_WR_SEND_WITH_INV, buf, 8, mr->lkey, n1, 0, 0) == EINVAL,
	      "Send with Invalidate on XRC");
	/* A local WR reaches no target: it names no SRQ. */
	struct ibv_send_wr li = { .wr_id = 7, .opcode = IBV_WR_LOCAL_INV,
				  .send_flags = IBV_SEND_SIGNALED,
				  .invalidate_rkey = 0x1234 }, *lbad;
	struct ibv_wc lwc;
	CHECK(ibv_post_send(ini, &li, &lbad) == 0, "LOCAL_INV on an XRC send QP");
	CHECK(t_poll_one(r.send_cq, &lwc, T_WAIT_MS, "LOCAL_INV") && lwc.wr_id == 7,
	      "its completion");

	/* ibv_open_qp: another handle to the target, which keeps it. */
	struct ibv_qp_open_attr oa = {
		.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
			     IBV_QP_OPEN_ATTR_TYPE | IBV_QP_OPEN_ATTR_CONTEXT,
		.qp_num = tgt->qp_num, .xrcd = x, .qp_context = &r,
		.qp_type = IBV_QPT_XRC_RECV,
	};
	struct ibv_qp *h = ibv_open_qp(r.ctx, &oa);
	REQUIRE(h, "ibv_open_qp: %s", strerror(errno));
	CHECK(h != tgt && h->qp_num == tgt->qp_num && h->qp_context == &r &&
	      h->qp_type == IBV_QPT_XRC_RECV, "the handle's fields");
	CHECK(t_qp_state(h) == IBV_QPS_RTS, "state through the handle: %d", t_qp_state(h));
	CHECK(t_post_recv(h, 1, buf, 8, mr->lkey) == EINVAL, "a receive on the handle");
	CHECK(post_xrc(h, 1, IBV_WR_SEND, buf, 8, mr->lkey, n1, 0, 0) == EINVAL,
	      "a send on the handle");
	/* Another context's handle: its engine is the first context's. */
	struct ibv_context *ctx2 = t_open_first_device();
	struct ibv_xrcd *x3 = open_xrcd(ctx2, fd, 0);
	REQUIRE(x3, "the domain in a second context: %s", strerror(errno));
	struct ibv_qp_open_attr oa2 = oa;
	oa2.xrcd = x3;
	errno = 0;
	struct ibv_qp *h2 = ibv_open_qp(ctx2, &oa2);
	CHECK(!h2 && errno == EOPNOTSUPP, "open from another context: %d", errno);
	CHECK(ibv_close_xrcd(x3) == 0 && ibv_close_device(ctx2) == 0, "second context");
	oa.qp_num = ini->qp_num;
	errno = 0;
	CHECK(!ibv_open_qp(r.ctx, &oa) && errno == EINVAL, "opening a send QP: %d", errno);
	if (priv) {
		oa.qp_num = tgt->qp_num;
		oa.xrcd = priv;
		errno = 0;
		CHECK(!ibv_open_qp(r.ctx, &oa) && errno == EINVAL, "another domain's: %d",
		      errno);
	}
	uint32_t tgt_num = tgt->qp_num;
	CHECK(ibv_destroy_qp(tgt) == 0, "destroy the target's first handle");
	CHECK(t_qp_state(h) == IBV_QPS_RTS, "the target lives on: %d", t_qp_state(h));
	CHECK(t_modify_state(h, IBV_QPS_ERR) == 0 && t_qp_state(h) == IBV_QPS_ERR,
	      "modify through the handle");
	CHECK(ibv_close_xrcd(x) == EBUSY, "closing a domain with a target QP");
	CHECK(ibv_destroy_qp(h) == 0, "destroy the last handle");
	oa.qp_num = tgt_num;
	oa.xrcd = x;
	errno = 0;
	CHECK(!ibv_open_qp(r.ctx, &oa) && errno == EINVAL, "gone after its last handle: %d",
	      errno);

	CHECK(ibv_destroy_qp(ini) == 0, "destroy send QP");
	CHECK(ibv_destroy_srq(s1) == 0 && ibv_destroy_srq(s2) == 0 &&
	      ibv_destroy_srq(basic) == 0, "destroy SRQs");
	CHECK(ibv_close_xrcd(x) == 0, "close");
	if (x2)
		CHECK(ibv_close_xrcd(x2) == 0, "close the second handle");
	/* Nobody holds it now: it no longer exists, and leaves nothing. */
	CHECK(!open_xrcd(r.ctx, fd, 0) && errno == ENOENT, "after the last close: %d", errno);
	CHECK(!held[0] || access(held, F_OK), "%s left after the last close", held);
	if (priv)
		CHECK(ibv_close_xrcd(priv) == 0, "close the private domain");
	t_res_close(&r);
	free(buf);
	close(fd);
	unlink(path);
}

/* ---- The data path in one process: two SRQs, one target ---- */

static void xrc_one_process(void *arg)
{
	(void)arg;
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	o.use_channel = true;
	struct t_res r;
	t_res_open(&r, &o);
	struct ibv_xrcd *x = open_xrcd(r.ctx, -1, O_CREAT), *other = open_xrcd(r.ctx, -1, O_CREAT);
	REQUIRE(x && other, "domains");
	struct ibv_cq *cqa = ibv_create_cq(r.ctx, 64, NULL, r.channel, 0);
	struct ibv_cq *cqb = ibv_create_cq(r.ctx, 64, NULL, NULL, 0);
	REQUIRE(cqa && cqb, "CQs");
	struct ibv_srq *sa = xsrq(&r, x, cqa), *sb = xsrq(&r, x, cqb), *so = xsrq(&r, other, cqb);
	uint32_t na, nb, no;
	REQUIRE(!ibv_get_srq_num(sa, &na) && !ibv_get_srq_num(sb, &nb) &&
		!ibv_get_srq_num(so, &no), "numbers");
	struct ibv_qp *tgt = tgt_qp(&r, x), *ini = ini_qp(&r);
	connect_local(&r, ini, tgt);

	uint8_t *src = t_alloc(4096), *dst = t_alloc(8192);
	struct ibv_mr *smr = t_reg(&r, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = t_reg(&r, dst, 8192,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	for (int i = 0; i < 4; i++) {
		post_srq(sa, 100 + i, dst + i * MSG, MSG, dmr->lkey);
		post_srq(sb, 200 + i, dst + 1024 + i * MSG, MSG, dmr->lkey);
	}
	/* Sends alternate between the SRQs; each lands in its SRQ's CQ. */
	static const enum ibv_wr_opcode ops[] = { IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
						  IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND };
	for (int i = 0; i < 4; i++) {
		for (int k = 0; k < 2; k++) {
			uint32_t n = k ? nb : na;
			uint64_t raddr = (uintptr_t)dst + 4096 + (uint64_t)(2 * i + k) * MSG;

			t_pattern_fill(src + (2 * i + k) * MSG, MSG, 2 * i + k);
			REQUIRE(post_xrc(ini, 2 * i + k, ops[i], src + (2 * i + k) * MSG, MSG,
					 smr->lkey, n, raddr, dmr->rkey) == 0, "post %d", i);
		}
	}
	struct ibv_wc wc;
	for (int i = 0; i < 8; i++)
		CHECK(t_poll_one(r.send_cq, &wc, T_WAIT_MS, "send") &&
		      wc.status == IBV_WC_SUCCESS, "send %d: %s", i, ibv_wc_status_str(wc.status));
	for (int k = 0; k < 2; k++) {
		for (int i = 0; i < 4; i++) {
			int m = 2 * i + k;
			bool write = ops[i] == IBV_WR_RDMA_WRITE_WITH_IMM;

			if (!t_poll_one(k ? cqb : cqa, &wc, T_WAIT_MS, "receive"))
				continue;
			CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)(k ? 200 : 100) + i &&
			      wc.qp_num == tgt->qp_num && wc.byte_len == MSG,
			      "receive %d of SRQ %c: %s wr_id %llu qp %#x len %u", i, "ab"[k],
			      ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id,
			      wc.qp_num, wc.byte_len);
			CHECK(wc.opcode == (enum ibv_wc_opcode)(write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV),
			      "opcode %d", wc.opcode);
			if (ops[i] != IBV_WR_SEND)
				CHECK((wc.wc_flags & IBV_WC_WITH_IMM) &&
				      ntohl(wc.imm_data) == 0x1234u + (uint32_t)m, "immediate");
			const uint8_t *got = write ? dst + 4096 + m * MSG :
						     dst + (k ? 1024 : 0) + i * MSG;
			CHECK(t_pattern_check(got, MSG, m) < 0, "data of message %d", m);
		}
	}
	CHECK(t_cq_drain(cqa, NULL, 4, 20) == 0 && t_cq_drain(cqb, NULL, 4, 0) == 0 &&
	      t_cq_drain(r.recv_cq, NULL, 4, 0) == 0, "nothing more");

	/* One-sided through the target, in the SRQ's PD. */
	uint64_t *res = (uint64_t *)(src + 2048);
	uint64_t *word = (uint64_t *)(dst + 6144);
	*word = 40;
	/* t_post_atomic names no SRQ: refused when posted. */
	CHECK(t_post_atomic(ini, 50, IBV_WR_ATOMIC_FETCH_AND_ADD, res, smr->lkey,
			    (uintptr_t)word, dmr->rkey, 2, 0) == EINVAL,
	      "an atomic naming no SRQ");
	struct ibv_sge sge = { (uintptr_t)res, 8, smr->lkey };
	struct ibv_send_wr aw = { .wr_id = 51, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	aw.qp_type.xrc.remote_srqn = na;
	aw.wr.atomic.remote_addr = (uintptr_t)word;
	aw.wr.atomic.rkey = dmr->rkey;
	aw.wr.atomic.compare_add = 2;
	REQUIRE(ibv_post_send(ini, &aw, &bad) == 0, "fetch and add");
	CHECK(t_expect_wc(r.send_cq, &wc, 51, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, "fetch and add") &&
	      *res == 40 && *word == 42, "fetch and add: old %llu now %llu",
	      (unsigned long long)*res, (unsigned long long)*word);
	t_pattern_fill(dst + 7168, 256, 77);
	REQUIRE(post_xrc(ini, 52, IBV_WR_RDMA_READ, src + 3072, 256, smr->lkey, nb,
			 (uintptr_t)dst + 7168, dmr->rkey) == 0, "read");
	CHECK(t_expect_wc(r.send_cq, &wc, 52, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "read") &&
	      t_pattern_check(src + 3072, 256, 77) < 0, "read data");

	/* An armed CQ of an XRC SRQ gets its event. */
	REQUIRE(ibv_req_notify_cq(cqa, 0) == 0, "arm");
	post_srq(sa, 300, dst, MSG, dmr->lkey);
	REQUIRE(post_xrc(ini, 60, IBV_WR_SEND, src, MSG, smr->lkey, na, 0, 0) == 0, "send");
	CHECK(t_wait_cq_event(r.channel, cqa, T_WAIT_MS), "no event on the SRQ's CQ");
	CHECK(t_expect_wc(cqa, &wc, 300, IBV_WC_SUCCESS, IBV_WC_RECV, "evented receive"),
	      "evented receive");
	CHECK(t_expect_wc(r.send_cq, &wc, 60, IBV_WC_SUCCESS, IBV_WC_SEND, "its send"), "send");

	/* A destroyed SRQ is none, even to a sender (and a target) that
	 * used it a moment ago and may hold on to it. */
	post_srq(sb, 250, dst, MSG, dmr->lkey);
	REQUIRE(post_xrc(ini, 61, IBV_WR_SEND, src, MSG, smr->lkey, nb, 0, 0) == 0, "send");
	CHECK(t_expect_wc(r.send_cq, &wc, 61, IBV_WC_SUCCESS, IBV_WC_SEND, "send to b"),
	      "send to b");
	CHECK(t_expect_wc(cqb, &wc, 250, IBV_WC_SUCCESS, IBV_WC_RECV, "receive of b"),
	      "receive of b");
	post_srq(sb, 251, dst, MSG, dmr->lkey);
	CHECK(ibv_destroy_srq(sb) == 0, "destroy SRQ b");
	sb = NULL;
	REQUIRE(post_xrc(ini, 62, IBV_WR_SEND, src, MSG, smr->lkey, nb, 0, 0) == 0, "send");
	CHECK(t_expect_wc(r.send_cq, &wc, 62, IBV_WC_REM_INV_REQ_ERR, -1,
			  "a send to a destroyed SRQ"), "a send to a destroyed SRQ");
	fresh_pair(&r, x, &ini, &tgt);

	/* Keys are the SRQ's PD's: an MR of another PD is refused.  (Over
	 * TCP, of a PD no XRC SRQ of the domain has: iWARP's headers do
	 * not say which SRQ, docs/wire-protocol.md.) */
	struct ibv_pd *pd2 = ibv_alloc_pd(r.ctx);
	REQUIRE(pd2, "second PD");
	uint8_t *odst = t_alloc(4096);
	struct ibv_mr *omr = ibv_reg_mr(pd2, odst, 4096,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(omr, "MR of the second PD");
	REQUIRE(post_xrc(ini, 65, IBV_WR_RDMA_WRITE, src, MSG, smr->lkey, na,
			 (uintptr_t)odst, omr->rkey) == 0, "write");
	CHECK(t_expect_wc(r.send_cq, &wc, 65, IBV_WC_REM_ACCESS_ERR, -1,
			  "a write to another PD's MR"), "a write to another PD's MR");
	fresh_pair(&r, x, &ini, &tgt);

	/* An SRQ of another domain is no SRQ of the target's. */
	post_srq(so, 400, dst, MSG, dmr->lkey);
	REQUIRE(post_xrc(ini, 70, IBV_WR_SEND, src, MSG, smr->lkey, no, 0, 0) == 0, "send");
	CHECK(t_expect_wc(r.send_cq, &wc, 70, IBV_WC_REM_INV_REQ_ERR, -1,
			  "a send to another domain's SRQ"), "status %s",
	      ibv_wc_status_str(wc.status));
	CHECK(t_cq_drain(cqb, NULL, 4, 50) == 0, "the other domain's SRQ took nothing");
	CHECK(t_qp_state(ini) == IBV_QPS_ERR, "the send QP in error: %d", t_qp_state(ini));

	CHECK(ibv_destroy_qp(ini) == 0 && ibv_destroy_qp(tgt) == 0, "destroy QPs");
	CHECK(ibv_destroy_srq(sa) == 0 && ibv_destroy_srq(so) == 0, "destroy SRQs");
	CHECK(ibv_destroy_cq(cqa) == 0 && ibv_destroy_cq(cqb) == 0, "destroy CQs");
	CHECK(ibv_close_xrcd(x) == 0 && ibv_close_xrcd(other) == 0, "close domains");
	CHECK(ibv_dereg_mr(omr) == 0 && ibv_dealloc_pd(pd2) == 0, "second PD");
	t_res_close(&r);
	free(src);
	free(dst);
	free(odst);
}

/* ---- A receive's event and the Sends before it, on one channel ---- */

/* Over TCP a Send completes when the peer's answer to it comes back on
 * its own stream; a reply that answers it comes into an XRC SRQ on
 * another stream, and may overtake that answer.  A program that waits
 * for its Send's event on a channel its receive CQ shares (Debian's
 * perftest -e) must get that event first, so the SRQ's event waits for
 * the Sends taken before it; for a while only, as a Send may go
 * unanswered.  Here the Send waits for a receive in an empty SRQ (b)
 * while another pair carries the reply into SRQ a. */
static void xrc_receive_event_after_send(void *arg)
{
	(void)arg;
	if (!over_tcp())
		t_skip("over shared memory a Send completes as it is taken");
	struct t_opts o = t_opts_default();
	o.create_qp = false;
	o.use_channel = true;
	struct t_res r;
	t_res_open(&r, &o);
	struct ibv_xrcd *x = open_xrcd(r.ctx, -1, O_CREAT);
	REQUIRE(x, "domain");
	/* a's CQ on the channel of the send CQ; the reply's pair sends into
	 * a CQ of no channel */
	struct ibv_cq *cqa = ibv_create_cq(r.ctx, 64, NULL, r.channel, 0);
	struct ibv_cq *quiet = ibv_create_cq(r.ctx, 64, NULL, NULL, 0);
	REQUIRE(cqa && quiet, "CQs");
	struct ibv_srq *sa = xsrq(&r, x, cqa), *sb = xsrq(&r, x, quiet);
	uint32_t na, nb;
	REQUIRE(!ibv_get_srq_num(sa, &na) && !ibv_get_srq_num(sb, &nb), "numbers");
	struct ibv_qp *tgt1 = tgt_qp(&r, x), *ini1 = ini_qp(&r);
	struct ibv_cq *keep = r.send_cq;
	r.send_cq = quiet;
	struct ibv_qp *tgt2 = tgt_qp(&r, x), *ini2 = ini_qp(&r);
	r.send_cq = keep;
	connect_local(&r, ini1, tgt1);
	connect_local(&r, ini2, tgt2);
	uint8_t *buf = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc;

	for (int round = 0; round < 2; round++) {
		bool answered = round == 0;

		REQUIRE(ibv_req_notify_cq(r.send_cq, 0) == 0 &&
			ibv_req_notify_cq(cqa, 0) == 0, "arm");
		post_srq(sa, 10 + round, buf + 1024, MSG, mr->lkey);
		REQUIRE(post_xrc(ini1, 20 + round, IBV_WR_SEND, buf, MSG, mr->lkey, nb, 0, 0) == 0,
			"the Send into the empty SRQ");
		REQUIRE(post_xrc(ini2, 30 + round, IBV_WR_SEND, buf + 64, MSG, mr->lkey, na, 0,
				 0) == 0, "the reply");
		/* The reply's Send completes once it was placed and its
		 * receive's event claimed. */
		CHECK(t_expect_wc(quiet, &wc, 30 + round, IBV_WC_SUCCESS, IBV_WC_SEND, "reply"),
		      "round %d: the reply's Send", round);
		if (answered) {
			CHECK(!t_fd_readable(r.channel->fd, 5),
			      "an event before the Send taken before the receive completed");
			post_srq(sb, 40, buf + 2048, MSG, mr->lkey);
			CHECK(t_wait_cq_event(r.channel, r.send_cq, T_WAIT_MS),
			      "the Send's event is not the first");
			CHECK(t_wait_cq_event(r.channel, cqa, T_WAIT_MS),
			      "the receive's event after it");
		} else {
			/* Unanswered: the receive's event comes all the same,
			 * once the wait (20 ms) is over. */
			uint64_t t0 = t_now_ms();

			CHECK(t_wait_cq_event(r.channel, cqa, T_WAIT_MS),
			      "no receive event while a Send waits unanswered");
			CHECK(t_now_ms() - t0 < 150, "the receive's event came after %llu ms",
			      (unsigned long long)(t_now_ms() - t0));
			post_srq(sb, 41, buf + 2048, MSG, mr->lkey);
			CHECK(t_wait_cq_event(r.channel, r.send_cq, T_WAIT_MS),
			      "the Send's event");
		}
		CHECK(t_expect_wc(r.send_cq, &wc, 20 + round, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
		      "round %d: the Send", round);
		CHECK(t_expect_wc(cqa, &wc, 10 + round, IBV_WC_SUCCESS, IBV_WC_RECV, "receive"),
		      "round %d: the reply's receive", round);
		CHECK(t_expect_wc(quiet, &wc, 40 + round, IBV_WC_SUCCESS, IBV_WC_RECV,
				  "receive of b"), "round %d: the Send's receive", round);
	}
	CHECK(ibv_destroy_qp(ini1) == 0 && ibv_destroy_qp(tgt1) == 0 &&
	      ibv_destroy_qp(ini2) == 0 && ibv_destroy_qp(tgt2) == 0, "destroy QPs");
	CHECK(ibv_destroy_srq(sa) == 0 && ibv_destroy_srq(sb) == 0, "destroy SRQs");
	CHECK(ibv_destroy_cq(cqa) == 0 && ibv_destroy_cq(quiet) == 0, "destroy CQs");
	CHECK(ibv_close_xrcd(x) == 0, "close domain");
	t_res_close(&r);
	free(buf);
}

/* ---- Two processes: the target of one, the SRQ of the other ---- */

static char pair_path[64];

struct srq_info {
	uint32_t srqn;
	uint64_t addr;
	uint32_t rkey;
};

/* The parent has the send and target QPs; its Sends name the child's SRQ,
 * in the same domain (the file), so the target's process places into the
 * child's memory; then a Write into the child's MR through the target. */
/* Either side: resources without a QP, and the domain's file open. */
static int pair_side(struct t_res *r)
{
	struct t_opts o = t_opts_default();
	int fd;

	o.create_qp = false;
	t_res_open(r, &o);
	fd = open(pair_path, O_RDONLY);
	REQUIRE(fd >= 0, "open %s", pair_path);
	return fd;
}

static void pair_parent(struct t_peer *p, void *arg)
{
	(void)arg;
	struct t_res r;
	int fd = pair_side(&r);
	struct ibv_xrcd *x = open_xrcd(r.ctx, fd, O_CREAT);
	REQUIRE(x, "domain: %s", strerror(errno));
	t_barrier(p); /* the child opens it too */
	struct srq_info si;
	t_recv_msg(p, &si, sizeof(si), T_WAIT_MS);
	struct ibv_qp *tgt = tgt_qp(&r, x), *ini = ini_qp(&r);
	connect_local(&r, ini, tgt);
	uint8_t *src = t_alloc(4096);
	struct ibv_mr *smr = t_reg(&r, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc;
	for (int i = 0; i < 8; i++) {
		t_pattern_fill(src + i * MSG, MSG, 10 + i);
		REQUIRE(post_xrc(ini, i, IBV_WR_SEND, src + i * MSG, MSG, smr->lkey, si.srqn, 0,
				 0) == 0, "send %d", i);
	}
	for (int i = 0; i < 8; i++)
		CHECK(t_expect_wc(r.send_cq, &wc, i, IBV_WC_SUCCESS, IBV_WC_SEND, "send"),
		      "send %d", i);
	/* A Write into the child's MR: over shared memory it reaches the
	 * SRQ's context; over TCP a target reaches the MRs of its own
	 * process only (docs/wire-protocol.md, XRC), and refuses cleanly. */
	t_pattern_fill(src + 2048, 512, 99);
	REQUIRE(post_xrc(ini, 20, IBV_WR_RDMA_WRITE, src + 2048, 512, smr->lkey, si.srqn,
			 si.addr + 2048, si.rkey) == 0, "write");
	enum ibv_wc_status want = over_tcp() ? IBV_WC_REM_ACCESS_ERR : IBV_WC_SUCCESS;
	CHECK(t_expect_wc(r.send_cq, &wc, 20, want, -1, "write"), "write: %s",
	      ibv_wc_status_str(wc.status));
	t_send_u64(p, 1);
	t_barrier(p); /* the child checked */
	CHECK(ibv_destroy_qp(ini) == 0 && ibv_destroy_qp(tgt) == 0, "destroy QPs");
	CHECK(ibv_close_xrcd(x) == 0, "close");
	t_res_close(&r);
	close(fd);
	free(src);
}

static void pair_child(struct t_peer *p, void *arg)
{
	(void)arg;
	struct t_res r;
	int fd = pair_side(&r);
	t_barrier(p);
	struct ibv_xrcd *x = open_xrcd(r.ctx, fd, 0); /* the parent's: it exists */
	REQUIRE(x, "the parent's domain without O_CREAT: %s", strerror(errno));
	struct ibv_srq *s = xsrq(&r, x, r.recv_cq);
	uint8_t *dst = t_alloc(4096);
	struct ibv_mr *mr = t_reg(&r, dst, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	for (int i = 0; i < 8; i++)
		post_srq(s, 100 + i, dst + i * MSG, MSG, mr->lkey);
	struct srq_info si = { .addr = (uintptr_t)dst, .rkey = mr->rkey };
	REQUIRE(ibv_get_srq_num(s, &si.srqn) == 0, "number");
	t_send_msg(p, &si, sizeof(si));
	struct ibv_wc wc;
	for (int i = 0; i < 8; i++) {
		if (!t_poll_one(r.recv_cq, &wc, T_WAIT_MS, "receive"))
			break;
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 100u + i && wc.byte_len == MSG &&
		      wc.opcode == IBV_WC_RECV, "receive %d: %s wr_id %llu", i,
		      ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
		CHECK(t_pattern_check(dst + i * MSG, MSG, 10 + i) < 0, "data %d", i);
	}
	t_recv_u64(p, T_WAIT_MS); /* the write is done */
	if (!over_tcp())
		CHECK(t_pattern_check(dst + 2048, 512, 99) < 0, "written data");
	t_barrier(p);
	CHECK(ibv_destroy_srq(s) == 0, "destroy SRQ");
	CHECK(ibv_close_xrcd(x) == 0, "close");
	t_res_close(&r);
	close(fd);
	free(dst);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	int fd = domain_file(pair_path, sizeof(pair_path));
	close(fd);
	t_case("xrc_rules", xrc_rules, NULL);
	t_case("xrc_one_process", xrc_one_process, NULL);
	t_case("xrc_receive_event_after_send", xrc_receive_event_after_send, NULL);
	t_pair("xrc_target_and_srq_in_two_processes", pair_parent, pair_child, NULL);
	int ret = t_finish();
	unlink(pair_path);
	return ret;
}
