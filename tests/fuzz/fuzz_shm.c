// SPDX-License-Identifier: MIT
/*
 * Fuzz target for what urdma reads from shared memory that another process
 * of the user may have written (issue 17):
 *
 *  - a deliverer's check of a peer QP's shared block (urdma_shm_qp_check),
 *    then receive WRs of that ring as spans of the owner's MR table
 *    (urdma_rqe_spans): every entry it computes lies inside the block, at
 *    most max_sge spans come out, each inside a registered region whose key
 *    and PD it names;
 *  - the owner's harvest of its own ring (urdma_qp_harvest) with a
 *    completion index and entries written by someone else: it never
 *    reports more than was posted, every completion's WR id is one that was
 *    posted, its status and opcode are ones a receive can have, a Send
 *    never longer than its receive; for a UD QP (whose ring any process
 *    of the user may write into) only Sends of at least the GRH's 40
 *    bytes, with a 24-bit source QPN and an SL; nonsense stops it.
 *
 * Input: a little-endian header of choices (QPN and context matches, the
 * block size the record claims, the owner's private indices), then the
 * block's bytes (struct urdma_shm_qp and the ring), then MR table entries.
 * Every buffer is an exact-size heap copy, so ASan catches a read past it.
 *
 * Built two ways: with libFuzzer (`make fuzz`), or with -DURDMA_FUZZ_MAIN
 * (ctest fuzz_shm_replay): a main() that runs a bounded number of inputs
 * made from a fixed seed: valid blocks and rings with mutations.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/urdma.h"
#include "transport/transport.h"
#include "fuzz.h"

#define QPN 0x123401
#define CTX 0x77
#define PD 5
#define NMR 4
#define OWN_SIZE 8 /* the owner's ring in the harvest part */
#define OWN_SGE 2

struct choices {
	uint8_t flags; /* bit 0: QPN matches, 1: context matches, 2: a good
			* header, 3: the owner is a UD QP */
	uint8_t nharvest;
	uint16_t claim; /* the record's block size, in 64-byte units */
	uint32_t prod, poll, done;
	uint16_t wr_len[OWN_SIZE];
} __attribute__((packed));

static struct urdma_shm_ctx *mrtab;
/* What the inputs reached (the replay prints it). */
static long n_blocks, n_spans, n_harvested, n_bad;

/* MR entries from the input: (key, va, length) of region i. */
static void mrs_from(const uint8_t *p, size_t n)
{
	if (!mrtab) {
		mrtab = calloc(1, sizeof(*mrtab));
		FUZZ_ASSERT(mrtab, "out of memory");
	}
	for (int i = 0; i < NMR; i++) {
		struct urdma_shm_mr *e = &mrtab->mr[i];
		uint64_t v[2] = { 0x10000ull * (i + 1), 4096 };

		if (n >= 16) {
			memcpy(v, p, 16);
			p += 16;
			n -= 16;
		}
		e->iova = e->va = v[0] & ((1ull << 47) - 1);
		e->length = v[1] & 0xffffff;
		e->access = IBV_ACCESS_LOCAL_WRITE | (i & 1 ? IBV_ACCESS_REMOTE_WRITE : 0);
		e->pd_id = i == 3 ? PD + 1 : PD;
		e->flags = 0;
		e->key = urdma_mr_key(i, 0x1000 + i);
	}
}

static bool in_some_mr(const struct urdma_span *s)
{
	for (int i = 0; i < NMR; i++) {
		const struct urdma_shm_mr *e = &mrtab->mr[i];

		if (e->pd_id == PD && s->va >= e->va && s->len <= e->length &&
		    s->va - e->va <= e->length - s->len)
			return true;
	}
	return false;
}

static void deliverer(const uint8_t *blk, size_t len, uint64_t claim)
{
	struct urdma_span sp[URDMA_MAX_SGE + 1];
	struct urdma_rq_geo g;
	uint64_t room;
	int n;

	if (claim > len)
		claim = len; /* the record can't give more than the mapping */
	if (urdma_shm_qp_check((const struct urdma_shm_qp *)blk, claim, QPN, CTX, &g))
		return;
	n_blocks++;
	FUZZ_ASSERT(g.size && !(g.size & (g.size - 1)) && g.size <= URDMA_MAX_QP_WR,
		    "size %u", g.size);
	FUZZ_ASSERT(g.max_sge >= 1 && g.max_sge <= URDMA_MAX_SGE, "max_sge %u", g.max_sge);
	FUZZ_ASSERT(g.stride == urdma_rq_stride(g.max_sge), "stride %u", g.stride);
	FUZZ_ASSERT(sizeof(struct urdma_shm_qp) + (uint64_t)g.size * g.stride <= claim,
		    "ring past the block");
	for (uint32_t idx = 0; idx < g.size + 3 && idx < 64; idx++) {
		uint8_t *ring = (uint8_t *)blk + sizeof(struct urdma_shm_qp);
		struct urdma_shm_rqe *e = urdma_rqe_at(ring, &g, idx * 2654435761u);

		FUZZ_ASSERT((uint8_t *)e >= ring &&
				    (uint8_t *)e + g.stride <= blk + claim,
			    "entry %u outside the block", idx);
		if (urdma_rqe_spans(mrtab, PD, g.max_sge, e, sp, &n, &room))
			continue;
		FUZZ_ASSERT(n >= 0 && (uint32_t)n <= g.max_sge, "%d spans", n);
		n_spans += n;
		for (int i = 0; i < n; i++)
			FUZZ_ASSERT(in_some_mr(&sp[i]), "span %d outside every MR", i);
	}
}

static void owner(const struct choices *c, const uint8_t *ring_in, size_t len)
{
	size_t bytes = sizeof(struct urdma_shm_qp) +
		       (size_t)OWN_SIZE * urdma_rq_stride(OWN_SGE);
	uint8_t *blk = calloc(1, bytes);
	struct urdma_qp *qp = calloc(1, sizeof(*qp));
	/* A context with no window: a Send with Invalidate read from the
	 * ring names none, and its receive becomes a protection error. */
	static struct urdma_context uctx;
	static struct urdma_mr *mrs[URDMA_MAX_MR];
	struct urdma_rq_wr wr[OWN_SIZE];
	struct ibv_wc wc[OWN_SIZE + 4];
	uint32_t posted, poll0;
	int n;

	FUZZ_ASSERT(blk && qp, "out of memory");
	memcpy(blk + sizeof(struct urdma_shm_qp), ring_in,
	       len < bytes - sizeof(struct urdma_shm_qp) ?
		       len :
		       bytes - sizeof(struct urdma_shm_qp));
	qp->shm = (struct urdma_shm_qp *)blk;
	if (!uctx.mrs) {
		uctx.mrs = mrs;
		pthread_mutex_init(&uctx.mw_lock, NULL);
	}
	qp->uctx = &uctx;
	qp->rq = (struct urdma_rq_geo){ OWN_SIZE, urdma_rq_stride(OWN_SGE), OWN_SGE };
	qp->rq_ring = blk + sizeof(struct urdma_shm_qp);
	for (int i = 0; i < OWN_SIZE; i++)
		wr[i] = (struct urdma_rq_wr){ .wr_id = 1000 + i, .len = c->wr_len[i] };
	qp->rq_wr = wr;
	/* What the owner knows: at most a ring's worth posted, unharvested. */
	poll0 = c->poll;
	posted = c->prod % (OWN_SIZE + 1);
	atomic_store(&qp->rq_prod, poll0 + posted);
	qp->rq_poll = poll0;
	atomic_store(&qp->shm->rq_done, c->done); /* anyone's */
	qp->ibqp.qp_num = QPN;
	/* A UD QP's ring has many writers, and its entries more fields. */
	qp->ibqp.qp_type = c->flags & 8 ? IBV_QPT_UD : IBV_QPT_RC;
	n = urdma_qp_harvest(qp, wc, 1 + c->nharvest % (OWN_SIZE + 3));
	FUZZ_ASSERT(n >= 0 && (uint32_t)n <= posted, "%d completions, %u posted", n, posted);
	FUZZ_ASSERT(qp->rq_poll == poll0 + (uint32_t)n, "poll moved by %u, %d reported",
		    qp->rq_poll - poll0, n);
	for (int i = 0; i < n; i++) {
		uint32_t slot = (poll0 + i) % OWN_SIZE;

		FUZZ_ASSERT(wc[i].wr_id == 1000 + slot, "wr_id %llu at %u",
			    (unsigned long long)wc[i].wr_id, slot);
		FUZZ_ASSERT(wc[i].status <= IBV_WC_TM_RNDV_INCOMPLETE, "status %u",
			    wc[i].status);
		FUZZ_ASSERT(wc[i].opcode == IBV_WC_RECV ||
				    wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM,
			    "opcode %u", wc[i].opcode);
		FUZZ_ASSERT(!(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_RECV) ||
				    wc[i].byte_len <= c->wr_len[slot],
			    "a %u-byte Send in a %u-byte receive", wc[i].byte_len,
			    c->wr_len[slot]);
		/* The QP has no windows: whatever a peer writes, no Send
		 * with Invalidate can complete with success. */
		FUZZ_ASSERT(!(wc[i].status == IBV_WC_SUCCESS &&
			      (wc[i].wc_flags & IBV_WC_WITH_INV)),
			    "an invalidation reported done with no window");
		if (qp->ibqp.qp_type != IBV_QPT_UD)
			continue;
		/* A UD receive: a Send, at least the GRH's 40 bytes. */
		FUZZ_ASSERT(wc[i].opcode == IBV_WC_RECV &&
				    !(wc[i].wc_flags & ~(unsigned)(IBV_WC_WITH_IMM | IBV_WC_GRH)) &&
				    wc[i].src_qp <= 0xffffff && wc[i].sl <= 15 &&
				    (wc[i].status != IBV_WC_SUCCESS || wc[i].byte_len >= 40),
			    "a UD completion that can't be: opcode %u flags %#x len %u",
			    wc[i].opcode, wc[i].wc_flags, wc[i].byte_len);
	}
	n_harvested += n > 0;
	n_bad += atomic_load(&qp->rq_bad);
	/* Once it found nonsense it reports nothing more until the flush. */
	if (atomic_load(&qp->rq_bad))
		FUZZ_ASSERT(urdma_qp_harvest(qp, wc, OWN_SIZE) == 0, "harvest after nonsense");
	free(qp);
	free(blk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct choices c;
	size_t blen, mrlen = 16 * NMR;
	uint8_t *blk;
	struct urdma_shm_qp *h;

	if (size < sizeof(c) + sizeof(struct urdma_shm_qp))
		return 0;
	memcpy(&c, data, sizeof(c));
	data += sizeof(c);
	size -= sizeof(c);
	if (size > mrlen + sizeof(struct urdma_shm_qp)) {
		mrs_from(data + size - mrlen, mrlen);
		size -= mrlen;
	} else {
		mrs_from(NULL, 0);
	}
	blen = size;
	blk = malloc(blen); /* exact size: ASan sees a read past it */
	FUZZ_ASSERT(blk, "out of memory");
	memcpy(blk, data, blen);
	h = (struct urdma_shm_qp *)blk;
	/* The fuzzer would take long to guess these: choose them. */
	if (c.flags & 1)
		h->qpn = QPN;
	if (c.flags & 2)
		h->ctx_id = CTX;
	if (c.flags & 4) {
		h->magic = URDMA_SHM_MAGIC;
		h->version = URDMA_SHM_VERSION;
		h->rq_offset = sizeof(*h);
	}
	deliverer(blk, blen, (uint64_t)c.claim * 64);
	owner(&c, blk + sizeof(*h), blen - sizeof(*h));
	free(blk);
	return 0;
}

#ifdef URDMA_FUZZ_MAIN
/* Inputs from a fixed seed: valid blocks (a ring of some geometry, entries
 * with keys of the MR table) and mutations of them. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next(void)
{
	return (uint32_t)fuzz_xorshift(&rng);
}

static size_t make_input(uint8_t *in, size_t cap)
{
	struct choices c = { 0 };
	/* Half of them in the owner's geometry, so its harvest sees entries
	 * where it looks for them. */
	bool own = next() % 2;
	uint32_t max_sge = own ? OWN_SGE : 1 + next() % URDMA_MAX_SGE;
	uint32_t size = own ? OWN_SIZE : 1u << (next() % 6);
	uint32_t stride = urdma_rq_stride(max_sge);
	size_t blen = sizeof(struct urdma_shm_qp) + (size_t)size * stride + next() % 128;
	struct urdma_shm_qp h = { .magic = URDMA_SHM_MAGIC, .version = URDMA_SHM_VERSION,
				  .qpn = QPN, .ctx_id = CTX, .rq_size = size,
				  .rq_stride = stride, .rq_max_sge = max_sge,
				  .rq_offset = sizeof(struct urdma_shm_qp) };
	size_t len = sizeof(c) + blen + 16 * NMR;

	if (len > cap)
		return 0;
	c.flags = next() & 15;
	c.nharvest = next();
	c.claim = (uint16_t)((blen + 63) / 64 - (next() % 4 == 0));
	c.prod = next() % (OWN_SIZE + 1);
	c.poll = next() % 3 ? 0 : next();
	c.done = c.poll + next() % (OWN_SIZE + 2) - (next() % 8 == 0 ? 3 : 0);
	for (int i = 0; i < OWN_SIZE; i++)
		c.wr_len[i] = next() % 256;
	memcpy(in, &c, sizeof(c));
	memset(in + sizeof(c), 0, blen);
	memcpy(in + sizeof(c), &h, sizeof(h));
	/* Ring entries: plausible receives and completions. */
	for (uint32_t i = 0; i < size && i < OWN_SIZE; i++) {
		struct urdma_shm_rqe *e =
			(struct urdma_shm_rqe *)(in + sizeof(c) + sizeof(h) + (size_t)i * stride);
		uint32_t k = next() % NMR;

		e->num_sge = next() % (max_sge + 2);
		e->status = next() % 4 ? IBV_WC_SUCCESS : next() % 30;
		e->opcode = next() % 8 ? IBV_WC_RECV : next() % 300;
		e->byte_len = next() % (next() % 4 ? c.wr_len[i] + 1 : 300);
		e->wc_flags = next() % 8 ? 0 : next();
		for (uint32_t s = 0; s < max_sge && s < 4; s++) {
			e->sge[s].lkey = urdma_mr_key(k, 0x1000 + k) ^ (next() % 16 == 0);
			e->sge[s].addr = 0x10000ull * (k + 1) + next() % 8192;
			e->sge[s].length = next() % 8192;
		}
	}
	for (int i = 0; i < NMR; i++) {
		uint64_t v[2] = { 0x10000ull * (i + 1), 4096 };

		memcpy(in + sizeof(c) + blen + 16 * i, v, 16);
	}
	/* Mutations: a few bytes anywhere. */
	for (int m = next() % 6; m > 0; m--)
		in[next() % len] ^= (uint8_t)(1u << (next() % 8));
	return len;
}

int main(int argc, char **argv)
{
	static uint8_t in[1 << 20];
	long iters = argc > 1 ? strtol(argv[1], NULL, 0) : 20000;
	size_t len;

	setenv("URDMA_LOG_FILE", "/dev/null", 1); /* rq_bad says what it found */
	for (long i = 0; i < iters; i++) {
		len = make_input(in, sizeof(in));
		if (len)
			LLVMFuzzerTestOneInput(in, len);
	}
	printf("fuzz_shm: %ld inputs: %ld blocks accepted, %ld spans, %ld harvests "
	       "with completions, %ld stopped by nonsense\n",
	       iters, n_blocks, n_spans, n_harvested, n_bad);
	return 0;
}
#endif
